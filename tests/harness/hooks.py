"""Session hooks that record what a run did, for tests to compare."""
from tpu_fc._tf import tf


class SessionSteps(tf.compat.v1.train.SessionRunHook):
  """(global step at the end, session.run calls) of every session it runs in."""

  def __init__(self):
    self.sessions = []

  def begin(self):
    self._global_step = tf.compat.v1.train.get_global_step()
    self._runs = 0

  def after_run(self, run_context, run_values):
    self._runs += 1

  def end(self, session):
    self.sessions.append((int(session.run(self._global_step)), self._runs))
