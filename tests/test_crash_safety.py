"""A killed training process loses nothing; a failed step keeps the last checkpoint.

tests/scripts/crash_train.py trains an emulated-TPU model (engine table and dense
weights, shuffled input, checkpoints every 3 steps with the input position) in a
subprocess that SIGKILLs itself at a random step, or a random few milliseconds
into a checkpoint save.  After each kill every checkpoint left in model_dir must
restore, and a restart must finish with exactly the variables of an uninterrupted
run.
"""
import importlib.util
import os
import random

import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf

from harness import scripts
from harness.oracle import outcome

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'scripts',
                      'crash_train.py')
TIMEOUT = 120


def _load_script():
  spec = importlib.util.spec_from_file_location('crash_train', SCRIPT)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


crash_train = _load_script()


def _run(model_dir, *args):
  return scripts.run_python([SCRIPT, str(model_dir)] + [str(a) for a in args],
                            timeout=TIMEOUT)


def _variables(checkpoint):
  """Every tensor of a checkpoint (the input position, a variant, excepted)."""
  reader = tf.train.load_checkpoint(checkpoint)
  return {name: reader.get_tensor(name)
          for name, dtype in reader.get_variable_to_dtype_map().items()
          if dtype != tf.variant}


def _assert_every_checkpoint_restores(model_dir, named_only=False):
  """Each checkpoint's every tensor reads back; the state file names existing ones.

  With `named_only`, only the checkpoints the state names: a save killed before
  naming its checkpoint may leave files that do not read (a restart removes them).
  """
  prefixes = sorted(p[:-len('.index')]
                    for p in tf.io.gfile.glob(os.path.join(str(model_dir),
                                                           '*.ckpt-*.index')))
  state = tf.train.get_checkpoint_state(str(model_dir))
  assert state is not None and prefixes
  named = [os.path.join(str(model_dir), os.path.basename(path))
           for path in state.all_model_checkpoint_paths]
  assert set(named) <= set(prefixes)
  for prefix in named if named_only else prefixes:
    assert 'global_step' in _variables(prefix), prefix
  estimator = crash_train.make_estimator(str(model_dir))
  assert estimator.get_variable_value('global_step') % crash_train.SAVE_EVERY == 0


@pytest.fixture(name='uninterrupted_dir', scope='module')
def _uninterrupted_dir(tmp_path_factory):
  """The model_dir of an uninterrupted run to MAX_STEPS (every checkpoint kept)."""
  model_dir = tmp_path_factory.mktemp('uninterrupted')
  crash_train.train(str(model_dir))
  return model_dir


@pytest.fixture(name='uninterrupted')
def _uninterrupted(uninterrupted_dir):
  """The variables at the end of the uninterrupted run."""
  return _variables(tf.train.latest_checkpoint(str(uninterrupted_dir)))


def _assert_restart_finishes_as_uninterrupted(model_dir, uninterrupted, what):
  """The restart runs in this process: only the kill needs one of its own."""
  _assert_every_checkpoint_restores(model_dir, named_only=True)
  crash_train.train(str(model_dir))
  _assert_every_checkpoint_restores(model_dir)
  final = _variables(tf.train.latest_checkpoint(str(model_dir)))
  assert sorted(final) == sorted(uninterrupted)
  for name, value in uninterrupted.items():
    np.testing.assert_array_equal(final[name], value,
                                  err_msg='{}: {}'.format(what, name))


@pytest.mark.subprocess
def test_killed_at_a_random_step_resumes_exactly(tmp_path, uninterrupted):
  step = random.randrange(2, crash_train.MAX_STEPS)
  killed = _run(tmp_path, '--kill-at-step', step)
  assert killed.returncode == -9, killed.stderr[-3000:]
  _assert_restart_finishes_as_uninterrupted(
      tmp_path, uninterrupted, 'killed at step {}'.format(step))


@pytest.mark.subprocess
def test_killed_during_a_checkpoint_save_resumes_exactly(tmp_path,
                                                         uninterrupted):
  step = random.choice([3, 6, 9])
  delay_ms = random.uniform(0, 5)
  killed = _run(tmp_path, '--kill-in-save', step, delay_ms)
  assert killed.returncode == -9, killed.stderr[-3000:]
  _assert_restart_finishes_as_uninterrupted(
      tmp_path, uninterrupted,
      'killed {:.2f} ms into the save of step {}'.format(delay_ms, step))


def test_without_the_hook_a_restart_replays_the_input(tmp_path, uninterrupted):
  """The position matters: restarting from a step without it diverges."""
  estimator = crash_train.make_estimator(str(tmp_path))
  estimator.train(crash_train.input_fn, max_steps=crash_train.SAVE_EVERY)
  estimator.train(crash_train.input_fn, max_steps=crash_train.MAX_STEPS)
  final = _variables(estimator.latest_checkpoint())
  assert any(not np.array_equal(final[name], value)
             for name, value in uninterrupted.items())


def test_a_failed_step_keeps_the_last_checkpoint(tmp_path, uninterrupted_dir):
  """An out-of-range id at step 5 fails training; the checkpoints before stay whole."""
  error = outcome(crash_train.train, str(tmp_path), bad_step=4)
  assert error is not None and error[0] is tf.errors.InvalidArgumentError
  assert error[1].startswith(
      'Feature ids (table tbl_ids): ids [11] are out of range [0, 11)')
  _assert_every_checkpoint_restores(tmp_path)
  latest = tf.train.latest_checkpoint(str(tmp_path))
  assert latest.endswith('model.ckpt-3')
  kept = _variables(latest)
  for name, value in _variables(
      os.path.join(str(uninterrupted_dir), 'model.ckpt-3')).items():
    np.testing.assert_array_equal(kept[name], value, err_msg=name)
  # Training resumes from it (here with new input, so without the position,
  # which would bring back the saved input pipeline, bad batch included).
  estimator = crash_train.make_estimator(str(tmp_path))
  estimator.train(crash_train.input_fn, max_steps=4)
  assert estimator.get_variable_value('global_step') == 4


def test_hook_with_tensor_input_warns_and_trains(tmp_path, tf_log):
  estimator = crash_train.make_estimator(str(tmp_path))

  def tensor_input_fn(params):
    return tf.compat.v1.data.make_one_shot_iterator(
        crash_train.input_fn(params)).get_next()

  estimator.train(tensor_input_fn, max_steps=1, hooks=[
      tpu_fc.estimator.hooks.CheckpointInputPipelineHook(estimator)])
  assert estimator.get_variable_value('global_step') == 1
  assert any('there is no input position to save' in m for m in tf_log)


def test_a_restart_removes_what_a_cut_short_save_left(tmp_path, caplog):
  """Unnamed, unreadable files past the last checkpoint go; the rest stays."""
  estimator = crash_train.make_estimator(str(tmp_path))
  estimator.train(crash_train.input_fn, max_steps=crash_train.SAVE_EVERY)
  last = estimator.latest_checkpoint()
  cut_short = os.path.join(str(tmp_path), 'model.ckpt-99')
  readable = os.path.join(str(tmp_path), 'model.ckpt-98')
  for suffix in ('.index', '.data-00000-of-00001'):
    with open(last + suffix, 'rb') as f:
      data = f.read()
    with open(cut_short + suffix, 'wb') as f:
      f.write(data[:len(data) // 3])  # as a kill in the middle of writing
    with open(readable + suffix, 'wb') as f:
      f.write(data)
  estimator.train(crash_train.input_fn, max_steps=crash_train.SAVE_EVERY + 1)
  assert not tf.io.gfile.glob(cut_short + '.*')
  assert len(tf.io.gfile.glob(readable + '.*')) == 2
  assert 'Removed {}, a checkpoint whose save was cut short'.format(
      cut_short) in caplog.text
  assert estimator.get_variable_value('global_step') == crash_train.SAVE_EVERY + 1
