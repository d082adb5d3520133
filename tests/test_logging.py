"""Progress and warning logs, as TF 2.15's TPUEstimator wrote them, on every lane.

With `TPUConfig(iterations_per_loop=5)` and `RunConfig(log_step_count_steps=10)`
TF 2.15's TPUEstimator on a TPU (tpu_estimator.py:2829-2840, 3323-3336) logged:

* `loss = ..., step = ...` by a LoggingTensorHook every ceil(10 / 5) = 2 session
  runs, each run a loop of 5 steps, the step read after the loop: runs 1, 3, 5,
  so steps 5, 15 and 25 of max_steps=30;
* `global_step/sec` and `examples/sec` by its ExamplesPerSecondHook, every 2
  global steps counted in runs of 5 (`_set_steps_per_run`): at the end of every
  run but the first (which only starts the clock), steps 10, 15, 20, 25, 30.
"""
import re

import pytest

from harness import estimators
from harness import inputs
from harness import scripts

pytestmark = pytest.mark.filterwarnings(
    'ignore:`tf.layers.dense` is deprecated')


def train(model_dir, use_tpu, train_input_fn=inputs.linear):
  """Trains to step 30 with iterations_per_loop=5, log_step_count_steps=10."""
  estimators.logged(model_dir, use_tpu).train(train_input_fn, max_steps=30)


def loss_steps(lines):
  return [int(m.group(1)) for m in
          (re.search(r'loss = \S+, step = (\d+)', line) for line in lines) if m]


def count(prefix, lines):
  return sum(line.startswith(prefix) for line in lines)


def test_tpu_logs_loss_at_loop_ends_and_rates(tmp_path, tf_log):
  train(tmp_path, use_tpu=True)
  assert loss_steps(tf_log) == [5, 15, 25]
  assert count('global_step/sec: ', tf_log) == 5
  assert count('examples/sec: ', tf_log) == 5


def test_tpu_without_loop_logs_loss_every_loop_of_steps(tmp_path, tf_log):
  """One step per run (tensor input): the loss still every 2 loops of 5 steps.

  Runs 1, 11 and 21, the step read after each; the rates, as TF counts them,
  every 2 steps past the first run (3, 5, ..., 29).
  """
  train(tmp_path, use_tpu=True, train_input_fn=inputs.linear_batch)
  assert loss_steps(tf_log) == [1, 11, 21]
  assert count('global_step/sec: ', tf_log) == 14
  assert count('examples/sec: ', tf_log) == 14


def test_cpu_logs_rates_only(tmp_path, tf_log):
  """use_tpu=False: one step per run, the rates as in TF 2.15 and no loss line.

  The rates every 2 steps past the first run (3, 5, ..., 29), as TF 2.15's
  TPUEstimator(use_tpu=False) (test_estimator_vs_legacy compares them with
  TF's); Estimator's loss line is off, as TF's TPUEstimator turned it off.
  """
  train(tmp_path, use_tpu=False)
  assert loss_steps(tf_log) == []
  assert count('global_step/sec: ', tf_log) == 14
  assert count('examples/sec: ', tf_log) == 14


SCRIPT = '''
import sys
from harness import estimators
from harness import inputs
from tpu_fc._tf import tf
tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.INFO)
estimators.logged(sys.argv[1], use_tpu=True).train(  # logs the emulation
    inputs.linear, max_steps=30)                      # warning first
tf.compat.v1.logging.info('probe line')
'''


@pytest.mark.subprocess
def test_each_line_printed_once(tmp_path):
  """In a fresh process: tpu_fc warns through TF's logger, not absl's.

  absl, logging before it is set up, adds a handler to the root logger, to
  which TF's logger passes its lines on: each was printed twice.
  """
  script = tmp_path / 'train.py'
  script.write_text(SCRIPT)
  proc = scripts.run_python([str(script), str(tmp_path / 'model')],
                            env=scripts.env(), timeout=120)
  assert proc.returncode == 0, proc.stderr[-4000:]
  lines = [line.split(':', 2)[2] for line in proc.stderr.splitlines()
           if line.startswith(('INFO:tensorflow:', 'WARNING:tensorflow:'))]
  assert count('No TPU: tpu_fc emulates the TPU', lines) == 1
  assert loss_steps(lines) == [5, 15, 25]
  assert count('examples/sec: ', lines) == 5
  assert proc.stderr.count('probe line') == 1
