"""Command line: `python -m tpu_fc COMMAND ...` (also installed as `tpu-fc`).

TensorFlow is imported only by the commands that need it, so `--help` is quick.
"""
import argparse
import importlib.util
import json
import os
import sys


def this_package():
  """The tpu_fc package holding this file, even where a folder shadows it.

  `python -m tpu_fc` run from a folder that holds a checkout named `tpu_fc`
  (and a `tpu-fc run` script's spawned child there) imports that folder as an
  empty namespace package when tpu_fc is installed editable (the working
  directory comes first on `sys.path`, the editable install's finder after
  it); load the package of this file in its place.
  """
  package = sys.modules.get('tpu_fc')
  if package is None or getattr(package, '__file__', None) is None:
    folder = os.path.dirname(os.path.abspath(__file__))
    spec = importlib.util.spec_from_file_location(
        'tpu_fc', os.path.join(folder, '__init__.py'),
        submodule_search_locations=[folder])
    package = importlib.util.module_from_spec(spec)
    sys.modules['tpu_fc'] = package
    spec.loader.exec_module(package)
  return package


def _run(args):
  """Runs a legacy script unchanged, with the legacy names bound to tpu_fc."""
  if not os.path.isfile(args.script):
    raise SystemExit('tpu-fc run: error: no such script {} (relative paths start '
                     'at {})'.format(args.script, os.getcwd()))
  from tpu_fc import legacy_names  # pylint: disable=g-import-not-at-top
  legacy_names.install()
  sys.argv = [os.path.abspath(args.script)] + list(args.script_args)
  legacy_names.run_script(args.script, run_name='__main__')


# TF's C++ logs at this level and above only (3: fatal errors).
_DEMO_NATIVE_LOG_LEVEL = '3'


def _quiet_native_logs():
  """Quiets TensorFlow's C++ logs in this process unless the user set
  `TF_CPP_MIN_LOG_LEVEL`: TF reads it when it loads, so call it before.

  Its start-up logs (on a machine without a GPU a failed `cuInit` error
  among them) would open the demo's first screen.
  """
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', _DEMO_NATIVE_LOG_LEVEL)


def _demo(args):
  _quiet_native_logs()
  from tpu_fc import demo  # pylint: disable=g-import-not-at-top  (loads TF)
  demo.main(model_dir=args.model_dir, steps=args.steps)


def _table_names(pairs):
  """`TABLE=LEGACY_NAME` arguments -> dict."""
  names = {}
  for pair in pairs or ():
    table, separator, legacy_name = pair.partition('=')
    if not separator or not table or not legacy_name:
      raise SystemExit('--table-name must be TABLE=CHECKPOINT_NAME, got {!r}'.format(pair))
    names[table] = legacy_name
  return names


def _positive_int(text):
  value = int(text)
  if value <= 0:
    raise argparse.ArgumentTypeError('must be > 0, got {}'.format(value))
  return value


def _reporting_user_errors(handler):
  """Bad checkpoints or specs end the command with their message, not a traceback."""
  def run(args):
    try:
      handler(args)
    except ValueError as error:  # CheckpointConversionError and bad --spec
      raise SystemExit('tpu-fc {}: error: {}'.format(args.command, error))
  return run


def _inspect(args):
  from tpu_fc import checkpoint_conversion as conversion  # pylint: disable=g-import-not-at-top
  from tpu_fc import legacy_names  # pylint: disable=g-import-not-at-top
  spec = legacy_names.spec_from_reference(args.spec) if args.spec else None
  report = conversion.inspect_checkpoint(args.checkpoint, spec)
  print(json.dumps(report, indent=2) if args.json
        else conversion.format_inspection(report))


def _convert_checkpoint(args):
  from tpu_fc import checkpoint_conversion as conversion  # pylint: disable=g-import-not-at-top
  from tpu_fc import legacy_names  # pylint: disable=g-import-not-at-top
  spec = legacy_names.spec_from_reference(args.spec)
  if args.to == 'mid-level':
    written = conversion.to_mid_level_checkpoint(
        spec, args.source, args.destination, _table_names(args.table_name),
        fresh_slots=args.fresh_slots)
  else:
    if args.fresh_slots:
      raise SystemExit('--fresh-slots applies to --to mid-level only')
    written = conversion.to_legacy_checkpoint(
        spec, args.source, args.destination, _table_names(args.table_name))
  print(written)


def _add_checkpoint_commands(commands):
  inspect = commands.add_parser(
      'inspect', help='tables, slots, shapes, optimizer, step of a checkpoint')
  inspect.add_argument('checkpoint', help='a model_dir (latest checkpoint) or a '
                       'checkpoint prefix, legacy or mid-level')
  inspect.add_argument('--json', action='store_true', help='print JSON')
  inspect.add_argument('--spec', help='MODULE:ATTR or FILE.py:ATTR naming the '
                       "model's EmbeddingConfigSpec (exact table detection)")
  inspect.set_defaults(handler=_reporting_user_errors(_inspect))
  convert = commands.add_parser(
      'convert-checkpoint',
      help='legacy TPUEstimator <-> mid-level TPUEmbedding checkpoints')
  convert.add_argument('--to', required=True, choices=('mid-level', 'legacy'))
  convert.add_argument('--spec', required=True, help='MODULE:ATTR or FILE.py:ATTR '
                       "naming the model's EmbeddingConfigSpec (or a function "
                       'returning it)')
  convert.add_argument('--table-name', action='append', metavar='TABLE=NAME',
                       help='legacy checkpoint name of a table (repeatable)')
  convert.add_argument('--fresh-slots', action='store_true',
                       help='start missing embedding-optimizer slots at their '
                       'initial values (e.g. from a use_tpu=False checkpoint)')
  convert.add_argument('source', help='model_dir or checkpoint prefix')
  convert.add_argument('destination', help='directory to write the checkpoint to')
  convert.set_defaults(handler=_reporting_user_errors(_convert_checkpoint))


def _cluster(args):
  from tpu_fc import cluster  # pylint: disable=g-import-not-at-top
  cluster.main(args)


def _add_cluster_command(commands):
  cluster = commands.add_parser(
      'cluster', help='run a script as a parameter-server cluster on this '
      'machine: ps tasks, a chief, workers and an evaluator on 127.0.0.1',
      usage='%(prog)s [--ps N] [--workers M] [--evaluator] [options] -- '
      'SCRIPT.py [ARGS...]')
  cluster.add_argument('--ps', type=int, default=1, help='ps tasks (default 1)')
  cluster.add_argument('--workers', type=int, default=1,
                       help='workers besides the chief (default 1)')
  cluster.add_argument('--evaluator', action='store_true',
                       help="also run an evaluator task (train_and_evaluate's "
                       'continuous evaluation)')
  cluster.add_argument('--log_dir', default=None,
                       help='where each task writes <job>-<index>.log '
                       '(default: a temporary dir)')
  cluster.add_argument('--timeout', type=float, default=None,
                       help='stop the job after this many seconds')
  cluster.add_argument('--max_restarts', type=int, default=3,
                       help='restarts of a killed task before the job fails')
  cluster.add_argument('--host_network', action='store_true',
                       help="run the tasks on the machine's network (they "
                       'reach the internet, and their servers listen on every '
                       'interface) instead of a loopback of their own')
  cluster.add_argument('script', help='the script every task runs, as __main__')
  cluster.add_argument('script_args', nargs=argparse.REMAINDER,
                       help='arguments passed to the script')
  cluster.set_defaults(handler=_cluster)


def main(argv=None):
  this_package()
  parser = argparse.ArgumentParser(
      prog='tpu-fc', description='Legacy TPU embedding columns and TPUEstimator '
      'on any TensorFlow version.')
  commands = parser.add_subparsers(dest='command', required=True)
  run = commands.add_parser('run', help='run a legacy script unchanged')
  run.add_argument('script', help='the script, run as __main__')
  run.add_argument('script_args', nargs=argparse.REMAINDER,
                   help='arguments passed to the script')
  run.set_defaults(handler=_run)
  demo = commands.add_parser(
      'demo', help='train, evaluate, export and serve a built-in model on '
      'synthetic data')
  demo.add_argument('--model_dir', default=None,
                    help='where to write checkpoints and the export (default: '
                    'a temporary dir, removed at the end)')
  demo.add_argument('--steps', type=_positive_int, default=300,
                    help='training steps (more steps when resuming a '
                    '--model_dir)')
  demo.set_defaults(handler=_demo)
  _add_checkpoint_commands(commands)
  _add_cluster_command(commands)
  args = parser.parse_args(argv)
  args.handler(args)


if __name__ == '__main__':
  main()
