"""The driver's hold on model_dir: its checkpoints only, one trainer at a time.

A `checkpoint` state file may name any path; TF 2.15's Estimator restores from it
and, with `keep_checkpoint_max`, deletes what it names.  tpu_fc refuses such a
file with an error naming it and the path, and touches nothing outside.  A
reader whose checkpoint a trainer pruned reads the newest; a second trainer on
one model_dir fails at once.
"""
import os
import signal
import socket
import subprocess
import sys

import numpy as np
import pytest

import tpu_fc
from tpu_fc import checkpoint_conversion
from tpu_fc._tf import tf

BATCH = 4
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


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


def _prune_latest_once(model_dir, pruned):
  """As a trainer saving often does, once: saves a newer checkpoint
  (model.ckpt-5, with the latest's values) and prunes the latest."""
  if pruned:
    return
  latest = tf.train.latest_checkpoint(str(model_dir))
  for path in tf.io.gfile.glob(latest + '.*'):
    tf.io.gfile.copy(path, path.replace('model.ckpt-2', 'model.ckpt-5'))
    tf.io.gfile.remove(path)
  tf.compat.v1.train.update_checkpoint_state(
      str(model_dir), str(model_dir / 'model.ckpt-5'))
  pruned.append(latest)


class _PruneLatestHook(tf.compat.v1.train.SessionRunHook):
  """Prunes between the reader's choice of a checkpoint and its restore."""

  def __init__(self, model_dir):
    self._model_dir = model_dir
    self.pruned = []

  def begin(self):
    _prune_latest_once(self._model_dir, self.pruned)


@pytest.mark.parametrize('read', ['evaluate', 'predict', 'export'])
def test_a_checkpoint_pruned_before_it_is_read_is_replaced_by_the_latest(
    tmp_path, read, tf_log):
  model_dir = tmp_path / 'model'
  estimator = tpu_fc.TPUEstimator(
      model_fn=_model_fn, use_tpu=False, train_batch_size=BATCH,
      eval_batch_size=BATCH, predict_batch_size=BATCH,
      config=tpu_fc.RunConfig(model_dir=str(model_dir), keep_checkpoint_max=2,
                              save_checkpoints_steps=1))
  estimator.train(_input_fn, max_steps=2)
  kernel, bias = (estimator.get_variable_value('dense/' + name)
                  for name in ('kernel', 'bias'))
  hook = _PruneLatestHook(model_dir)
  if read == 'evaluate':
    assert estimator.evaluate(_input_fn, steps=1, hooks=[hook])[
        'global_step'] == 2
  elif read == 'predict':
    x = np.arange(BATCH * 2, dtype=np.float32).reshape(BATCH, 2)
    prediction = next(estimator.predict(_input_fn, hooks=[hook]))['y']
    np.testing.assert_allclose(prediction, x[0] @ kernel + bias, rtol=1e-6)
  else:
    def receiver_fn():
      _prune_latest_once(model_dir, hook.pruned)
      x = tf.compat.v1.placeholder(tf.float32, [None, 2])
      return tpu_fc.export.TensorServingInputReceiver(x, {'x': x})
    export_dir = estimator.export_saved_model(str(tmp_path / 'export'),
                                              receiver_fn)
    assert os.listdir(tmp_path / 'export') == [os.path.basename(
        export_dir.decode())]
  assert hook.pruned == [str(model_dir / 'model.ckpt-2')]
  assert any('Checkpoint {} was deleted before it was read'.format(
      hook.pruned[0]) in message for message in tf_log)


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


def test_a_killed_training_run_leaves_no_lock(tmp_path):
  model_dir = tmp_path / 'model'
  model_dir.mkdir()
  killed = subprocess.run(
      [sys.executable, '-c', 'import os, signal\n'
       'from tpu_fc.estimator import checkpoints\n'
       'with checkpoints.training_lock({!r}):\n'
       '  os.kill(os.getpid(), signal.SIGKILL)\n'.format(str(model_dir))],
      capture_output=True, text=True, timeout=300, check=False,
      env=dict(os.environ, PYTHONPATH=REPO + os.pathsep +
               os.environ.get('PYTHONPATH', '')))
  assert killed.returncode == -signal.SIGKILL, killed.stderr
  assert (model_dir / '.tpu_fc_training.lock').read_text().startswith('pid ')
  _estimator(model_dir).train(_input_fn, max_steps=1)
  assert tf.train.latest_checkpoint(str(model_dir)).endswith('model.ckpt-1')
