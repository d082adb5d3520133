"""`python -m tpu_fc demo`, the README's main command, on a few steps."""
import logging
import os
import re
import tempfile

import pytest

from tpu_fc import __main__ as command_line
from tpu_fc import demo
from tpu_fc._tf import tf

from harness import scripts


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
def test_the_demo_command_trains_exports_serves_and_leaves_nothing_behind(
    tmp_path):
  """`python -m tpu_fc demo` as users run it, without --model_dir: it opens
  with the demo, quiets TF's C++ logs in its own process (here, without a
  GPU, TF 2.21 logs `failed call to cuInit` as an error, TF 2.15 its CUDA
  factories' registrations), trains, evaluates, exports and serves what
  estimator.predict gave, and its temporary dir, export included, is gone
  at the end (TMPDIR, also the working dir, is empty)."""
  temp_dir = tmp_path / 'tmp'
  temp_dir.mkdir()
  env = scripts.env(TMPDIR=str(temp_dir))
  env.pop('TF_CPP_MIN_LOG_LEVEL', None)  # (scripts/lane.sh sets it)
  result = scripts.run_python(['-m', 'tpu_fc', 'demo', '--steps', '2'],
                              cwd=str(temp_dir), env=env, timeout=600)
  assert result.returncode == 0, result.stderr
  out = result.stdout
  assert out.startswith('tpu_fc demo, TensorFlow')
  assert [line for line in result.stderr.splitlines()
          if _NATIVE_WARNING_OR_ERROR.match(line)] == []
  assert 'a temporary dir, removed at the end' in out
  assert 'tbl_item_query_item_shared_embedding' in out
  assert re.search(r'^Before training \(step 0\): +eval loss \d+\.\d+ ', out,
                   re.MULTILINE), out
  assert re.search(r'^After training \(step 2\): +eval loss \d+\.\d+ ', out,
                   re.MULTILINE), out
  assert re.search(r'^Trained 2 steps of 64 examples in [\d.]+s: [1-9]\d* '
                   r'examples/s', out, re.MULTILINE), out
  assert 'Exported a SavedModel (CPU lookup) into the temporary dir' in out
  # Three held-out rows of each label, served, then how far from predict().
  served = re.findall(r'^ +([01]) +(\d\.\d{3})$', out, re.MULTILINE)
  assert sorted(label for label, _ in served) == ['0'] * 3 + ['1'] * 3, out
  assert all(0 < float(probability) < 1 for _, probability in served)
  difference = re.search(
      r'^Same as estimator.predict: max difference (\S+)$', out, re.MULTILINE)
  assert difference and float(difference.group(1)) <= 1e-5, out
  assert not list(temp_dir.iterdir())


def test_the_demo_keeps_a_native_log_level_the_user_set(monkeypatch):
  monkeypatch.setenv('TF_CPP_MIN_LOG_LEVEL', '0')
  command_line._quiet_native_logs()  # pylint: disable=protected-access
  assert os.environ['TF_CPP_MIN_LOG_LEVEL'] == '0'
  monkeypatch.delenv('TF_CPP_MIN_LOG_LEVEL')
  command_line._quiet_native_logs()  # pylint: disable=protected-access
  assert os.environ['TF_CPP_MIN_LOG_LEVEL'] == '3'
