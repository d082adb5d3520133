"""Runs one of tensorflow-estimator's own test files, unchanged, against tpu_fc.

    scripts/lane.sh legacy python scripts/upstream_tests/estimator_tests.py \\
        /tmp/tpu_estimator_test.py [--timeout 60] [--only REGEX] [--tf]

The test file is TF's, extracted unchanged from the tensorflow/estimator
mirror, e.g.

    git -C /work/.mirror/tensorflow+estimator/repo show \\
        v2.15.0:tensorflow_estimator/python/estimator/tpu/tpu_estimator_test.py \\
        > /tmp/tpu_estimator_test.py

Legacy lane only (the test files import tensorflow_estimator).  Before the
test module is imported, tpu_fc's classes are bound onto the
tensorflow_estimator modules the tests import them from (`_BINDINGS`), so
`tpu_estimator.TPUEstimator` in the test is tpu_fc's; `--tf` binds nothing
(TF's own code, to tell which failures are a CPU's).  As TF's BUILD runs them:
`--test_num_shards=2` (the flag the TPU test files define; every test starts
with the flags as parsed, so one test's change of a flag does not leak into
the next) and, as their `__main__` does, `disable_v2_behavior()`.

Each test runs with a timeout (`--timeout` seconds): the tests run in a child
process that a hung test kills (`faulthandler`); the runner records it as
TIMEOUT and goes on with the rest in a new child.  It prints one line per
test (PASS / FAIL / ERROR / SKIP / TIMEOUT, seconds) and the counts.
"""
import argparse
import importlib
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import types

# This checkout's tpu_fc, whatever the virtualenv's editable install points at.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

# tensorflow_estimator module -> {name there: tpu_fc's object, 'module:attr'}.
# (The tests' inputs, e.g. `numpy_io.numpy_input_fn`, whose queue runners
# some tests are about, stay TF's.)
_BINDINGS = {
    'tensorflow_estimator.python.estimator.tpu.tpu_estimator': {
        name: 'tpu_fc:' + name for name in (
            'TPUEstimator', 'TPUEstimatorSpec', 'EmbeddingConfigSpec',
            'AdagradParameters', 'AdamParameters', 'FtrlParameters',
            'StochasticGradientDescentParameters')},
    'tensorflow_estimator.python.estimator.tpu.tpu_config': {
        name: 'tpu_fc:' + name
        for name in ('RunConfig', 'TPUConfig', 'InputPipelineConfig')},
    'tensorflow_estimator.python.estimator.tpu.util': {
        'parse_iterations_per_loop':
            'tpu_fc.estimator.tpu.tpu_config:parse_iterations_per_loop'},
    'tensorflow_estimator.python.estimator.estimator': {
        name: 'tpu_fc.estimator.estimator:' + name for name in (
            'Estimator', 'EstimatorV2',
            '_load_global_step_from_checkpoint_dir')},
    'tensorflow_estimator.python.estimator.run_config': {
        'RunConfig': 'tpu_fc.estimator.run_config:RunConfig'},
    'tensorflow_estimator.python.estimator.model_fn': {
        'EstimatorSpec': 'tpu_fc:EstimatorSpec'},
    'tensorflow_estimator.python.estimator.export.export': {
        name: 'tpu_fc.export:' + name for name in (
            'build_parsing_serving_input_receiver_fn',
            'build_raw_serving_input_receiver_fn', 'ServingInputReceiver',
            'TensorServingInputReceiver')},
}
# (tensorflow_estimator module, name) -> the tpu_fc module that reads it: the
# tests' writes of it reach tpu_fc's (TF's private switches tpu_fc keeps).
_FORWARDED = {
    ('tensorflow_estimator.python.estimator.tpu.tpu_estimator',
     '_WRAP_INPUT_FN_INTO_WHILE_LOOP'): 'tpu_fc.estimator.tpu.tpu_estimator',
}
_ARGV = ['--test_num_shards=2']


class _Forwarding(types.ModuleType):
  """A tensorflow_estimator module whose `_FORWARDED` names, when set, are set
  on tpu_fc's module too."""

  def __setattr__(self, name, value):
    super().__setattr__(name, value)
    target = _FORWARDED.get((self.__name__, name))
    if target:
      setattr(importlib.import_module(target), name, value)


def _bind():
  """Binds tpu_fc's classes onto tensorflow_estimator's modules."""
  import tpu_fc  # pylint: disable=g-import-not-at-top,unused-import
  for module_name, names in _BINDINGS.items():
    module = importlib.import_module(module_name)
    for name, target in names.items():
      target_module, attribute = target.split(':')
      setattr(module, name,
              getattr(importlib.import_module(target_module), attribute))
  for module_name, name in _FORWARDED:
    module = importlib.import_module(module_name)
    module.__class__ = _Forwarding
    setattr(module, name, getattr(module, name))


def _test_cases(suite):
  for test in suite:
    if hasattr(test, '__iter__'):
      yield from _test_cases(test)
    else:
      yield test


def _load(path, bind):
  """(module, {test id: test case}) of the test file at `path`."""
  import unittest  # pylint: disable=g-import-not-at-top
  if bind:
    _bind()
  from absl import flags  # pylint: disable=g-import-not-at-top
  sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
  module = importlib.import_module(
      os.path.splitext(os.path.basename(path))[0])
  flags.FLAGS([sys.argv[0]] + _ARGV, known_only=True)
  import tensorflow as tf  # pylint: disable=g-import-not-at-top
  tf.compat.v1.disable_v2_behavior()
  suite = unittest.defaultTestLoader.loadTestsFromModule(module)
  return {_short_id(test): test for test in _test_cases(suite)}


def _short_id(test):
  """`Class.method` (a parameterized test's method name has its index)."""
  return '{}.{}'.format(type(test).__name__, test._testMethodName)  # pylint: disable=protected-access


def _child(path, bind, names, timeout, results):
  """Runs tests `names` one by one, appending a JSON line per test."""
  import faulthandler  # pylint: disable=g-import-not-at-top
  import unittest  # pylint: disable=g-import-not-at-top
  from absl import flags  # pylint: disable=g-import-not-at-top
  tests = _load(path, bind)
  parsed = {name: flags.FLAGS[name].value for name in flags.FLAGS
            if name.startswith('test_')}
  for name in names:
    with open(results, 'a') as f:
      f.write(json.dumps({'test': name, 'status': 'START'}) + '\n')
    for flag, value in parsed.items():
      setattr(flags.FLAGS, flag, value)
    faulthandler.dump_traceback_later(timeout, exit=True)
    start = time.time()
    result = unittest.TestResult()
    tests[name].run(result)
    faulthandler.cancel_dump_traceback_later()
    status, detail = 'PASS', ''
    for kind, outcomes in (('SKIP', result.skipped), ('FAIL', result.failures),
                           ('ERROR', result.errors)):
      if outcomes:
        status, detail = kind, str(outcomes[0][1])
    if result.expectedFailures:
      status = 'PASS'
    with open(results, 'a') as f:
      f.write(json.dumps({'test': name, 'status': status,
                          'seconds': round(time.time() - start, 1),
                          'detail': detail[-3000:]}) + '\n')


def _run(path, bind, names, timeout, verbose):
  """Runs `names` in children, restarting after a timeout; returns
  {test: (status, seconds, detail)}."""
  outcomes = {}
  pending = list(names)
  while pending:
    with tempfile.NamedTemporaryFile(suffix='.jsonl', delete=False) as f:
      results = f.name
    command = [sys.executable, os.path.abspath(__file__), path, '--child',
               results, '--timeout', str(timeout)] + (
                   [] if bind else ['--tf'])
    child = subprocess.Popen(command, stdin=subprocess.PIPE, text=True,
                             stdout=None if verbose else subprocess.DEVNULL,
                             stderr=None if verbose else subprocess.DEVNULL)
    child.stdin.write('\n'.join(pending))
    child.stdin.close()
    started, read = None, 0
    while True:  # each test's outcome as soon as the child writes it
      finished = child.poll() is not None
      with open(results) as f:
        lines = f.readlines()
      complete = [line for line in lines if line.endswith('\n')]
      for line in complete[read:]:
        record = json.loads(line)
        if record['status'] == 'START':
          started, started_at = record['test'], time.time()
          continue
        started = None
        outcomes[record['test']] = (record['status'], record['seconds'],
                                    record['detail'])
        _report(record['test'], *outcomes[record['test']])
      read = len(complete)
      if finished:
        break
      time.sleep(0.5)
    os.remove(results)
    if started is not None:  # killed by its timeout, or crashed
      seconds = round(time.time() - started_at, 1)
      outcomes[started] = ('TIMEOUT' if seconds >= timeout - 1 else 'CRASH',
                           seconds, 'the child exited with {}'.format(
                               child.returncode))
      _report(started, *outcomes[started])
    elif not outcomes.keys() >= set(pending):
      for name in pending:
        if name not in outcomes:  # the child could not even load the tests
          outcomes[name] = ('ERROR', 0.0, 'child process failed')
          _report(name, *outcomes[name])
    pending = [name for name in pending if name not in outcomes]
  return outcomes


def _report(name, status, seconds, detail):
  print('{:8s} {:6.1f}s {}'.format(status, seconds, name), flush=True)
  if status in ('FAIL', 'ERROR') and detail:
    last = [line for line in detail.strip().splitlines() if line.strip()][-1]
    print('           ' + last[:300], flush=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('path', help='an unchanged tensorflow-estimator test file')
  parser.add_argument('--timeout', type=float, default=60,
                      help='seconds each test may run (default 60)')
  parser.add_argument('--only', default='',
                      help='a regex: run only the tests whose id matches it')
  parser.add_argument('--tf', action='store_true',
                      help="TF's own classes (bind nothing)")
  parser.add_argument('--verbose', action='store_true',
                      help="show the tests' output")
  parser.add_argument('--child', help=argparse.SUPPRESS)
  args = parser.parse_args()
  os.environ.setdefault('TEST_TMPDIR', tempfile.mkdtemp(prefix='tf_tests_'))
  if args.child:
    sys.argv = sys.argv[:1]
    _child(args.path, not args.tf, sys.stdin.read().split(), args.timeout,
           args.child)
    return
  # The test ids, listed by a child (the parent imports no TensorFlow).
  listing = subprocess.run(
      [sys.executable, '-c',
       'import sys; sys.argv = sys.argv[:1]; import runpy; '
       'm = runpy.run_path({!r}); print("\\n".join(m["_load"]({!r}, {!r})))'
       .format(os.path.abspath(__file__), args.path, not args.tf)],
      capture_output=True, text=True, check=True)
  # (TF's `TestCase.test_session` is no test: TF skips it; left out.)
  names = [line for line in listing.stdout.split('\n')
           if re.fullmatch(r'[\w.]+', line) and re.search(args.only, line)
           and not line.endswith('.test_session')]
  outcomes = _run(args.path, not args.tf, names, args.timeout, args.verbose)
  counts = {}
  for status, _, _ in outcomes.values():
    counts[status] = counts.get(status, 0) + 1
  print('{}: {} tests, {}'.format(
      os.path.basename(args.path), len(outcomes),
      ', '.join('{} {}'.format(count, status)
                for status, count in sorted(counts.items()))))


if __name__ == '__main__':
  main()
