"""install()/uninstall(): legacy names bound to tpu_fc (`python -m tpu_fc run`
of a legacy script: tests/test_legacy_scripts.py)."""

import pytest

import tpu_fc
import tensorflow as tf

from harness import lanes
from harness import scripts


# Every `*Parameters` of TF 2.15's tensorflow.python.tpu.tpu_embedding.
LEGACY_PARAMETERS = (
    'AdagradParameters', 'AdamParameters', 'FtrlParameters',
    'StochasticGradientDescentParameters', 'MomentumParameters',
    'RMSPropParameters', 'ProximalAdagradParameters',
    'AdagradMomentumParameters', 'ProximalYogiParameters',
    'FrequencyEstimatorParameters')


@pytest.fixture
def installed():
  tpu_fc.install()
  yield
  tpu_fc.uninstall()


def test_install_binds_legacy_names(installed):
  v1 = tf.compat.v1
  assert v1.tpu.experimental.embedding_column is tpu_fc.embedding_column
  assert (v1.tpu.experimental.shared_embedding_columns is
          tpu_fc.shared_embedding_columns)
  for name in LEGACY_PARAMETERS:
    assert getattr(v1.tpu.experimental, name) is getattr(tpu_fc, name)
  for estimator_namespace in (v1.estimator, tf.estimator):
    tpu = estimator_namespace.tpu
    assert tpu.experimental.EmbeddingConfigSpec is tpu_fc.EmbeddingConfigSpec
    assert tpu.TPUEstimator is tpu_fc.TPUEstimator
    assert tpu.TPUEstimatorSpec is tpu_fc.TPUEstimatorSpec
    assert tpu.RunConfig is tpu_fc.RunConfig
    assert tpu.TPUConfig is tpu_fc.TPUConfig
    assert tpu.InputPipelineConfig is tpu_fc.InputPipelineConfig
    assert estimator_namespace.ModeKeys is tpu_fc.ModeKeys


HOOK_NAMES = ('SessionRunHook', 'SessionRunArgs', 'SessionRunContext',
              'SessionRunValues', 'LoggingTensorHook', 'StopAtStepHook',
              'CheckpointSaverHook', 'CheckpointSaverListener', 'StepCounterHook',
              'SummarySaverHook', 'NanTensorHook', 'NanLossDuringTrainingError',
              'GlobalStepWaiterHook', 'FinalOpsHook', 'FeedFnHook',
              'ProfilerHook', 'SecondOrStepTimer')
TRAINING_NAMES = ('TrainSpec', 'EvalSpec', 'Exporter', 'LatestExporter',
                  'FinalExporter', 'BestExporter')


def test_install_binds_train_and_evaluate_names_where_tf_has_none(installed):
  """TF 2.15's own names win; without tf.estimator, tpu_fc's stand in."""
  from tpu_fc.estimator import estimator as estimator_lib  # pylint: disable=g-import-not-at-top
  from tpu_fc.estimator import hooks  # pylint: disable=g-import-not-at-top
  from tpu_fc.estimator import inputs  # pylint: disable=g-import-not-at-top
  from tpu_fc.estimator import model_fn  # pylint: disable=g-import-not-at-top
  from tpu_fc.estimator import run_config  # pylint: disable=g-import-not-at-top
  legacy = lanes.LEGACY
  for estimator_namespace in (tf.compat.v1.estimator, tf.estimator):
    for name in HOOK_NAMES:  # tensorflow_estimator re-exported TF core's
      assert getattr(estimator_namespace, name) is getattr(
          tf.compat.v1.train, name), name
    own = {name: getattr(tpu_fc, name) for name in TRAINING_NAMES}
    own.update(WarmStartSettings=estimator_lib.WarmStartSettings,
               Estimator=estimator_lib.Estimator,
               RunConfig=run_config.RunConfig,
               EstimatorSpec=tpu_fc.EstimatorSpec)
    for name, value in own.items():
      bound = getattr(estimator_namespace, name)
      if legacy:
        assert bound.__module__.startswith('tensorflow_estimator.'), name
      else:
        assert bound is value, name
    assert (estimator_namespace.train_and_evaluate.__wrapped__ is
            tpu_fc.train_and_evaluate)
    assert estimator_namespace.VocabInfo is tf.compat.v1.train.VocabInfo
    assert estimator_namespace.export.EvalOutput is tpu_fc.export.EvalOutput
    experimental = {
        'InMemoryEvaluatorHook': hooks.InMemoryEvaluatorHook,
        'make_stop_at_checkpoint_step_hook': (
            hooks.make_stop_at_checkpoint_step_hook),
        'build_raw_supervised_input_receiver_fn': (
            tpu_fc.export.build_raw_supervised_input_receiver_fn),
        'call_logit_fn': model_fn.call_logit_fn}
    for name, value in experimental.items():
      bound = getattr(estimator_namespace.experimental, name)
      assert (bound.__module__.startswith('tensorflow_estimator.') if legacy
              else bound is value), name
  for name in ('numpy_input_fn', 'pandas_input_fn'):  # TF 1's API only
    bound = getattr(tf.compat.v1.estimator.inputs, name)
    assert (bound.__module__.startswith('tensorflow_estimator.') if legacy
            else bound is getattr(inputs, name)), name
  assert not hasattr(tf.estimator, 'inputs')
  # Loading tensorflow_estimator for those names left the bindings alone.
  assert tf.estimator.tpu.TPUEstimator is tpu_fc.TPUEstimator


def _twin_model_fn(features, labels, mode):
  """A TPUEstimator script's CPU/GPU twin's model, by TF's names only: one
  dense unit (kernel 0.3, bias 0), squared error, gradient descent at 0.1."""
  logits = tf.compat.v1.layers.dense(
      features['x'], 1,
      kernel_initializer=tf.compat.v1.constant_initializer(0.3))
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions={'logit': logits})
  loss = tf.compat.v1.losses.mean_squared_error(labels, logits)
  train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
      loss, tf.compat.v1.train.get_global_step())
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op)


def _twin_input_fn():
  """Two rows of x = [1, 1], label 1."""
  return tf.data.Dataset.from_tensor_slices((
      {'x': [[1., 1.], [1., 1.]]}, [[1.], [1.]])).batch(2)


@pytest.mark.filterwarnings('ignore:`tf.layers.dense` is deprecated')
def test_the_cpu_twin_of_a_tpu_estimator_script_runs_unchanged(installed,
                                                               tmp_path):
  """`tf.estimator.Estimator(model_fn, config=tf.estimator.RunConfig(...))`:
  tpu_fc's core Estimator where TF has none, TF's own on TF 2.15; a
  TPUEstimator refuses that RunConfig with TF's text."""
  from tpu_fc.estimator import estimator as estimator_lib  # pylint: disable=g-import-not-at-top
  from tpu_fc.estimator import run_config  # pylint: disable=g-import-not-at-top
  for namespace in (tf.estimator, tf.compat.v1.estimator):
    if lanes.LEGACY:
      assert namespace.Estimator.__module__.startswith('tensorflow_estimator.')
    else:
      assert namespace.Estimator is estimator_lib.Estimator
      assert namespace.RunConfig is run_config.RunConfig
  estimator = tf.estimator.Estimator(
      _twin_model_fn, config=tf.estimator.RunConfig(model_dir=str(tmp_path)))
  # logit 2 * 0.3 = 0.6: loss (1 - 0.6)^2 = 0.16; one step moves the kernel
  # and bias by 0.1 * 2 * 0.4 = 0.08: logit 2 * 0.38 + 0.08 = 0.84, loss
  # 0.16^2 = 0.0256.
  assert estimator.evaluate(_twin_input_fn)['loss'] == pytest.approx(0.16)
  estimator.train(_twin_input_fn, steps=1)
  assert estimator.evaluate(_twin_input_fn) == {
      'loss': pytest.approx(0.0256), 'global_step': 1}
  assert [p['logit'] for p in estimator.predict(
      lambda: _twin_input_fn().map(lambda x, y: x))] == [
          pytest.approx([0.84])] * 2
  with pytest.raises(ValueError) as error:
    tf.compat.v1.estimator.tpu.TPUEstimator(
        _twin_model_fn, config=tf.estimator.RunConfig(), use_tpu=False)
  assert str(error.value) == (
      '`config` must be provided with type `tpu_config.RunConfig`')


@pytest.mark.parametrize('name', [
    'train_and_evaluate', 'add_metrics', 'experimental.make_early_stopping_hook',
    'experimental.stop_if_higher_hook', 'experimental.stop_if_lower_hook',
    'experimental.stop_if_no_increase_hook',
    'experimental.stop_if_no_decrease_hook'])
def test_estimator_functions_leave_other_estimators_to_tf(installed, name):
  """tpu_fc's take tpu_fc's estimators; any other goes to TF's own, if any."""
  arguments = {
      'train_and_evaluate': (tf.estimator.TrainSpec(lambda: None),
                             tf.estimator.EvalSpec(lambda: None)),
      'add_metrics': (lambda labels: {},),
      'experimental.make_early_stopping_hook': (lambda: True,)}
  for estimator_namespace in (tf.compat.v1.estimator, tf.estimator):
    function = estimator_namespace
    for attribute in name.split('.'):
      function = getattr(function, attribute)
    with pytest.raises((TypeError, AttributeError)) as error:
      function(object(), *arguments.get(name, ('loss', 1)))
    ours = "here: tpu_fc's Estimator or TPUEstimator" in str(error.value)
    assert ours != lanes.LEGACY, error.value


def test_removed_legacy_module_is_stood_in_for(installed):
  """TF 2.16 removed tensorflow.python.tpu.tpu_embedding; scripts import from it."""
  from tensorflow.python.tpu import tpu_embedding  # pylint: disable=g-import-not-at-top
  if lanes.LEGACY:
    assert tpu_embedding.__file__.endswith('tpu_embedding.py')  # TF's own, untouched
  else:
    for name in LEGACY_PARAMETERS:
      assert getattr(tpu_embedding, name) is getattr(tpu_fc, name)
    assert tpu_embedding.TableConfig is tpu_fc.TableConfig


def test_install_is_idempotent_and_uninstall_restores():
  before = {name: tf.compat.v1.tpu.experimental.__dict__.get(name)
            for name in ('embedding_column', 'AdagradParameters')}
  estimator_before = tf.__dict__.get('estimator')
  tpu_fc.install()
  tpu_fc.install()
  assert tf.compat.v1.tpu.experimental.embedding_column is tpu_fc.embedding_column
  tpu_fc.uninstall()
  after = {name: tf.compat.v1.tpu.experimental.__dict__.get(name)
           for name in before}
  assert after == before
  assert tf.__dict__.get('estimator') is estimator_before
  assert not tpu_fc.legacy_names.is_installed()


def test_unknown_estimator_name_is_a_clear_attribute_error(installed):
  if lanes.LEGACY:
    pytest.skip('on TF 2.15 unknown names fall back to tensorflow_estimator')
  with pytest.raises(AttributeError, match='tpu_fc provides: .*TPUEstimator'):
    tf.compat.v1.estimator.tpu.NoSuchThing  # pylint: disable=pointless-statement


IMPORT_SCRIPT = """
import tpu_fc
tpu_fc.install()
import tensorflow as tf
from tensorflow.estimator.experimental import stop_if_no_decrease_hook
from tensorflow.compat.v1.estimator.tpu import TPUEstimator
from tensorflow.compat.v1.estimator.tpu.experimental import EmbeddingConfigSpec
import tensorflow.estimator.export as export
from tensorflow.compat.v1.estimator.inputs import numpy_input_fn
from tpu_fc.estimator import early_stopping
assert numpy_input_fn is tf.compat.v1.estimator.inputs.numpy_input_fn
assert stop_if_no_decrease_hook.__wrapped__ is (
    early_stopping.stop_if_no_decrease_hook)
assert TPUEstimator is tpu_fc.TPUEstimator
assert EmbeddingConfigSpec is tpu_fc.EmbeddingConfigSpec
assert export.ServingInputReceiver is tpu_fc.export.ServingInputReceiver
# The imports left the bound names alone.
assert tf.estimator.tpu.TPUEstimator is tpu_fc.TPUEstimator
assert tf.compat.v1.estimator.tpu.TPUEstimator is tpu_fc.TPUEstimator
tpu_fc.uninstall()
import sys
assert 'tensorflow.estimator.experimental' not in sys.modules or (
    sys.modules['tensorflow.estimator.experimental'].__name__ !=
    'tensorflow.estimator.experimental')
print('imports ok')
"""


@pytest.mark.subprocess
def test_imports_by_path_get_the_installed_names():
  """`from tensorflow.estimator.experimental import ...` (a path import loads
  TF's module and binds it over the installed namespace, or on TF >= 2.16
  finds no module at all)."""
  finished = scripts.run_python(['-c', IMPORT_SCRIPT])
  assert finished.returncode == 0, finished.stderr[-3000:]
  assert 'imports ok' in finished.stdout
