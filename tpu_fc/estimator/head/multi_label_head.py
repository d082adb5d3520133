"""`MultiLabelHead`: TF 2.15's `tf.estimator.MultiLabelHead`."""
from __future__ import annotations

from tpu_fc._tf import tf
from tpu_fc.estimator.head import base_head

_KEYS = base_head.MetricKeys
_PRED = base_head.PredictionKeys


class MultiLabelHead(base_head.SingleHead):
  """A head for multi-label classification: each example has any number of
  `n_classes` labels; the loss is the sigmoid cross entropy averaged over
  the classes.

  Logits are `[D0, ... DN, n_classes]`; labels a multi-hot tensor of that
  shape, or a `SparseTensor` (`dense_shape` `[D0, ... DN, ?]`) of class ids
  or, with `label_vocabulary`, of its strings.  Weights are `[D0, ... DN]` or
  `[D0, ... DN, 1]`.  Metrics: `loss` (in `evaluate`), `average_loss`, `auc`,
  `auc_precision_recall`, at each of `thresholds` accuracy, precision and
  recall, and for each of `classes_for_class_based_metrics` the probability
  mean and both AUCs (keys suffixed `/<name>` for a named head).
  Predictions: `logits`, `probabilities` (the sigmoids), `classes` (every
  class, per example).  Export outputs: `classification` (served by
  default), `predict`.

  Args:
    n_classes: the number of classes, > 1.
    weight_column: a feature key or `tf.feature_column.numeric_column` of
      the example weights (per example, not per class).
    thresholds: floats in (0, 1), each the probability threshold of an
      accuracy, precision and recall metric.
    label_vocabulary: the `n_classes` label strings (list or tuple).
    loss_reduction: a `tf.losses.Reduction` but `NONE`.
    loss_fn: `(labels, logits[, features])` -> unreduced `[D0, ... DN, 1]`
      loss, given multi-hot labels.
    classes_for_class_based_metrics: class ids (or vocabulary strings) to
      give their own metrics.
    name: the suffix of metric and summary keys, the ops' name scope.
  """
  _prediction_keys = [_PRED.LOGITS, _PRED.PROBABILITIES, _PRED.CLASSES]

  def __init__(self, n_classes, weight_column=None, thresholds=None,
               label_vocabulary=None,
               loss_reduction=base_head.SUM_OVER_BATCH_SIZE, loss_fn=None,
               classes_for_class_based_metrics=None, name=None):
    if n_classes is None or n_classes < 2:
      raise ValueError('n_classes must be > 1 for multi-label classification. '
                       'Given: {}'.format(n_classes))
    thresholds = tuple(thresholds) if thresholds else ()
    for threshold in thresholds:
      if threshold <= 0.0 or threshold >= 1.0:
        raise ValueError(
            'thresholds must be in (0, 1) range. Given: {}'.format(threshold))
    if label_vocabulary is not None:
      if not isinstance(label_vocabulary, (list, tuple)):
        raise ValueError('label_vocabulary must be a list or tuple. '
                         'Given type: {}'.format(type(label_vocabulary)))
      if len(label_vocabulary) != n_classes:
        raise ValueError('Length of label_vocabulary must be n_classes ({}). '
                         'Given: {}'.format(n_classes, len(label_vocabulary)))
    super().__init__(n_classes, weight_column, loss_reduction, loss_fn, name,
                     label_vocabulary, thresholds)
    self._n_classes = n_classes
    self._class_ids = tuple(classes_for_class_based_metrics or ())
    if self._class_ids and isinstance(self._class_ids[0], str):
      if not label_vocabulary:
        raise ValueError('label_vocabulary must be provided when '
                         'classes_for_class_based_metrics are strings.')
      self._class_ids = tuple(label_vocabulary.index(class_string)
                              for class_string in self._class_ids)
    for class_id in self._class_ids:
      if class_id < 0 or class_id >= n_classes:
        raise ValueError(
            'All classes_for_class_based_metrics must be in range [0, {}]. '
            'Given: {}'.format(n_classes - 1, class_id))

  def _class_keys(self, class_id):
    """The (probability mean, AUC, PR AUC) keys of a class's metrics."""
    if self._label_vocabulary is None:
      keys = (_KEYS.PROBABILITY_MEAN_AT_CLASS, _KEYS.AUC_AT_CLASS,
              _KEYS.AUC_PR_AT_CLASS)
    else:
      keys = (_KEYS.PROBABILITY_MEAN_AT_NAME, _KEYS.AUC_AT_NAME,
              _KEYS.AUC_PR_AT_NAME)
      class_id = self._label_vocabulary[class_id]
    return tuple(self._summary_key(key % class_id) for key in keys)

  def _processed_labels(self, logits, labels):
    """Labels as a multi-hot `[D0, ... DN, n_classes]` tensor."""
    if labels is None:
      raise ValueError(base_head._LABEL_NONE_ERR_MSG)  # pylint: disable=protected-access
    if isinstance(labels, tf.sparse.SparseTensor):
      if labels.dtype == tf.string:
        processed_labels = tf.sparse.to_indicator(
            labels.with_values(self._class_ids_of(labels.values)),
            self._n_classes)
      else:
        if not labels.values.dtype.is_integer:
          raise ValueError('Labels dtype should be integer. Instead got {}.'
                           .format(labels.values.dtype))
        checked = base_head.check_label_range(
            labels.values, self._n_classes,
            message='labels must be an integer SparseTensor with values in '
            '[0, {})'.format(self._n_classes))
        with tf.control_dependencies([checked]):
          processed_labels = tf.sparse.to_indicator(labels, self._n_classes)
      processed_labels = tf.cast(processed_labels, dtype=tf.int64)
    else:
      processed_labels = base_head.check_label_range(
          labels, 2, message='labels must be an integer indicator Tensor with '
          'values in [0, 1]')
    return base_head.check_dense_labels_match_logits_and_reshape(
        processed_labels, logits, expected_labels_dimension=self._n_classes)

  def _default_loss(self, labels, logits):
    return tf.math.reduce_mean(
        tf.compat.v1.losses.sigmoid_cross_entropy(
            multi_class_labels=labels, logits=logits,
            reduction=tf.compat.v1.losses.Reduction.NONE),
        axis=-1, keepdims=True)

  def _class_predictions(self, logits, keys):
    """`probabilities` (the sigmoids) and `classes` (every class, per
    example)."""
    predictions = {}
    if _PRED.PROBABILITIES in keys:
      predictions[_PRED.PROBABILITIES] = tf.math.sigmoid(
          logits, name=_PRED.PROBABILITIES)
    if _PRED.CLASSES in keys:
      predictions[_PRED.CLASSES] = self._all_classes(logits)
    return predictions

  def _own_metrics(self):
    return [tf.keras.metrics.AUC(name=_KEYS.AUC),
            tf.keras.metrics.AUC(curve='PR', name=_KEYS.AUC_PR)]

  def _keyed_metrics(self):
    """The thresholds' metrics, then each class's."""
    metrics = super()._keyed_metrics()
    for class_id in self._class_ids:
      probability_mean, auc, auc_pr = self._class_keys(class_id)
      metrics[probability_mean] = tf.keras.metrics.Mean(name=probability_mean)
      metrics[auc] = tf.keras.metrics.AUC(name=auc)
      metrics[auc_pr] = tf.keras.metrics.AUC(curve='PR', name=auc_pr)
    return metrics

  def _update_metrics(self, eval_metrics, predictions, labels, weights):
    probabilities = predictions[_PRED.PROBABILITIES]
    for key in (_KEYS.AUC, _KEYS.AUC_PR):
      eval_metrics[self._summary_key(key)].update_state(
          y_true=labels, y_pred=probabilities, sample_weight=weights)
    self._update_threshold_metrics(eval_metrics, labels, probabilities,
                                   weights)
    for class_id in self._class_ids:
      probability_mean, auc, auc_pr = self._class_keys(class_id)
      class_probabilities = probabilities[..., class_id:class_id + 1]
      class_labels = labels[..., class_id:class_id + 1]
      eval_metrics[probability_mean].update_state(
          values=class_probabilities, sample_weight=weights)
      for key in (auc, auc_pr):
        eval_metrics[key].update_state(
            y_true=class_labels, y_pred=class_probabilities,
            sample_weight=weights)
