"""`MultiClassHead`: TF 2.15's `tf.estimator.MultiClassHead`."""
from __future__ import annotations

from tpu_fc._tf import tf
from tpu_fc.estimator.head import base_head

_KEYS = base_head.MetricKeys
_PRED = base_head.PredictionKeys


class MultiClassHead(base_head.SingleHead):
  """A head for single-label classification into `n_classes` > 2 classes, by
  sparse softmax cross entropy.

  Logits are `[D0, ... DN, n_classes]`, labels `[D0, ... DN, 1]` (or
  `[D0, ... DN]`): integer class ids, or strings of `label_vocabulary`.
  Weights are `[D0, ... DN]` or `[D0, ... DN, 1]`.  Metrics: `loss` (in
  `evaluate`), `average_loss`, `accuracy` (suffixed `/<name>` for a named
  head).  Predictions: `logits`, `probabilities`, `class_ids`, `classes`,
  `all_class_ids`, `all_classes`.  Export outputs: `classification` (served
  by default), `predict`.

  Args:
    n_classes: the number of classes, > 2 (2: `BinaryClassHead`).
    weight_column: a feature key or `tf.feature_column.numeric_column` of
      the example weights.
    label_vocabulary: the `n_classes` label strings (list or tuple); None:
      labels are class ids.
    loss_reduction: a `tf.losses.Reduction` but `NONE`.
    loss_fn: `(labels, logits[, features])` -> unreduced `[D0, ... DN, 1]`
      loss, instead of softmax cross entropy (labels as class ids).
    name: the suffix of metric and summary keys, the ops' name scope.
  """
  _prediction_keys = [
      _PRED.LOGITS, _PRED.PROBABILITIES, _PRED.CLASS_IDS, _PRED.CLASSES,
      _PRED.ALL_CLASS_IDS, _PRED.ALL_CLASSES]

  def __init__(self, n_classes, weight_column=None, label_vocabulary=None,
               loss_reduction=base_head.SUM_OVER_BATCH_SIZE, loss_fn=None,
               name=None):
    if n_classes is None:
      raise ValueError('n_classes cannot be None')
    base_head.check_label_vocabulary(label_vocabulary)
    if label_vocabulary is not None and len(label_vocabulary) != n_classes:
      raise ValueError(
          '"label_vocabulary" does not have "n_classes" items. '
          'len(label_vocabulary)={}, n_classes={}, label_vocabulary={}'.format(
              len(label_vocabulary), n_classes, label_vocabulary))
    super().__init__(n_classes, weight_column, loss_reduction, loss_fn, name,
                     label_vocabulary)
    if isinstance(n_classes, int) and n_classes <= 2:
      raise ValueError('n_classes must be > 2: %s.' % n_classes)
    # (as TF 2.15: a check of a tensor `n_classes`, in the current graph)
    with tf.control_dependencies([tf.compat.v1.debugging.assert_greater(
        tf.convert_to_tensor(n_classes), 2,
        message='n_classes must be greater than 2')]):
      tf.no_op()
    self._n_classes = n_classes

  def _processed_labels(self, logits, labels):
    labels = base_head.check_dense_labels_match_logits_and_reshape(
        labels, logits, expected_labels_dimension=1)
    if self._label_vocabulary is not None:
      if labels.dtype != tf.string:
        raise ValueError('Labels dtype should be string if there is a '
                         'vocabulary. Instead got {}'.format(labels.dtype))
      labels = self._class_ids_of(labels)
    elif not labels.dtype.is_integer:
      raise ValueError('Labels dtype should be integer. Instead got {}.'
                       .format(labels.dtype))
    return base_head.check_label_range(labels, self._n_classes)

  def _default_loss(self, labels, logits):
    return tf.compat.v1.expand_dims(
        tf.compat.v1.losses.sparse_softmax_cross_entropy(
            labels=labels, logits=logits,
            reduction=tf.compat.v1.losses.Reduction.NONE), axis=-1)

  def _class_predictions(self, logits, keys):
    return self._softmax_predictions(logits, keys)

  def _own_metrics(self):
    return [tf.keras.metrics.Accuracy(name=_KEYS.ACCURACY)]

  def _update_metrics(self, eval_metrics, predictions, labels, weights):
    eval_metrics[self._summary_key(_KEYS.ACCURACY)].update_state(
        y_true=labels, y_pred=predictions[_PRED.CLASS_IDS],
        sample_weight=weights)
