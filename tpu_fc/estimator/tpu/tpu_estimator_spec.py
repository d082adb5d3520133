"""`TPUEstimatorSpec` of tensorflow-estimator 2.15, and how the driver runs it.

Same fields, defaults, validation and error texts; `to_estimator_spec` also takes
tensorflow_estimator's own spec namedtuples, so model_fns written against
`tf.compat.v1.estimator.tpu.TPUEstimatorSpec` run unchanged.
"""
from __future__ import annotations

import collections
from typing import Any, Callable, Iterable, Mapping, Sequence

from tpu_fc._tf import tf
from tpu_fc import _tf_internals as internals
from tpu_fc.estimator import model_fn


class HostCallHook(tf.compat.v1.train.SessionRunHook):
  """Runs a spec's `host_call` outputs: every step (use_tpu=False), or on the
  steps a TPU's training loop runs them.

  Initializes the graph's `tf.summary.create_file_writer` writers once the
  session exists and flushes them at the end, so host_call summaries land in
  their log directories.

  Args:
    tensors: the host_call outputs to run, or None (run inside an in-graph
      training loop instead).
    every_n_steps, steps_per_loop: for one-step runs of the emulated TPU,
      which stand for loops of `steps_per_loop` steps (None: one loop): as TF
      2.15's TPU training loop runs host_call, on a loop's first step and
      every `every_n_steps`-th after it
      (`TPUConfig.experimental_host_call_every_n_steps`).
  """

  def __init__(self, tensors, every_n_steps=1, steps_per_loop=None):
    self.tensors = tensors
    self._every_n_steps = every_n_steps
    self._steps_per_loop = steps_per_loop
    self._runs = 0
    self._init_ops = None
    self._flush_ops = None

  def begin(self):
    self._runs = 0
    self._init_ops = internals.summary_writer_initializer_ops()
    with tf.device('cpu:0'):
      self._flush_ops = [
          tf.raw_ops.FlushSummaryWriter(writer=op.inputs[0])
          for op in self._init_ops
      ]

  def after_create_session(self, session, coord):
    del coord
    session.run(self._init_ops)

  def before_run(self, run_context):
    if self.tensors is None:  # run inside an in-graph training loop instead
      return None
    step_in_loop = (self._runs if self._steps_per_loop is None else
                    self._runs % self._steps_per_loop)
    self._runs += 1
    if step_in_loop % self._every_n_steps:
      return None
    return tf.compat.v1.train.SessionRunArgs(self.tensors)

  def end(self, session):
    session.run(self._flush_ops)
    return {}


def _validate_host_calls(host_calls):
  """Checks `eval_metrics` / `host_call` pairs (legacy _OutfeedHostCall)."""
  for name, host_call in host_calls.items():
    if not isinstance(host_call, (tuple, list)):
      raise ValueError('{} should be tuple or list'.format(name))
    if len(host_call) != 2:
      raise ValueError('{} should have two elements.'.format(name))
    fn, tensors = host_call
    if not callable(fn):
      raise TypeError('{}[0] should be callable.'.format(name))
    if not isinstance(tensors, (tuple, list, dict)):
      raise ValueError('{}[1] should be tuple or list, or dict.'.format(name))
    if isinstance(tensors, (tuple, list)):
      has_varargs = internals.getfullargspec(fn).varargs is not None
      fn_args = internals.fn_args(fn)
      if not has_varargs and len(tensors) != len(fn_args):
        raise RuntimeError(
            'In TPUEstimatorSpec.{}, length of tensors {} does not match '
            'method args of the function, which takes {}.'.format(
                name, len(tensors), len(fn_args)))


def call_host_fn(name, host_call):
  """Calls a host_call on the host (CPU) with its tensors."""
  fn, tensors = host_call
  if isinstance(tensors, (tuple, list)):
    return fn(*tensors)
  try:
    return fn(**tensors)
  except TypeError as e:
    tf.compat.v1.logging.warn(
        'Exception while calling %s: %s. It is likely the tensors '
        '(%s[1]) do not match the '
        'function\'s arguments', name, e, name)
    raise


class TPUEstimatorSpec(
    collections.namedtuple('TPUEstimatorSpec', [
        'mode', 'predictions', 'loss', 'train_op', 'eval_metrics',
        'export_outputs', 'scaffold_fn', 'host_call', 'training_hooks',
        'evaluation_hooks', 'prediction_hooks'
    ])):
  """What a TPU model_fn returns (legacy `tf.estimator.tpu.TPUEstimatorSpec`).

  `eval_metrics` and `host_call` are `(fn, tensors)` with tensors a list
  (positional) or dict (keyword); `scaffold_fn` builds the `Scaffold` on the
  host.  On the emulated TPU each shard's model_fn returns one; the loss and
  ops are shard 0's, as on a TPU, and the host functions get each of their
  tensors concatenated over the shards along the batch.  With `use_tpu=False`
  it runs as the `EstimatorSpec` of `as_estimator_spec()`.

  Args:
    mode, predictions, loss, train_op, export_outputs, training_hooks,
      evaluation_hooks, prediction_hooks: as in `EstimatorSpec`.
    eval_metrics: a pair (tuple or list) `(metric_fn, tensors)` for
      evaluation: `metric_fn(*tensors)`
      (a list) or `metric_fn(**tensors)` (a dict) returns metric name ->
      `(value, update_op)`, called on the host (on the emulated TPU a Keras
      metric object is refused with a `TypeError`, as on a TPU; on the CPU it
      is taken).
    scaffold_fn: a zero-argument function returning the
      `tf.compat.v1.train.Scaffold`, called on the host; None: a default one.
    host_call: a pair `(fn, tensors)` as `eval_metrics`, whose ops (e.g.
      `tf.summary` writes) run on the host every step; in the emulated TPU's
      training loops, on a loop's first step and every
      `TPUConfig.experimental_host_call_every_n_steps` after it, and
      `tf.compat.v1.summary` ops in it are refused (`ValueError`), as on a
      TPU.

  Raises:
    ValueError: `eval_metrics` or `host_call` not a pair, or its tensors not
      a list, tuple or dict; and `EstimatorSpec`'s checks of the other fields.
    TypeError: the function of `eval_metrics` or `host_call` not callable;
      and `EstimatorSpec`'s checks of the other fields.
    RuntimeError: a list of tensors whose length differs from the function's
      arguments (without `*args`).
  """

  def __new__(cls,
              mode: str,
              predictions: tf.Tensor | Mapping[str, tf.Tensor] | None = None,
              loss: tf.Tensor | None = None,
              train_op: tf.Operation | tf.Tensor | None = None,
              eval_metrics: Sequence[Any] | None = None,
              export_outputs: Mapping[str, Any] | None = None,
              scaffold_fn: Callable[[], Any] | None = None,
              host_call: Sequence[Any] | None = None,
              training_hooks: Iterable[Any] | None = None,
              evaluation_hooks: Iterable[Any] | None = None,
              prediction_hooks: Iterable[Any] | None = None):
    host_calls = {'eval_metrics': eval_metrics, 'host_call': host_call}
    _validate_host_calls({k: v for k, v in host_calls.items() if v is not None})
    training_hooks = model_fn.validate_hooks(training_hooks)
    evaluation_hooks = model_fn.validate_hooks(evaluation_hooks)
    prediction_hooks = model_fn.validate_hooks(prediction_hooks)
    train_op = model_fn.validate_train_op(train_op, mode)
    loss = model_fn.validate_loss(loss, mode)
    predictions = model_fn.validate_predictions(predictions, mode)
    export_outputs = model_fn.validate_export_outputs(export_outputs, predictions, mode)
    return super(TPUEstimatorSpec, cls).__new__(
        cls, mode, predictions, loss, train_op, eval_metrics, export_outputs,
        scaffold_fn, host_call, training_hooks, evaluation_hooks,
        prediction_hooks)

  def as_estimator_spec(self) -> model_fn.EstimatorSpec:
    """The `EstimatorSpec` TPUEstimator runs on CPU.

    Calls `eval_metrics`' metric_fn, then `host_call` (run every step by a hook
    in every mode), then `scaffold_fn`, in that order, in the current graph.
    """
    eval_metric_ops = (None if self.eval_metrics is None else
                       call_host_fn('eval_metrics', self.eval_metrics))
    host_hooks = (() if self.host_call is None else
                  (HostCallHook(call_host_fn('host_call', self.host_call)),))
    scaffold = self.scaffold_fn() if self.scaffold_fn else None
    return model_fn.EstimatorSpec(
        mode=self.mode,
        predictions=self.predictions,
        loss=self.loss,
        train_op=self.train_op,
        eval_metric_ops=eval_metric_ops,
        export_outputs=self.export_outputs,
        scaffold=scaffold,
        training_hooks=self.training_hooks + host_hooks,
        evaluation_hooks=self.evaluation_hooks + host_hooks,
        prediction_hooks=self.prediction_hooks + host_hooks)


def as_tpu_estimator_spec(spec):
  """A model_fn result as our `TPUEstimatorSpec` (ours or TF's), else None."""
  if isinstance(spec, TPUEstimatorSpec):
    return spec
  if isinstance(spec, model_fn.EstimatorSpec):
    return None
  tpu_fields = model_fn.fields_of(spec, TPUEstimatorSpec)
  return None if tpu_fields is None else TPUEstimatorSpec(**tpu_fields)


def to_estimator_spec(spec):
  """The `EstimatorSpec` to run for a model_fn result: a `TPUEstimatorSpec`
  (ours or TF's) as TPUEstimator runs it on the CPU, else an `EstimatorSpec`."""
  tpu_spec = as_tpu_estimator_spec(spec)
  if tpu_spec is not None:
    return tpu_spec.as_estimator_spec()
  return model_fn.to_estimator_spec(spec)
