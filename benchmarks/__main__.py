"""`python -m benchmarks`: the full run (about 20 minutes on 2 cores), or --quick."""
import argparse
import json
import os
import shlex
import sys

from benchmarks import report
from benchmarks import run

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'results')


def parse_args(argv):
  parser = argparse.ArgumentParser(prog='python -m benchmarks',
                                   description=__doc__)
  parser.add_argument('--quick', action='store_true',
                      help="the full run's tables, fewer steps and repetitions, "
                      'dim-16 targets only: about 5 minutes')
  parser.add_argument('--scale', action='store_true',
                      help='also the scaling sweep: one 64-wide table of '
                      '1/100, 1/10 and all of --scale-rows rows, at 1/4 and '
                      'all of --batch-size (the largest needs 6+ GiB per '
                      'path); step times and peak RSS kept in OUT/scale.json')
  parser.add_argument('--scale-rows', type=int, default=10_000_000)
  parser.add_argument('--out', default=DEFAULT_OUT,
                      help='folder for results_<mode>.json/.md/.png (the chart)')
  parser.add_argument('--paths', nargs='+', choices=list(run.TRAINING_PATHS),
                      help='measure only these training paths')
  parser.add_argument('--dims', nargs='+', type=int, choices=(16, 64),
                      help='only the workloads of these embedding dims')
  parser.add_argument('--no-serving', action='store_true')
  parser.add_argument('--legacy-python',
                      help='interpreter with TF 2.15 + tensorflow-estimator '
                      'for legacy_cpu (default: this one, if it has them)')
  parser.add_argument('--vocabulary-cap', type=int,
                      help='rows per table at most (default 1M, quick too)')
  parser.add_argument('--batch-size', type=int, default=4096)
  parser.add_argument('--num-batches', type=int,
                      help='distinct batches, cycled (default 16, quick 4)')
  parser.add_argument('--iterations-per-loop', type=int)
  parser.add_argument('--warmup-steps', type=int)
  parser.add_argument('--steps-per-rep', type=int)
  parser.add_argument('--reps', type=int)
  parser.add_argument('--max-warmup-seconds', type=float,
                      help='end warm-up after 3 runs once this long '
                      '(default 15, quick 8)')
  parser.add_argument('--max-rep-seconds', type=float,
                      help='end a repetition after 1 run once this long '
                      '(default 3, quick 1.5)')
  parser.add_argument('--threads', type=int, default=2,
                      help='intra- and inter-op threads of every path')
  parser.add_argument('--num-shards', type=int, default=1,
                      help='emulated TPU cores of the tpu_fc TPU paths (the '
                      'batch is split over them; default 1)')
  return parser.parse_args(argv)


def _scale_record(results, out_dir):
  """Saves a --scale measurement, or attaches the last recorded one."""
  path = os.path.join(out_dir, 'scale.json')
  if 'scale' in results:
    os.makedirs(out_dir, exist_ok=True)
    with open(path, 'w') as out:
      json.dump(dict(results['scale'], recorded_date=results['date'],
                     recorded_command=results['command']), out, indent=1)
  elif os.path.exists(path):
    with open(path) as recorded:
      results['scale_recorded'] = json.load(recorded)


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  args = parse_args(argv)
  for name in ('iterations_per_loop', 'warmup_steps', 'steps_per_rep'):
    value = getattr(args, name)
    if value is not None and value <= 0:
      raise SystemExit('--{} must be positive'.format(name.replace('_', '-')))
  settings = run.plan(args)
  if settings.steps_per_rep % settings.iterations_per_loop:
    raise SystemExit('--steps-per-rep must be a multiple of '
                     '--iterations-per-loop ({})'.format(
                         settings.iterations_per_loop))
  command = 'python -m benchmarks ' + ' '.join(shlex.quote(a) for a in argv)
  results = run.run(settings, command.strip())
  _scale_record(results, args.out)
  for line in report.write(results, args.out):
    print(line)


if __name__ == '__main__':
  main()
