"""Early stopping (`tf.estimator.experimental.stop_if_*_hook`) with tpu_fc's TPUEstimator.

The evaluated metric is `(global_step - 4)²`, so when training stops follows
from the schedule alone: with a checkpoint (and an evaluation) every 2 steps
the evaluations read 4, 0, 4, 16 at steps 2, 4, 6, 8, and
`stop_if_no_decrease_hook(max_steps_without_decrease=4)` stops at step 8, the
first evaluation 4 steps past the best (the checkpoint hook, a chief hook,
saves and evaluates before the training hooks run).  With an emulated TPU
running 3 steps per `session.run`, checkpoints fall at 3, 6, 9 (1, 4, 25), and
training stops at 9.  Legacy lane: TF 2.15's TPUEstimator(use_tpu=False) with
TF's own hook stops at the same step with the same evaluations, and both save
the hook's stop variable (the Saver is built after the hooks' `begin`).
"""
import json

import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf
from tpu_fc.estimator import early_stopping

from harness import estimators
from harness import inputs
from harness import lanes
from harness import models
from harness import scripts

pytestmark = pytest.mark.filterwarnings('ignore::UserWarning')


@pytest.fixture
def installed():
  tpu_fc.install()
  yield
  tpu_fc.uninstall()


@pytest.fixture(scope='module')
def stopped(tmp_path_factory):
  """stopped(use_tpu): (what `train_until_stopped` gives, the evaluations'
  metrics) of tpu_fc's TPUEstimator under TF's names, as a legacy script
  has them, once per device: the module's tests share it."""
  runs = {}

  def run(use_tpu):
    if use_tpu not in runs:
      with tpu_fc.legacy_names.installed():
        estimator = estimators.early_stopping_estimator(
            tf.compat.v1.estimator.tpu, tmp_path_factory.mktemp('stopped'),
            use_tpu)
        runs[use_tpu] = (
            estimators.train_until_stopped(
                tf.compat.v1.estimator, tf.compat.v1.estimator.experimental,
                estimator),
            early_stopping.read_eval_metrics(estimator.eval_dir()))
    return runs[use_tpu]

  return run


def distances_of(evaluated):
  """{step: the evaluated metric at it}, from the schedule alone."""
  return {step: float((step - models.BEST_STEP) ** 2) for step in evaluated}


# Three steps a loop on the emulated TPU: test_a_legacy_script_stops_early_on_every_lane.
@pytest.mark.parametrize('use_tpu', [False, True])
def test_no_decrease_stops_where_the_schedule_says(stopped, use_tpu):
  got, metrics = stopped(use_tpu)
  assert got == (8, [2, 4, 6, 8], True)  # TF's Saver saves it too
  assert {step: m['distance'] for step, m in metrics.items()} == distances_of(
      [2, 4, 6, 8])


@pytest.mark.legacy_only
def test_stops_as_tf_2_15_does(stopped, tmp_path):
  """TF 2.15's TPUEstimator(use_tpu=False) and hook against tpu_fc's run of
  the test above."""
  estimator = estimators.early_stopping_estimator(
      tf.compat.v1.estimator.tpu, tmp_path, False)
  theirs = (estimators.train_until_stopped(
      tf.compat.v1.estimator, tf.compat.v1.estimator.experimental, estimator),
            early_stopping.read_eval_metrics(estimator.eval_dir()))
  ours = stopped(False)
  assert ours[0] == theirs[0]
  assert ours[0][0] < 30  # it did stop early
  assert list(ours[1]) == list(theirs[1])
  for step, metrics in theirs[1].items():
    assert sorted(ours[1][step]) == sorted(metrics)
    np.testing.assert_allclose(ours[1][step]['distance'],
                               metrics['distance'], rtol=0, err_msg=str(step))


def write_evaluations(eval_dir, history):
  """Writes {step: {metric: value}} as evaluations write them."""
  with tf.Graph().as_default():
    writer = tf.compat.v1.summary.FileWriter(str(eval_dir))
    for step, metrics in history.items():
      summary = tf.compat.v1.Summary()
      for tag, value in metrics.items():
        summary.value.add(tag=tag, simple_value=value)
      writer.add_summary(summary, step)
    writer.close()


def steps_until_stopped(hook):
  """Session runs a fresh graph makes before `hook` stops it (at most 3)."""
  with tf.Graph().as_default():
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.assign_add(step, 1)
    runs = 0
    with tf.compat.v1.train.MonitoredSession(hooks=[
        hook, tf.compat.v1.train.StopAtStepHook(last_step=3)]) as session:
      while not session.should_stop():
        session.run(train_op)
        runs += 1
    return runs


# The history's loss: 5, 4, 4.5, 4.2 at steps 10..40; accuracy 0.5, 0.7,
# 0.65, 0.8. {case: (hook, its arguments, stops?)}: hand-derived.
HISTORY = {10: dict(loss=5.0, accuracy=0.5), 20: dict(loss=4.0, accuracy=0.7),
           30: dict(loss=4.5, accuracy=0.65), 40: dict(loss=4.2, accuracy=0.8)}
PREDICATES = {
    'no decrease for 20 (40 - 20)': (
        'stop_if_no_decrease_hook', ('loss', 20), {}, True),
    'no decrease for 21': ('stop_if_no_decrease_hook', ('loss', 21), {}, False),
    'no increase for 10 (30 - 20)': (
        'stop_if_no_increase_hook', ('accuracy', 10), {}, True),
    'no increase for 11 (40 beats 20)': (
        'stop_if_no_increase_hook', ('accuracy', 11), {}, False),
    'lower than 4.1': ('stop_if_lower_hook', ('loss', 4.1), {}, True),
    'lower than 4.0 (not equal)': (
        'stop_if_lower_hook', ('loss', 4.0), {}, False),
    'higher than 0.75': ('stop_if_higher_hook', ('accuracy', 0.75), {}, True),
    'higher than 0.75 before step 40': (
        'stop_if_higher_hook', ('accuracy', 0.75), {'eval_dir': 'before 40'},
        False),
    'lower than 4.1, from step 30 (4.2 at 40)': (
        'stop_if_lower_hook', ('loss', 4.1), {'min_steps': 30}, False),
    'no decrease for 10, from step 30 (best at 30)': (
        'stop_if_no_decrease_hook', ('loss', 10), {'min_steps': 30}, False),
}


@pytest.mark.parametrize('case', sorted(PREDICATES))
def test_predicates(tmp_path, case):
  name, args, kwargs, stops = PREDICATES[case]
  write_evaluations(tmp_path / 'eval', HISTORY)
  write_evaluations(tmp_path / 'before 40',
                    {s: m for s, m in HISTORY.items() if s < 40})
  kwargs = dict(kwargs, eval_dir=str(tmp_path / kwargs.get('eval_dir', 'eval')))
  watched = [(early_stopping,
              estimators.early_stopping_estimator(tpu_fc, tmp_path, False))]
  if lanes.LEGACY:
    watched.append((tf.compat.v1.estimator.experimental,
                    tf.compat.v1.estimator.Estimator(
                        models.distance_model_fn(), model_dir=str(tmp_path))))
  for namespace, estimator in watched:
    hook = getattr(namespace, name)(estimator, *args, run_every_secs=None,
                                    run_every_steps=1, **kwargs)
    assert steps_until_stopped(hook) == (1 if stops else 3), namespace


def test_a_metric_the_evaluations_lack_is_named(tmp_path):
  write_evaluations(tmp_path / 'eval', HISTORY)
  hook = early_stopping.stop_if_lower_hook(
      estimators.early_stopping_estimator(tpu_fc, tmp_path, False), 'auc', 0.9,
      eval_dir=str(tmp_path / 'eval'), run_every_secs=None, run_every_steps=1)
  with pytest.raises(KeyError, match='watches the metric "auc", but the '
                     'evaluation of step 10 .* has only: accuracy, loss'):
    steps_until_stopped(hook)


@pytest.mark.parametrize('name', lanes.DRIVERS)
def test_workers_stop_when_the_chief_has(name, tmp_path, monkeypatch):
  """A worker's hook reads the stop variable the chief's hook sets, under
  TF's names (`_get_or_create_stop_var`, the hooks' `_stop_var`: TF's tests
  read them)."""
  monkeypatch.setenv('TF_CONFIG', json.dumps(dict(
      cluster=dict(chief=['localhost:1'], worker=['localhost:2']),
      task=dict(type='worker', index=0))))
  module = lanes.core_module(name, 'early_stopping')
  if name == 'tpu_fc':
    estimator = estimators.early_stopping_estimator(tpu_fc, tmp_path, False)
  else:
    estimator = tf.compat.v1.estimator.Estimator(models.distance_model_fn(),
                                                 model_dir=str(tmp_path))
  assert not estimator.config.is_chief
  worker_hook = module.make_early_stopping_hook(estimator, lambda: True)
  with tf.Graph().as_default():
    step = tf.compat.v1.train.get_or_create_global_step()
    train_op = tf.compat.v1.assign_add(step, 1)
    stop = module._get_or_create_stop_var()  # pylint: disable=protected-access
    chief_stops = tf.compat.v1.assign(stop, True)
    with tf.compat.v1.train.MonitoredSession(hooks=[worker_hook]) as session:
      assert worker_hook._stop_var is stop  # pylint: disable=protected-access
      session.run(train_op)
      assert not session.should_stop()  # the chief has not asked
      session.run(chief_stops)
      session.run(train_op)
      assert session.should_stop()


def test_bad_arguments_get_tf_2_15_errors(tmp_path):
  estimator = estimators.early_stopping_estimator(tpu_fc, tmp_path, False)
  with pytest.raises(ValueError, match='Only one of `run_every_secs` and '
                     '`run_every_steps` must be set.'):
    early_stopping.make_early_stopping_hook(estimator, lambda: True, 10, 10)
  with pytest.raises(TypeError, match='`should_stop_fn` must be callable.'):
    early_stopping.make_early_stopping_hook(estimator, None)
  with pytest.raises(TypeError, match='must have type `tf.estimator.Estimator`'
                     r" \(here: tpu_fc's Estimator or TPUEstimator\)"):
    early_stopping.stop_if_lower_hook(object(), 'loss', 1.0)


@pytest.mark.subprocess
def test_a_legacy_script_stops_early_on_every_lane(tmp_path):
  """`tf.estimator.experimental.stop_if_no_decrease_hook` under `tpu_fc run`,
  on the emulated TPU running 3 steps a loop: it stops, and evaluates, where
  the schedule says (the one run of that schedule)."""
  script = tmp_path / 'script.py'
  script.write_text(
      'import tensorflow as tf\n'
      'from harness import estimators\n'
      'estimator = estimators.early_stopping_estimator(\n'
      '    tf.compat.v1.estimator.tpu, {model_dir!r}, True, 3)\n'
      'print("stopped at", estimators.train_until_stopped(\n'
      '    tf.estimator, tf.estimator.experimental, estimator))\n'
      'from tpu_fc.estimator import early_stopping\n'
      'print("distances", {{step: float(m["distance"]) for step, m in\n'
      '    early_stopping.read_eval_metrics(estimator.eval_dir()).items()}})\n'
      .format(model_dir=str(tmp_path / 'model')))
  out = scripts.run_python(['-m', 'tpu_fc', 'run', str(script)], check=True,
                           cwd=str(tmp_path), env=scripts.env())
  assert 'stopped at (9, [3, 6, 9], True)' in out.stdout
  assert 'distances {}'.format(distances_of([3, 6, 9])) in out.stdout


def test_a_checkpoint_without_the_stop_variable_resumes(installed, tmp_path):
  """Where TF 2.15's restore failed (`Key signal_early_stopping/STOP not found`)."""
  del installed  # the model_fn's TF names
  estimator = estimators.early_stopping_estimator(tpu_fc, tmp_path, True)
  estimator.train(inputs.ids_and_x_repeated, max_steps=2)
  before = dict(tf.train.list_variables(estimator.latest_checkpoint()))
  estimator.train(inputs.ids_and_x_repeated, max_steps=4, hooks=[
      early_stopping.make_early_stopping_hook(estimator, lambda: False)])
  after = dict(tf.train.list_variables(estimator.latest_checkpoint()))
  assert estimator.get_variable_value('global_step') == 4
  assert set(after) - set(before) == {'signal_early_stopping/STOP'}
