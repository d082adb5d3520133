"""Training on TF's distributed runtime: 2 ps tasks, a chief and a worker on loopback.

The job is `tests/scripts/cluster_model.py`, started by `tpu_fc.cluster.LocalCluster`
(what `tpu-fc cluster` runs).  Its inputs are a function of the global step and
the replica, so the synchronous job must equal a single host with the same
global batch, also across a killed and restarted worker or chief and a killed ps task
(the job stops; its last checkpoint resumes exactly).  A single
host also restores the cluster's checkpoints, which convert to the mid-level
format as a single host's do.  The asynchronous default runs
in-process, the tasks' roles given by explicit `ClusterResolver`s, and so does
a synchronous chief alone (one replica: a single host's steps) whose model_fn
has batch norm and may compute its loss with a Keras loss object.
"""
import json
import os
import re
import shutil
import socket
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

import tpu_fc
from tpu_fc import checkpoint_conversion
from tpu_fc import cluster
from tpu_fc import local_network
from tpu_fc.estimator import distributed
import tensorflow as tf  # pylint: disable=g-bad-import-order  (after tpu_fc)

sys.path.insert(0, os.path.join(os.path.dirname(__file__), 'scripts'))
import cluster_model  # pylint: disable=g-import-not-at-top,wrong-import-position

from harness import scripts  # pylint: disable=g-import-not-at-top,wrong-import-position

SCRIPT = os.path.join(os.path.dirname(__file__), 'scripts', 'cluster_model.py')
TIMEOUT_SECS = 150
TOL = dict(rtol=1e-5, atol=1e-5)
REPLICAS = 2  # the chief and one worker

pytestmark = pytest.mark.filterwarnings('ignore::UserWarning')


def run_job(tmp_path, name, model_dir, *args, kill_ps_after_step=None):
  """Runs the job on 2 ps + chief + 1 worker; returns its ClusterResult.

  With `kill_ps_after_step`, kills ps task 1 once a checkpoint past that step
  exists (the launcher meanwhile restarting what dies), and returns the
  ClusterError the job stops with instead.
  """
  job = cluster.LocalCluster(
      SCRIPT, ['--model_dir', str(model_dir)] + list(args), num_ps=2,
      num_workers=1, log_dir=str(tmp_path / ('logs_' + name)),
      timeout=TIMEOUT_SECS)
  with job:
    if kill_ps_after_step is None:
      return job.wait()
    outcomes = []

    def supervise():
      try:
        outcomes.append(job.wait())
      except cluster.ClusterError as error:
        outcomes.append(error)

    supervisor = threading.Thread(target=supervise, daemon=True)
    supervisor.start()
    _wait_for_checkpoint_after(model_dir, kill_ps_after_step, supervisor)
    job.kill('ps', 1)
    supervisor.join(TIMEOUT_SECS)
  for task in job._tasks:  # pylint: disable=protected-access
    assert task.process is None  # every process stopped
  assert len(outcomes) == 1 and isinstance(outcomes[0], cluster.ClusterError), (
      outcomes)
  return outcomes[0]


def _wait_for_checkpoint_after(model_dir, step, supervisor):
  deadline = time.monotonic() + TIMEOUT_SECS
  while _checkpoint_step(model_dir) <= step:
    assert supervisor.is_alive(), 'the job ended before a checkpoint'
    assert time.monotonic() < deadline, 'no checkpoint after step %d' % step
    time.sleep(0.1)


def _checkpoint_step(model_dir):
  checkpoint = tf.train.latest_checkpoint(str(model_dir))
  return int(checkpoint.rsplit('-', 1)[1]) if checkpoint else -1


def checkpoint_values(model_dir):
  return {name: tf.train.load_variable(str(model_dir), name)
          for name, _ in tf.train.list_variables(str(model_dir))}


def single_host(model_dir, use_tpu, max_steps):
  """The reference: one host, the global batch of all replicas."""
  cluster_model.estimator(
      str(model_dir), use_tpu, batch_size=REPLICAS * cluster_model.BATCH).train(
          cluster_model.input_fn, max_steps=max_steps)
  return checkpoint_values(model_dir)


def assert_same_variables(got, want):
  assert sorted(got) == sorted(want)
  for name, value in want.items():
    if np.asarray(value).dtype.kind in 'SO':  # a mid-level checkpoint's names
      assert got[name] == value, name
    else:
      np.testing.assert_allclose(got[name], value, err_msg=name, **TOL)


def assert_tables_on_every_ps(model_dir):
  """Every table (and its slots) has one part on each ps task, part N on ps N."""
  with open(os.path.join(model_dir, 'devices.json')) as f:
    devices = json.load(f)
  parts = {name: device for name, device in devices.items() if '/part_' in name}
  tables = {name.rsplit('/part_', 1)[0] for name in parts}
  assert tables, devices
  for table in tables:
    assert [parts['{}/part_{}'.format(table, n)] for n in range(2)] == [
        '/job:ps/task:0', '/job:ps/task:1'], table


def assert_loss_falls(model_dir):
  with open(os.path.join(model_dir, 'losses.json')) as f:
    losses = json.load(f)
  assert np.mean(losses[-2:]) < np.mean(losses[:2]), losses


def assert_restores_on_one_host(cluster_dir, reference_dir, use_tpu, tmp_path,
                                steps):
  """One host continues the cluster's checkpoint exactly as its own."""
  continued = {}
  for name, model_dir in (('cluster', cluster_dir), ('one_host', reference_dir)):
    copy = tmp_path / ('continued_' + name)
    shutil.copytree(model_dir, copy)
    continued[name] = single_host(copy, use_tpu,
                                  _checkpoint_step(model_dir) + steps)
  assert_same_variables(continued['cluster'], continued['one_host'])


@pytest.mark.subprocess
def test_sync_emulated_core_equals_one_host_across_a_worker_restart(tmp_path):
  """use_tpu=True: the engine's partitioned table, updated on the ps owning the rows."""
  model_dir = tmp_path / 'cluster'
  result = run_job(tmp_path, 'sync', model_dir, '--use_tpu', '--sync',
                   '--max_steps', '6', '--die_at_step', '3')
  assert result.restarts[('worker', 0)] == 1
  reference = single_host(tmp_path / 'one_host', True, 6)
  got = checkpoint_values(model_dir)
  assert 'dense_features/ids_embedding/embedding_weights/Adagrad' in got
  assert_same_variables(got, reference)
  assert_tables_on_every_ps(model_dir)
  assert_loss_falls(model_dir)
  assert_restores_on_one_host(model_dir, tmp_path / 'one_host', True, tmp_path,
                              steps=2)
  converted = {
      name: checkpoint_values(os.path.dirname(
          checkpoint_conversion.to_mid_level_checkpoint(
              cluster_model.spec(), str(source), str(tmp_path / ('mid_' + name)))))
      for name, source in (('cluster', model_dir),
                           ('one_host', tmp_path / 'one_host'))}
  assert_same_variables(converted['cluster'], converted['one_host'])


@pytest.mark.subprocess
def test_chief_and_ps_failures_leave_checkpoints_that_resume_exactly(tmp_path,
                                                                     capfd):
  """use_tpu=False: the feature column's table, partitioned through the scope.

  The chief killed at step 3 restarts the whole job, which resumes from the
  checkpoint of step 2; the chief is slow: a worker taking its tokens would run
  ahead (or hang the job).  Then a killed ps stops the job, and what the job
  left resumes exactly, on one host (resuming in a job that starts again, as
  the chief's restart just did).  One job start for both failures.
  """
  model_dir = tmp_path / 'cluster'
  error = run_job(tmp_path, 'killed', model_dir, '--sync', '--max_steps',
                  '100000', '--die_task', 'chief', '--die_at_step', '3',
                  '--slow_chief_secs', '0.3', kill_ps_after_step=2)
  assert 'ps task 1 was killed by SIGKILL; stopping the job' in str(error)
  assert 'resume from the last one' in str(error)
  assert capfd.readouterr().err.count('restarting the job') == 1
  with open(os.path.join(tmp_path, 'logs_killed', 'chief-0.log')) as f:
    restored = re.findall(r'Restoring parameters from .*model\.ckpt-(\d+)',
                          f.read())
  # (the task's log repeats each line; the restarted chief may also recover
  # its session from a later checkpoint when the ps dies, before the launcher
  # stops it, as TF's MonitoredSession does)
  restored = [int(step) for step in dict.fromkeys(restored)]
  assert restored[0] == 2 and all(step > 2 for step in restored[1:]), restored
  last = _checkpoint_step(model_dir)
  reference = single_host(tmp_path / 'one_host', False, last)
  assert_same_variables(checkpoint_values(model_dir), reference)
  assert_tables_on_every_ps(model_dir)
  assert_restores_on_one_host(model_dir, tmp_path / 'one_host', False,
                              tmp_path, steps=2)


def eval_events(eval_dir):
  """{global step: scalar metrics} of the evaluations written to `eval_dir`."""
  evaluations = {}
  for event_file in tf.io.gfile.glob(os.path.join(eval_dir, '*.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(event_file):
      values = {v.tag: v.simple_value for v in event.summary.value
                if v.HasField('simple_value')}
      if 'loss' in values:
        evaluations[event.step] = values
  return evaluations


@pytest.mark.subprocess
def test_evaluator_task_evaluates_new_checkpoints_and_exports(tmp_path):
  """train_and_evaluate on a ps, the chief and an evaluator task (emulated TPU).

  The evaluator evaluates checkpoints until the last one, exporting each, and
  its last result is that checkpoint's evaluation on one host.
  """
  model_dir = tmp_path / 'model'
  result = cluster.LocalCluster(
      SCRIPT, ['--model_dir', str(model_dir), '--use_tpu',
               '--train_and_evaluate'], num_ps=1, num_workers=0,
      evaluator=True, log_dir=str(tmp_path / 'logs'),
      timeout=TIMEOUT_SECS).run()
  assert sorted(result.logs) == [('chief', 0), ('evaluator', 0), ('ps', 0)]
  evaluations = eval_events(model_dir / 'eval')
  state = tf.train.get_checkpoint_state(str(model_dir))
  checkpoint_steps = {int(path.rsplit('-', 1)[1])
                      for path in state.all_model_checkpoint_paths}
  max_steps = _checkpoint_step(model_dir)
  assert max(evaluations) == max_steps and set(evaluations) <= checkpoint_steps
  assert len(os.listdir(model_dir / 'export' / 'latest')) == len(evaluations)
  want = cluster_model.estimator(str(model_dir), use_tpu=True).evaluate(
      cluster_model.eval_input_fn, steps=1)
  np.testing.assert_allclose(evaluations[max_steps]['loss'], want['loss'],
                             **TOL)


def _resolver(spec, job, index):
  return tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec(spec), task_type=job, task_id=index)


def test_async_training_in_process_with_explicit_cluster(tmp_path, tf_log):
  """The default: chief and worker apply their own steps to the ps variables.

  The cluster starts from a single host's checkpoint.
  """
  single_host(tmp_path, False, 2)
  spec = cluster.cluster_spec(num_ps=2, num_workers=1)
  configs = {
      (job, index): tpu_fc.RunConfig(
          cluster=_resolver(spec, job, index), model_dir=str(tmp_path),
          save_checkpoints_steps=2, log_step_count_steps=None)
      for job, index in (('ps', 0), ('ps', 1), ('chief', 0), ('worker', 0))}
  assert configs[('chief', 0)].is_chief
  assert configs[('worker', 0)].master == 'grpc://' + spec['worker'][0]
  for job, index in (('ps', 0), ('ps', 1)):
    distributed.server(configs[(job, index)])
  errors = []

  def train(job):
    try:
      tpu_fc.TPUEstimator(
          cluster_model.model_fn, use_tpu=False,
          train_batch_size=cluster_model.BATCH, config=configs[(job, 0)],
          embedding_config_spec=cluster_model.spec()).train(
              cluster_model.input_fn,
              hooks=[cluster_model.RecordHook(str(tmp_path))] if job == 'chief'
              else [], max_steps=8)
    except Exception as e:  # pylint: disable=broad-except
      errors.append(e)

  threads = [threading.Thread(target=train, args=(job,), daemon=True)
             for job in ('chief', 'worker')]
  for thread in threads:
    thread.start()
  for thread in threads:
    thread.join(TIMEOUT_SECS)
  assert not errors and not any(t.is_alive() for t in threads), errors
  assert 'Restoring parameters from {}'.format(
      os.path.join(tmp_path, 'model.ckpt-2')) in tf_log
  assert_tables_on_every_ps(tmp_path)
  trained = checkpoint_values(tmp_path)
  assert trained['global_step'] >= 8
  table = trained['dense_features/ids_embedding/embedding_weights']
  start = cluster_model.row_initializer(table.shape).numpy()
  assert table.shape == (cluster_model.VOCABULARY, cluster_model.DIMENSION)
  assert not np.allclose(table, start)
  evaluation = tpu_fc.TPUEstimator(
      cluster_model.model_fn, use_tpu=False, eval_batch_size=8,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path)),
      embedding_config_spec=cluster_model.spec()).evaluate(
          cluster_model.input_fn, steps=1)
  assert evaluation['global_step'] == trained['global_step']


def test_sync_with_pipelined_tables_is_a_clear_error(tmp_path):
  spec = cluster.cluster_spec(num_ps=1, num_workers=0)
  config = tpu_fc.RunConfig(cluster=_resolver(spec, 'chief', 0),
                            model_dir=str(tmp_path), sync_replicas=True)
  pipelined = cluster_model.spec()._replace(
      pipeline_execution_with_tensor_core=True)
  estimator = tpu_fc.TPUEstimator(
      cluster_model.model_fn, use_tpu=True, train_batch_size=4, config=config,
      embedding_config_spec=pipelined)
  with pytest.raises(ValueError, match='does not support pipeline_execution'):
    estimator.train(cluster_model.input_fn, max_steps=1)


def _model_fn_with_batch_norm(features, labels, mode, params):
  """A model_fn as users write them: batch norm, its moving statistics updated
  before the train op, and the loss `params['loss']`."""
  activations = tf.keras.layers.DenseFeatures([cluster_model.embedding_column()])(
      features)
  inputs = tf.concat([activations, features['x']], axis=1)
  normalized = tf.compat.v1.layers.batch_normalization(inputs, training=True)
  logits = tf.compat.v1.layers.dense(
      normalized, 1, kernel_initializer=tf.compat.v1.constant_initializer(
          [[0.3], [-0.2], [0.1]]))
  loss = params['loss'](labels, logits)
  optimizer = tf.compat.v1.train.AdagradOptimizer(cluster_model.LEARNING_RATE)
  with tf.control_dependencies(
      tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)):
    train_op = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
  return tpu_fc.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


@pytest.mark.parametrize('loss', [
    tf.compat.v1.losses.mean_squared_error,
    tf.keras.losses.MeanSquaredError()], ids=['tf1_loss', 'keras_loss_object'])
def test_sync_chief_alone_equals_one_host_with_batch_norm(tmp_path, loss):
  """One replica: each step's average is the chief's own gradient, applied once.

  The batch norm's moving statistics move once a step (the sync op runs no
  forward pass of its own), and a Keras loss object builds as without
  sync_replicas.
  """
  def train(model_dir, config):
    tpu_fc.TPUEstimator(
        _model_fn_with_batch_norm, use_tpu=False,
        train_batch_size=cluster_model.BATCH, config=config,
        embedding_config_spec=cluster_model.spec(),
        params={'loss': loss}).train(cluster_model.input_fn, max_steps=3)
    return checkpoint_values(model_dir)

  one_host = train(tmp_path / 'one_host',
                   tpu_fc.RunConfig(model_dir=str(tmp_path / 'one_host')))
  spec = cluster.cluster_spec(num_ps=1, num_workers=0)
  distributed.server(tpu_fc.RunConfig(cluster=_resolver(spec, 'ps', 0)))
  synchronous = train(tmp_path / 'sync', tpu_fc.RunConfig(
      cluster=_resolver(spec, 'chief', 0), model_dir=str(tmp_path / 'sync'),
      sync_replicas=True))
  assert synchronous['global_step'] == 3
  assert_same_variables(synchronous, one_host)


CLUSTER = {'chief': ['host0:2222'], 'ps': ['host1:2222', 'host2:2222'],
           'worker': ['host3:2222', 'host4:2222']}


@pytest.mark.legacy_only
@pytest.mark.parametrize('tf_config', [
    {'cluster': CLUSTER, 'task': {'type': 'chief', 'index': 0}},
    {'cluster': CLUSTER, 'task': {'type': 'worker', 'index': 1}},
    {'cluster': CLUSTER, 'task': {'type': 'ps', 'index': 1}},
    {'cluster': CLUSTER, 'task': {'type': 'evaluator', 'index': 0}},
    {'cluster': {'master': ['h:1'], 'ps': ['h:2']},
     'task': {'type': 'master', 'index': 0}},
    {'cluster': {'chief': ['h:1']}, 'task': {'type': 'chief', 'index': 0}},
    {'task': {'type': 'worker', 'index': 0}, 'session_master': 'grpc://x:1'},
    {'cluster': CLUSTER, 'task': {'type': 'worker', 'index': 2}},
    {'cluster': CLUSTER, 'task': {'type': 'worker'}},
    {'cluster': {'ps': ['h:2']}, 'task': {'type': 'ps', 'index': 0}},
    {'task': {'type': 'ps', 'index': 0}},
])
def test_run_config_reads_tf_config_as_tf_2_15(monkeypatch, tf_config):
  monkeypatch.setenv('TF_CONFIG', json.dumps(tf_config))
  fields = ('task_type', 'task_id', 'is_chief', 'master', 'evaluation_master',
            'num_ps_replicas', 'num_worker_replicas', 'global_id_in_cluster')

  def read(run_config_class):
    try:
      config = run_config_class()
    except ValueError as e:
      return 'ValueError', str(e)
    return ({f: getattr(config, f) for f in fields},
            config.cluster_spec.as_dict())

  assert read(tpu_fc.RunConfig) == read(tf.compat.v1.estimator.tpu.RunConfig)


def test_run_config_of_a_ps_cluster_filters_devices_as_estimator(monkeypatch):
  monkeypatch.setenv('TF_CONFIG', json.dumps(
      {'cluster': CLUSTER, 'task': {'type': 'worker', 'index': 1}}))
  config = tpu_fc.RunConfig()
  assert list(config.session_config.device_filters) == [
      '/job:ps', '/job:worker/task:1']
  assert config.global_id_in_cluster == 2  # chief 0, workers 1 and 2, ps last
  assert config.num_worker_replicas == 3 and config.num_ps_replicas == 2
  assert not config.sync_replicas
  assert config.replace(sync_replicas=True).sync_replicas


def test_train_on_an_evaluator_task_is_an_error_as_in_tf(monkeypatch, tmp_path):
  monkeypatch.setenv('TF_CONFIG', json.dumps(
      {'cluster': CLUSTER, 'task': {'type': 'evaluator', 'index': 0}}))
  job = cluster_model.estimator(str(tmp_path), use_tpu=False)
  with pytest.raises(ValueError, match='Train has been called wrong '
                     'configuration. Please use tf.estimator.train_and_evaluate'):
    job.train(cluster_model.input_fn, max_steps=1)


def test_cluster_command_line(tmp_path):
  """`tpu-fc cluster` parses its options and the script's arguments after `--`."""
  from tpu_fc import __main__ as cli  # pylint: disable=g-import-not-at-top
  with pytest.raises(SystemExit, match='--ps >= 1, got 0'):
    cli.main(['cluster', '--ps', '0', '--workers', '1', '--log_dir',
              str(tmp_path), '--', SCRIPT, '--model_dir', str(tmp_path)])


@pytest.mark.subprocess
def test_launcher_stops_every_process_at_its_timeout(tmp_path):
  """A job that never finishes is stopped at the timeout, processes and all."""
  script = tmp_path / 'hang.py'
  script.write_text('import time\nwhile True:\n  time.sleep(1)\n')
  job = cluster.LocalCluster(str(script), num_ps=1, num_workers=1,
                             log_dir=str(tmp_path / 'logs'), timeout=2)
  started = time.monotonic()
  with pytest.raises(cluster.ClusterError, match='did not finish within 2'):
    job.run()
  assert time.monotonic() - started < 60
  assert all(task.process is None for task in job._tasks)  # pylint: disable=protected-access


PROBE = os.path.join(os.path.dirname(__file__), 'scripts', 'cluster_probe.py')


def _probed_tasks(out_dir, jobs, seconds=120):
  """{job: what cluster_probe.py wrote} once every job's task wrote it."""
  deadline = time.monotonic() + seconds
  while time.monotonic() < deadline:
    paths = {job: out_dir / (job + '.json') for job in jobs}
    if all(path.exists() for path in paths.values()):
      return {job: json.loads(path.read_text()) for job, path in paths.items()}
    time.sleep(0.1)
  raise AssertionError('the tasks did not start: {}'.format(
      sorted(os.listdir(out_dir))))


def _reachable(port):
  try:
    with socket.create_connection(('127.0.0.1', port), timeout=5):
      return True
  except OSError:
    return False


def _running(pid):
  """Whether `pid` runs (a zombie whose parent died does not)."""
  try:
    with open('/proc/{}/status'.format(pid)) as f:
      return 'State:\tZ' not in f.read()
  except FileNotFoundError:
    return False


@pytest.mark.subprocess
def test_no_task_outlives_a_killed_launcher(tmp_path):
  """SIGKILL leaves the launcher no chance to stop its tasks: the kernel kills
  them (and the namespace holder) when it dies.  (A ps and the chief: a worker
  starts as the chief does.)  Before that: the tasks listen on every
  interface, as TF's servers do, but they run in a network namespace of
  their own, so nothing outside reaches them (each task reaches its own);
  where there is no namespace the launcher warns and they are reachable."""
  holder = local_network.holder()
  holder.stop()
  isolated = holder.pid is not None
  out_dir = tmp_path / 'out'
  out_dir.mkdir()
  launcher = scripts.popen_python(
      ['-m', 'tpu_fc', 'cluster', '--ps', '1', '--workers', '0',
       '--log_dir', str(tmp_path / 'logs'), '--', PROBE, str(out_dir)],
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
      env=scripts.env())
  try:
    tasks = _probed_tasks(out_dir, ['ps-0', 'chief-0'])
    reached = {name: _reachable(task['port']) for name, task in tasks.items()}
  finally:
    launcher.kill()
    _, stderr = launcher.communicate(timeout=60)
  assert reached == {'ps-0': not isolated, 'chief-0': not isolated}
  assert ("the tasks use the machine's network" in stderr) == (not isolated)
  deadline = time.monotonic() + 30
  while (any(_running(task['pid']) for task in tasks.values()) and
         time.monotonic() < deadline):
    time.sleep(0.1)
  assert not [name for name, task in tasks.items() if _running(task['pid'])]


@pytest.mark.subprocess
def test_a_terminated_launcher_stops_its_tasks_and_says_so(tmp_path):
  """With `--host_network` the tasks, which listen on every interface as
  TF's servers do, are reachable from here, and the launcher warns (their
  isolation without it: test_no_task_outlives_a_killed_launcher).  Then
  SIGTERM: every task stopped, the signal named, exit code 128 + 15."""
  out_dir = tmp_path / 'out'
  out_dir.mkdir()
  launcher = scripts.popen_python(
      ['-m', 'tpu_fc', 'cluster', '--ps', '1', '--workers', '0',
       '--host_network', '--log_dir', str(tmp_path / 'logs'), '--', PROBE,
       str(out_dir)],
      stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
      env=scripts.env())
  try:
    tasks = _probed_tasks(out_dir, ['ps-0', 'chief-0'])
    reached = {name: _reachable(task['port']) for name, task in tasks.items()}
    launcher.terminate()
    _, stderr = launcher.communicate(timeout=60)
  finally:
    launcher.kill()
  assert reached == {'ps-0': True, 'chief-0': True}
  assert "the tasks use the machine's network" in stderr
  assert launcher.returncode == 128 + signal.SIGTERM
  assert 'tpu_fc cluster: stopped (SIGTERM); every task was stopped.' in stderr
  assert not [name for name, task in tasks.items() if _running(task['pid'])]
