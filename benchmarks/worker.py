"""One measured path in its own process: `python -m benchmarks.worker`.

The coordinator writes one JSON job on stdin; the worker builds the path, warms it
up, says `ready`, then runs one timed repetition per `rep` command until `stop`,
and ends with its peak RSS.  Each process holds one path, so peak RSS is the
path's own and paths can be interleaved repetition by repetition.  Messages go on
the original stdout; anything TensorFlow prints goes to stderr.
"""
import json
import os
import resource
import sys
import time

from benchmarks import workload as workload_lib


class Channel(object):
  """JSON lines to the coordinator (saved stdout) and commands from stdin."""

  def __init__(self):
    self._out = os.fdopen(os.dup(1), 'w')
    os.dup2(2, 1)  # stray prints must not corrupt the protocol
    sys.stdout = sys.stderr

  def send(self, **message):
    self._out.write(json.dumps(message) + '\n')
    self._out.flush()

  @staticmethod
  def receive():
    line = sys.stdin.readline()
    if not line:
      raise SystemExit('coordinator went away')
    return line.strip()


class Controller(object):
  """Counts steps, times repetitions, and talks to the coordinator between runs.

  `after_run(steps)` is called after every call that trains `steps` steps (one
  session.run, or one call of an in-graph loop); it returns True when the path
  must stop.  A repetition's time runs from the command that starts it to the
  end of its last run, so per-run framework overhead is included.  Slow paths
  end warm-up (after 3 runs) and repetitions (after 1 run) early, once they
  have taken `max_warmup_seconds` / `max_rep_seconds`: rates stay exact, runs
  stay bounded.
  """

  def __init__(self, channel, job):
    self._channel = channel
    self._warmup_steps = job['warmup_steps']
    self._steps_per_rep = job['steps_per_rep']
    self._max_warmup_seconds = job['max_warmup_seconds']
    self._max_rep_seconds = job['max_rep_seconds']
    self._warming_up = True
    self._steps = 0
    self._runs = 0
    self._step_seconds = []
    self._start = self._last = time.perf_counter()
    self._rep_start = None
    self.steps_per_run = set()

  def after_run(self, steps):
    now = time.perf_counter()
    self.steps_per_run.add(steps)
    self._steps += steps
    self._runs += 1
    if self._warming_up:
      if (self._steps < self._warmup_steps and
          (self._runs < 3 or now - self._start < self._max_warmup_seconds)):
        return False
      self._warming_up = False
      self._channel.send(event='ready', warmup_steps=self._steps)
      return self._next_command()
    self._step_seconds.extend([(now - self._last) / steps] * steps)
    self._last = now
    if (self._steps < self._steps_per_rep and
        now - self._rep_start < self._max_rep_seconds):
      return False
    self._channel.send(event='rep', seconds=now - self._rep_start,
                       steps=self._steps, step_seconds=self._step_seconds)
    return self._next_command()

  def _next_command(self):
    command = self._channel.receive()
    if command == 'stop':
      return True
    if command != 'rep':
      raise SystemExit('unknown command {!r}'.format(command))
    self._steps = 0
    self._step_seconds = []
    self._rep_start = self._last = time.perf_counter()
    return False


def peak_rss_bytes():
  return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def main():
  channel = Channel()
  job = json.loads(channel.receive())
  from benchmarks import paths  # imports TensorFlow: after the channel is set up
  workload = workload_lib.Workload(**job['workload'])
  start = time.perf_counter()
  if job['path'] == 'serving':
    from benchmarks import serving
    result = serving.measure(job, channel)
  else:
    controller = Controller(channel, job)
    result = paths.run(job, workload, controller) or {}
    result['steps_per_run'] = sorted(controller.steps_per_run)
  result['peak_rss_bytes'] = peak_rss_bytes()
  result['wall_seconds'] = time.perf_counter() - start
  channel.send(event='done', **result)


if __name__ == '__main__':
  main()
