"""`python -m tpu_fc demo`, the README's main command, on a few steps."""
import logging
import math
import os
import re
import tempfile

import numpy as np
import pytest

from tpu_fc import __main__ as command_line
from tpu_fc import demo
from tpu_fc._tf import tf

from harness import scripts


def test_demo_trains_exports_and_serves(tmp_path, capsys):
  model_dir = tmp_path / 'model'
  result = demo.main(model_dir=str(model_dir), steps=20)
  out = capsys.readouterr().out
  assert result.metrics['global_step'] == 20
  assert math.isfinite(result.metrics['loss'])
  assert 'tbl_item_query_item_shared_embedding' in out
  assert 'Before training (step 0):' in out
  assert 'After training (step 20):' in out
  assert re.search(
      r'Trained 20 steps of 64 examples in [\d.]+s: \d+ examples/s', out)
  assert result.examples_per_second > 0
  # The export is in model_dir, named, and serves what estimator.predict gives.
  assert os.path.isfile(os.path.join(result.export_dir, 'saved_model.pb'))
  assert result.export_dir.startswith(str(model_dir / 'export'))
  assert 'Exported a SavedModel (CPU lookup): {}\n'.format(
      result.export_dir) in out
  np.testing.assert_allclose(result.served, result.predicted, rtol=0,
                             atol=1e-5)
  assert sorted(set(result.labels)) == [0, 1]
  for label, probability in zip(result.labels, result.served):
    assert '\n  {:>5}  {:.3f}\n'.format(int(label), probability) in out
  assert 'Same as estimator.predict: max difference' in out


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
  """tempfile's directory, empty: what a run leaves there can be seen."""
  monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
  return tmp_path


def test_a_failing_demo_removes_its_temporary_dir_and_restores_tfs_logger(
    temp_root):
  """The demo quiets TF's logger while it runs, not for its caller after it
  (a test's log capture, say), and removes its temporary dir, even when it
  fails (here in train(), after evaluate() wrote to the dir)."""
  logger = tf.get_logger()
  before = logger.level
  logger.setLevel(logging.INFO)
  try:
    with pytest.raises(ValueError, match='Must specify steps > 0'):
      demo.main(steps=0)
    assert logger.level == logging.INFO
  finally:
    logger.setLevel(before)
  # (AutoGraph writes the functions it converts, in whatever test first
  # converts them, into tempfile's dir, and removes them at exit: TF's, not
  # the demo's)
  assert not [path for path in temp_root.iterdir()
              if not path.name.startswith('__autograph_generated_file')]


# A warning or error line of TF's C++ logs: TF 2.21's ('E0000 00:00:...')
# or TF 2.15's ('2026-01-01 00:00:00.000000: E external/...').
_NATIVE_WARNING_OR_ERROR = re.compile(
    r'^(?:[WEF]\d{4} |\d{4}-\d\d-\d\d [\d:.]+: [WEF] )')


@pytest.mark.subprocess
def test_the_demo_command_shows_only_the_demo_and_leaves_nothing_behind(
    tmp_path):
  """`python -m tpu_fc demo` as users run it, without --model_dir: it opens
  with the demo, quiets TF's C++ logs in its own process (here, without a
  GPU, TF 2.21 logs `failed call to cuInit` as an error, TF 2.15 its CUDA
  factories' registrations), and its temporary dir, export included, is gone
  at the end (TMPDIR, also the working dir, is empty)."""
  temp_dir = tmp_path / 'tmp'
  temp_dir.mkdir()
  env = scripts.env(TMPDIR=str(temp_dir))
  env.pop('TF_CPP_MIN_LOG_LEVEL', None)  # (scripts/lane.sh sets it)
  result = scripts.run_python(['-m', 'tpu_fc', 'demo', '--steps', '1'],
                              cwd=str(temp_dir), env=env, timeout=600)
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith('tpu_fc demo, TensorFlow')
  assert [line for line in result.stderr.splitlines()
          if _NATIVE_WARNING_OR_ERROR.match(line)] == []
  assert 'a temporary dir, removed at the end' in result.stdout
  assert 'Exported a SavedModel (CPU lookup) into the temporary dir' in (
      result.stdout)
  assert 'Same as estimator.predict' in result.stdout
  assert not list(temp_dir.iterdir())


def test_the_demo_keeps_a_native_log_level_the_user_set(monkeypatch):
  monkeypatch.setenv('TF_CPP_MIN_LOG_LEVEL', '0')
  command_line._quiet_native_logs()  # pylint: disable=protected-access
  assert os.environ['TF_CPP_MIN_LOG_LEVEL'] == '0'
  monkeypatch.delenv('TF_CPP_MIN_LOG_LEVEL')
  command_line._quiet_native_logs()  # pylint: disable=protected-access
  assert os.environ['TF_CPP_MIN_LOG_LEVEL'] == '3'
