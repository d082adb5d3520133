"""The driver's hold on model_dir: its checkpoints only, one trainer at a time.

A `checkpoint` state file may name any path; TF 2.15's Estimator restores from it
and, with `keep_checkpoint_max`, deletes what it names.  tpu_fc refuses such a
file with an error naming it and the path, and touches nothing outside.  A
reader holds the checkpoint it chose, which a trainer's pruning cannot take; a
second trainer on one model_dir fails at once.
"""
import glob
import os
import signal
import socket
import tempfile
import threading

import numpy as np
import pytest

import tpu_fc
from tpu_fc import checkpoint_conversion
from tpu_fc._tf import tf
from tpu_fc.estimator import checkpoints

from harness import scripts

BATCH = 4


def _input_fn(params):
  x = np.arange(BATCH * 2, dtype=np.float32).reshape(BATCH, 2)
  return tf.data.Dataset.from_tensors((x, np.ones([BATCH, 1], np.float32))).repeat()


def _model_fn(features, labels, mode, params):
  del params
  predictions = tf.compat.v1.layers.dense(features, 1)
  if mode == tpu_fc.ModeKeys.PREDICT:
    return tpu_fc.TPUEstimatorSpec(mode, predictions={'y': predictions})
  loss = tf.compat.v1.losses.mean_squared_error(labels, predictions)
  return tpu_fc.TPUEstimatorSpec(
      mode, loss=loss, train_op=tf.compat.v1.train.GradientDescentOptimizer(
          0.01).minimize(loss, tf.compat.v1.train.get_global_step()))


def _estimator(model_dir):
  return tpu_fc.TPUEstimator(
      model_fn=_model_fn, use_tpu=False, train_batch_size=BATCH,
      eval_batch_size=BATCH, predict_batch_size=BATCH,
      config=tpu_fc.RunConfig(model_dir=str(model_dir), keep_checkpoint_max=1,
                              save_checkpoints_steps=1))


@pytest.fixture(name='victim')
def _victim(tmp_path):
  """A checkpoint's files outside the model_dir, and their contents."""
  victim = tmp_path / 'victim'
  victim.mkdir()
  files = {victim / ('precious' + suffix): suffix.encode()
           for suffix in ('.index', '.data-00000-of-00001', '.meta')}
  for path, content in files.items():
    path.write_bytes(content)
  return files


@pytest.mark.parametrize('outside', ['relative', 'absolute'])
def test_a_state_file_naming_a_checkpoint_outside_model_dir_is_refused(
    tmp_path, victim, outside):
  model_dir = tmp_path / 'model'
  estimator = _estimator(model_dir)
  estimator.train(_input_fn, max_steps=1)
  named = ('../victim/precious' if outside == 'relative' else
           str(tmp_path / 'victim' / 'precious'))
  (model_dir / 'checkpoint').write_text(
      'model_checkpoint_path: "model.ckpt-1"\n'
      'all_model_checkpoint_paths: "{}"\n'
      'all_model_checkpoint_paths: "model.ckpt-1"\n'.format(named))
  message = ('The checkpoint state file {} names {}, outside {}: tpu_fc reads, '
             'restores and deletes checkpoints only inside the model_dir'.format(
                 model_dir / 'checkpoint', tmp_path / 'victim' / 'precious',
                 model_dir))
  calls = {
      'train': lambda: estimator.train(_input_fn, max_steps=3),
      'evaluate': lambda: estimator.evaluate(_input_fn, steps=1),
      'predict': lambda: next(estimator.predict(_input_fn)),
      'get_variable_value': lambda: estimator.get_variable_value('global_step'),
      'inspect': lambda: checkpoint_conversion.inspect_checkpoint(
          str(model_dir)),
  }
  for name, call in calls.items():
    with pytest.raises(ValueError) as raised:
      call()
    assert str(raised.value).startswith(message), (name, raised.value)
  for path, content in victim.items():  # train() pruned nothing outside
    assert path.read_bytes() == content
  # An explicit checkpoint is the user's choice.
  explicit = estimator.evaluate(
      _input_fn, steps=1, checkpoint_path=str(model_dir / 'model.ckpt-1'))
  assert explicit['global_step'] == 1


def _step_model_fn(features, labels, mode, params):
  """`_model_fn`, predicting also the global step its checkpoint was saved at."""
  spec = _model_fn(features, labels, mode, params)
  if mode != tpu_fc.ModeKeys.PREDICT:
    return spec
  step = tf.compat.v1.train.get_global_step()
  return spec._replace(predictions=dict(spec.predictions, step=tf.fill(
      [BATCH], step)))


class _Saves(tf.compat.v1.train.CheckpointSaverListener):
  """The steps a trainer saved, waited on by readers."""

  def __init__(self):
    self.steps = []
    self.changed = threading.Condition()

  def after_save(self, session, global_step_value):
    with self.changed:
      self.steps.append(global_step_value)
      self.changed.notify_all()

  def wait_for(self, count, after_step=-1):
    """Until `count` saves of steps after `after_step`."""
    with self.changed:
      assert self.changed.wait_for(
          lambda: sum(step > after_step for step in self.steps) >= count,
          timeout=300), self.steps


class _StopWhen(tf.compat.v1.train.SessionRunHook):

  def __init__(self, event):
    self._event = event

  def after_run(self, run_context, run_values):
    if self._event.is_set():
      run_context.request_stop()


def test_a_trainer_pruning_cannot_take_the_checkpoint_a_reader_chose(
    tmp_path, tf_log):
  """A trainer saves every 5 steps, keeping 2, in another thread; each
  export, evaluate and predict, once it has chosen the latest checkpoint,
  waits (in its input function) until the trainer saved twice more, so that
  what it chose is pruned before it restores it.  Each reads what it chose,
  reports it by its own name, and leaves no file behind."""
  model_dir = tmp_path / 'model'
  config = tpu_fc.RunConfig(model_dir=str(model_dir), keep_checkpoint_max=2,
                            save_checkpoints_steps=5)
  estimator = tpu_fc.TPUEstimator(
      model_fn=_step_model_fn, use_tpu=False, train_batch_size=BATCH,
      eval_batch_size=BATCH, predict_batch_size=BATCH, config=config)
  saves, done, failed = _Saves(), threading.Event(), []

  def train():
    try:
      estimator.train(_input_fn, max_steps=10 ** 9, hooks=[_StopWhen(done)],
                      saving_listeners=[saves])
    except Exception as error:  # pylint: disable=broad-except
      failed.append(error)
      saves.wait_for = lambda *args, error=error, **kwargs: pytest.fail(
          repr(error))

  trainer = threading.Thread(target=train)
  trainer.start()
  chosen_at_most = []

  def after_two_more_saves():
    """The step of the latest checkpoint (the chosen one or a later), once
    two more saves pruned it."""
    latest = tf.train.latest_checkpoint(str(model_dir))
    step = int(latest.rsplit('-', 1)[1])
    saves.wait_for(2, after_step=step)
    assert not os.path.exists(latest + '.index')  # pruned
    chosen_at_most.append(step)

  def receiver_fn():
    after_two_more_saves()
    x = tf.compat.v1.placeholder(tf.float32, [None, 2])
    return tpu_fc.export.TensorServingInputReceiver(x, {'x': x})

  def input_fn(params):
    after_two_more_saves()
    return _input_fn(params).take(1)

  try:
    saves.wait_for(1)
    exported = [estimator.export_saved_model(str(tmp_path / 'export'),
                                             receiver_fn) for _ in range(3)]
    metrics = estimator.evaluate(input_fn)
    prediction = next(estimator.predict(input_fn))
  finally:
    done.set()
    trainer.join()
  assert not failed
  steps = [int(tf.train.load_variable(os.path.join(path.decode(), 'variables',
                                                   'variables'), 'global_step'))
           for path in exported] + [metrics['global_step'], prediction['step']]
  assert all(0 <= step <= at_most
             for step, at_most in zip(steps, chosen_at_most)), (
                 steps, chosen_at_most)
  evaluated = 'model.ckpt-{}'.format(metrics['global_step'])
  summary_paths = [
      value.tensor.string_val[0].decode()
      for path in tf.io.gfile.glob(str(model_dir / 'eval' / 'events*'))
      for event in tf.compat.v1.train.summary_iterator(path)
      for value in event.summary.value if value.tag == 'checkpoint_path']
  assert summary_paths == [str(model_dir / evaluated)]
  restored = [m for m in tf_log if m.startswith('Restoring parameters from')]
  assert len(restored) == 5 and 'Restoring parameters from {}'.format(
      model_dir / evaluated) in restored, restored
  assert not [name for name in os.listdir(model_dir)
              if name.startswith(checkpoints.HELD_DIRECTORY_PREFIX)]
  assert not any('was deleted before' in m for m in tf_log)


class _HeldCopies(tf.compat.v1.train.SessionRunHook):
  """The held copies in the system's temp dir while the session starts."""

  def begin(self):
    self.held = {
        path: sorted(os.listdir(path))
        for path in glob.glob(os.path.join(
            tempfile.gettempdir(), checkpoints.HELD_DIRECTORY_PREFIX + '*'))}


def test_where_hard_links_fail_the_checkpoint_is_held_as_a_copy(tmp_path):
  """A filesystem without hard links (TF's ram://, as gs://): the held copy
  is a copy in the system's temp dir, removed after the read."""
  model_dir = 'ram://' + str(tmp_path / 'model')
  estimator = tpu_fc.TPUEstimator(
      model_fn=_model_fn, use_tpu=False, train_batch_size=BATCH,
      eval_batch_size=BATCH, config=tpu_fc.RunConfig(model_dir=model_dir))
  estimator.train(_input_fn, max_steps=2)
  hook = _HeldCopies()
  assert estimator.evaluate(_input_fn, steps=1, hooks=[hook])[
      'global_step'] == 2
  held = [path for path, files in hook.held.items() if files == [
      'model.ckpt-2.data-00000-of-00001', 'model.ckpt-2.index']]
  assert len(held) == 1 and not os.path.exists(held[0])


class _TrainAgainHook(tf.compat.v1.train.SessionRunHook):
  """Starts a second training run on the model_dir while the first runs."""

  def __init__(self, estimator):
    self._estimator = estimator
    self.error = None

  def after_create_session(self, session, coord):
    del session, coord
    try:
      self._estimator.train(_input_fn, max_steps=5)
    except RuntimeError as error:
      self.error = str(error)


def test_a_second_training_run_on_a_model_dir_fails_at_once(tmp_path):
  model_dir = tmp_path / 'model'
  hook = _TrainAgainHook(_estimator(model_dir))
  _estimator(model_dir).train(_input_fn, max_steps=2, hooks=[hook])
  assert hook.error == (
      'model_dir {} is being trained by another run (pid {} on {}): two runs '
      "would overwrite each other's checkpoints. Wait for it to end, or train "
      'into another model_dir.'.format(model_dir, os.getpid(),
                                       socket.gethostname()))
  assert tf.train.latest_checkpoint(str(model_dir)).endswith('model.ckpt-2')
  _estimator(model_dir).train(_input_fn, max_steps=3)  # released at the end


@pytest.mark.subprocess
def test_a_killed_training_run_leaves_no_lock(tmp_path):
  model_dir = tmp_path / 'model'
  model_dir.mkdir()
  killed = scripts.run_python(
      ['-c', 'import os, signal\n'
       'from tpu_fc.estimator import checkpoints\n'
       'with checkpoints.training_lock({!r}):\n'
       '  os.kill(os.getpid(), signal.SIGKILL)\n'.format(str(model_dir))],
      env=scripts.env())
  assert killed.returncode == -signal.SIGKILL, killed.stderr
  assert (model_dir / '.tpu_fc_training.lock').read_text().startswith('pid ')
  _estimator(model_dir).train(_input_fn, max_steps=1)
  assert tf.train.latest_checkpoint(str(model_dir)).endswith('model.ckpt-1')
