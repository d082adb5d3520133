"""Long run: many small emulated-TPU training steps, resident memory every 1,000 steps.

Not part of the test suite (it takes minutes).  Trains the demo model
(`tpu_fc.demo`: embedding-core, shared and sequence columns, Adagrad) with
checkpoints and summaries on, and reports the process's resident set size (RSS);
the verdict line compares the last report with the one at the end of warm-up.

    scripts/lane.sh latest python scripts/long_run.py --steps 50000
"""
import argparse
import os
import tempfile
import time

from tpu_fc import demo
from tpu_fc._tf import tf


def resident_mib():
  """This process's current resident set size, from /proc (Linux)."""
  with open('/proc/self/status') as status:
    for line in status:
      if line.startswith('VmRSS:'):
        return int(line.split()[1]) / 1024
  raise RuntimeError('no VmRSS in /proc/self/status')


class ResidentMemoryHook(tf.compat.v1.train.SessionRunHook):
  """Records (global step, RSS MiB, seconds) every `every` steps."""

  def __init__(self, every):
    self._every = every
    self._start = time.time()
    self.reports = []

  def begin(self):
    self._global_step = tf.compat.v1.train.get_global_step()

  def before_run(self, run_context):
    return tf.compat.v1.train.SessionRunArgs(self._global_step)

  def after_run(self, run_context, run_values):
    step = run_values.results
    if not self.reports or step // self._every > self.reports[-1][0] // self._every:
      report = (step, resident_mib(), time.time() - self._start)
      self.reports.append(report)
      print('step {:>6}  RSS {:8.1f} MiB  {:6.0f} s'.format(*report), flush=True)


def main():
  parser = argparse.ArgumentParser(description=__doc__)
  parser.add_argument('--steps', type=int, default=50000)
  parser.add_argument('--every', type=int, default=1000)
  parser.add_argument('--warmup_steps', type=int, default=5000)
  parser.add_argument('--model_dir', default=None)
  args = parser.parse_args()
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.WARN)
  model_dir = args.model_dir or tempfile.mkdtemp(prefix='tpu_fc_long_run_')
  features, labels = demo.synthetic_data(4096, seed=0)
  estimator, _ = demo.build_estimator(model_dir)
  hook = ResidentMemoryHook(args.every)
  estimator.train(demo.make_input_fn(features, labels, repeat=True),
                  max_steps=args.steps, hooks=[hook])
  warm = [r for r in hook.reports if r[0] >= args.warmup_steps]
  if len(warm) < 2:
    raise SystemExit('run longer than --warmup_steps to get a verdict')
  growth = warm[-1][1] / warm[0][1] - 1
  print('RSS growth after warm-up (step {} -> {}): {:+.1%} (goal < 5%) {}'.format(
      warm[0][0], warm[-1][0], growth, 'met' if growth < 0.05 else 'not met'))
  print('model_dir: {} (pid {})'.format(model_dir, os.getpid()))


if __name__ == '__main__':
  main()
