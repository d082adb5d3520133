"""`use_tpu=True` without a TPU: one TRAIN or EVAL step as the TPU would run it.

The spec's lookup backends (`tpu_fc.lookup.backends`) prepare the features over
the global batch: the host engine looks up every embedding-core feature,
tensor-core features are densified with their mask; the model_fn is built once
per emulated shard on its slice of the batch (`replication`); after it, the
engine applies the captured embedding gradients with the spec's optimizer.
Checkpoints keep the legacy names: tables and slots under the names the columns
recorded, dense variables under their own, TPU dummy variables left out.
"""
import contextlib
import functools
import weakref

from tpu_fc._tf import tf
from tpu_fc import _tf_internals as internals
from tpu_fc import naming
from tpu_fc.estimator import checkpoints
from tpu_fc.estimator import hooks as hooks_lib
from tpu_fc.estimator import replication
from tpu_fc.estimator import spec as spec_lib
from tpu_fc import build_context
from tpu_fc.lookup import backends as lookup_backends
from tpu_fc.lookup import sparse_update

_logged_once = []


def log_emulation_once():
  if not _logged_once:
    _logged_once.append(True)
    tf.compat.v1.logging.warning(
        'No TPU: tpu_fc emulates the TPU (embedding core on the host with the '
        'TPU update rules, model_fn per shard).')


def predict_padded(call_model_fn, features, batch_size):
  """The PREDICT spec as TPUEstimator builds it on a TPU: every feature padded
  with zeros to `batch_size` examples (a static batch, the last, short batch
  too), the predictions sliced back to the real examples.

  Args:
    call_model_fn: `features -> EstimatorSpec`.
    features: one batch of input_fn (a SparseTensor gets the batch in its dense
      shape, no entries).
    batch_size: the predict batch size, or None: no padding.
  """
  leaves = [leaf for leaf in tf.nest.flatten(features)
            if isinstance(leaf, (tf.Tensor, tf.SparseTensor))
            and leaf.shape.rank]
  if batch_size is None or not leaves:
    return call_model_fn(features)
  first = leaves[0]
  real = tf.cast(first.dense_shape[0] if isinstance(first, tf.SparseTensor)
                 else tf.shape(first)[0], tf.int32)
  check = tf.debugging.assert_less_equal(
      real, batch_size,
      message='The real batch size should not be greater than batch_size.')
  with tf.control_dependencies([check]):
    missing = batch_size - real

  def padded(value):
    if isinstance(value, tf.SparseTensor):
      return tf.sparse.reset_shape(value, tf.concat(
          [[batch_size], value.dense_shape[1:]], axis=0))
    if not isinstance(value, tf.Tensor) or not value.shape.rank:
      return value
    result = tf.pad(value, [[0, missing]] + [[0, 0]] * (value.shape.rank - 1))
    result.set_shape([batch_size] + value.shape[1:])
    return result

  spec = call_model_fn(tf.nest.map_structure(padded, features))
  return spec._replace(predictions=tf.nest.map_structure(
      lambda prediction: prediction[:real], spec.predictions))


def _check_static_shapes(value, name):
  """TF 2.15's check: a TPU's infeed carries only statically shaped tensors.

  Run on what the model_fn receives (embedding features taken out), as
  TPUEstimator does before calling it on the TPU.
  """
  items = value.items() if isinstance(value, dict) else [(None, value)]
  for key, tensor in items:
    for leaf in tf.nest.flatten(tensor, expand_composites=False):
      if not tf.TensorShape(leaf.shape).is_fully_defined():
        raise ValueError(
            'The {} to the model returned by input_fn must have static shape. '
            'Tensor: {}.{} A TPU (and its emulation) needs every dimension '
            'known: batch the Dataset with drop_remainder=True, or set the '
            'shape in input_fn.'.format(
                name, leaf, '' if key is None else
                ' Feature {!r} has shape {}.'.format(key, leaf.shape)))


def _concat_shards(values):
  """Per-shard eval_metrics / host_call tensors (list or dict), joined on axis 0."""
  first = values[0]
  if isinstance(first, dict):
    return {k: tf.concat([v[k] for v in values], axis=0) for k in first}
  return [tf.concat(list(parts), axis=0) for parts in zip(*values)]


# Graph -> the `_LoopBody` being built in it.  Not a graph collection: a meta
# graph written meanwhile (a ProfilerHook's FileWriter) could not serialize it.
_LOOP_BODIES = weakref.WeakKeyDictionary()


class _LoopBody:
  """What building an in-graph loop's body leaves to the driver, after the loop.

  scaffold_fn runs after the loop, as on a TPU's host (its ops, e.g.
  `init_from_checkpoint`'s initializers, cannot live in the loop); an evaluation
  loop's metric_fn is replayed outside it (`_EvaluationLoopMetrics`).
  """

  def __init__(self, outer_scope):
    self.scaffold_fns = []
    self.metrics = _EvaluationLoopMetrics()
    self._outer_scope = outer_scope
    self._body_scope = ''

  @contextlib.contextmanager
  def creating_variables_outside(self):
    """Variables the body creates are created once, outside the loop.

    They get the name scope the loop was entered in: a TF1 loop builds its body
    in a name scope of its own, which would rename Keras layers' variables.
    """
    self._body_scope = tf.compat.v1.get_default_graph().get_name_scope()
    with tf.compat.v1.variable_creator_scope(self._create_outside):
      yield

  def in_outer_name_scope(self):
    """The name scope the loop was entered in: a TF1 loop prefixes its body's
    op names, and so the tags of summaries written in it."""
    return tf.compat.v1.get_default_graph().name_scope(
        self._outer_scope + '/' if self._outer_scope else '')

  def _create_outside(self, next_creator, **kwargs):
    scope = tf.compat.v1.get_default_graph().get_name_scope()
    if self._body_scope and (scope + '/').startswith(self._body_scope + '/'):
      scope = '/'.join(part for part in (
          self._outer_scope, scope[len(self._body_scope):].strip('/')) if part)
    with tf.init_scope(), tf.compat.v1.get_default_graph().name_scope(
        scope + '/' if scope else None):
      return next_creator(**kwargs)

  def scaffold(self):
    """The Scaffold of the body's scaffold_fn, or None."""
    return self.scaffold_fns[0]() if self.scaffold_fns else None


@contextlib.contextmanager
def _building_loop_body(graph):
  """Marks `graph` as building a loop body (with v1 or v2 control flow alike)."""
  body = _LoopBody(graph.get_name_scope())
  _LOOP_BODIES[graph] = body
  try:
    yield body
  finally:
    del _LOOP_BODIES[graph]


def _loop_body(graph):
  """The `_LoopBody` being built in `graph` (or a graph it is nested in), or None."""
  return _LOOP_BODIES.get(_outermost(graph))


def _merged_spec(raw_specs, mode):
  """Shard 0's spec, with `eval_metrics` / `host_call` tensors of all shards.

  As on a TPU, the host functions see each tensor concatenated over the shards
  along the batch axis, and the loss is shard 0's (TF 2.15's TPU loops run with
  `outputs_from_all_shards=False`).
  """
  tpu_specs = [spec_lib.as_tpu_estimator_spec(raw) for raw in raw_specs]
  if tpu_specs[0] is None:
    return _verified_estimator_spec(raw_specs[0], mode)
  loop_body = _loop_body(tf.compat.v1.get_default_graph())
  if loop_body is not None and tpu_specs[0].scaffold_fn is not None:
    loop_body.scaffold_fns.append(tpu_specs[0].scaffold_fn)
    tpu_specs[0] = tpu_specs[0]._replace(scaffold_fn=None)
  if mode == spec_lib.ModeKeys.TRAIN:  # metric_fn is for evaluation only
    tpu_specs[0] = tpu_specs[0]._replace(eval_metrics=None)
  field = 'eval_metrics' if mode == spec_lib.ModeKeys.EVAL else 'host_call'
  host_call = getattr(tpu_specs[0], field)
  if host_call is None:
    return tpu_specs[0].as_estimator_spec()
  tensors = _concat_shards([getattr(spec, field)[1] for spec in tpu_specs])
  metric_fn = _refusing_v1_summaries(host_call[0])
  if mode == spec_lib.ModeKeys.EVAL and loop_body is not None:
    metric_fn = loop_body.metrics.recorded_host_call(metric_fn, tensors)
  tpu_spec = tpu_specs[0]._replace(**{field: (metric_fn, tensors)})
  if loop_body is None:
    return tpu_spec.as_estimator_spec()
  with loop_body.in_outer_name_scope():  # host_call's summary tags, as on a TPU
    return tpu_spec.as_estimator_spec()


def _verified_estimator_spec(raw_spec, mode):
  """A model_fn's plain `EstimatorSpec`, as TPUEstimator takes it on a TPU.

  TF 2.15's `_verify_estimator_spec`: chief hooks are refused, the scaffold
  ignored (a TPU's scaffold comes from `scaffold_fn`); evaluation needs the
  TPU's metric_fn.
  """
  if mode == spec_lib.ModeKeys.EVAL:
    raise RuntimeError(
        'estimator_spec used by TPU evaluation must have type'
        '`TPUEstimatorSpec`. Got {}'.format(type(raw_spec)))
  if raw_spec.training_chief_hooks:
    raise ValueError(
        'training_chief_hooks returned by EstimatorSpec is not supported in '
        'TPUEstimator.If you want to pass training hooks, please pass via '
        'training_hooks.')
  tf.compat.v1.logging.warn('EstimatorSpec.Scaffold is ignored by TPU '
                            'train/eval. Please use TPUEstimatorSpec.')
  return spec_lib.to_estimator_spec(raw_spec)._replace(
      scaffold=tf.compat.v1.train.Scaffold())


# What a TPU's host_call refuses (TF 2.15's `CatchInvalidHostcallFunctions`).
_V1_SUMMARY_OPS = frozenset((
    'AudioSummary', 'AudioSummaryV2', 'HistogramSummary', 'ImageSummary',
    'MergeSummary', 'ScalarSummary', 'TensorSummary', 'TensorSummaryV2'))


def _refusing_v1_summaries(host_fn):
  """`host_fn`, raising TF's error if it makes a `tf.compat.v1.summary` op.

  On a TPU such a summary has no writer in the host loop; TF refuses it, in
  every loop length (tpu_fc's one-step runs could write it, its loops not).
  """
  @functools.wraps(host_fn)
  def refusing(*args, **kwargs):
    graph = tf.compat.v1.get_default_graph()
    ops_before = len(graph.get_operations())
    result = host_fn(*args, **kwargs)
    if any(op.type in _V1_SUMMARY_OPS
           for op in graph.get_operations()[ops_before:]):
      raise ValueError('Please use tf.contrib.summary instead of tf.summary '
                       'inside of host_calls.')
    return result

  return refusing


def _outermost(graph):
  """The graph itself, or the one holding it when building a v2 loop body."""
  while getattr(graph, 'outer_graph', None) is not None:
    graph = graph.outer_graph
  return graph


def _localize_dummies(graph):
  """Makes the TPU dummy variables and their model-optimizer slots local.

  They only carry the activation gradients (always zero themselves), so they are
  not model state: not saved, and re-initialized whenever a session starts, also
  after a restore.
  """
  global_variables = graph.get_collection_ref(
      tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
  dummies = [v for v in global_variables if naming.is_dummy(v.op.name)]
  dummy_ids = {id(v) for v in dummies}
  global_variables[:] = [v for v in global_variables if id(v) not in dummy_ids]
  for variable in dummies:
    graph.add_to_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES, variable)


def _checkpoint_names(backends, graph):
  """Legacy checkpoint name -> variable: the backends' tables and slots, the
  model's variables under their own names."""
  names = {}
  for backend in backends:
    names.update(backend.checkpoint_variables(graph))
  owned = {id(part) for v in names.values()
           for part in sparse_update.table_parts(v)}
  for variable in tf.compat.v1.global_variables():
    if id(variable) not in owned:
      names[variable.op.name] = variable
  return names


def build(call_model_fn, features, labels, mode, backends, num_shards,
          batch_size, broadcast=False, aggregate_rows=None):
  """The EstimatorSpec of an emulated TPU TRAIN or EVAL step.

  Args:
    call_model_fn: `(features, labels) -> model_fn result` for one shard, with
      the per-shard batch size in params.
    features, labels: the global batch from input_fn.  Like TPUEstimator,
      raises unless what the model_fn receives has static shapes.
    mode: ModeKeys.TRAIN or ModeKeys.EVAL.
    backends: the spec's lookup backends (`lookup.backends.backends_for`).
    num_shards: emulated TPU cores.
    batch_size: the mode's global batch size (TPUEstimator's train or eval
      batch size), the static batch of the activations, lengths and masks.
    broadcast: `InputPipelineConfig.BROADCAST`: every shard gets the whole
      batch (TPUEstimator refuses it with embedding features).
    aggregate_rows: the synchronous replicas' aggregation of the tables' row
      gradients (`EmbeddingBackend.apply_gradients`), or None.
  """
  log_emulation_once()
  training = mode == spec_lib.ModeKeys.TRAIN
  steps, activations = [], [{} for _ in range(num_shards)]
  for backend in backends:
    backend.create_variables(training)
    step, per_shard = backend.lookup(features, num_shards, batch_size)
    steps.append(step)
    for shard, values in zip(activations, per_shard):
      shard.update(values)
  model_features = lookup_backends.model_features(backends, features,
                                                  batch_size)
  _check_static_shapes(model_features, 'features')
  if labels is not None:
    _check_static_shapes(labels, 'labels')

  def slice_of(value, shard, name='Labels'):
    if broadcast:
      return value
    return replication.split_batch(value, num_shards, shard, name)

  def build_shard(shard):
    shard_features = slice_of(model_features, shard, 'features')
    if activations[shard]:
      shard_features.update(activations[shard])
    with build_context.building(mode):
      return call_model_fn(shard_features, slice_of(labels, shard))

  raw_specs = replication.replicate(build_shard, num_shards, [
      creator for backend in backends
      for creator in backend.shared_table_creators()])
  graph = tf.compat.v1.get_default_graph()
  driver_graph = _outermost(graph)  # where the driver reads its collections
  _localize_dummies(graph)
  # The tables exist before scaffold_fn runs (its Saver, init_from_checkpoint),
  # as TPUEstimator creates them first.
  checkpoints.record_names(driver_graph, _checkpoint_names(backends, graph))
  estimator_spec = _merged_spec(raw_specs, mode)
  if not training or not backends:
    return estimator_spec
  updates, hooks = [], list(estimator_spec.training_hooks)
  with tf.control_dependencies([estimator_spec.train_op]):
    for backend, step in zip(backends, steps):
      updates.append(backend.apply_gradients(step, aggregate_rows))
      hooks.extend(backend.training_hooks(step))
  for backend in backends:
    if (build_op := backend.before_save()) is not None:
      checkpoints.run_before_save(driver_graph, build_op)
  return estimator_spec._replace(
      train_op=tf.group(estimator_spec.train_op,
                        *[update for update in updates if update is not None]),
      training_hooks=tuple(hooks))


_ITERATIONS_COLLECTION = 'tpu_fc_training_loop_iterations'
_LOOP_LOCAL_COLLECTIONS = (
    tf.compat.v1.GraphKeys.SUMMARIES,
    tf.compat.v1.GraphKeys.LOSSES,
    tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES,
    tf.compat.v1.GraphKeys.UPDATE_OPS,
)


def in_training_loop(graph):
  """Whether the model_fn of `graph` runs inside the emulated TPU training loop."""
  return bool(graph.get_collection(_ITERATIONS_COLLECTION))


def steps_per_run(graph):
  """Steps one session.run of `graph` trains: the loop's iterations, or 1."""
  loops = graph.get_collection(_ITERATIONS_COLLECTION)
  if not loops:
    return 1
  return int(tf.get_static_value(loops[0].op.inputs[0]))


def _run_host_calls_in_loop(hooks):
  """`hooks`, with host_call tensors moved into the loop body.

  As on a TPU, host_call runs every step; its hook keeps only opening and
  flushing the summary writers.  Returns (hooks, host_call tensors).
  """
  kept, tensors = [], []
  for hook in hooks:
    if isinstance(hook, hooks_lib.HostCallHook):
      tensors.extend(tf.nest.flatten(hook.tensors))
      hook = hooks_lib.HostCallHook(None)
    kept.append(hook)
  return tuple(kept), tensors


def training_loop(build_step, next_batch, iterations):
  """`iterations` emulated TPU training steps per session.run, in a tf.while_loop.

  As TPUEstimator does on a TPU: hooks run at loop boundaries; the loss is the
  last step's; `LoopIterationsHook` shortens the last loop so steps/max_steps
  are met exactly; model summaries stay inside the loop (use host_call); the
  model's variables are created once, outside it.

  Args:
    build_step: `(features, labels) -> EstimatorSpec` of one emulated step.
    next_batch: `() -> (features, labels)`, the next element of the input.
    iterations: steps per loop (TPUConfig.iterations_per_loop).
  """
  graph = tf.compat.v1.get_default_graph()
  before = {key: list(graph.get_collection(key))
            for key in _LOOP_LOCAL_COLLECTIONS}
  steps_this_run = tf.compat.v1.placeholder_with_default(
      iterations, [], name='training_loop_iterations')
  graph.add_to_collection(_ITERATIONS_COLLECTION, steps_this_run)
  specs = []

  def condition(step, loss):
    del loss
    return step < steps_this_run

  def body(step, loss):
    del loss
    with loop_body.creating_variables_outside():
      spec = build_step(*next_batch())
    hooks, host_calls = _run_host_calls_in_loop(spec.training_hooks)
    specs.append(spec._replace(training_hooks=hooks))
    with tf.control_dependencies([spec.train_op] + host_calls):
      return [step + 1, tf.identity(tf.cast(spec.loss, tf.float32))]

  # A hook's global step, fetched in the loop's run, is the step before the
  # loop (on a TPU the loop is one program), never a step inside it.
  global_step = tf.compat.v1.train.get_global_step(graph)
  step_reads = [internals.fetched_read(global_step),
                internals.get_or_create_global_step_read(graph)]
  with _building_loop_body(graph) as loop_body, \
      tf.control_dependencies(step_reads):
    _, loss = tf.compat.v1.while_loop(
        condition, body, [tf.constant(0), tf.constant(0.)],
        maximum_iterations=iterations, name='training_loop')
  for key, items in before.items():
    graph.get_collection_ref(key)[:] = items
  return spec_lib.EstimatorSpec(
      mode=spec_lib.ModeKeys.TRAIN, loss=loss, train_op=loss.op,
      training_hooks=specs[0].training_hooks,
      training_chief_hooks=specs[0].training_chief_hooks,
      scaffold=loop_body.scaffold())


class LoopIterationsHook(tf.compat.v1.train.SessionRunHook):
  """Feeds each run's loop length: iterations_per_loop, less at the last step.

  Stops training once the last step is reached (a global step fetched in the
  same run as the loop is the step before it, so the hook counts the steps).
  """

  def __init__(self, steps, max_steps):
    self._steps = steps
    self._max_steps = max_steps
    self._loop = None

  def begin(self):
    graph = tf.compat.v1.get_default_graph()
    loops = graph.get_collection(_ITERATIONS_COLLECTION)
    if loops:  # the steps-per-run placeholder, defaulting to iterations_per_loop
      self._loop = (loops[0], steps_per_run(graph))

  def after_create_session(self, session, coord):
    del coord
    if self._loop is not None:
      self._step = session.run(tf.compat.v1.train.get_global_step())
      self._last_step = (self._max_steps if self._max_steps is not None else
                         self._step + self._steps)

  def before_run(self, run_context):
    if self._loop is None:
      return None
    steps_this_run, iterations = self._loop
    self._running = min(iterations, self._last_step - self._step)
    return tf.compat.v1.train.SessionRunArgs(
        None, feed_dict={steps_this_run: self._running})

  def after_run(self, run_context, run_values):
    if self._loop is None:
      return
    self._step += self._running
    if self._step >= self._last_step:
      run_context.request_stop()


class _EvaluationLoopMetrics:
  """The metric_fn of an evaluation loop, once inside the loop and once outside.

  Inside, the metric_fn's update ops run every iteration, its variables created
  outside the loop; a loop body's tensors cannot be fetched, so the values are
  built by calling the metric_fn again outside, on placeholders of its tensors,
  with its variables handed back in creation order (the values read only them).
  """
  def __init__(self):
    self._variables = []
    self._replayed = 0
    self._host_call = None

  def _record(self, next_creator, **kwargs):
    variable = next_creator(**kwargs)
    self._variables.append(variable)
    return variable

  def _replay(self, next_creator, **kwargs):
    del next_creator
    if self._replayed >= len(self._variables):
      raise ValueError(
          'metric_fn created variable {!r} outside the evaluation loop that it '
          'did not create inside it; it must build the same metrics each '
          'call.'.format(kwargs.get('name')))
    self._replayed += 1
    return self._variables[self._replayed - 1]

  def recorded(self, fn):
    """`fn`, recording the variables it creates, in order."""
    def call(*args, **kwargs):
      with tf.compat.v1.variable_creator_scope(self._record):
        return fn(*args, **kwargs)
    return call

  def recorded_host_call(self, metric_fn, tensors):
    """The eval_metrics host call's metric_fn, recorded for `values`."""
    self._host_call = (metric_fn, tensors)
    return self.recorded(metric_fn)

  def values(self, loss):
    """(`{name: (value, no-op)}` of the metrics, mean loss value), replayed in
    the order of the loop body: metric_fn, then the mean loss."""
    placeholder = lambda t: tf.compat.v1.placeholder(t.dtype, t.shape)
    metrics = {}
    with tf.compat.v1.variable_creator_scope(self._replay):
      if self._host_call is not None:
        metric_fn, tensors = self._host_call
        metrics = spec_lib.call_host_fn(
            'eval_metrics',
            (metric_fn, tf.nest.map_structure(placeholder, tensors)))
      mean_loss, _ = tf.compat.v1.metrics.mean(placeholder(loss))
    no_op = tf.no_op()
    return {name: (value, no_op) for name, (value, _) in metrics.items()}, mean_loss


def evaluation_loop(build_step, next_batch, iterations):
  """`iterations` emulated TPU evaluation steps in one session.run.

  As TPUEstimator on a TPU runs `evaluate(steps=N)`: a loop of N steps, so hooks
  see one run and the eval step counter moves by N.  Returns the EstimatorSpec
  whose metric values (and mean loss, under LOOP_LOSS_METRIC with the loop as
  its update) read the metric variables the loop updated; an input that ends
  inside the loop keeps the updates of the steps before.
  """
  graph = tf.compat.v1.get_default_graph()
  eval_step = internals.get_or_create_eval_step()
  specs, losses = [], []

  def body(step):
    with loop_body.creating_variables_outside():
      spec = build_step(*next_batch())
      mean = loop_body.metrics.recorded(tf.compat.v1.metrics.mean)
      loss_update = mean(spec.loss)[1]
    hooks, host_calls = _run_host_calls_in_loop(spec.evaluation_hooks)
    specs.append(spec._replace(evaluation_hooks=hooks))
    losses.append(spec.loss)
    updates = [update for _, update in (spec.eval_metric_ops or {}).values()]
    updates += host_calls
    # The driver's run adds 1 to the eval step; the loop adds the others.
    with tf.control_dependencies(updates + [loss_update]):
      counted = eval_step.assign_add(tf.minimum(tf.cast(step, tf.int64), 1))
    with tf.control_dependencies([counted]):
      return step + 1

  with _building_loop_body(graph) as loop_body:
    loop = tf.compat.v1.while_loop(
        lambda step: step < iterations, body, [tf.constant(0)],
        maximum_iterations=iterations, name='evaluation_loop')
  eval_metric_ops, mean_loss = loop_body.metrics.values(losses[0])
  # Running the loop is the update of the mean loss, which the driver reports
  # as `loss`: one run, all iterations.
  eval_metric_ops[LOOP_LOSS_METRIC] = (mean_loss, loop)
  return spec_lib.EstimatorSpec(
      mode=spec_lib.ModeKeys.EVAL, loss=mean_loss,
      eval_metric_ops=eval_metric_ops,
      evaluation_hooks=specs[0].evaluation_hooks, scaffold=loop_body.scaffold())


# The evaluation loop's (mean loss, loop) pair among its spec's metrics.
LOOP_LOSS_METRIC = 'tpu_fc_evaluation_loop_loss'
