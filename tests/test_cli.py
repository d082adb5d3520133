"""The command line as a newcomer meets it: quick help, scripts by relative path."""
import os
import sys

import pytest

from harness import lanes
from harness import scripts

pytestmark = pytest.mark.subprocess

REPO = os.path.realpath(scripts.REPO)
LANE = lanes.NAME
PYTHON = '%d.%d' % sys.version_info[:2]
# The TPU_FC_PYTHON under which scripts/lane.sh runs in this virtualenv ('' for
# the lane's own Python), or None outside lane.sh's virtualenvs.
LANE_PYTHON = {
    os.path.join(REPO, '.venv-' + LANE): '',
    os.path.join(REPO, '.venv-{}-py{}'.format(LANE, PYTHON)): PYTHON,
}.get(os.path.realpath(sys.prefix))
SCRIPT = '''
import sys
import tensorflow as tf
import tpu_fc
assert tf.compat.v1.tpu.experimental.embedding_column is tpu_fc.embedding_column
print('ran', sys.argv[1:])
'''


def test_help_answers_without_importing_tensorflow(tmp_path):
  result = scripts.run_python(['-X', 'importtime', '-m', 'tpu_fc', '--help'],
                              tmp_path)
  assert result.returncode == 0, result.stderr
  assert result.stdout.startswith('usage: tpu-fc')
  imported = [line.split('|')[-1].strip()
              for line in result.stderr.splitlines() if '|' in line]
  assert 'tpu_fc' in imported
  assert not [name for name in imported if name.startswith('tensorflow')]


@pytest.mark.skipif(LANE_PYTHON is None,
                    reason="runs in scripts/lane.sh's own virtualenvs only")
def test_lane_script_runs_a_script_by_its_relative_path(tmp_path):
  (tmp_path / 'mine.py').write_text(SCRIPT)
  lane = os.path.join(REPO, 'scripts', 'lane.sh')
  env = dict(os.environ, TPU_FC_PYTHON=LANE_PYTHON)
  prefix = scripts.run(
      [lane, LANE, 'python', '-c', 'import sys; print(sys.prefix)'],
      tmp_path, env)
  assert (os.path.realpath(prefix.stdout.strip()) ==  # this very virtualenv
          os.path.realpath(sys.prefix)), prefix.stderr
  result = scripts.run(
      [lane, LANE, 'python', '-m', 'tpu_fc', 'run', 'mine.py', 'x'],
      tmp_path, env)
  assert result.returncode == 0, result.stderr
  assert "ran ['x']" in result.stdout
  missing = scripts.run(
      [lane, LANE, 'python', '-m', 'tpu_fc', 'run', 'nope.py'], tmp_path, env)
  assert missing.returncode != 0
  assert 'no such script nope.py (relative paths start at {})'.format(
      tmp_path) in missing.stderr


@pytest.mark.parametrize('argv, code, text', [
    (['demo', '--steps', '0'], 2, 'argument --steps: must be > 0, got 0'),
    (['cluster', '--log_dir', 'a_file/logs', '--', 'script.py'], 1,
     'tpu-fc cluster: --log_dir a_file/logs cannot be made: Not a directory.'),
], ids=['demo_steps', 'cluster_log_dir_under_a_file'])
def test_command_line_mistakes_get_a_line_not_a_traceback(tmp_path, argv, code,
                                                          text):
  (tmp_path / 'a_file').write_text('')
  result = scripts.run_python(['-m', 'tpu_fc'] + argv, tmp_path)
  assert result.returncode == code
  assert text in result.stderr
  assert 'Traceback' not in result.stderr


def test_run_scripts_multiprocessing_children_see_the_legacy_names(tmp_path):
  """A script run from a folder holding a checkout named `tpu_fc` (no
  `__init__.py` at its top) gets its flags and the legacy names.  A spawn
  child runs the script's top level again in a fresh interpreter; under
  `tpu-fc run` it binds the legacy names first (before, on TF >= 2.16: an
  AttributeError in the child, and a Pool waiting forever), also where that
  checkout shadows the package (the child once imported that folder, and the
  Pool waited forever again)."""
  (tmp_path / 'tpu_fc').mkdir()
  (tmp_path / 'tpu_fc' / 'README.md').write_text('# tpu_fc\n')
  (tmp_path / 'pool.py').write_text(SCRIPT + (
      'import multiprocessing\n'
      'RUN_CONFIG = tf.compat.v1.estimator.tpu.RunConfig  # a legacy name\n'
      'def double(x):\n'
      '  return 2 * x\n'
      "if __name__ == '__main__':\n"
      "  with multiprocessing.get_context('spawn').Pool(1) as pool:\n"
      "    print('doubled', pool.map(double, [1, 2]))\n"))
  result = scripts.run_python(['-m', 'tpu_fc', 'run', 'pool.py', '--flag'],
                              tmp_path)
  assert result.returncode == 0, result.stderr[-2000:]
  assert "ran ['--flag']" in result.stdout
  assert 'doubled [2, 4]' in result.stdout
