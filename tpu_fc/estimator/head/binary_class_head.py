"""`BinaryClassHead`: TF 2.15's `tf.estimator.BinaryClassHead`."""
from __future__ import annotations

from tpu_fc import export as export_lib
from tpu_fc._tf import tf
from tpu_fc.estimator.head import base_head

_KEYS = base_head.MetricKeys
_PRED = base_head.PredictionKeys


class BinaryClassHead(base_head.SingleHead):
  """A head for single-label binary classification, by sigmoid cross entropy.

  Logits and labels are `[D0, ... DN, 1]` (labels may be `[D0, ... DN]`);
  labels are floats in [0, 1], or strings of `label_vocabulary`.  Weights
  (`weight_column`) are `[D0, ... DN]` or `[D0, ... DN, 1]`.  The loss is the
  weighted per-example loss reduced by `loss_reduction`.  Metrics: `loss`
  (in `evaluate`), `average_loss`, `accuracy`, `precision`, `recall`,
  `prediction/mean`, `label/mean`, `accuracy_baseline`, `auc`,
  `auc_precision_recall`, and at each of `thresholds` accuracy, precision and
  recall; each key suffixed `/<name>` for a named head.  Predictions:
  `logits`, `logistic`, `probabilities`, `class_ids`, `classes`,
  `all_class_ids`, `all_classes`.  Export outputs:
  `classification` (served by default), `regression` (the logistic) and
  `predict`.

  Args:
    weight_column: a feature key or `tf.feature_column.numeric_column` of
      the example weights.
    thresholds: floats in (0, 1), each giving the logistic threshold of an
      accuracy, precision and recall metric.
    label_vocabulary: the two label strings (list or tuple); None: labels are
      already 0 or 1 (floats in [0, 1]).
    loss_reduction: a `tf.losses.Reduction` but `NONE`.
    loss_fn: `(labels, logits[, features])` -> unreduced `[D0, ... DN, 1]`
      loss, instead of sigmoid cross entropy (labels as float ids).
    name: the suffix of metric and summary keys, the ops' name scope.
  """
  _prediction_keys = [
      _PRED.LOGITS, _PRED.LOGISTIC, _PRED.PROBABILITIES, _PRED.CLASS_IDS,
      _PRED.CLASSES, _PRED.ALL_CLASS_IDS, _PRED.ALL_CLASSES]

  def __init__(self, weight_column=None, thresholds=None,
               label_vocabulary=None,
               loss_reduction=base_head.SUM_OVER_BATCH_SIZE, loss_fn=None,
               name=None):
    base_head.check_label_vocabulary(label_vocabulary)
    thresholds = tuple(thresholds) if thresholds else ()
    for threshold in thresholds:
      if threshold <= 0.0 or threshold >= 1.0:
        raise ValueError('thresholds not in (0, 1): {}.'.format((thresholds,)))
    super().__init__(1, weight_column, loss_reduction, loss_fn, name,
                     label_vocabulary, thresholds)
    self._n_classes = 2

  def _processed_labels(self, logits, labels):
    labels = base_head.check_dense_labels_match_logits_and_reshape(
        labels, logits, expected_labels_dimension=1)
    if self._label_vocabulary is not None:
      labels = self._class_ids_of(labels)
    return base_head.check_label_range(tf.cast(labels, tf.float32), 2)

  def _default_loss(self, labels, logits):
    return tf.compat.v1.nn.sigmoid_cross_entropy_with_logits(
        labels=labels, logits=logits)

  def _class_predictions(self, logits, keys):
    predictions = {}
    if _PRED.LOGISTIC in keys:
      predictions[_PRED.LOGISTIC] = tf.math.sigmoid(logits, name=_PRED.LOGISTIC)
    two_class_logits = tf.concat((tf.compat.v1.zeros_like(logits), logits),
                                 axis=-1, name='two_class_logits')
    predictions.update(
        self._softmax_predictions(two_class_logits, keys))
    return predictions

  def _own_metrics(self):
    metrics = tf.keras.metrics
    return [metrics.Accuracy(name=_KEYS.ACCURACY),
            metrics.Precision(name=_KEYS.PRECISION),
            metrics.Recall(name=_KEYS.RECALL),
            metrics.Mean(name=_KEYS.PREDICTION_MEAN),
            metrics.Mean(name=_KEYS.LABEL_MEAN),
            metrics.Mean(name=_KEYS.ACCURACY_BASELINE),
            metrics.AUC(name=_KEYS.AUC),
            metrics.AUC(curve='PR', name=_KEYS.AUC_PR)]

  def _update_metrics(self, eval_metrics, predictions, labels, weights):
    class_ids = predictions[_PRED.CLASS_IDS]
    key = self._summary_key
    for name in (_KEYS.ACCURACY, _KEYS.PRECISION, _KEYS.RECALL):
      eval_metrics[key(name)].update_state(
          y_true=labels, y_pred=class_ids, sample_weight=weights)
    logistic = predictions[_PRED.LOGISTIC]
    eval_metrics[key(_KEYS.PREDICTION_MEAN)].update_state(
        values=logistic, sample_weight=weights)
    label_mean = eval_metrics[key(_KEYS.LABEL_MEAN)]
    label_mean.update_state(values=labels, sample_weight=weights)
    # Always predicting the more frequent label: the accuracy baseline reads
    # the label mean's variables, max(total, count - total) / count.
    baseline = eval_metrics[key(_KEYS.ACCURACY_BASELINE)]
    baseline.add_update(tf.no_op())
    baseline.total = tf.math.maximum(label_mean.total,
                                     label_mean.count - label_mean.total)
    baseline.count = label_mean.count
    for name in (_KEYS.AUC, _KEYS.AUC_PR):
      eval_metrics[key(name)].update_state(
          y_true=labels, y_pred=logistic, sample_weight=weights)
    self._update_threshold_metrics(eval_metrics, labels, logistic, weights)

  def _export_outputs(self, predictions):
    return super()._export_outputs(
        predictions, regression=export_lib.RegressionOutput(
            value=predictions[_PRED.LOGISTIC]))
