"""Session hooks the driver adds, as TPUEstimator added them on CPU, and
tf.estimator's own (`tf.estimator.experimental.InMemoryEvaluatorHook`,
`make_stop_at_checkpoint_step_hook`) for TF versions without them."""
import time

from tpu_fc import _tf_internals as internals
from tpu_fc._tf import tf
from tpu_fc.estimator import checkpoints


def checked_types(values, cls, message):
  """`values` (None: none) as a list; a TypeError, `message` formatted with the
  value, for one that is no `cls` (the hook and listener checks, each with
  its TF wording)."""
  values = list(values or [])
  for value in values:
    if not isinstance(value, cls):
      raise TypeError(message.format(value))
  return values


def check_hooks_type(hooks):
  """`hooks` as a list; TF's error for one that is no `SessionRunHook`."""
  return checked_types(hooks, tf.compat.v1.train.SessionRunHook,
                       'Hooks must be a SessionRunHook, given: {}')


class CheckpointInputPipelineHook(tf.compat.v1.train.SessionRunHook):
  """Saves the training input's position in every checkpoint (`train(hooks=...)`).

  `tf.data.experimental.CheckpointInputPipelineHook`'s signature.  Where TF's hook
  wrote the iterator to separate `input.ckpt-N` files by a second saver, tpu_fc
  writes it into each model checkpoint, by the same save as the weights, so a
  process killed at any point restarts with weights and input position of one
  step: the run ends as an uninterrupted one would.  A checkpoint without a
  position (written without the hook) restores with the input at its start.

  Args:
    estimator: the `TPUEstimator` whose `train` gets the hook (kept for TF's
      signature; the driver saves into its own model_dir).
    external_state_policy: 'fail' (default), 'warn' or 'ignore': what to do
      with input pipelines that depend on state outside them (TF's argument).
  """

  def __init__(self, estimator, external_state_policy=None):
    del estimator
    self.external_state_policy = external_state_policy


class EvaluationStepsHook(internals.StopAfterNEvalsHook):
  """Ends an evaluation after `steps` (tf.estimator's hook of `evaluate`'s
  steps), which an in-graph evaluation loop also reads."""

  def __init__(self, steps):
    super().__init__(num_evals=steps)
    self.steps = steps


class DatasetInitializerHook(tf.compat.v1.train.SessionRunHook):
  """Initializes the input_fn's dataset iterator in every new session.

  After `save_position(...)` (CheckpointInputPipelineHook) the initialized
  iterator moves on to the position the restored checkpoint holds.
  """

  def __init__(self, iterator):
    self._iterator = iterator
    self._initializer = None
    self._position = None

  def save_position(self, model_dir, external_state_policy):
    """Has the iterator's position saved in the graph's checkpoints (graph
    build time); returns the `InputPipelinePosition`, whose `saveable` the
    Saver must save."""
    self._position = checkpoints.InputPipelinePosition(
        self._iterator, model_dir, external_state_policy)
    return self._position

  def begin(self):
    self._initializer = self._iterator.initializer

  def after_create_session(self, session, coord):
    del coord
    session.run(self._initializer)
    if self._position is not None:
      self._position.restore(session)


class ExamplesPerSecondHook(tf.compat.v1.train.StepCounterHook):
  """Logs and records `global_step/sec` and `examples/sec`.

  With no batch size (train_batch_size=None) only `global_step/sec` is
  reported; TF 2.15's hook raised a TypeError at its first report there.
  """

  def __init__(self, batch_size, every_n_steps=100, every_n_secs=None,
               output_dir=None):
    super().__init__(every_n_steps=every_n_steps, every_n_secs=every_n_secs,
                     output_dir=output_dir)
    self._batch_size = batch_size

  def _log_and_record(self, elapsed_steps, elapsed_time, global_step):
    super()._log_and_record(elapsed_steps, elapsed_time, global_step)
    if self._batch_size is None:
      return
    examples_per_sec = self._batch_size * elapsed_steps / elapsed_time
    if self._summary_writer is not None:
      self._summary_writer.add_summary(
          tf.compat.v1.Summary(value=[
              tf.compat.v1.Summary.Value(
                  tag='examples/sec', simple_value=examples_per_sec)
          ]), global_step)
    tf.compat.v1.logging.info('examples/sec: %g', examples_per_sec)


class InMemoryEvaluatorHook(tf.compat.v1.train.SessionRunHook):
  """Evaluates the model being trained from its variables, not a checkpoint
  (tf.estimator.experimental's, as TF 2.15 runs it).

  Every `every_n_iter` session runs of training (an emulated TPU loop is one),
  after the session is created and at the end, the training variables are
  copied into an evaluation graph built once with the estimator's
  `_evaluate_build_graph` and evaluated with its `_evaluate_run`: summaries in
  `eval_dir(name)`.  Single-machine training only; no custom saver, init_fn or
  saveables other than variables (TF's limits and errors).
  """

  def __init__(self, estimator, input_fn, steps=None, hooks=None, name=None,
               every_n_iter=100):
    if every_n_iter is None or every_n_iter <= 0:
      raise ValueError('invalid every_n_iter=%s.' % every_n_iter)
    if (estimator.config.num_ps_replicas > 0 or
        estimator.config.num_worker_replicas > 1):
      raise ValueError(
          'InMemoryEvaluator supports only single machine (aka Local) setting.')
    self._estimator = estimator
    self._input_fn = input_fn
    self._eval_dir = estimator.eval_dir(name)
    self._hooks = check_hooks_type(hooks)
    self._hooks.extend(estimator._convert_eval_steps_to_hooks(steps))  # pylint: disable=protected-access
    self._timer = tf.compat.v1.train.SecondOrStepTimer(every_steps=every_n_iter)
    self._graph = None

  def begin(self):
    """Builds the evaluation graph, with a placeholder to feed each variable."""
    self._timer.reset()
    self._iter_count = 0
    self._graph = tf.Graph()
    with self._graph.as_default():
      (self._scaffold, self._update_op, self._eval_dict,
       self._all_hooks) = self._estimator._evaluate_build_graph(  # pylint: disable=protected-access
           self._input_fn, self._hooks, checkpoint_path=None)
      if self._scaffold.saver is not None:
        raise ValueError('InMemoryEvaluator does not support custom saver')
      if self._scaffold.init_fn is not None:
        raise ValueError('InMemoryEvaluator does not support custom init_fn')
      self._eval_variables = {v.name: v for v in tf.compat.v1.global_variables()}
      self._placeholders = {
          name: tf.compat.v1.placeholder(variable.dtype)
          for name, variable in self._eval_variables.items()}

  def after_create_session(self, session, coord):
    """Evaluates before training (its first run)."""
    del coord
    if tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS):
      raise ValueError(
          'InMemoryEvaluator does not support saveables other than global '
          'variables.')
    training = {v.name: v for v in tf.compat.v1.global_variables()}
    shared = set(training) & set(self._eval_variables)
    self._train_variables = {name: training[name] for name in shared}
    with self._graph.as_default():
      self._feed_variables = tf.group([
          tf.compat.v1.assign(self._eval_variables[name],
                              self._placeholders[name]) for name in shared])
    self._evaluate(session)

  def _evaluate(self, train_session):
    values = train_session.run(self._train_variables)
    feed = {self._placeholders[name]: value for name, value in values.items()}

    def feed_variables(scaffold, session):
      del scaffold
      session.run(self._feed_variables, feed_dict=feed)

    scaffold = tf.compat.v1.train.Scaffold(init_fn=feed_variables,
                                           copy_from_scaffold=self._scaffold)
    with self._graph.as_default():
      self._estimator._evaluate_run(  # pylint: disable=protected-access
          checkpoint_path=None, scaffold=scaffold, update_op=self._update_op,
          eval_dict=self._eval_dict, all_hooks=self._all_hooks,
          output_dir=self._eval_dir)
    self._timer.update_last_triggered_step(self._iter_count)

  def after_run(self, run_context, run_values):
    del run_values
    self._iter_count += 1
    if self._timer.should_trigger_for_step(self._iter_count):
      self._evaluate(run_context.session)

  def end(self, session):
    """Evaluates the final model."""
    self._evaluate(session)


class _StopAtCheckpointStepHook(tf.compat.v1.train.SessionRunHook):
  """Stops a worker once the chief's latest checkpoint holds `last_step`,
  checking it (then waiting `wait_after_file_check_secs`) from the step
  before on: the chief saves the last step's checkpoint."""

  def __init__(self, model_dir, last_step, wait_after_file_check_secs=30):
    for name, value in (('last_step', last_step), ('model_dir', model_dir)):
      if value is None:
        raise ValueError('{} must be specified.'.format(name))
    self._model_dir = model_dir
    self._last_step = last_step
    self._wait_after_file_check_secs = wait_after_file_check_secs

  def begin(self):
    self._global_step = internals.get_or_create_global_step_read()
    if self._global_step is None:
      raise RuntimeError(
          'Global step should be created to use StopAtCheckpointStepHook.')

  def before_run(self, run_context):
    del run_context
    return tf.compat.v1.train.SessionRunArgs(self._global_step)

  def after_run(self, run_context, run_values):
    if run_values.results + 1 < self._last_step:
      return
    if checkpoints.latest_global_step(self._model_dir) >= self._last_step:
      run_context.request_stop()
    else:
      time.sleep(self._wait_after_file_check_secs)


def make_stop_at_checkpoint_step_hook(estimator, last_step,
                                      wait_after_file_check_secs=30):
  """The hook that ends training at `last_step`: the chief's
  `StopAtStepHook`, or a worker's that waits for the chief's checkpoint of
  it (tf.estimator.experimental's)."""
  if estimator.config.is_chief:
    return tf.compat.v1.train.StopAtStepHook(last_step=last_step)
  return _StopAtCheckpointStepHook(
      model_dir=estimator.model_dir, last_step=last_step,
      wait_after_file_check_secs=wait_after_file_check_secs)
