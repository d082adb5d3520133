"""`ModeKeys` and `EstimatorSpec` of tensorflow-estimator 2.15 (its `model_fn.py`).

Same fields, defaults, validation and error texts; `to_estimator_spec` also
takes tensorflow_estimator's own `EstimatorSpec`, so model_fns written against
`tf.estimator.EstimatorSpec` run unchanged.  The TPU's spec is in
`tpu_fc.estimator.tpu.tpu_estimator_spec`.
"""
from __future__ import annotations

import collections
from typing import Any, Callable, Iterable, Mapping, NamedTuple

from tpu_fc._tf import tf
from tpu_fc import _tf_internals as internals
from tpu_fc.estimator import hooks as hooks_lib


class ModeKeys(object):
  """Standard names for model modes (values equal tf.estimator.ModeKeys).

  A model_fn's `mode` argument is one of these strings, so a model_fn compares
  it with TF's `tf.estimator.ModeKeys` or tpu_fc's alike.
  """
  TRAIN = 'train'
  EVAL = 'eval'
  PREDICT = 'infer'


# The metric of an evaluation's mean loss (TF's `model_fn.LOSS_METRIC_KEY`).
LOSS_METRIC_KEY = 'loss'
_GRAPH_ERROR = (
    '{0} with "{1}" must be from the default graph. '
    'Possible causes of this error include: \n\n'
    '1) {0} was created outside the context of the default graph.'
    '\n\n'
    '2) The object passed through to EstimatorSpec was not created '
    'in the most recent call to "model_fn".')


def _check_in_default_graph(value, what, key=None):
  """TF's error unless `value` (a tensor or op: the `what`, or its `key`) was
  built in the default graph; a resource variable's `assign_add` (the update
  op of some metrics) by its op: its `graph` is its variable's, outside the
  emulated TPU loop's body."""
  if not (tf.executing_eagerly() or getattr(value, 'op', value).graph is
          tf.compat.v1.get_default_graph()):
    name = value.name if key is None else '{0}: {1}'.format(key, value.name)
    raise ValueError(_GRAPH_ERROR.format(what, name))


def _check_is_tensor(x, name):
  if not isinstance(x, tf.compat.v2.__internal__.types.Tensor):
    raise TypeError('{} must be Tensor, given: {}'.format(name, x))
  return x


def validate_train_op(train_op, mode):
  if train_op is None:
    if mode == ModeKeys.TRAIN:
      raise ValueError('Missing train_op.')
    return None
  if not isinstance(train_op,
                    (tf.Operation, tf.compat.v2.__internal__.types.Tensor)):
    raise TypeError(
        'train_op must be Operation or Tensor, given: {}'.format(train_op))
  if isinstance(train_op, tf.Variable):
    train_op = train_op.op
  _check_in_default_graph(train_op, 'train_op')
  return train_op


def validate_loss(loss, mode):
  if loss is None:
    if mode in (ModeKeys.TRAIN, ModeKeys.EVAL):
      raise ValueError('Missing loss.')
    return None
  loss = _check_is_tensor(loss, 'loss')
  shape = loss.get_shape()
  if shape.num_elements() not in (None, 1):
    raise ValueError('Loss must be scalar, given: {}'.format(loss))
  if not shape.is_compatible_with(tf.TensorShape([])):
    loss = tf.reshape(loss, [])
  _check_in_default_graph(loss, 'loss')
  return loss


def validate_predictions(predictions, mode):
  if predictions is None:
    if mode == ModeKeys.PREDICT:
      raise ValueError('Missing predictions.')
    return {}
  if isinstance(predictions, dict):
    predictions = {
        k: _check_is_tensor(v, 'predictions[{}]'.format(k))
        for k, v in predictions.items()
    }
    for key, value in predictions.items():
      _check_in_default_graph(value, 'prediction values', key)
    return predictions
  predictions = _check_is_tensor(predictions, 'predictions')
  _check_in_default_graph(predictions, 'prediction values')
  return predictions


def validate_export_outputs(export_outputs, predictions, mode):
  if mode == ModeKeys.PREDICT:
    return internals.get_export_outputs(export_outputs, predictions)
  return export_outputs


def validate_hooks(hooks):
  return tuple(hooks_lib.checked_types(
      hooks, tf.compat.v1.train.SessionRunHook,
      'All hooks must be SessionRunHook instances, given: {}'))


def _is_keras_metric(value):
  return all(hasattr(value, a) for a in ('updates', 'result', 'variables'))


def _validate_eval_metric_ops(eval_metric_ops):
  """Checks `(value, update_op)` pairs; turns Keras metrics into such pairs."""
  if eval_metric_ops is None:
    return {}
  if not isinstance(eval_metric_ops, dict):
    raise TypeError(
        'eval_metric_ops must be a dict, given: {}'.format(eval_metric_ops))
  eval_metric_ops = dict(eval_metric_ops)
  metric_variables = []
  for key, value in eval_metric_ops.items():
    if _is_keras_metric(value):
      if not value.updates:
        raise ValueError(
            'Please call update_state(...) on the "{metric_name}" metric'
            .format(metric_name=value.name))
      to_check = list(value.updates) + [value.result()]
    elif isinstance(value, tuple) and len(value) == 2:
      to_check = tf.nest.flatten(value)
    else:
      raise TypeError(
          'Values of eval_metric_ops must be (metric_value, update_op) '
          'tuples, given: {} for key: {}'.format(value, key))
    for tensor in to_check:
      _check_in_default_graph(tensor, 'eval_metric_ops', key)
  for key, value in eval_metric_ops.items():
    if _is_keras_metric(value):
      metric_variables.extend(value.variables)
      eval_metric_ops[key] = (value.result(), value.updates[0])
  for collection in (tf.compat.v1.GraphKeys.LOCAL_VARIABLES,
                     tf.compat.v1.GraphKeys.METRIC_VARIABLES):
    existing = set(tf.compat.v1.get_collection(collection))
    for variable in metric_variables:
      if variable not in existing:
        tf.compat.v1.add_to_collection(collection, variable)
        existing.add(variable)
  return eval_metric_ops


def _validate_scaffold(scaffold):
  scaffold = scaffold or tf.compat.v1.train.Scaffold()
  if not isinstance(scaffold, tf.compat.v1.train.Scaffold):
    raise TypeError(
        'scaffold must be tf.train.Scaffold. Given: {}'.format(scaffold))
  return scaffold


def call_logit_fn(logit_fn: Callable[..., Any], features: Any, mode: str,
                  params: Any, config: Any) -> Any:
  """`logit_fn(features=features)` with those of `mode`, `params` and
  `config` it takes (tf.estimator.experimental's, TF's model_fn module's).

  Returns:
    Its logits: a Tensor or a dict of Tensors by string.

  Raises:
    ValueError: it returned anything else.
  """
  args = internals.fn_args(logit_fn)
  logits = logit_fn(features=features, **{
      name: value for name, value in (
          ('mode', mode), ('params', params), ('config', config))
      if name in args})
  if not (isinstance(logits, tf.Tensor) or (isinstance(logits, dict) and all(
      isinstance(key, str) and isinstance(value, tf.Tensor)
      for key, value in logits.items()))):
    raise ValueError('logit_fn should return a Tensor or a dictionary mapping '
                     'strings to Tensors.  logit_fn returned: %s' % logits)
  return logits


class EstimatorSpec(
    collections.namedtuple('EstimatorSpec', [
        'mode', 'predictions', 'loss', 'train_op', 'eval_metric_ops',
        'export_outputs', 'training_chief_hooks', 'training_hooks', 'scaffold',
        'evaluation_hooks', 'prediction_hooks'
    ])):
  """What a model_fn returns for one mode (legacy `tf.estimator.EstimatorSpec`).

  TRAIN needs `loss` and `train_op`, EVAL `loss`, PREDICT `predictions`.
  Every tensor must come from the graph the model_fn was called in.
  A `TPUEstimator` takes it in every mode with `use_tpu=False`; on the
  emulated TPU, as TF 2.15 on a TPU, training takes it without
  `training_chief_hooks` (a `ValueError`) and ignores its `scaffold` (logged),
  evaluation refuses it (a `RuntimeError`: return a `TPUEstimatorSpec`).

  Args:
    mode: the `ModeKeys` value the model_fn was called with.
    predictions: a tensor or a dict of tensors: what `predict` yields and an
      export serves by default.
    loss: the scalar loss tensor (a one-element tensor is reshaped to a
      scalar).
    train_op: the op (or tensor) that runs one training step.
    eval_metric_ops: metric name -> `(value tensor, update op)`, or a Keras
      metric object whose `update_state` was called; the metrics `evaluate`
      returns (with `loss`).
    export_outputs: signature name -> `tf.estimator.export.ExportOutput`
      (`tpu_fc.export`'s `PredictOutput`, ...), the serving signatures of an
      export; None in PREDICT: a `PredictOutput` of `predictions` as
      `serving_default`.
    training_chief_hooks: `SessionRunHook`s run by the chief's training.
    training_hooks: `SessionRunHook`s run by every training task.
    scaffold: a `tf.compat.v1.train.Scaffold` (init ops, saver, ...); None: a
      default one.
    evaluation_hooks: `SessionRunHook`s run by `evaluate`.
    prediction_hooks: `SessionRunHook`s run by `predict`.

  Raises:
    ValueError: the mode's required field is missing, `loss` is not scalar,
      a tensor or op is from another graph, or a Keras metric was never
      updated.
    TypeError: a field of the wrong type: `loss` or a prediction not a
      tensor, `train_op` neither op nor tensor, a hook not a
      `SessionRunHook`, `eval_metric_ops` not a dict of pairs or metrics,
      `export_outputs` not a dict of `ExportOutput`s, `scaffold` not a
      `Scaffold`.
  """

  def __new__(cls,
              mode: str,
              predictions: tf.Tensor | Mapping[str, tf.Tensor] | None = None,
              loss: tf.Tensor | None = None,
              train_op: tf.Operation | tf.Tensor | None = None,
              eval_metric_ops: Mapping[str, Any] | None = None,
              export_outputs: Mapping[str, Any] | None = None,
              training_chief_hooks: Iterable[Any] | None = None,
              training_hooks: Iterable[Any] | None = None,
              scaffold: Any = None,
              evaluation_hooks: Iterable[Any] | None = None,
              prediction_hooks: Iterable[Any] | None = None):
    train_op = validate_train_op(train_op, mode)
    loss = validate_loss(loss, mode)
    predictions = validate_predictions(predictions, mode)
    export_outputs = validate_export_outputs(export_outputs, predictions, mode)
    training_hooks = validate_hooks(training_hooks)
    evaluation_hooks = validate_hooks(evaluation_hooks)
    prediction_hooks = validate_hooks(prediction_hooks)
    training_chief_hooks = validate_hooks(training_chief_hooks)
    eval_metric_ops = _validate_eval_metric_ops(eval_metric_ops)
    scaffold = _validate_scaffold(scaffold)
    return super(EstimatorSpec, cls).__new__(
        cls,
        mode=mode,
        predictions=predictions,
        loss=loss,
        train_op=train_op,
        eval_metric_ops=eval_metric_ops,
        export_outputs=export_outputs,
        training_chief_hooks=training_chief_hooks,
        training_hooks=training_hooks,
        scaffold=scaffold,
        evaluation_hooks=evaluation_hooks,
        prediction_hooks=prediction_hooks)

  def _replace(self, **kwds):
    """Returns a re-validated copy; `mode` cannot change."""
    if 'mode' in kwds and self.mode != kwds['mode']:
      raise ValueError('mode of EstimatorSpec cannot be changed.')
    return EstimatorSpec(**dict(self._asdict(), **kwds))


class BuiltGraph(NamedTuple):
  """What building a mode's model gives the session runs, besides the graph.

  spec: the `EstimatorSpec` to run.
  checkpoint_names: {checkpoint name: variable} of what the build named
    itself (the emulated TPU's tables under their legacy names), or None:
    every variable under its own name.
  before_save: functions building the ops each checkpoint save runs first.
  steps_per_run: the global steps one `session.run` of the train op takes.
  loop_iterations: the feedable step count of an in-graph training loop
    (`session.run` runs that many steps), or None: no loop.
  eval_loss: an evaluation loop's `(mean loss, the loop)` metric, or None:
    the mean of `spec.loss` over the runs.
  runs_per_prediction_batch: the prediction runs whose outputs make one
    batch `predict(yield_single_examples=False)` yields (a TPU step's, its
    cores' batches joined, when each run predicts one core's batch).
  """
  spec: EstimatorSpec
  checkpoint_names: dict[str, tf.Variable] | None = None
  before_save: tuple[Callable[[], tf.Operation], ...] = ()
  steps_per_run: int = 1
  loop_iterations: tf.Tensor | None = None
  eval_loss: tuple[tf.Tensor, tf.Operation] | None = None
  runs_per_prediction_batch: int = 1


def fields_of(spec, spec_class):
  """`spec`'s values for `spec_class`'s fields, or None if it lacks one."""
  if not all(hasattr(spec, field) for field in spec_class._fields):
    return None
  return {field: getattr(spec, field) for field in spec_class._fields}


def to_estimator_spec(spec):
  """The `EstimatorSpec` to run for a model_fn result (ours or TF's spec)."""
  if isinstance(spec, EstimatorSpec):
    return spec
  fields = fields_of(spec, EstimatorSpec)
  if fields is not None:
    return EstimatorSpec(**fields)
  raise ValueError('model_fn should return an EstimatorSpec.')
