"""`RegressionHead`, `PoissonRegressionHead`, `LogisticRegressionHead`: TF 2.15's."""
from __future__ import annotations

from tpu_fc import export as export_lib
from tpu_fc._tf import tf
from tpu_fc.estimator.head import base_head

_KEYS = base_head.MetricKeys
_PRED = base_head.PredictionKeys


class RegressionHead(base_head.SingleHead):
  """A head for regression, by mean squared error.

  Logits and labels are `[D0, ... DN, label_dimension]` (labels may be
  `[D0, ... DN]` for one dimension); the loss is weighted and reduced over
  the batch and the label dimension.  Weights are `[D0, ... DN]`,
  `[D0, ... DN, 1]` or `[D0, ... DN, label_dimension]`.  Metrics: `loss` (in
  `evaluate`), `average_loss`, `prediction/mean`, `label/mean` (suffixed
  `/<name>` for a named head).  Predictions: `predictions` (and `logits`
  with an `inverse_link_fn`).  Export outputs: `regression` (served by
  default), `predict`.

  Args:
    label_dimension: the labels' last dimension.
    weight_column: a feature key or `tf.feature_column.numeric_column` of
      the example weights.
    loss_reduction: a `tf.losses.Reduction` but `NONE`.
    loss_fn: `(labels, logits[, features])` -> unreduced
      `[D0, ... DN, label_dimension]` loss, instead of the squared error.
    inverse_link_fn: logits -> predicted values (e.g. `tf.exp`); None: the
      logits.
    name: the suffix of metric and summary keys, the ops' name scope.
  """
  _per_logit = True

  def __init__(self, label_dimension=1, weight_column=None,
               loss_reduction=base_head.SUM_OVER_BATCH_SIZE, loss_fn=None,
               inverse_link_fn=None, name=None):
    if label_dimension < 1:
      raise ValueError('Invalid label_dimension {}.'.format(label_dimension))
    super().__init__(label_dimension, weight_column, loss_reduction, loss_fn,
                     name)
    self._inverse_link_fn = inverse_link_fn

  def _processed_labels(self, logits, labels):
    return tf.cast(base_head.check_dense_labels_match_logits_and_reshape(
        labels, logits, self._logits_dimension), dtype=tf.float32)

  def _default_loss(self, labels, logits):
    return tf.compat.v1.losses.mean_squared_error(
        labels=labels, predictions=logits,
        reduction=tf.compat.v1.losses.Reduction.NONE)

  def predictions(self, logits):
    """`predictions` (and `logits` with an `inverse_link_fn`)."""
    logits = base_head.check_logits_final_dim(logits, self._logits_dimension)
    with tf.compat.v1.name_scope('predictions', values=(logits,)):
      if self._inverse_link_fn:
        return {_PRED.PREDICTIONS: self._inverse_link_fn(logits),
                _PRED.LOGITS: logits}
      return {_PRED.PREDICTIONS: logits}

  def _own_metrics(self):
    return [tf.keras.metrics.Mean(name=_KEYS.PREDICTION_MEAN),
            tf.keras.metrics.Mean(name=_KEYS.LABEL_MEAN)]

  def _update_metrics(self, eval_metrics, predictions, labels, weights):
    """The means of the predictions and of the labels."""
    eval_metrics[self._summary_key(_KEYS.LABEL_MEAN)].update_state(
        values=labels, sample_weight=weights)
    eval_metrics[self._summary_key(_KEYS.PREDICTION_MEAN)].update_state(
        values=predictions[_PRED.PREDICTIONS], sample_weight=weights)

  def _export_outputs(self, predictions):
    return base_head.export_outputs(
        base_head.REGRESS_SERVING_KEY,
        export_lib.RegressionOutput(value=predictions[_PRED.PREDICTIONS]),
        predictions)


class PoissonRegressionHead(RegressionHead):
  """A head for Poisson regression: `tf.nn.log_poisson_loss` of the logits
  (log rates), predictions their exponential.  Shapes, weights, metrics and
  outputs as `RegressionHead`'s.

  Args:
    label_dimension, weight_column, loss_reduction, name: as
      `RegressionHead`'s.
    compute_full_loss: include the Stirling term `log(z!)` in the loss.
  """

  def __init__(self, label_dimension=1, weight_column=None,
               loss_reduction=base_head.SUM_OVER_BATCH_SIZE,
               compute_full_loss=True, name=None):
    self._compute_full_loss = compute_full_loss
    super().__init__(label_dimension, weight_column, loss_reduction,
                     self._poisson_loss, tf.math.exp, name)

  def _poisson_loss(self, labels, logits):
    return tf.nn.log_poisson_loss(targets=labels, log_input=logits,
                                  compute_full_loss=self._compute_full_loss)


class LogisticRegressionHead(RegressionHead):
  """A head for logistic regression: sigmoid cross entropy against float
  labels in [0, 1] (no vocabulary), predictions the sigmoids.  Shapes of one
  dimension; weights, metrics and outputs as `RegressionHead`'s (no AUC and
  classes as `BinaryClassHead`'s).

  Args:
    weight_column, loss_reduction, name: as `RegressionHead`'s.
  """

  def __init__(self, weight_column=None,
               loss_reduction=base_head.SUM_OVER_BATCH_SIZE, name=None):
    super().__init__(1, weight_column, loss_reduction, self._logistic_loss,
                     tf.math.sigmoid, name)

  def _logistic_loss(self, labels, logits):
    labels = base_head.check_label_range(
        labels, n_classes=2, message='Labels must be in range [0, 1]')
    return tf.compat.v1.nn.sigmoid_cross_entropy_with_logits(
        labels=labels, logits=logits)
