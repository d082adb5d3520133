"""`train_and_evaluate`, its specs and exporters, against TF 2.15's.

Legacy lane: the same model and data through TF's own TPUEstimator(use_tpu=False)
and `train_and_evaluate`, and through tpu_fc's, give the same evaluations (at
the same steps, with the same hooks, names and step counts), the same results
and the same export directories.  Both lanes: a legacy script using only TF's
names (`tf.estimator.train_and_evaluate`, an emulated TPU with an embedding
spec, a LatestExporter) runs unchanged under `python -m tpu_fc run`; bad specs
get TF's errors.  TF's private `_TrainingExecutor` API, which TF's own
training_test drives (legacy lane: against TF's): `run()` calls the task's
`run_<type>` as the executor has it then, the task's server is created as TF
creates it, `train_hooks`, a `_ContinuousEvalListener` ending local training
or the evaluator task, and TF's errors for bad `evaluate` results and
executor arguments.
"""
import functools
import importlib
import json
import os
import sys

import numpy as np
import pytest

import tpu_fc
from tpu_fc import cluster
from tpu_fc._tf import tf
from tpu_fc.estimator import distributed
from tpu_fc.estimator import training as tpu_fc_training

from harness import hooks
from harness import inputs
from harness import lanes
from harness import models
from harness import scripts
from harness.oracle import outcome

SCRIPT = os.path.join(scripts.SCRIPTS, 'legacy_train_and_evaluate.py')
BATCH = 4
RTOL = 1e-5

pytestmark = pytest.mark.filterwarnings('ignore::UserWarning')


def _mean_absolute_error(labels, predictions):
  return {'mae': tf.compat.v1.metrics.mean_absolute_error(labels, predictions)}


MODEL_FN = models.ids_and_x_model_fn(_mean_absolute_error)


def serving_input_receiver_fn():
  return tpu_fc.export.build_parsing_serving_input_receiver_fn(
      tf.feature_column.make_parse_example_spec(models.ids_and_x_columns(3)))()


def exporters(driver, case):
  if not case['exporters']:
    return None
  return [driver.LatestExporter('latest', serving_input_receiver_fn,
                                exports_to_keep=1),
          driver.FinalExporter('final', serving_input_receiver_fn),
          driver.BestExporter('best', serving_input_receiver_fn,
                              event_file_pattern='eval_holdout/*.tfevents.*')]


def _files_under(directory):
  return sorted(os.path.relpath(os.path.join(root, f), directory)
                for root, _, files in os.walk(directory) for f in files)


def export_structure(model_dir):
  """{exporter: sorted files of each export, the timestamp left out}."""
  base = os.path.join(model_dir, 'export')
  if not os.path.isdir(base):
    return {}
  structure = {}
  for name in sorted(os.listdir(base)):
    structure[name] = [
        _files_under(os.path.join(base, name, export))
        for export in sorted(os.listdir(os.path.join(base, name)))]
  return structure


def cpu_estimator(library, model_dir, model_fn, **config):
  """`model_fn` in a `library` TPUEstimator, on the CPU."""
  driver = lanes.driver(library)
  return driver.TPUEstimator(
      model_fn=model_fn, use_tpu=False, train_batch_size=BATCH,
      eval_batch_size=BATCH, export_to_tpu=False,
      config=driver.RunConfig(model_dir=str(model_dir), tf_random_seed=7,
                              **config))


def run_train_and_evaluate(library, model_dir, case):
  """Runs `case` through `library`; returns what the comparison looks at."""
  driver = lanes.driver(library)
  train_hook, eval_hook = hooks.SessionSteps(), hooks.SessionSteps()
  estimator = cpu_estimator(library, model_dir, MODEL_FN,
                            save_checkpoints_steps=case['checkpoint_every'])
  eval_result, export_results = driver.train_and_evaluate(
      estimator,
      driver.TrainSpec(inputs.ids_and_x_repeated, max_steps=case['max_steps'],
                       hooks=[train_hook]),
      driver.EvalSpec(inputs.ids_and_x, steps=case['eval_steps'], name=case['name'],
                      hooks=[eval_hook], exporters=exporters(driver, case),
                      throttle_secs=case['throttle_secs']))
  return dict(
      eval_result=eval_result,
      export_results=[
          None if path is None else os.path.relpath(
              os.path.dirname(path.decode()), str(model_dir))
          for path in export_results],
      returned_exports_exist=all(
          path is None or os.path.isdir(path) for path in export_results),
      train_sessions=train_hook.sessions, evaluations=eval_hook.sessions,
      exports=export_structure(str(model_dir)))


CASES = {
    'every_checkpoint_with_exporters': dict(
        checkpoint_every=2, max_steps=6, eval_steps=1, name='holdout',
        throttle_secs=0, exporters=True),
    'throttled_until_input_ends': dict(
        checkpoint_every=1, max_steps=4, eval_steps=None, name=None,
        throttle_secs=600, exporters=False),
}


@pytest.mark.legacy_only
@pytest.mark.parametrize('case', sorted(CASES))
def test_same_evaluations_results_and_exports_as_tf_2_15(tmp_path, case):
  runs = {library: run_train_and_evaluate(library, tmp_path / library,
                                          CASES[case])
          for library in ('tf', 'tpu_fc')}
  want, got = runs['tf'], runs['tpu_fc']
  assert got['evaluations'] == want['evaluations']
  assert got['train_sessions'] == want['train_sessions']
  assert sorted(got['eval_result']) == sorted(want['eval_result'])
  for name, value in want['eval_result'].items():
    np.testing.assert_allclose(got['eval_result'][name], value, rtol=RTOL,
                               err_msg=name)
  assert got['export_results'] == want['export_results']
  assert got['exports'] == want['exports']
  assert got['returned_exports_exist'] and want['returned_exports_exist']
  assert len(want['evaluations']) > 1  # the case does evaluate more than once


@pytest.mark.subprocess
def test_legacy_script_runs_unchanged_with_an_emulated_tpu(tmp_path):
  """`tf.estimator.train_and_evaluate` + TPUEstimator(use_tpu=True) + spec + exporter."""
  model_dir, out = tmp_path / 'model', tmp_path / 'out.json'
  scripts.run_python(['-m', 'tpu_fc', 'run', SCRIPT, str(model_dir), str(out)],
                     check=True, env=scripts.env(), cwd=str(tmp_path))
  result = json.loads(out.read_text())
  tpu_fc.install()  # the script's TF names, for the reference evaluation
  try:
    sys.path.insert(0, os.path.dirname(SCRIPT))
    legacy_script = importlib.import_module('legacy_train_and_evaluate')
    want = legacy_script.estimator(str(model_dir)).evaluate(
        legacy_script.input_fn, steps=legacy_script.EVAL_STEPS)
  finally:
    sys.path.remove(os.path.dirname(SCRIPT))
    tpu_fc.uninstall()
  checkpoint_steps = list(range(legacy_script.CHECKPOINT_EVERY,
                                legacy_script.MAX_STEPS + 1,
                                legacy_script.CHECKPOINT_EVERY))
  assert result['evaluated_steps'] == checkpoint_steps  # throttle_secs=0
  exports = os.listdir(model_dir / 'export' / 'latest')
  assert len(exports) == 1  # exports_to_keep=1
  assert result['export_results'] == [
      str(model_dir / 'export' / 'latest' / exports[0])]
  assert sorted(result['eval_result']) == sorted(want)
  for name, value in want.items():
    np.testing.assert_allclose(result['eval_result'][name], value, rtol=RTOL,
                               err_msg=name)


def compare_without_current(best_eval_result):
  del best_eval_result


# {case: (error, TF 2.15's text, call)}: the text is checked against TF
# itself on the legacy lane.
BAD_INPUT = {
    'TrainSpec(input_fn=1)': (
        TypeError, '`input_fn` must be callable, given: 1',
        lambda lib: lib.TrainSpec(1)),
    'TrainSpec(max_steps=0)': (
        ValueError, 'Must specify max_steps > 0, given: 0',
        lambda lib: lib.TrainSpec(inputs.ids_and_x, max_steps=0)),
    'TrainSpec(hooks=[1])': (
        TypeError, 'All hooks must be `SessionRunHook` instances, given: 1',
        lambda lib: lib.TrainSpec(inputs.ids_and_x, hooks=[1])),
    'TrainSpec(saving_listeners=[1])': (
        TypeError, 'All saving_listeners must be `CheckpointSaverListener` '
        'instances, given: 1',
        lambda lib: lib.TrainSpec(inputs.ids_and_x, saving_listeners=[1])),
    'EvalSpec(steps=0)': (
        ValueError, 'Must specify steps > 0, given: 0',
        lambda lib: lib.EvalSpec(inputs.ids_and_x, steps=0)),
    'EvalSpec(name=1)': (
        TypeError, '`name` must be string, given: 1',
        lambda lib: lib.EvalSpec(inputs.ids_and_x, name=1)),
    'EvalSpec(start_delay_secs=-1)': (
        ValueError, 'Must specify start_delay_secs >= 0, given: -1',
        lambda lib: lib.EvalSpec(inputs.ids_and_x, start_delay_secs=-1)),
    'EvalSpec(throttle_secs=-1)': (
        ValueError, 'Must specify throttle_secs >= 0, given: -1',
        lambda lib: lib.EvalSpec(inputs.ids_and_x, throttle_secs=-1)),
    'EvalSpec(exporters=3)': (
        TypeError, '`exporters` must be an Exporter, an iterable of Exporter, '
        'or `None`, found 3.',
        lambda lib: lib.EvalSpec(inputs.ids_and_x, exporters=3)),
    'EvalSpec(exporters=[same names])': (
        ValueError, '`exporters` must have unique names. Such a name cannot be '
        "`None`. All exporter names: ['e', 'e']",
        lambda lib: lib.EvalSpec(inputs.ids_and_x, exporters=[
            lib.LatestExporter('e', serving_input_receiver_fn),
            lib.LatestExporter('e', serving_input_receiver_fn)])),
    'EvalSpec(exporters=[empty name])': (
        ValueError, 'An Exporter cannot have a name that is `None` or empty. '
        "All exporter names: ['']",
        lambda lib: lib.EvalSpec(inputs.ids_and_x, exporters=lib.LatestExporter(
            '', serving_input_receiver_fn))),
    'LatestExporter(exports_to_keep=0)': (
        ValueError, '`exports_to_keep`, if provided, must be positive number',
        lambda lib: lib.LatestExporter('e', serving_input_receiver_fn,
                                       exports_to_keep=0)),
    'BestExporter(exports_to_keep=0)': (
        ValueError, '`exports_to_keep`, if provided, must be a positive number. '
        'Got 0',
        lambda lib: lib.BestExporter('e', serving_input_receiver_fn,
                                     exports_to_keep=0)),
    'BestExporter(compare_fn=None)': (
        ValueError, '`compare_fn` must not be None.',
        lambda lib: lib.BestExporter('e', serving_input_receiver_fn,
                                     compare_fn=None)),
    'BestExporter(compare_fn without current_eval_result)': (
        ValueError, 'must include current_eval_result argument.',
        lambda lib: lib.BestExporter('e', serving_input_receiver_fn,
                                     compare_fn=compare_without_current)),
    'train_and_evaluate(eval_spec=None)': (
        TypeError, "`eval_spec` must have type `tf.estimator.EvalSpec`. Got: "
        "<class 'NoneType'>",
        lambda lib: lib.train_and_evaluate(None, lib.TrainSpec(inputs.ids_and_x), None)),
}


@pytest.mark.parametrize('case', sorted(BAD_INPUT))
def test_bad_input_gets_tf_2_15_errors(case):
  error, message, call = BAD_INPUT[case]
  got = outcome(call, tpu_fc)
  assert got is not None and got[0] is error and message in got[1], got
  if lanes.LEGACY:
      assert got == outcome(call, tf.compat.v1.estimator)


def test_train_and_evaluate_takes_only_tpu_fc_estimators():
  with pytest.raises(TypeError, match='must have type `tf.estimator.Estimator`'
                     r" \(here: tpu_fc's Estimator or TPUEstimator\)"):
    tpu_fc.train_and_evaluate(object(), tpu_fc.TrainSpec(inputs.ids_and_x),
                              tpu_fc.EvalSpec(inputs.ids_and_x))


@pytest.mark.legacy_only
def test_spec_fields_and_defaults_are_tf_2_15s():
  for name in ('TrainSpec', 'EvalSpec'):
    ours = getattr(tpu_fc, name)(inputs.ids_and_x)
    theirs = getattr(tf.compat.v1.estimator, name)(inputs.ids_and_x)
    assert ours._asdict() == theirs._asdict(), name


# TF's private `_TrainingExecutor` and what it takes, whose API tpu_fc's keeps
# (TF's own training_test drives it): compared with TF 2.15's on the legacy lane.
LIBRARIES = ('tpu_fc', 'tf') if lanes.LEGACY else ('tpu_fc',)


def training_of(library):
  return tpu_fc_training if library == 'tpu_fc' else lanes.tf_training


def executor_estimator(library, model_dir, **config):
  """A model of `inputs.dense_x` by `library`'s names (on both lanes)."""
  return cpu_estimator(library, model_dir, models.dense_x_model_fn(
      lanes.driver(library), cross_shard=False), **config)


def _input_fn_no_task_calls(params):
  raise AssertionError('no task of this test reads its input')


def _tf_config(task_type, cluster=None):
  return json.dumps({'cluster': cluster or CLUSTER,
                     'task': {'type': task_type, 'index': 0}})


CLUSTER = {'chief': ['host0:2222'], 'ps': ['host1:2222'],
           'worker': ['host2:2222']}
# Local first: were the runner not looked up when run() runs, the local task
# would train (its input_fn raises) and end the test before a cluster task
# started a server for these addresses (a ps task would join it forever).
TASK_CONFIGS = [
    ('local', None),
    ('chief', _tf_config('chief')),
    ('worker', _tf_config('worker')),
    ('ps', _tf_config('ps')),
    ('evaluator', _tf_config('evaluator')),
    ('master', _tf_config('master', {'master': ['host0:2222'],
                                     'ps': ['host1:2222']})),
]


def test_run_calls_the_task_method_the_executor_has_when_it_runs(
    tmp_path, monkeypatch):
  for library in LIBRARIES:
    driver, ran = lanes.driver(library), []
    for task, tf_config in TASK_CONFIGS:
      if tf_config:
        monkeypatch.setenv('TF_CONFIG', tf_config)
      else:
        monkeypatch.delenv('TF_CONFIG', raising=False)
      executor = training_of(library)._TrainingExecutor(
          executor_estimator(library, tmp_path / library),
          driver.TrainSpec(_input_fn_no_task_calls),
          driver.EvalSpec(_input_fn_no_task_calls))
      setattr(executor, 'run_' + task, functools.partial(ran.append, task))
      executor.run()
    assert ran == [task for task, _ in TASK_CONFIGS], library


GPU_OPTIONS = tf.compat.v1.GPUOptions(per_process_gpu_memory_fraction=0.25,
                                      allow_growth=True)


def _started_ps_server(library, model_dir, monkeypatch):
  """The server train_and_evaluate starts for ps task 0 (on a loopback port of
  its own), with a session config of several options."""
  spec = cluster.cluster_spec(num_ps=1, num_workers=0)
  monkeypatch.setenv('TF_CONFIG', _tf_config('ps', spec))
  config = lanes.driver(library).RunConfig(
      protocol='grpc', session_config=tf.compat.v1.ConfigProto(
          allow_soft_placement=True, log_device_placement=True,
          gpu_options=GPU_OPTIONS))
  if library == 'tpu_fc':
    server = tpu_fc_training._start_std_server(config)
    assert server is distributed.server(config)  # the estimator's sessions'
    return server
  executor = lanes.tf_training._TrainingExecutor(
      executor_estimator('tf', model_dir), lanes.driver('tf').TrainSpec(
          _input_fn_no_task_calls), None)
  return executor._start_std_server(config)  # pylint: disable=protected-access


def _server_settings(server):
  server_def = server.server_def
  return (server_def.job_name, server_def.task_index, server_def.protocol,
          server_def.default_session_config)


def test_task_servers_are_created_as_tf_2_15_creates_them(tmp_path,
                                                          monkeypatch):
  """Of the session config, only its GPU options (the server's devices are
  created with them)."""
  got = _server_settings(_started_ps_server('tpu_fc', tmp_path, monkeypatch))
  assert got == ('ps', 0, 'grpc', tf.compat.v1.ConfigProto(
      log_device_placement=False, gpu_options=GPU_OPTIONS))
  if lanes.LEGACY:
    assert got == _server_settings(_started_ps_server('tf', tmp_path,
                                                      monkeypatch))


def _recording_listener(library, before_eval, after_eval):
  """A `_ContinuousEvalListener` of `library` that records its calls and
  answers `before_eval()` / `after_eval(the evaluated global steps)`."""

  class Recording(training_of(library)._ContinuousEvalListener):  # pylint: disable=protected-access

    def __init__(self):
      self.calls, self.steps = [], []

    def before_eval(self):
      self.calls.append('before_eval')
      return before_eval()

    def after_eval(self, eval_result):
      self.calls.append(('after_eval', eval_result.status))
      if eval_result.metrics:
        self.steps.append(int(eval_result.metrics['global_step']))
      return after_eval(self.steps)

  return Recording()


# {case: (before_eval's answer, after_eval's given the steps evaluated so far,
#  the listener's calls, the steps evaluated, the step training ends at)}:
#  locally, checkpoints at steps 0, 2, 4 and 6.
LOCAL_LISTENERS = {
    'evaluating_every_checkpoint': (
        lambda: True, lambda steps: True,
        ['before_eval', ('after_eval', 'evaluated')] * 3, [2, 4, 6], 6),
    'stopping_after_an_evaluation': (
        lambda: True, lambda steps: len(steps) < 2,
        ['before_eval', ('after_eval', 'evaluated')] * 2, [2, 4], 4),
    'stopping_before_evaluating': (
        lambda: False, lambda steps: True,
        ['before_eval', 'before_eval'], [], 2),
}


def run_local(library, model_dir, case):
  """`case`'s listener and a train hook in `library`'s local run."""
  before_eval, after_eval = LOCAL_LISTENERS[case][:2]
  driver, train_hook = lanes.driver(library), hooks.SessionSteps()
  listener = _recording_listener(library, before_eval, after_eval)
  metrics, export_results = training_of(library)._TrainingExecutor(
      executor_estimator(library, model_dir, save_checkpoints_steps=2),
      driver.TrainSpec(inputs.dense_x, max_steps=6),
      driver.EvalSpec(inputs.dense_x, steps=1, throttle_secs=0),
      train_hooks=[train_hook],
      continuous_eval_listener=listener).run_local()
  return dict(metrics=metrics, export_results=export_results,
              calls=listener.calls, steps=listener.steps,
              train_sessions=train_hook.sessions)


@pytest.mark.parametrize('case', sorted(LOCAL_LISTENERS))
def test_local_training_ends_where_the_continuous_eval_listener_stops(
    tmp_path, case):
  """`train_hooks` join the training's hooks; a listener's False ends
  evaluating and training."""
  calls, steps, last_step = LOCAL_LISTENERS[case][2:]
  got = run_local('tpu_fc', tmp_path / 'tpu_fc', case)
  assert (got['calls'], got['steps']) == (calls, steps)
  assert got['train_sessions'] == [(last_step, last_step)]
  if steps:
    assert got['metrics']['global_step'] == steps[-1]
  else:
    assert got['metrics'] is None
  if lanes.LEGACY:
    want = run_local('tf', tmp_path / 'tf', case)
    assert sorted(got) == sorted(want)
    for name in ('calls', 'steps', 'train_sessions', 'export_results'):
      assert got[name] == want[name], name
    for name, value in (want['metrics'] or {}).items():
      np.testing.assert_allclose(got['metrics'][name], value, rtol=RTOL,
                                 err_msg=name)


@pytest.fixture(name='trained_model_dirs', scope='module')
def _trained_model_dirs(tmp_path_factory):
  """{library: a model_dir trained 2 steps (checkpoints at 0 and 2) by it}."""
  model_dirs = {}
  for library in LIBRARIES:
    model_dirs[library] = tmp_path_factory.mktemp(library)
    executor_estimator(library, model_dirs[library]).train(
        inputs.dense_x, max_steps=2)
  return model_dirs


def run_evaluator(library, model_dir, monkeypatch, evaluate_returns=None,
                  **listener):
  """The evaluator task of a cluster whose training runs to step 6, on
  `model_dir` (its checkpoint at step 2); returns the listener's record.

  With `evaluate_returns`, the estimator's `evaluate` returns that.
  """
  monkeypatch.setenv('TF_CONFIG', _tf_config('evaluator'))
  driver = lanes.driver(library)
  recording = _recording_listener(library, **listener)
  estimator = executor_estimator(library, model_dir)
  if evaluate_returns is not None:
    estimator.evaluate = lambda **kwargs: evaluate_returns
  training_of(library)._TrainingExecutor(
      estimator,
      driver.TrainSpec(_input_fn_no_task_calls, max_steps=6),
      driver.EvalSpec(inputs.dense_x, steps=1, start_delay_secs=0,
                      throttle_secs=0),
      continuous_eval_listener=recording).run()
  return recording.calls, recording.steps


# {case: listener answers, (what it sees, the steps evaluated)}
EVALUATOR_LISTENERS = {
    'stopping_after_an_evaluation': (
        dict(before_eval=lambda: True, after_eval=lambda steps: False),
        (['before_eval', ('after_eval', 'evaluated')], [2])),
    'stopping_before_evaluating': (
        dict(before_eval=lambda: False, after_eval=lambda steps: True),
        (['before_eval'], [])),
}


@pytest.mark.parametrize('case', sorted(EVALUATOR_LISTENERS))
def test_the_evaluator_task_ends_where_the_continuous_eval_listener_stops(
    trained_model_dirs, monkeypatch, case):
  """(Training has not reached its max_steps: without the listener, the
  evaluator would wait for a new checkpoint.)"""
  listener, want = EVALUATOR_LISTENERS[case]
  for library in LIBRARIES:
    assert run_evaluator(library, trained_model_dirs[library], monkeypatch,
                         **listener) == want, library


# {case: what `evaluate` returns, the error TF 2.15 raises}
BAD_EVALUATE_RESULTS = {
    'empty': ({}, (ValueError, 'Internal error: `Estimator.evaluate` should '
                   'never return empty metrics.')),
    'not_a_dict': (3, (TypeError, '`Estimator.evaluate` should return dict. '
                       "Given <class 'int'>.")),
    'no_global_step': ({'loss': 1.0}, (
        ValueError, 'Internal error: `Estimator.evaluate` result should have '
        "`global_step` in result. Given {'loss': 1.0}")),
}


@pytest.mark.parametrize('case', sorted(BAD_EVALUATE_RESULTS))
def test_an_evaluate_result_without_metrics_is_tf_2_15s_error(
    trained_model_dirs, monkeypatch, case):
  metrics, want = BAD_EVALUATE_RESULTS[case]
  for library in LIBRARIES:
    got = outcome(run_evaluator, library, trained_model_dirs[library],
                  monkeypatch, evaluate_returns=metrics,
                  before_eval=lambda: True, after_eval=lambda steps: False)
    assert got == want, library


# {case: (error, TF 2.15's text, a call of (the library's training module,
#  its driver, an estimator))}
EXECUTOR_BAD_INPUT = {
    'eval_spec=object()': (
        TypeError, '`eval_spec` must be either `None` or have type '
        "`tf.estimator.EvalSpec`. Got: <class 'object'>",
        lambda training, driver, estimator: training._TrainingExecutor(
            estimator, driver.TrainSpec(_input_fn_no_task_calls), object())),
    'eval_spec=None, run_local()': (
        TypeError, '`eval_spec` must have type `tf.estimator.EvalSpec`. '
        "Got: <class 'NoneType'>",
        lambda training, driver, estimator: training._TrainingExecutor(
            estimator, driver.TrainSpec(_input_fn_no_task_calls),
            None).run_local()),
    'train_hooks=[1]': (
        TypeError, 'All hooks must be `SessionRunHook` instances, given: 1',
        lambda training, driver, estimator: training._TrainingExecutor(
            estimator, driver.TrainSpec(_input_fn_no_task_calls), None,
            train_hooks=[1])),
    'continuous_eval_listener=object()': (
        TypeError,
        '`continuous_eval_listener` must have type `_ContinuousEvalListener`.',
        lambda training, driver, estimator: training._TrainingExecutor(
            estimator, driver.TrainSpec(_input_fn_no_task_calls), None,
            continuous_eval_listener=object())),
}


@pytest.mark.parametrize('case', sorted(EXECUTOR_BAD_INPUT))
def test_bad_executor_arguments_get_tf_2_15_errors(tmp_path, case):
  error, message, call = EXECUTOR_BAD_INPUT[case]
  for library in LIBRARIES:
    got = outcome(call, training_of(library), lanes.driver(library),
                  executor_estimator(library, tmp_path / library))
    assert got == (error, message), library
