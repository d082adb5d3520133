"""The `Head` interface of TF 2.15 (`tf.estimator.Head`) and what its heads share.

A head turns a model's logits into predictions, a loss, metrics, export outputs
and, through `create_estimator_spec`, the `EstimatorSpec` a model_fn returns.
`SingleHead` holds the logic of the four single-objective heads (labels, loss,
the spec of each mode); the module functions the checks and pieces every head
uses, graph and eager, with TF 2.15's error texts.  Losses are TF's loss ops
reduced by Keras' `compute_weighted_loss`, metrics Keras metric objects, as in
TF 2.15.
"""
from __future__ import annotations

import abc

from tpu_fc import _tf_internals as internals
from tpu_fc import export as export_lib
from tpu_fc._tf import tf
from tpu_fc.estimator.model_fn import ModeKeys
from tpu_fc.estimator.tpu import tpu_estimator_spec

DEFAULT_SERVING_KEY = tf.saved_model.DEFAULT_SERVING_SIGNATURE_DEF_KEY
CLASSIFY_SERVING_KEY = 'classification'
REGRESS_SERVING_KEY = 'regression'
PREDICT_SERVING_KEY = 'predict'
# `tf.losses.Reduction.SUM_OVER_BATCH_SIZE`, the heads' default, without
# loading Keras when the heads are imported.
SUM_OVER_BATCH_SIZE = 'sum_over_batch_size'


class MetricKeys(object):
  """The keys of the heads' metrics (and the training loss summary)."""
  LOSS = 'loss'
  LOSS_MEAN = 'average_loss'
  LOSS_REGULARIZATION = 'regularization_loss'
  ACCURACY = 'accuracy'
  PRECISION = 'precision'
  RECALL = 'recall'
  ACCURACY_BASELINE = 'accuracy_baseline'
  AUC = 'auc'
  AUC_PR = 'auc_precision_recall'
  LABEL_MEAN = 'label/mean'
  PREDICTION_MEAN = 'prediction/mean'
  ACCURACY_AT_THRESHOLD = 'accuracy/positive_threshold_%g'
  PRECISION_AT_THRESHOLD = 'precision/positive_threshold_%g'
  RECALL_AT_THRESHOLD = 'recall/positive_threshold_%g'
  PROBABILITY_MEAN_AT_CLASS = 'probability_mean/class%d'
  AUC_AT_CLASS = 'auc/class%d'
  AUC_PR_AT_CLASS = 'auc_precision_recall/class%d'
  PROBABILITY_MEAN_AT_NAME = 'probability_mean/%s'
  AUC_AT_NAME = 'auc/%s'
  AUC_PR_AT_NAME = 'auc_precision_recall/%s'


class PredictionKeys(object):
  """The keys of the heads' predictions."""
  CLASSES = 'classes'
  CLASS_IDS = 'class_ids'
  ALL_CLASSES = 'all_classes'
  ALL_CLASS_IDS = 'all_class_ids'
  LOGISTIC = 'logistic'
  LOGITS = 'logits'
  PREDICTIONS = 'predictions'
  PROBABILITIES = 'probabilities'


_LABEL_NONE_ERR_MSG = (
    'You must provide a labels Tensor. Given: None. '
    'Suggested troubleshooting steps: Check that your data contains your label '
    'feature. Check that your input_fn properly parses and returns labels.')
_SPARSE_LABEL_ERR_MSG = (
    'SparseTensor labels are not supported. Labels must be a Tensor of shape '
    '[D0, D1, ..., DN, {0}], e.g. [batch_size, {0}].Suggested Fix (1): Check '
    'the label feature in your data. Each example must contain {0} value(s). '
    'If not, your choice of label was probably incorrect. Suggested Fix (2): '
    'In your input_fn, use tf.sparse_tensor_to_dense() to turn labels into a '
    'Tensor.')
_MISMATCHED_LABEL_DIM_ERR_MSG = (
    'Mismatched label shape. Expected labels dimension={}.  Received {}. '
    'Suggested Fix: If your classifier expects one-hot encoding label, check '
    'your n_classes argument to the estimator and/or the shape of your label. '
    'Otherwise, check the shape of your label.')
_LABEL_SHAPE_ERR_MSG = (
    'labels shape must be [D0, D1, ... DN, {}]. Suggested Fix: check your '
    'n_classes argument to the head and/or the shape of your label.')
_LOGITS_SHAPE_ERR_MSG = 'logits shape must be [D0, D1, ... DN, logits_dimension]'
_VALIDATION_ERROR_MSG = '{} should be a list or a tuple. Given type: {}.'


class Head(abc.ABC):
  """Interface for the head/top of a model (TF 2.15's `tf.estimator.Head`).

  A model_fn computes logits and returns `head.create_estimator_spec(...)`;
  in eager code `loss`, `predictions`, `metrics` and `update_metrics` give
  the same pieces.  A subclass implements `create_estimator_spec` or
  `_create_tpu_estimator_spec` (a `TPUEstimatorSpec`, whose CPU form
  `create_estimator_spec` returns).
  """

  @property
  @abc.abstractmethod
  def name(self):
    """The head's name: the suffix of its metric and summary keys, or None."""

  @property
  @abc.abstractmethod
  def logits_dimension(self):
    """The size of the logits' last dimension."""

  @property
  @abc.abstractmethod
  def loss_reduction(self):
    """How the training loss reduces over the batch (`tf.losses.Reduction`)."""

  @abc.abstractmethod
  def loss(self, labels, logits, features=None, mode=None,
           regularization_losses=None):
    """The scalar training loss, plus the sum of `regularization_losses`."""

  @abc.abstractmethod
  def predictions(self, logits, keys=None):
    """Prediction name -> tensor (those of `keys`; None: all)."""

  @abc.abstractmethod
  def metrics(self, regularization_losses=None):
    """Metric key -> a new Keras metric object."""

  @abc.abstractmethod
  def update_metrics(self, eval_metrics, features, logits, labels, mode=None,
                     regularization_losses=None):
    """`eval_metrics` (from `metrics`) updated with one batch."""

  def _summary_key(self, key):
    return '{}/{}'.format(key, self.name) if self.name else key

  def _regularization_metric(self, regularization_losses):
    """{key: a new mean of the regularization loss}, or {} without such
    losses."""
    if regularization_losses is None:
      return {}
    key = MetricKeys.LOSS_REGULARIZATION
    return {self._summary_key(key): tf.keras.metrics.Mean(name=key)}

  def _update_regularization_metric(self, eval_metrics, regularization_losses):
    if regularization_losses is not None:
      eval_metrics[self._summary_key(
          MetricKeys.LOSS_REGULARIZATION)].update_state(
              values=tf.math.add_n(regularization_losses))

  def create_estimator_spec(self, features, mode, logits, labels=None,
                            optimizer=None, trainable_variables=None,
                            train_op_fn=None, update_ops=None,
                            regularization_losses=None):
    """The `EstimatorSpec` of `mode` for a model_fn to return.

    Args:
      features: the model_fn's features (a weight column is read from them).
      mode: a `ModeKeys` value.
      logits: the model's logits, `[D0, ... DN, logits_dimension]`.
      labels: the model_fn's labels (TRAIN and EVAL).
      optimizer: TRAIN: a Keras optimizer (`tf.keras.optimizers.legacy.*`:
        TF 2.15 calls its `get_updates(loss, trainable_variables)`), or None
        with `train_op_fn`.
      trainable_variables: the list or tuple of variables `optimizer` trains.
      train_op_fn: TRAIN without `optimizer`: loss -> train op.
      update_ops: ops the train op also runs (e.g. batch norm's updates).
      regularization_losses: scalar losses added to the training loss.

    Raises:
      NotImplementedError: the head implements neither this nor
        `_create_tpu_estimator_spec`.
    """
    try:
      return tpu_estimator_spec.to_estimator_spec(
          self._create_tpu_estimator_spec(
              features=features, mode=mode, logits=logits, labels=labels,
              optimizer=optimizer, trainable_variables=trainable_variables,
              train_op_fn=train_op_fn, update_ops=update_ops,
              regularization_losses=regularization_losses))
    except NotImplementedError:
      raise NotImplementedError(
          'Subclasses of Head must implement `create_estimator_spec()` or '
          '_create_tpu_estimator_spec().')

  def _create_tpu_estimator_spec(self, features, mode, logits, labels=None,
                                 optimizer=None, trainable_variables=None,
                                 train_op_fn=None, update_ops=None,
                                 regularization_losses=None):
    """The `TPUEstimatorSpec` of `mode` (arguments as `create_estimator_spec`).

    Its EVAL `eval_metrics` returns Keras metric objects, which a TPU's
    evaluation refuses, as TF 2.15's did: evaluate a head's model with
    `eval_on_tpu=False`.
    """
    raise NotImplementedError(
        'TPUEstimatorSpec not available for this model head.')


class SingleHead(Head):
  """What TF's single-objective heads share: labels to loss, the spec of
  each mode, vocabulary lookups, the common metrics, a classifier's
  predictions and export outputs.

  A subclass gives `_processed_labels`, `_default_loss` (the loss without a
  `loss_fn`), `_own_metrics` (its metrics but the losses' and those
  `_keyed_metrics` makes), `_update_metrics` (its metrics but the losses'),
  and `_class_predictions` with `_prediction_keys` (a classifier) or
  `predictions` and `_export_outputs`.  `_per_logit`: the loss (and weights
  may be) per logit, not per example.
  """
  _per_logit = False

  def __init__(self, logits_dimension, weight_column, loss_reduction, loss_fn,
               name, label_vocabulary=None, thresholds=()):
    validate_loss_reduction(loss_reduction)
    if loss_fn:
      validate_loss_fn_args(loss_fn)
    self._logits_dimension = logits_dimension
    self._weight_column = weight_column
    self._loss_reduction = loss_reduction
    self._loss_fn = loss_fn
    self._name = name
    self._label_vocabulary = label_vocabulary
    self._thresholds = thresholds
    self._tables = {}

  @property
  def name(self):
    return self._name

  @property
  def logits_dimension(self):
    return self._logits_dimension

  @property
  def loss_reduction(self):
    return self._loss_reduction

  def _vocabulary_table(self, name, keys, values, default_value):
    """A lookup table between the label vocabulary and class ids.

    Eager code builds it once; a graph gets its own (Estimator builds a graph
    per mode).
    """
    if name not in self._tables or not tf.executing_eagerly():
      with tf.compat.v1.name_scope(name):
        self._tables[name] = tf.compat.v1.lookup.StaticHashTable(
            tf.lookup.KeyValueTensorInitializer(keys, values), default_value)
    return self._tables[name]

  def _class_ids_of(self, labels):
    """The class ids of vocabulary strings (-1 for others)."""
    vocabulary = tf.constant(tuple(self._label_vocabulary))
    return self._vocabulary_table(
        'class_id_lookup', vocabulary,
        tf.range(tf.size(vocabulary, out_type=tf.int64)), -1).lookup(labels)

  def _classes_of(self, class_ids):
    """The vocabulary strings of class ids ('UNK' for others)."""
    vocabulary = tf.constant(tuple(self._label_vocabulary))
    return self._vocabulary_table(
        'class_string_lookup', tf.range(tf.size(vocabulary, out_type=tf.int64)),
        vocabulary, 'UNK').lookup(class_ids)

  def _unweighted_loss_and_weights(self, logits, labels, features):
    if self._loss_fn:
      unweighted_loss = call_loss_fn(
          self._loss_fn, labels, logits, features,
          expected_loss_dim=self._logits_dimension if self._per_logit else 1)
    else:
      unweighted_loss = self._default_loss(labels, logits)
    weights = get_weights_and_check_match_logits(
        features, self._weight_column, logits,
        allow_per_logit_weights=self._per_logit)
    return unweighted_loss, weights

  def loss(self, labels, logits, features=None, mode=None,
           regularization_losses=None):
    """The weighted training loss, reduced by `loss_reduction`, plus the sum
    of `regularization_losses`; `mode` is unused."""
    del mode
    with tf.compat.v1.name_scope(
        'losses', values=(logits, labels, regularization_losses, features)):
      logits = check_logits_final_dim(logits, self._logits_dimension)
      labels = self._processed_labels(logits, labels)
      unweighted_loss, weights = self._unweighted_loss_and_weights(
          logits, labels, features)
      return plus_regularization(
          internals.compute_weighted_loss(
              unweighted_loss, sample_weight=weights,
              reduction=self._loss_reduction), regularization_losses)

  def metrics(self, regularization_losses=None):
    """New metrics by key: see the class doc."""
    with tf.compat.v1.name_scope('metrics', values=(regularization_losses,)):
      metrics = [tf.keras.metrics.Mean(name=MetricKeys.LOSS_MEAN)]
      metrics += self._own_metrics()
      eval_metrics = {self._summary_key(metric.name): metric
                      for metric in metrics}
      eval_metrics.update(self._regularization_metric(regularization_losses))
      eval_metrics.update(self._keyed_metrics())
    return eval_metrics

  def update_metrics(self, eval_metrics, features, logits, labels,
                     regularization_losses=None):
    """`eval_metrics` (from `metrics`) updated with a batch."""
    predictions = self.predictions(logits)
    logits = check_logits_final_dim(logits, self._logits_dimension)
    labels = self._processed_labels(logits, labels)
    unweighted_loss, weights = self._unweighted_loss_and_weights(
        logits, labels, features)
    eval_metrics[self._summary_key(MetricKeys.LOSS_MEAN)].update_state(
        values=unweighted_loss, sample_weight=weights)
    self._update_regularization_metric(eval_metrics, regularization_losses)
    self._update_metrics(eval_metrics, predictions, labels, weights)
    return eval_metrics

  def _threshold_keys(self):
    """(accuracy, precision, recall) metric keys of each threshold."""
    return [tuple(self._summary_key(key % threshold) for key in (
        MetricKeys.ACCURACY_AT_THRESHOLD, MetricKeys.PRECISION_AT_THRESHOLD,
        MetricKeys.RECALL_AT_THRESHOLD)) for threshold in self._thresholds]

  def _keyed_metrics(self):
    """Metrics named by their keys: accuracy, precision and recall at each
    threshold."""
    metrics = {}
    for threshold, (accuracy, precision, recall) in zip(
        self._thresholds, self._threshold_keys()):
      metrics[accuracy] = tf.keras.metrics.BinaryAccuracy(
          name=accuracy, threshold=threshold)
      metrics[precision] = tf.keras.metrics.Precision(
          name=precision, thresholds=threshold)
      metrics[recall] = tf.keras.metrics.Recall(
          name=recall, thresholds=threshold)
    return metrics

  def _update_threshold_metrics(self, eval_metrics, labels, probabilities,
                                weights):
    for keys in self._threshold_keys():
      for key in keys:
        eval_metrics[key].update_state(
            y_true=labels, y_pred=probabilities, sample_weight=weights)

  def predictions(self, logits, keys=None):
    """A classifier's predictions of `keys` (None: all), `logits` and its
    `_class_predictions`."""
    keys = checked_prediction_keys(keys, self._prediction_keys)
    logits = check_logits_final_dim(logits, self._logits_dimension)
    with tf.compat.v1.name_scope('predictions', values=(logits,)):
      predictions = ({PredictionKeys.LOGITS: logits}
                     if PredictionKeys.LOGITS in keys else {})
      predictions.update(self._class_predictions(logits, keys))
      return predictions

  def _all_classes(self, logits):
    """Every class's name (vocabulary string or id as a string), per example."""
    if self._label_vocabulary:
      return _per_example(logits, tf.constant(self._label_vocabulary))
    return _per_example(
        logits, tf.strings.as_string(tf.range(self._n_classes)))

  def _softmax_predictions(self, logits, keys):
    """The predictions of a classifier over one logit per class, those of
    `keys`."""
    pred_keys = PredictionKeys
    predictions = {}
    if pred_keys.PROBABILITIES in keys:
      predictions[pred_keys.PROBABILITIES] = tf.compat.v1.nn.softmax(
          logits, name=pred_keys.PROBABILITIES)
    if pred_keys.CLASS_IDS in keys or pred_keys.CLASSES in keys:
      class_ids = tf.compat.v1.expand_dims(tf.compat.v1.math.argmax(
          logits, axis=-1, name=pred_keys.CLASS_IDS), axis=-1)
      if pred_keys.CLASS_IDS in keys:
        predictions[pred_keys.CLASS_IDS] = class_ids
      if pred_keys.CLASSES in keys:
        predictions[pred_keys.CLASSES] = (
            self._classes_of(class_ids) if self._label_vocabulary else
            tf.strings.as_string(class_ids, name='str_classes'))
    if pred_keys.ALL_CLASS_IDS in keys:
      predictions[pred_keys.ALL_CLASS_IDS] = _per_example(
          logits, tf.range(self._n_classes))
    if pred_keys.ALL_CLASSES in keys:
      predictions[pred_keys.ALL_CLASSES] = self._all_classes(logits)
    return predictions

  def _export_outputs(self, predictions, **others):
    """A classifier's export outputs: its classification by default, under
    'classification', `others` by their keys, all predictions under
    'predict'."""
    probabilities = predictions[PredictionKeys.PROBABILITIES]
    classification = export_lib.ClassificationOutput(
        scores=probabilities, classes=self._all_classes(probabilities))
    return export_outputs(CLASSIFY_SERVING_KEY, classification, predictions,
                          **others)

  def _create_tpu_estimator_spec(self, features, mode, logits, labels=None,
                                 optimizer=None, trainable_variables=None,
                                 train_op_fn=None, update_ops=None,
                                 regularization_losses=None):
    with tf.compat.v1.name_scope(self._name, 'head'):
      predictions = self.predictions(logits)
      if mode == ModeKeys.PREDICT:
        return tpu_estimator_spec.TPUEstimatorSpec(
            mode=ModeKeys.PREDICT, predictions=predictions,
            export_outputs=self._export_outputs(predictions))
      loss = self.loss(logits=logits, labels=labels, features=features,
                       mode=mode, regularization_losses=regularization_losses)
      if mode == ModeKeys.EVAL:
        return tpu_estimator_spec.TPUEstimatorSpec(
            mode=ModeKeys.EVAL, predictions=predictions, loss=loss,
            eval_metrics=create_eval_metrics_tuple(self.update_metrics, dict(
                eval_metrics=self.metrics(
                    regularization_losses=regularization_losses),
                features=features, logits=logits, labels=labels,
                regularization_losses=regularization_losses)))
      train_op = create_train_op(optimizer, trainable_variables, train_op_fn,
                                 update_ops, loss, self._loss_reduction)
    create_loss_summaries(loss, regularization_losses, self._summary_key)
    return tpu_estimator_spec.TPUEstimatorSpec(
        mode=ModeKeys.TRAIN, predictions=predictions, loss=loss,
        train_op=train_op)


def _per_example(logits, row):
  """`row` (a value per class) repeated for each example of `logits`."""
  return tf.tile(tf.expand_dims(row, axis=0),
                 multiples=[tf.compat.v1.shape(logits)[0], 1])


def _shape(tensor):
  """A tensor's (or array's) static shape as a tuple."""
  return tuple(tf.TensorShape(tensor.shape).as_list())


def check_dense_labels_match_logits_and_reshape(labels, logits,
                                                expected_labels_dimension):
  """`labels` as a dense tensor `[D0, ... DN, expected_labels_dimension]`
  matching `logits` (labels one rank short get that last dimension)."""
  if labels is None:
    raise ValueError(_LABEL_NONE_ERR_MSG)
  with tf.compat.v1.name_scope('labels', values=(labels, logits)) as scope:
    labels = tf.compat.v1.convert_to_tensor_or_sparse_tensor(labels)
    if isinstance(labels, tf.sparse.SparseTensor):
      raise ValueError(_SPARSE_LABEL_ERR_MSG.format(expected_labels_dimension))
    if (labels.shape.ndims is not None and logits.shape.ndims is not None and
        labels.shape.ndims == logits.shape.ndims - 1):
      labels = tf.compat.v1.expand_dims(labels, -1)
    shape_message = _LABEL_SHAPE_ERR_MSG.format(expected_labels_dimension)
    if tf.executing_eagerly():
      labels_shape = _shape(labels)
      if len(labels_shape) < 2:
        raise ValueError('labels must have rank at least 2.  Received rank {}, '
                         'shape {}'.format(len(labels_shape), labels_shape))
      if labels_shape[-1] != expected_labels_dimension:
        raise ValueError(_MISMATCHED_LABEL_DIM_ERR_MSG.format(
            expected_labels_dimension, labels_shape[-1]))
      expected_labels_shape = _shape(logits)[:-1] + (expected_labels_dimension,)
      if expected_labels_shape != labels_shape:
        raise ValueError(
            '{}, expected_labels_shape: {}. labels_shape: {}.'.format(
                shape_message, expected_labels_shape, labels_shape))
      return labels
    assert_rank = tf.compat.v1.debugging.assert_rank_at_least(
        labels, 2, message=shape_message)
    with tf.control_dependencies([assert_rank]):
      if labels.shape.ndims is not None:
        final_dim = labels.shape[-1]
        if final_dim is not None and final_dim != expected_labels_dimension:
          raise ValueError(_MISMATCHED_LABEL_DIM_ERR_MSG.format(
              expected_labels_dimension, final_dim))
      expected_labels_shape = tf.concat(
          [tf.compat.v1.shape(logits)[:-1], [expected_labels_dimension]],
          axis=0)
      labels_shape = tf.compat.v1.shape(labels)
      assert_dimension = tf.compat.v1.debugging.assert_equal(
          expected_labels_shape, labels_shape, message=shape_message,
          data=['expected_labels_shape: ', expected_labels_shape,
                'labels_shape: ', labels_shape])
      with tf.control_dependencies([assert_dimension]):
        return tf.identity(labels, name=scope)


def get_weights_and_check_match_logits(features, weight_column, logits,
                                       allow_per_logit_weights=False):
  """The example weights of `features` (1. without `weight_column`), as
  float32 `[D0, ... DN, 1]` (or `[..., logits_dimension]` where allowed)."""
  err_msg = ('weights shape must be [D0, D1, ... DN], [D0, D1, ... DN, 1] or '
             '[D0, D1, ... DN, logits_dimension]' if allow_per_logit_weights else
             'weights shape must be [D0, D1, ... DN] or [D0, D1, ... DN, 1]')
  with tf.compat.v1.name_scope(
      'weights', values=tuple(features.values()) + (logits,)) as scope:
    if weight_column is None:
      return 1.
    if isinstance(weight_column, str):
      weight_column = tf.feature_column.numeric_column(
          key=weight_column, shape=(1,))
    if not isinstance(weight_column, internals.NUMERIC_COLUMN_TYPES):
      raise TypeError('Weight column must be either a string or NumericColumn.'
                      ' Given type: {}.'.format(type(weight_column)))
    weights = internals.numeric_column_dense_tensor(weight_column, features)
    if not (weights.dtype.is_floating or weights.dtype.is_integer):
      raise ValueError('Weight column should be castable to float. '
                       'Given dtype: {}'.format(weights.dtype))
    weights = tf.cast(weights, name='weights', dtype=tf.float32)
    one_rank_short = (
        weights.shape.ndims is not None and logits.shape.ndims is not None and
        weights.shape.ndims == logits.shape.ndims - 1)
    if tf.executing_eagerly():
      weights_shape, logits_shape = _shape(weights), _shape(logits)
      allowed = ([logits_shape[:-1]] if one_rank_short else
                 [logits_shape[:-1] + (1,)] +
                 [logits_shape] * allow_per_logit_weights)
      if weights_shape not in allowed:
        raise ValueError('{}, logits_shape: {}. weights_shape: {}.'.format(
            err_msg, logits_shape, weights_shape))
      return (tf.compat.v1.expand_dims(weights, -1, name=scope)
              if one_rank_short else weights)
    weights_shape = tf.compat.v1.shape(weights, name='weights_shape')
    logits_shape = tf.compat.v1.shape(logits, name='logits_shape')
    data = ['logits_shape: ', logits_shape, 'weights_shape: ', weights_shape]
    if one_rank_short:
      assert_dimension = tf.compat.v1.debugging.assert_equal(
          logits_shape[:-1], weights_shape, message=err_msg, data=data)
      with tf.control_dependencies([assert_dimension]):
        return tf.compat.v1.expand_dims(weights, -1, name=scope)
    supported_weights_shape = tf.concat([logits_shape[:-1], [1]], axis=0)
    if allow_per_logit_weights:
      assert_dimension = tf.debugging.Assert(
          condition=tf.math.reduce_any([
              tf.reduce_all(tf.math.equal(logits_shape, weights_shape)),
              tf.reduce_all(
                  tf.math.equal(supported_weights_shape, weights_shape))]),
          data=[err_msg] + data)
    else:
      assert_dimension = tf.compat.v1.debugging.assert_equal(
          supported_weights_shape, weights_shape, message=err_msg, data=data)
    with tf.control_dependencies([assert_dimension]):
      return tf.identity(weights, name=scope)


def check_logits_final_dim(logits, expected_logits_dimension):
  """`logits` as float32, checked to be `[D0, ... DN, logits_dimension]`."""
  with tf.compat.v1.name_scope('logits', values=(logits,)) as scope:
    logits = tf.cast(logits, tf.float32)
    if tf.executing_eagerly():
      logits_shape = _shape(logits)
      if len(logits_shape) < 2:
        raise ValueError('logits must have rank at least 2.  Received rank {}, '
                         'shape {}'.format(len(logits_shape), logits_shape))
      if (isinstance(expected_logits_dimension, int) and
          logits_shape[-1] != expected_logits_dimension):
        raise ValueError('{}, got {}.'.format(_LOGITS_SHAPE_ERR_MSG,
                                              logits_shape))
      return logits
    logits_shape = tf.compat.v1.shape(logits)
    assert_rank = tf.compat.v1.debugging.assert_rank_at_least(
        logits, 2, data=[logits_shape], message=_LOGITS_SHAPE_ERR_MSG)
    with tf.control_dependencies([assert_rank]):
      static_shape = logits.shape
      if static_shape.ndims is not None and static_shape[-1] is not None:
        if (isinstance(expected_logits_dimension, int) and
            static_shape[-1] != expected_logits_dimension):
          raise ValueError('{}, got {}.'.format(_LOGITS_SHAPE_ERR_MSG,
                                                static_shape))
        return logits
      assert_dimension = tf.compat.v1.debugging.assert_equal(
          expected_logits_dimension, logits_shape[-1], data=[logits_shape],
          message=_LOGITS_SHAPE_ERR_MSG)
      with tf.control_dependencies([assert_dimension]):
        return tf.identity(logits, name=scope)


def validate_loss_fn_args(loss_fn):
  """Checks that `loss_fn` takes `labels`, `logits` and at most `features`
  and `loss_reduction` besides."""
  loss_fn_args = internals.fn_args(loss_fn)
  for required_arg in ('labels', 'logits'):
    if required_arg not in loss_fn_args:
      raise ValueError('loss_fn must contain argument: {}. '
                       'Given arguments: {}'.format(required_arg, loss_fn_args))
  invalid_args = list(set(loss_fn_args) -
                      {'labels', 'logits', 'features', 'loss_reduction'})
  if invalid_args:
    raise ValueError('loss_fn has unexpected args: {}'.format(invalid_args))


def validate_loss_reduction(loss_reduction):
  if (loss_reduction not in tf.losses.Reduction.all() or
      loss_reduction == tf.losses.Reduction.NONE):
    raise ValueError(
        'Invalid loss_reduction: {}. See `tf.losses.Reduction` for valid '
        'options.'.format(loss_reduction))


def check_label_vocabulary(label_vocabulary):
  if label_vocabulary is not None and not isinstance(label_vocabulary,
                                                     (list, tuple)):
    raise ValueError(
        'label_vocabulary should be a list or a tuple. Given type: {}'.format(
            type(label_vocabulary)))


def call_loss_fn(loss_fn, labels, logits, features, expected_loss_dim=1):
  """`loss_fn`'s unreduced loss, checked to be
  `[D0, ... DN, expected_loss_dim]` (`features` passed if it takes them)."""
  kwargs = ({'features': features}
            if 'features' in internals.fn_args(loss_fn) else {})
  with tf.compat.v1.name_scope(
      'call_loss_fn', values=[labels, logits] + list(features.values())):
    unweighted_loss = loss_fn(labels=labels, logits=logits, **kwargs)
    message = ('loss_fn must return Tensor of shape '
               '[D0, D1, ... DN, {}]. '.format(expected_loss_dim))
    if tf.executing_eagerly():
      loss_shape, logits_shape = _shape(unweighted_loss), _shape(logits)
      if loss_shape != logits_shape[:-1] + (expected_loss_dim,):
        raise ValueError(message, 'logits_shape: ', logits_shape,
                         'loss_shape: ', loss_shape)
      return unweighted_loss
    logits_shape = tf.compat.v1.shape(logits, name='logits_shape')
    expected_loss_shape = tf.concat(
        [logits_shape[:-1], [expected_loss_dim]], axis=0,
        name='expected_loss_shape')
    loss_shape = tf.compat.v1.shape(unweighted_loss, name='loss_shape')
    check_loss_shape = tf.debugging.Assert(
        tf.reduce_all(tf.math.equal(loss_shape, expected_loss_shape)),
        data=[message, 'logits_shape: ', logits_shape, 'loss_shape: ',
              loss_shape],
        name='check_loss_shape')
    with tf.control_dependencies([check_loss_shape]):
      return tf.identity(unweighted_loss)


def checked_prediction_keys(keys, valid_keys):
  """The prediction keys asked for: `keys`, checked, or all valid ones."""
  for key in keys or ():
    if key not in valid_keys:
      raise ValueError('Prediction key must be in PredictionKeys, given: {}.'
                       'Valid prediction keys include {}.'.format(
                           key, valid_keys))
  return keys or valid_keys


def export_outputs(default_key, default_output, predictions, **others):
  """A head's export outputs: `default_output` served by default and under
  `default_key`, `others` by their keys, every prediction under 'predict'."""
  return {DEFAULT_SERVING_KEY: default_output, default_key: default_output,
          **others,
          PREDICT_SERVING_KEY: export_lib.PredictOutput(predictions)}


def check_label_range(labels, n_classes, message=None):
  """`labels`, checked to lie in [0, n_classes)."""
  with tf.compat.v1.name_scope('check_label_range', values=(labels,)):
    if tf.executing_eagerly():
      if not tf.reduce_all(tf.math.less_equal(labels, n_classes - 1)):
        raise ValueError(message or 'Labels must be <= {} - 1'.format(n_classes))
      if not tf.reduce_all(tf.math.greater_equal(labels, 0)):
        raise ValueError(message or 'Labels must be >= 0')
      return labels
    assert_less = tf.compat.v1.debugging.assert_less_equal(
        labels, tf.convert_to_tensor(n_classes - 1, dtype=labels.dtype),
        message=message or 'Labels must be <= n_classes - 1')
    assert_greater = tf.compat.v1.debugging.assert_non_negative(
        labels, message=message or 'Labels must be >= 0')
    with tf.control_dependencies((assert_less, assert_greater)):
      return tf.identity(labels)


def plus_regularization(loss, regularization_losses):
  if regularization_losses is None:
    return loss
  return loss + tf.math.add_n(regularization_losses)


def create_eval_metrics_tuple(fn, kwargs):
  """`(metric_fn, tensors)` for a `TPUEstimatorSpec`: `fn` on `kwargs`, its
  tensors passed as the metric_fn's arguments, the rest bound."""
  tensors = {k: v for k, v in kwargs.items() if tf.is_tensor(v)}
  others = {k: v for k, v in kwargs.items() if not tf.is_tensor(v)}
  return (lambda **given: fn(**dict(others, **given)), tensors)


def create_train_op(optimizer, trainable_variables, train_op_fn, update_ops,
                    loss, loss_reduction):
  """The train op: `optimizer`'s updates or `train_op_fn(loss)`, grouped
  with `update_ops`, built under the name scope 'training' (Keras')."""
  if update_ops is not None and not isinstance(update_ops, (list, tuple)):
    raise ValueError(_VALIDATION_ERROR_MSG.format('update_ops',
                                                  type(update_ops)))
  with tf.compat.v1.name_scope(''), tf.compat.v1.name_scope('training'):
    if optimizer is not None:
      if train_op_fn is not None:
        raise ValueError('train_op_fn and optimizer cannot both be set.')
      if not isinstance(optimizer, (tf.keras.optimizers.Optimizer,
                                    tf.keras.optimizers.legacy.Optimizer)):
        raise ValueError(
            'The given optimizer is not a tf.keras.optimizers.Optimizer '
            'instance. Received optimizer of type {}'.format(type(optimizer)))
      if trainable_variables is None:
        raise ValueError('trainable_variables cannot be None. Given {}'.format(
            trainable_variables))
      if not isinstance(trainable_variables, (list, tuple)):
        raise ValueError(_VALIDATION_ERROR_MSG.format(
            'trainable_variables', type(trainable_variables)))
      num_replicas = tf.distribute.get_strategy().num_replicas_in_sync
      if loss_reduction == SUM_OVER_BATCH_SIZE and num_replicas > 1:
        loss *= 1. / num_replicas
      train_op = optimizer.get_updates(loss, trainable_variables)[0]
    elif train_op_fn is not None:
      train_op = train_op_fn(loss)
    else:
      raise ValueError('train_op_fn and optimizer cannot both be None.')
    if update_ops is not None:
      train_op = tf.group(train_op, *update_ops)
    return train_op


def create_loss_summaries(loss, regularization_losses, summary_key):
  """The training loss's summary (and the regularization loss's), tagged
  by `summary_key(MetricKeys...)` at the root name scope."""
  with tf.compat.v1.name_scope(''):
    tf.compat.v1.summary.scalar(summary_key(MetricKeys.LOSS), loss)
    if regularization_losses is not None:
      tf.compat.v1.summary.scalar(
          summary_key(MetricKeys.LOSS_REGULARIZATION),
          tf.math.add_n(regularization_losses))
