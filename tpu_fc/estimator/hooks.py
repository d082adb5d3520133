"""Session hooks the driver adds, as TPUEstimator added them on CPU."""
from tpu_fc._tf import tf
from tpu_fc.estimator import checkpoints


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
