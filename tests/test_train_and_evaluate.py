"""`train_and_evaluate`, its specs and exporters, against TF 2.15's.

Legacy lane: the same model and data through TF's own TPUEstimator(use_tpu=False)
and `train_and_evaluate`, and through tpu_fc's, give the same evaluations (at
the same steps, with the same hooks, names and step counts), the same results
and the same export directories.  Both lanes: a legacy script using only TF's
names (`tf.estimator.train_and_evaluate`, an emulated TPU with an embedding
spec, a LatestExporter) runs unchanged under `python -m tpu_fc run`; bad specs
get TF's errors.
"""
import importlib
import json
import os
import sys

import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf

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


def run_train_and_evaluate(library, model_dir, case):
  """Runs `case` through `library`; returns what the comparison looks at."""
  driver = lanes.driver(library)
  train_hook, eval_hook = hooks.SessionSteps(), hooks.SessionSteps()
  estimator = driver.TPUEstimator(
      model_fn=MODEL_FN, use_tpu=False, train_batch_size=BATCH,
      eval_batch_size=BATCH, export_to_tpu=False,
      config=driver.RunConfig(model_dir=str(model_dir), tf_random_seed=7,
                              save_checkpoints_steps=case['checkpoint_every']))
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
