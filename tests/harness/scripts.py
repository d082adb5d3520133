"""Running a process from a test: a Python script, `python -m tpu_fc ...`, a
console script.

Each pays a TensorFlow import, so a test that runs one carries
`@pytest.mark.subprocess` (`pytest -m "not subprocess"` leaves them out);
these functions refuse to run from a test without it (tests/conftest.py tells
them which test runs).  A script run with `env()` imports tpu_fc from this
checkout and the harness (`import harness.models`), never a test module.
"""
import os
import subprocess
import sys

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(TESTS)
SCRIPTS = os.path.join(TESTS, 'scripts')  # scripts tests run in a process

# The pytest item running now (set by tests/conftest.py), None outside pytest.
current_test = None


def env(**variables):
  """os.environ with this checkout and the harness first on PYTHONPATH, and
  `variables`."""
  path = os.pathsep.join([REPO, TESTS] + [
      part for part in [os.environ.get('PYTHONPATH')] if part])
  return dict(os.environ, PYTHONPATH=path, **variables)


def _check_marked():
  if (current_test is not None and
      current_test.get_closest_marker('subprocess') is None):
    raise AssertionError(
        '{} runs a process: mark it @pytest.mark.subprocess'.format(
            current_test.nodeid))


def run(command, cwd=None, env=None, timeout=300, check=False):  # pylint: disable=redefined-outer-name
  """`command` run to its end, its output captured as text."""
  _check_marked()
  return subprocess.run(command, cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=timeout, check=check)


def run_python(args, cwd=None, **kwargs):
  """`run` of this Python (the lane's) with `args`."""
  return run([sys.executable] + list(args), cwd, **kwargs)


def popen_python(args, **kwargs):
  """This Python with `args`, started (`subprocess.Popen`'s `kwargs`)."""
  _check_marked()
  return subprocess.Popen([sys.executable] + list(args), **kwargs)
