"""A parameter-server cluster on this machine: `tpu-fc cluster --ps N --workers M [--evaluator] -- SCRIPT.py`.

Starts one process per task (the chief, M workers, N ps tasks, and with
`--evaluator` an `evaluator` task) on 127.0.0.1 with free ports, in a network
namespace of their own (`tpu_fc.local_network`: TF's servers listen on every
interface; `--host_network` opts out, warned), each running
the script through `python -m tpu_fc run` with its own `TF_CONFIG`, as a cluster
manager would; TF's runtime does the rest (see `tpu_fc.estimator.distributed`).
The evaluator is not part of the cluster spec (as in Estimator): it reads the
checkpoints from model_dir, `train_and_evaluate`'s continuous evaluation.
Supervision, as Estimator's cluster managers did:

* a worker or the evaluator that dies (killed by a signal) is restarted, and
  rejoins or evaluates the latest checkpoint;
* the chief dying restarts the whole job, which resumes from the last checkpoint;
* a ps task dying stops the job with an error (rerun it to resume from the last
  checkpoint); so does any task exiting with an error status;
* the job is done when the chief, every worker and the evaluator (which
  returns after evaluating the final checkpoint) exited 0; the ps tasks are
  then stopped.  Every process is stopped on the way out, whatever happens
  (its own process group: SIGTERM, then SIGKILL), and the whole run is bounded
  by `timeout`; a launcher killed outright takes its tasks with it.

Each task's output goes to `<log_dir>/<job>-<index>.log`; restarted tasks
append, and see how often they were restarted in `TPU_FC_RESTART_COUNT`.
"""
import contextlib
import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Tuple

from tpu_fc import local_network

RESTART_COUNT_ENV = 'TPU_FC_RESTART_COUNT'
_POLL_SECS = 0.05
_STOP_GRACE_SECS = 5.0


_EXPOSED_WARNING = (
    'tpu_fc cluster: WARNING: {}: the tasks use the machine\'s network, and '
    'TensorFlow\'s servers listen on every interface, unauthenticated: anyone '
    'who reaches these ports can run graphs here. Firewall them (see '
    'docs/scaling.md).')


class ClusterError(RuntimeError):
  """The job failed or timed out; the message says which task and where its log is."""


@dataclasses.dataclass
class ClusterResult:
  """What a finished job did: restarts per task, its log files."""
  restarts: Dict[Tuple[str, int], int]
  job_restarts: int
  logs: Dict[Tuple[str, int], str]


def free_ports(count):
  """`count` distinct free TCP ports on 127.0.0.1."""
  sockets = []
  try:
    for _ in range(count):
      sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
      sock.bind(('127.0.0.1', 0))
      sockets.append(sock)
    return [sock.getsockname()[1] for sock in sockets]
  finally:
    for sock in sockets:
      sock.close()


def cluster_spec(num_ps, num_workers):
  """`{'chief': [...], 'worker': [...], 'ps': [...]}` on free loopback ports (no empty job)."""
  ports = iter(free_ports(1 + num_workers + num_ps))
  address = lambda: '127.0.0.1:{}'.format(next(ports))
  spec = {'chief': [address()],
          'worker': [address() for _ in range(num_workers)],
          'ps': [address() for _ in range(num_ps)]}
  return {job: addresses for job, addresses in spec.items() if addresses}


class _Task:
  """One task's process, restarted in place."""

  def __init__(self, job, index, command, env, log_path):
    """`command` runs as given (see `local_network.task_command`)."""
    self.job, self.index = job, index
    self._command, self._env, self.log_path = command, env, log_path
    self.restarts = 0
    self.process = None

  def start(self):
    env = dict(self._env, **{RESTART_COUNT_ENV: str(self.restarts)})
    with open(self.log_path, 'ab') as log:
      self.process = subprocess.Popen(
          self._command, env=env, stdout=log, stderr=subprocess.STDOUT,
          stdin=subprocess.DEVNULL, start_new_session=True)

  def stop(self):
    """Stops the task's process group: SIGTERM, then SIGKILL after a grace period."""
    if self.process is None:
      return
    for sig, wait in ((signal.SIGTERM, _STOP_GRACE_SECS), (signal.SIGKILL, None)):
      with contextlib.suppress(ProcessLookupError):
        os.killpg(self.process.pid, sig)
      with contextlib.suppress(subprocess.TimeoutExpired):
        self.process.wait(timeout=wait)
        break
    self.process = None

  def describe(self):
    return '{} task {}'.format(self.job, self.index)


def _exit_description(returncode):
  if returncode < 0:
    return 'was killed by {}'.format(signal.Signals(-returncode).name)
  return 'exited with status {}'.format(returncode)


class LocalCluster:
  """ps tasks, a chief, workers and an optional evaluator running `script` on loopback.

  See the module doc.

  Use as a context manager (every process is stopped on exit), or call `run()`.
  `kill(job, index)` kills one task's process (as a crash would), for fault drills.
  """

  def __init__(self, script, script_args=(), num_ps=1, num_workers=1,
               log_dir=None, timeout=None, max_restarts=3, env=None,
               evaluator=False, host_network=False):
    if num_ps < 1:
      raise ValueError('A parameter-server cluster needs --ps >= 1, got '
                       '{}.'.format(num_ps))
    if num_workers < 0:
      raise ValueError('--workers must be >= 0, got {}.'.format(num_workers))
    self._command = [sys.executable, '-m', 'tpu_fc', 'run', script] + list(
        script_args)
    self._num_ps, self._num_workers = num_ps, num_workers
    self._evaluator = evaluator
    self.log_dir = log_dir or tempfile.mkdtemp(prefix='tpu_fc_cluster_')
    try:
      os.makedirs(self.log_dir, exist_ok=True)
    except OSError as error:
      raise ValueError('--log_dir {} cannot be made: {}.'.format(
          self.log_dir, error.strerror)) from error
    self._timeout = timeout
    self._max_restarts = max_restarts
    self._env = dict(os.environ if env is None else env)
    self._tasks: List[_Task] = []
    self._host_network = host_network
    self._holder = None
    self.job_restarts = 0

  def __enter__(self):
    self.start()
    return self

  def __exit__(self, *exc_info):
    self.stop()

  def _network(self):
    """The namespace tasks run in (None: the machine's network), with a
    warning where the servers are exposed."""
    if self._host_network:
      print(_EXPOSED_WARNING.format('--host-network'), file=sys.stderr,
            flush=True)
      return None
    self._holder = local_network.holder()
    if self._holder.pid is None:
      print(_EXPOSED_WARNING.format(
          'no network namespace could be created ({})'.format(
              self._holder.reason)), file=sys.stderr, flush=True)
    return self._holder.pid

  def start(self):
    """Starts every task on fresh ports, in a network of their own (loopback)."""
    namespace = self._network()
    command = local_network.task_command(self._command, namespace)
    spec = cluster_spec(self._num_ps, self._num_workers)
    restarts = {(t.job, t.index): t.restarts for t in self._tasks}
    self._tasks = []
    tasks = [(job, index) for job in ('ps', 'chief', 'worker')
             for index in range(len(spec.get(job, ())))]
    if self._evaluator:
      tasks.append(('evaluator', 0))
    for job, index in tasks:
      env = dict(self._env, TF_CONFIG=json.dumps(
          {'cluster': spec, 'task': {'type': job, 'index': index}}))
      task = _Task(job, index, command, env, os.path.join(
          self.log_dir, '{}-{}.log'.format(job, index)))
      task.restarts = restarts.get((job, index), 0)
      task.start()
      self._tasks.append(task)

  def stop(self):
    """Stops every task still running (the evaluator and trainers first, ps tasks last)."""
    for task in reversed(self._tasks):
      task.stop()
    if self._holder is not None:
      self._holder.stop()
      self._holder = None

  def task(self, job, index):
    return next(t for t in self._tasks if (t.job, t.index) == (job, index))

  def kill(self, job, index):
    """Kills a task's process with SIGKILL, as a crash or preemption would."""
    with contextlib.suppress(ProcessLookupError):
      os.killpg(self.task(job, index).process.pid, signal.SIGKILL)

  def _fail(self, task, what):
    with open(task.log_path, 'rb') as log:
      tail = log.read().decode('utf-8', 'replace').splitlines()[-20:]
    raise ClusterError(
        '{} {}; stopping the job. Checkpoints already written are kept: run it '
        'again to resume from the last one. Log {}:\n{}'.format(
            task.describe(), what, task.log_path,
            '\n'.join('  | ' + line for line in tail)))

  def _restart(self, task, returncode):
    """Restarts a killed task (the chief: the whole job), within max_restarts."""
    if task.restarts >= self._max_restarts:
      self._fail(task, '{} after {} restarts'.format(
          _exit_description(returncode), task.restarts))
    task.restarts += 1
    print('tpu_fc cluster: {} {}; restarting {} ({} of at most {}).'.format(
        task.describe(), _exit_description(returncode),
        'the job' if task.job == 'chief' else 'it', task.restarts,
        self._max_restarts), file=sys.stderr, flush=True)
    if task.job == 'chief':
      self.stop()
      self.job_restarts += 1
      self.start()
    else:
      task.start()

  def wait(self):
    """Supervises the job until it is done; returns a `ClusterResult`.

    Raises `ClusterError` when a ps task dies, a task exits with an error, a
    task keeps dying, or the timeout passes.
    """
    deadline = None if self._timeout is None else time.monotonic() + self._timeout
    while True:
      done = True  # the chief, the workers and the evaluator
      for task in list(self._tasks):
        returncode = task.process.poll() if task.process else 0
        if task.job == 'ps':
          if returncode is not None:
            self._fail(task, _exit_description(returncode))
          continue
        if returncode is None:
          done = False
        elif returncode < 0:
          self._restart(task, returncode)
          done = False
          break  # the task list may have been rebuilt
        elif returncode > 0:
          self._fail(task, _exit_description(returncode))
      if done:
        return ClusterResult(
            restarts={(t.job, t.index): t.restarts for t in self._tasks},
            job_restarts=self.job_restarts,
            logs={(t.job, t.index): t.log_path for t in self._tasks})
      if deadline is not None and time.monotonic() > deadline:
        raise ClusterError('The job did not finish within {} s; stopped. Logs '
                           'in {}.'.format(self._timeout, self.log_dir))
      time.sleep(_POLL_SECS)

  def run(self):
    """Starts the job, supervises it to the end and stops every process."""
    with self:
      return self.wait()


def main(args):
  """The `tpu-fc cluster` command."""
  try:
    cluster = LocalCluster(args.script, args.script_args, num_ps=args.ps,
                           num_workers=args.workers, log_dir=args.log_dir,
                           timeout=args.timeout, max_restarts=args.max_restarts,
                           evaluator=args.evaluator,
                           host_network=args.host_network)
  except ValueError as error:
    raise SystemExit('tpu-fc cluster: {}'.format(error)) from error
  print('tpu_fc cluster: {} ps, a chief, {} workers{}; logs in {}'.format(
      args.ps, args.workers, ', an evaluator' if args.evaluator else '',
      cluster.log_dir), file=sys.stderr, flush=True)

  def stop_on_signal(signum, frame):
    del frame
    raise KeyboardInterrupt(signal.Signals(signum).name)

  signal.signal(signal.SIGTERM, stop_on_signal)
  try:
    result = cluster.run()
  except ClusterError as error:
    print('tpu_fc cluster: ' + str(error), file=sys.stderr)
    sys.exit(1)
  except KeyboardInterrupt as interrupt:
    name = str(interrupt) or 'SIGINT'  # Ctrl-C's carries no name
    print('tpu_fc cluster: stopped ({}); every task was stopped.'.format(name),
          file=sys.stderr)
    sys.exit(128 + signal.Signals[name])
  print('tpu_fc cluster: done (restarts: {}).'.format(
      {'{}-{}'.format(*key): n for key, n in result.restarts.items() if n}
      or 'none'), file=sys.stderr)
