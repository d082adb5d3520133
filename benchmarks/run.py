"""The coordinator: plans the run, drives worker processes, collects results.

Paths of one workload run side by side: their workers build and warm up
concurrently, then the coordinator interleaves timed repetitions one path at a
time (rotating the order), so a slow spell of a shared machine hits every path
alike.  Workers that would not fit in memory together run in successive groups.
"""
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from benchmarks import workload as workload_lib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Measured order: the paths a target compares come first, so they share a group.
TRAINING_PATHS = {
    'legacy_cpu': "TF 2.15 TPUEstimator(use_tpu=False) with TF's TPU "
                  'embedding_column (legacy lane only)',
    'tpu_fc_embedding_core': 'tpu_fc TPUEstimator(use_tpu=True), emulated '
                             'embedding core',
    'raw': 'raw TF: unique + gather + segment mean + '
           'ResourceSparseApplyAdagrad, Grappler arithmetic optimizer off',
    'tpu_fc_embedding_core_8_shards': 'tpu_fc emulated embedding core on 8 '
                                      'emulated TPU cores (per-core update '
                                      'order)',
    'tpu_fc_mid_level': 'the model migrated to the mid-level API: '
                        'tpu_fc.mid_level.TPUEmbedding (enqueue, dequeue, '
                        'apply_gradients) in a TF2 loop',
    'mid_level': 'mid-level API by hand: TPUEmbeddingForServing + '
                 'serving_embedding_lookup + GradientTape + Adagrad',
    'tpu_fc_cpu': 'tpu_fc TPUEstimator(use_tpu=False)',
    'tpu_fc_tensor_core': 'tpu_fc TPUEstimator(use_tpu=True), tpu_tensor_core '
                          'columns',
    'tpu_fc_embedding_core_no_mlp': 'tpu_fc emulated embedding core, model '
                                    'without MLP',
    'raw_no_mlp': 'raw TF, model without MLP',
}
CONTRAST_PATHS = ('legacy_cpu', 'tpu_fc_embedding_core', 'raw')
TARGET_PATHS = CONTRAST_PATHS + ('tpu_fc_tensor_core',
                                 'tpu_fc_embedding_core_8_shards',
                                 'tpu_fc_mid_level', 'mid_level',
                                 'tpu_fc_embedding_core_no_mlp')
SERVED_PATHS = ('legacy_cpu', 'tpu_fc_embedding_core')
LEGACY_ONLY_PATHS = ('legacy_cpu',)
SCALE_PATHS = ('tpu_fc_embedding_core', 'legacy_cpu')
_GIB = 2**30


@dataclasses.dataclass
class Settings:
  """What one invocation measures, and how long."""
  mode: str
  vocabulary_cap: int
  batch_size: int
  num_batches: int
  iterations_per_loop: int
  warmup_steps: int
  steps_per_rep: int
  reps: int
  max_warmup_seconds: float
  max_rep_seconds: float
  threads: int
  num_shards: int
  learning_rate: float
  experiments: list          # [(Workload, paths)]
  serving: bool
  serving_reps: int
  latency_calls: int
  throughput_batch: int
  throughput_calls: int
  scale: bool
  scale_rows: int
  python: str
  legacy_python: str

  def job(self, path, workload, **extra):
    job = dict(path=path, workload=dataclasses.asdict(workload),
               warmup_steps=self.warmup_steps, steps_per_rep=self.steps_per_rep,
               max_warmup_seconds=self.max_warmup_seconds,
               max_rep_seconds=self.max_rep_seconds,
               iterations_per_loop=self.iterations_per_loop,
               threads=self.threads, num_shards=self.num_shards,
               learning_rate=self.learning_rate)
    job.update(extra)
    return job


def plan(args):
  """Settings for --quick or the full run, with command-line overrides."""
  quick = args.quick
  defaults = dict(
      vocabulary_cap=1_000_000,  # quick too: its verdicts mean the full run's
      num_batches=4 if quick else 16,
      iterations_per_loop=5 if quick else 10,
      warmup_steps=10 if quick else 20,
      steps_per_rep=10 if quick else 20,
      reps=5 if quick else 7,
      max_warmup_seconds=8 if quick else 15,
      max_rep_seconds=1.5 if quick else 3)
  values = {name: getattr(args, name) if getattr(args, name) is not None else
            default for name, default in defaults.items()}
  base = workload_lib.Workload(
      vocabulary_cap=values['vocabulary_cap'], batch_size=args.batch_size,
      num_batches=values['num_batches'])
  zipf16 = dataclasses.replace(base, dim=16)
  zipf64 = dataclasses.replace(base, dim=64)
  all_paths = tuple(TRAINING_PATHS)
  multi_hot = dataclasses.replace(zipf16, ids_per_feature=4)
  if quick:  # dim 16 only: dim 64's paths need successive groups (memory)
    experiments = [(zipf16, TARGET_PATHS),
                   (multi_hot, ('legacy_cpu', 'tpu_fc_tensor_core'))]
  else:
    experiments = [
        (zipf16, all_paths),
        (zipf64, tuple(p for p in all_paths if p != 'raw_no_mlp')),
        (dataclasses.replace(zipf16, distribution='uniform'), CONTRAST_PATHS),
        (multi_hot, CONTRAST_PATHS + ('tpu_fc_tensor_core',))]
  if args.dims:
    experiments = [(w, p) for w, p in experiments if w.dim in args.dims]
  if args.paths:
    experiments = [(w, tuple(x for x in p if x in args.paths))
                   for w, p in experiments]
  python = sys.executable
  # Absolute: the workers start in the run's copy of the sources.
  legacy_python = (os.path.abspath(args.legacy_python) if args.legacy_python
                   else python if interpreter(python)['lane'] == 'legacy'
                   else None)
  if not legacy_python:
    experiments = [(w, tuple(x for x in p if x not in LEGACY_ONLY_PATHS))
                   for w, p in experiments]
  experiments = [(w, p) for w, p in experiments if p]
  return Settings(
      mode='quick' if quick else 'full', batch_size=args.batch_size,
      threads=args.threads, num_shards=args.num_shards, learning_rate=0.01,
      experiments=experiments,
      serving=not args.no_serving, serving_reps=5 if quick else 9,
      latency_calls=50 if quick else 200, throughput_batch=512,
      throughput_calls=4 if quick else 10, scale=args.scale,
      scale_rows=args.scale_rows, python=python,
      legacy_python=legacy_python, **values)


_INTERPRETER_PROBE = (
    'import importlib.util, json, platform; from importlib import metadata; '
    'print(json.dumps(dict(lane="legacy" if importlib.util.find_spec('
    '"tensorflow_estimator") else "latest", tensorflow=metadata.version('
    '"tensorflow"), python=platform.python_version())))')


def interpreter(python):
  """{lane, tensorflow, python} of the interpreter `python` (the legacy lane's
  has TF 2.15's tensorflow_estimator): what the report records of it, never
  its path, which is one machine's."""
  return json.loads(subprocess.run([python, '-c', _INTERPRETER_PROBE],
                                   capture_output=True, text=True,
                                   check=True).stdout)


class WorkerFailed(Exception):
  pass


def snapshot_sources(log_dir):
  """Copies tpu_fc/ and benchmarks/ as they are now; workers import the copy.

  The working tree may change while a long run goes on; every worker of the
  run must measure the same code.
  """
  root = os.path.join(log_dir, 'sources')
  for package in ('tpu_fc', 'benchmarks'):
    shutil.copytree(os.path.join(REPO, package), os.path.join(root, package),
                    ignore=shutil.ignore_patterns('__pycache__', 'results'))
  return root


class Worker(object):
  """One path in a `python -m benchmarks.worker` process, run from `sources`."""

  def __init__(self, python, job, log_dir):
    self.path = job['path']
    self.log = os.path.join(log_dir, '{}-{}.log'.format(
        self.path, job['workload']['dim']))
    sources = os.path.join(log_dir, 'sources')
    # Without TF_USE_LEGACY_KERAS: importing tpu_fc sets it where the worker's
    # TensorFlow wants it, and the latest lane's would break a legacy worker's
    # TF 2.15 (its tf.keras would look for tf-keras).
    env = {name: value for name, value in os.environ.items()
           if name != 'TF_USE_LEGACY_KERAS'}
    env.update(TF_CPP_MIN_LOG_LEVEL='2', PYTHONPATH=sources + os.pathsep +
               os.environ.get('PYTHONPATH', ''))
    with open(self.log, 'w') as log:
      self._process = subprocess.Popen(
          [python, '-m', 'benchmarks.worker'], cwd=sources, env=env,
          stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
    self.send(json.dumps(job))

  def send(self, line):
    try:
      self._process.stdin.write(line + '\n')
      self._process.stdin.flush()
    except BrokenPipeError:
      raise WorkerFailed(self.log_tail())

  def expect(self, event):
    line = self._process.stdout.readline()
    if not line:
      self._process.wait()
      raise WorkerFailed(self.log_tail())
    message = json.loads(line)
    if message.get('event') != event:
      raise WorkerFailed('expected {}, got {}'.format(event, line[:200]))
    return message

  def log_tail(self, lines=15):
    with open(self.log) as log:
      return ''.join(log.readlines()[-lines:])

  def close(self):
    if self._process.poll() is None:
      self._process.kill()
    self._process.wait()


def _memory_estimate(workload):
  """Bytes a training worker may need: tables, slots, initializer copies, runtime."""
  return 3 * workload.table_bytes + 1.5 * _GIB


def _available_memory():
  with open('/proc/meminfo') as meminfo:
    for line in meminfo:
      if line.startswith('MemAvailable:'):
        return int(line.split()[1]) * 1024
  return 8 * _GIB


def _groups(paths, workload):
  """Consecutive paths that fit together into 70 % of the available memory."""
  per_worker = _memory_estimate(workload)
  size = max(1, int(0.7 * _available_memory() // per_worker))
  return [paths[i:i + size] for i in range(0, len(paths), size)]


def _summary(reps, batch_size):
  seconds = [r['seconds'] for r in reps]
  steps = [r['steps'] for r in reps]
  rates = [batch_size * n / s for n, s in zip(steps, seconds)]
  step_seconds = [t for r in reps for t in r['step_seconds']]
  return {
      'examples_per_s': float(np.median(rates)),
      'examples_per_s_reps': rates,
      'steps_per_rep': steps,
      'p50_step_ms': 1e3 * float(np.percentile(step_seconds, 50)),
      'p90_step_ms': 1e3 * float(np.percentile(step_seconds, 90)),
  }


def _python_for(settings, path):
  return settings.legacy_python if path in LEGACY_ONLY_PATHS else settings.python


def run_group(settings, workload, paths, log_dir, extra_jobs=None, log=print):
  """Builds the group's workers concurrently, then interleaves repetitions."""
  results = {}
  workers = []
  for path in paths:
    job = settings.job(path, workload, **(extra_jobs or {}).get(path, {}))
    workers.append(Worker(_python_for(settings, path), job, log_dir))
  live = []
  for worker in workers:
    try:
      worker.expect('ready')
      live.append(worker)
    except WorkerFailed as failure:
      results[worker.path] = {'error': str(failure)}
      log('  {} failed while building:\n{}'.format(worker.path, failure))
      worker.close()
  reps = {worker.path: [] for worker in live}
  for rep in range(settings.reps):
    order = live[rep % len(live):] + live[:rep % len(live)] if live else []
    for worker in order:
      if worker.path in results:
        continue
      try:
        worker.send('rep')
        reps[worker.path].append(worker.expect('rep'))
      except WorkerFailed as failure:
        results[worker.path] = {'error': str(failure)}
        log('  {} failed in repetition {}:\n{}'.format(worker.path, rep, failure))
  for worker in live:
    if worker.path in results:
      worker.close()
      continue
    try:
      worker.send('stop')
      done = worker.expect('done')
      done.pop('event')
      results[worker.path] = dict(_summary(reps[worker.path],
                                           workload.batch_size), **done)
    except WorkerFailed as failure:
      results[worker.path] = {'error': str(failure)}
    worker.close()
  return results


def measure_bandwidth(size_bytes=256 * 2**20, repeats=5, threads=2):
  """numpy copy bandwidth (bytes read + written per second), 1 and `threads` threads."""
  import concurrent.futures  # pylint: disable=g-import-not-at-top
  source = np.ones(size_bytes // 8)
  target = np.empty_like(source)

  def copy(part):
    np.copyto(target[part], source[part])

  def best_rate(parts):
    with concurrent.futures.ThreadPoolExecutor(len(parts)) as pool:
      best = 0.0
      for _ in range(repeats):
        start = time.perf_counter()
        list(pool.map(copy, parts))
        best = max(best, 2 * size_bytes / (time.perf_counter() - start))
      return best

  n = len(source)
  single = best_rate([slice(0, n)])
  multi = best_rate([slice(i * n // threads, (i + 1) * n // threads)
                     for i in range(threads)])
  return {'copy_bytes': size_bytes, 'single_thread_bytes_per_s': single,
          'threads': threads, 'multi_thread_bytes_per_s': multi,
          'roofline_bytes_per_s': max(single, multi)}


def machine_info(settings):
  with open('/proc/cpuinfo') as cpuinfo:
    models = [l.split(':', 1)[1].strip() for l in cpuinfo
              if l.startswith('model name')]
  with open('/proc/meminfo') as meminfo:
    total = int(meminfo.readline().split()[1]) * 1024
  interpreters = {role: interpreter(python) for role, python in (
      ('python', settings.python), ('legacy_python', settings.legacy_python))
                  if python}
  commit = subprocess.run(['git', 'describe', '--always', '--dirty'],
                          cwd=REPO, capture_output=True, text=True).stdout.strip()
  changed = subprocess.run(['git', 'status', '--short', '--', 'tpu_fc',
                            'benchmarks'], cwd=REPO, capture_output=True,
                           text=True).stdout.split('\n')
  return {'cpu': models[0] if models else 'unknown',
          'cpus': os.cpu_count(), 'usable_cpus': len(os.sched_getaffinity(0)),
          'memory_bytes': total, 'load_average_start': os.getloadavg(),
          'interpreters': interpreters, 'git_commit': commit,
          'uncommitted_sources': [line[3:] for line in changed if line]}


def run(settings, command, log=print):
  """Runs everything the settings ask for; returns the results dict."""
  started = time.time()
  log_dir = tempfile.mkdtemp(prefix='tpu_fc_bench_logs_')
  snapshot_sources(log_dir)
  results = {'command': command, 'mode': settings.mode,
             'date': time.strftime('%Y-%m-%d %H:%M:%S %Z'),
             'machine': machine_info(settings), 'logs': log_dir,
             # (the interpreters by lane and versions in 'machine': their
             # paths are one machine's)
             'settings': {k: v for k, v in dataclasses.asdict(settings).items()
                          if k not in ('experiments', 'python',
                                       'legacy_python')}}
  log('tpu_fc benchmarks ({}), worker logs in {}'.format(settings.mode, log_dir))
  results['bandwidth'] = measure_bandwidth(threads=settings.threads)
  log('memory copy bandwidth: {:.1f} GB/s (1 thread {:.1f} GB/s)'.format(
      results['bandwidth']['roofline_bytes_per_s'] / 1e9,
      results['bandwidth']['single_thread_bytes_per_s'] / 1e9))
  results['training'] = []
  exports = {}
  export_base = tempfile.mkdtemp(prefix='tpu_fc_bench_exports_')
  for index, (workload, paths) in enumerate(settings.experiments):
    traffic = workload_lib.traffic_per_step(workload,
                                            workload_lib.make_data(workload)[0])
    entry = {'workload': workload.name, 'params': dataclasses.asdict(workload),
             'tables': len(workload.table_sizes),
             'table_rows': sum(workload.table_sizes),
             'table_bytes': workload.table_bytes, 'traffic': traffic,
             'roofline_examples_per_s': (
                 results['bandwidth']['roofline_bytes_per_s'] /
                 traffic['bytes_per_example']),
             'paths': {}, 'groups': []}
    serve_here = settings.serving and index == 0
    extra = {path: {'export_dir': os.path.join(export_base, path)}
             for path in SERVED_PATHS} if serve_here else {}
    for group in _groups(paths, workload):
      log('{}: {}'.format(workload.name, ', '.join(group)))
      entry['groups'].append(list(group))
      entry['paths'].update(run_group(settings, workload, group, log_dir, extra,
                                      log))
    for path, result in entry['paths'].items():
      if 'examples_per_s' in result:
        log('  {:<30} {:>10.0f} examples/s  p90 step {:7.1f} ms  peak RSS '
            '{:.2f} GiB'.format(path, result['examples_per_s'],
                                result['p90_step_ms'],
                                result['peak_rss_bytes'] / _GIB))
      if 'export_dir' in result:
        exports[path] = result['export_dir']
    results['training'].append(entry)
  if settings.serving:
    results['serving'] = measure_serving(settings, exports, log_dir, log)
  shutil.rmtree(export_base, ignore_errors=True)
  if settings.scale:
    results['scale'] = measure_scale(settings, log_dir, log)
  results['machine']['load_average_end'] = os.getloadavg()
  results['seconds'] = time.time() - started
  return results


def measure_serving(settings, exports, log_dir, log):
  """Batch-1 latency and batch throughput of each export, in one process."""
  if not exports:
    return {'error': 'no export to serve'}
  workload = settings.experiments[0][0]
  job = dict(path='serving', workload=dataclasses.asdict(workload),
             exports=exports, threads=settings.threads,
             reps=settings.serving_reps, latency_calls=settings.latency_calls,
             throughput_batch=settings.throughput_batch,
             throughput_calls=settings.throughput_calls)
  log('serving: {}'.format(', '.join(sorted(exports))))
  worker = Worker(settings.python, job, log_dir)
  try:
    done = worker.expect('done')
  except WorkerFailed as failure:
    return {'error': str(failure)}
  finally:
    worker.close()
  for name, model in done['models'].items():
    log('  {:<30} p50 {:.2f} ms  p99 {:.2f} ms  batch {}: {:.0f} examples/s'
        .format(name, model['p50_latency_ms'], model['p99_latency_ms'],
                settings.throughput_batch, model['throughput_examples_per_s']))
  return dict(done, workload=workload.name)


# The --scale sweep: one table of --scale-rows rows divided by each row divisor,
# at --batch-size divided by each batch divisor; the last point (the whole table
# and batch) is the one the peak-RSS target reads.
SCALE_ROW_DIVISORS = (100, 10, 1)
SCALE_BATCH_DIVISORS = (4, 1)


def measure_scale(settings, log_dir, log):
  """One 64-wide table with Adagrad, a few steps per path at each point of the
  sweep: step time against table rows and batch, and at the largest table
  (10M x 64) peak RSS against table + slot bytes."""
  scale_settings = dataclasses.replace(
      settings, warmup_steps=settings.iterations_per_loop,
      steps_per_rep=settings.iterations_per_loop, reps=2)
  table_and_slot = 2 * settings.scale_rows * 64 * workload_lib.FLOAT_BYTES
  results = {'rows': settings.scale_rows, 'dim': 64,
             'batch_size': settings.batch_size,
             'table_and_slot_bytes': table_and_slot, 'paths': {}, 'sweep': {}}
  for path in SCALE_PATHS:
    if not _python_for(settings, path):
      continue
    points = results['sweep'][path] = []
    for batch_divisor in SCALE_BATCH_DIVISORS:
      for row_divisor in SCALE_ROW_DIVISORS:
        workload = workload_lib.Workload(
            dim=64, vocabularies=(settings.scale_rows // row_divisor,),
            batch_size=settings.batch_size // batch_divisor, num_batches=4)
        (rows,) = workload.table_sizes
        log('scale: {} rows x 64, batch {}, {}'.format(
            rows, workload.batch_size, path))
        result = run_group(scale_settings, workload, [path], log_dir,
                           log=log)[path]
        if 'p50_step_ms' in result:
          log('  p50 step {:.1f} ms, peak RSS {:.2f} GiB'.format(
              result['p50_step_ms'], result['peak_rss_bytes'] / _GIB))
        points.append(dict(result, rows=rows, batch_size=workload.batch_size))
    target = results['paths'][path] = points[-1]
    if 'peak_rss_bytes' in target:
      target['peak_rss_over_table_and_slot'] = (
          target['peak_rss_bytes'] / table_and_slot)
      log('  peak RSS {:.2f} GiB = {:.2f} x table + slot ({:.2f} GiB)'.format(
          target['peak_rss_bytes'] / _GIB,
          target['peak_rss_over_table_and_slot'], table_and_slot / _GIB))
  return results
