"""The emulated TPU's in-graph loops: `iterations_per_loop` training steps, or
all the steps of an evaluation, in one `session.run`, as a TPU runs them.

A loop builds its step once as a `tf.while_loop` body (`emulation.build` with
the loop's `LoopBody`): the model's variables are created once, outside the
loop; scaffold_fn runs after it; an evaluation's metric_fn is replayed outside
it to read the values.
"""
import contextlib

from tpu_fc._tf import tf
from tpu_fc import _tf_internals as internals
from tpu_fc.estimator import model_fn
from tpu_fc.estimator.tpu import replication
from tpu_fc.estimator.tpu import tpu_estimator_spec


class LoopBody:
  """What building an in-graph loop's body leaves to the driver, after the loop.

  The loop hands it to its step's build (`emulation.build(loop_body=...)`):
  scaffold_fn runs after the loop, as on a TPU's host (its ops, e.g.
  `init_from_checkpoint`'s initializers, cannot live in the loop); an evaluation
  loop's metric_fn is replayed outside it (`_EvaluationLoopMetrics`).
  """

  def __init__(self, outer_scope, host_call_every_n_steps=1):
    self.scaffold_fns = []
    self.metrics = _EvaluationLoopMetrics()
    self.step = None  # the loop counter of the body being built
    self._outer_scope = outer_scope
    self._body_scope = ''
    self._host_call_every_n_steps = host_call_every_n_steps

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

  def host_call_on_its_steps(self, host_call):
    """A training step's `(host_fn, tensors)`, its host_fn run on the steps a
    TPU runs it (in the outer name scope: its summary tags).

    TF 2.15's TPU training loop (`tpu_estimator.py`, `_OutfeedHostCall.
    create_enqueue_op`, lines 2179-2210, given the loop's counter by
    `convert_to_single_tpu_train_step`, lines 1763-1844) runs it where the
    counter, from 0 in every loop, is a multiple of
    `TPUConfig.experimental_host_call_every_n_steps`; with 1 (the default),
    every step.
    """
    host_fn, tensors = host_call
    every_n_steps = self._host_call_every_n_steps
    if every_n_steps == 1:
      return host_call

    def on_its_steps(*args, **kwargs):
      def run():
        with self.in_outer_name_scope():  # (a cond has a name scope of its own)
          outputs = [output for output in
                     tf.nest.flatten(host_fn(*args, **kwargs))
                     if output is not None]
        with tf.control_dependencies(outputs):
          return tf.constant(True)
      return tf.cond(tf.equal(self.step % every_n_steps, 0), run,
                     lambda: tf.constant(False))

    return on_its_steps, tensors


def _run_host_calls_in_loop(hooks):
  """`hooks`, with host_call tensors moved into the loop body.

  As on a TPU, host_call runs in the loop (training: on the steps
  `LoopBody.host_call_on_its_steps` says; evaluation: every step); its hook
  keeps only opening and flushing the summary writers.  Returns (hooks,
  host_call tensors).
  """
  kept, tensors = [], []
  for hook in hooks:
    if isinstance(hook, tpu_estimator_spec.HostCallHook):
      tensors.extend(tf.nest.flatten(hook.tensors))
      hook = tpu_estimator_spec.HostCallHook(None)
    kept.append(hook)
  return tuple(kept), tensors


def training_loop(build_step, next_batch, iterations, host_call_every_n_steps=1):
  """`iterations` emulated TPU training steps per session.run, in a tf.while_loop.

  As TPUEstimator does on a TPU: hooks run at loop boundaries; the loss is the
  last step's; `LoopIterationsHook` shortens the last loop so steps/max_steps
  are met exactly; model summaries stay inside the loop (use host_call); the
  model's variables are created once, outside it.

  Args:
    build_step: `(features, labels, loop_body) -> BuiltGraph` of one emulated
      step, built as the body of the loop `loop_body` (a `LoopBody`).
    next_batch: `() -> (features, labels)`, the next element of the input.
    iterations: steps per loop (TPUConfig.iterations_per_loop).
    host_call_every_n_steps: TPUConfig.experimental_host_call_every_n_steps.

  Returns:
    The loop's `BuiltGraph`: the step's checkpoint names and before-save ops,
    `iterations` steps per run, the loop's step count to feed.
  """
  graph = tf.compat.v1.get_default_graph()
  steps_this_run = tf.compat.v1.placeholder_with_default(
      iterations, [], name='training_loop_iterations')
  steps = []

  def body(step, loss):
    del loss
    loop_body.step = step
    with loop_body.creating_variables_outside():
      built = build_step(*next_batch(), loop_body)
    hooks, host_calls = _run_host_calls_in_loop(built.spec.training_hooks)
    steps.append(built._replace(
        spec=built.spec._replace(training_hooks=hooks)))
    with tf.control_dependencies([built.spec.train_op] + host_calls):
      return [step + 1, tf.identity(tf.cast(built.spec.loss, tf.float32))]

  # A hook's global step, fetched in the loop's run, is the step before the
  # loop (on a TPU the loop is one program), never a step inside it.
  global_step = tf.compat.v1.train.get_global_step(graph)
  step_reads = [internals.fetched_read(global_step),
                internals.get_or_create_global_step_read(graph)]
  loop_body = LoopBody(graph.get_name_scope(), host_call_every_n_steps)
  # The body's summaries, losses and update ops stay in the loop; but for a
  # TF1 loop's summaries, which stay in the graph's collection, as in TF's TPU
  # loop: the Scaffold's summary op then refuses them, as TF's does (a v2
  # loop's body keeps its own collections).
  with tf.control_dependencies(step_reads), \
      replication.per_replica_entries_dropped(
          graph, keep_summaries=not tf.compat.v1.control_flow_v2_enabled()):
    _, loss = tf.compat.v1.while_loop(
        lambda step, loss: step < steps_this_run, body,
        [tf.constant(0), tf.constant(0.)],
        maximum_iterations=iterations, name='training_loop')
  step, = steps
  return step._replace(
      spec=model_fn.EstimatorSpec(
          mode=model_fn.ModeKeys.TRAIN, loss=loss, train_op=loss.op,
          training_hooks=step.spec.training_hooks,
          training_chief_hooks=step.spec.training_chief_hooks,
          scaffold=loop_body.scaffold()),
      steps_per_run=iterations, loop_iterations=steps_this_run)


class LoopIterationsHook(tf.compat.v1.train.SessionRunHook):
  """Feeds each run's loop length: iterations_per_loop, less at the last step.

  Stops training once the last step is reached (a global step fetched in the
  same run as the loop is the step before it, so the hook counts the steps).

  Args:
    loop_iterations: the loop's feedable step count (`BuiltGraph`'s).
    iterations: the steps of a whole loop.
    steps, max_steps: `train`'s.
  """

  def __init__(self, loop_iterations, iterations, steps, max_steps):
    self._loop_iterations = loop_iterations
    self._iterations = iterations
    self._steps = steps
    self._max_steps = max_steps

  def after_create_session(self, session, coord):
    del coord
    self._step = session.run(tf.compat.v1.train.get_global_step())
    self._last_step = (self._max_steps if self._max_steps is not None else
                       self._step + self._steps)

  def before_run(self, run_context):
    self._running = min(self._iterations, self._last_step - self._step)
    return tf.compat.v1.train.SessionRunArgs(
        None, feed_dict={self._loop_iterations: self._running})

  def after_run(self, run_context, run_values):
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
        metrics = tpu_estimator_spec.call_host_fn(
            'eval_metrics',
            (metric_fn, tf.nest.map_structure(placeholder, tensors)))
      mean_loss, _ = tf.compat.v1.metrics.mean(placeholder(loss))
    no_op = tf.no_op()
    return {name: (value, no_op) for name, (value, _) in metrics.items()}, mean_loss


def evaluation_loop(build_step, next_batch, iterations):
  """`iterations` emulated TPU evaluation steps in one session.run.

  As TPUEstimator on a TPU runs `evaluate(steps=N)`: a loop of N steps, so hooks
  see one run and the eval step counter moves by N.  `build_step` as in
  `training_loop`.  Returns the `BuiltGraph` whose metric values (and mean loss,
  `eval_loss`, with the loop as its update) read the metric variables the
  loop updated; an input that ends inside the loop keeps the updates of the
  steps before.
  """
  graph = tf.compat.v1.get_default_graph()
  eval_step = internals.get_or_create_eval_step()
  steps = []

  def body(step):
    with loop_body.creating_variables_outside():
      built = build_step(*next_batch(), loop_body)
      spec = built.spec
      mean = loop_body.metrics.recorded(tf.compat.v1.metrics.mean)
      loss_update = mean(spec.loss)[1]
    hooks, host_calls = _run_host_calls_in_loop(spec.evaluation_hooks)
    steps.append(built._replace(spec=spec._replace(evaluation_hooks=hooks)))
    updates = [update for _, update in (spec.eval_metric_ops or {}).values()]
    # The driver's run adds 1 to the eval step; the loop adds the others.
    with tf.control_dependencies(updates + host_calls + [loss_update]):
      counted = eval_step.assign_add(tf.minimum(tf.cast(step, tf.int64), 1))
    with tf.control_dependencies([counted]):
      return step + 1

  loop_body = LoopBody(graph.get_name_scope())
  loop = tf.compat.v1.while_loop(
      lambda step: step < iterations, body, [tf.constant(0)],
      maximum_iterations=iterations, name='evaluation_loop')
  step, = steps
  eval_metric_ops, mean_loss = loop_body.metrics.values(step.spec.loss)
  return step._replace(
      spec=model_fn.EstimatorSpec(
          mode=model_fn.ModeKeys.EVAL, loss=mean_loss,
          eval_metric_ops=eval_metric_ops,
          evaluation_hooks=step.spec.evaluation_hooks,
          scaffold=loop_body.scaffold()),
      # Running the loop is the update of the mean loss, which the driver
      # reports as `loss`: one run, all iterations.
      eval_loss=(mean_loss, loop))
