"""What a model_fn's spec gets on the emulated TPU, as TPUEstimator on a TPU.

Against TF 2.15's `tpu_estimator.py` (which needs a TPU to run): `scaffold_fn`
runs once the embedding tables exist, in one-step runs too; a host_call's
`tf.compat.v1.summary` op is refused with TF's text in every loop length; a
plain `EstimatorSpec`'s chief hooks are refused and its scaffold ignored with
TF's warning, and TPU evaluation refuses a plain `EstimatorSpec`; a hook
fetching a model_fn tensor from the evaluation loop is told why.
"""
import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf

from harness import estimators
from harness import inputs
from harness import lanes
from harness import models

pytestmark = pytest.mark.filterwarnings('ignore::UserWarning')
TABLE_AND_SLOT = {models.TABLE, models.TABLE + '/Adagrad'}


@pytest.mark.parametrize('input_fn, iterations_per_loop', [
    (inputs.contract_input_fn('sparse'), 1), (inputs.contract_tensors, 2),
    (inputs.contract_input_fn('sparse'), 2)],
                         ids=['one_step_loop', 'tensors', 'loop'])
def test_a_scaffold_fn_saver_saves_the_tables(tmp_path, input_fn,
                                              iterations_per_loop):
  tpu = estimators.option_estimator(tmp_path, 'scaffold_saver',
                                    iterations_per_loop)
  tpu.train(input_fn, max_steps=4)
  saved = dict(tf.train.list_variables(tpu.latest_checkpoint()))
  assert TABLE_AND_SLOT <= set(saved)
  assert not any('dummy' in name for name in saved)
  assert len(tf.train.get_checkpoint_state(
      str(tmp_path)).all_model_checkpoint_paths) == 1  # its max_to_keep
  assert tpu.evaluate(input_fn, steps=1)['global_step'] == 4


def _finalize_counting_model_fn(driver, finalized):
  """features['x'] through a dense layer, whose scaffold_fn's Scaffold counts,
  per mode, the calls of a `finalize` it overrides (as TF's TPU tests do)."""
  def model_fn(features, labels, mode, params):
    def scaffold_fn():
      scaffold = tf.compat.v1.train.Scaffold()
      finalize = scaffold.finalize

      def counted():
        finalized[mode] = finalized.get(mode, 0) + 1
        return finalize()

      scaffold.finalize = counted
      return scaffold

    logits = tf.compat.v1.layers.dense(features['x'], 1)
    if mode == tpu_fc.ModeKeys.PREDICT:
      return driver.TPUEstimatorSpec(mode, predictions={'logit': logits},
                                     scaffold_fn=scaffold_fn)
    loss = tf.compat.v1.losses.mean_squared_error(labels, logits)
    return models.tpu_spec(
        mode, loss, cross_shard=params['use_tpu'], driver=driver,
        scaffold_fn=scaffold_fn, eval_metrics=(
            lambda logits: {'mean': tf.compat.v1.metrics.mean(logits)},
            [logits]))
  return model_fn


@pytest.mark.parametrize('driver,use_tpu', [('tpu_fc', True), ('tpu_fc', False)] + (
    [('tf', False)] if 'tf' in lanes.DRIVERS else []))
def test_the_scaffold_fn_scaffold_is_the_one_finalized_once_per_mode(
    tmp_path, driver, use_tpu):
  """The Scaffold of `scaffold_fn` is the session's, finalized once in every
  mode, on the emulated TPU as on the CPU, and as TF 2.15's
  TPUEstimator(use_tpu=False) finalizes it."""
  namespace = lanes.driver(driver)
  finalized = {}
  estimator = namespace.TPUEstimator(
      model_fn=_finalize_counting_model_fn(namespace, finalized),
      use_tpu=use_tpu, train_batch_size=4, eval_batch_size=4,
      predict_batch_size=4, config=namespace.RunConfig(
          model_dir=str(tmp_path), tpu_config=namespace.TPUConfig(
              num_shards=2 if use_tpu else None, iterations_per_loop=2)))
  estimator.train(inputs.dense_x, steps=2)
  estimator.evaluate(inputs.dense_x, steps=1)
  next(estimator.predict(inputs.dense_x))
  assert finalized == {'train': 1, 'eval': 1, 'infer': 1}


@pytest.mark.parametrize('iterations_per_loop', [1, 2])
def test_a_v1_summary_in_host_call_gets_tfs_error(tmp_path,
                                                  iterations_per_loop):
  with pytest.raises(ValueError, match='Please use tf.contrib.summary instead '
                     'of tf.summary inside of host_calls.'):
    estimators.option_estimator(
        tmp_path, 'v1_summary_in_host_call', iterations_per_loop).train(
            inputs.contract_input_fn('sparse'), max_steps=2)


def test_a_plain_spec_with_chief_hooks_gets_tfs_error(tmp_path):
  with pytest.raises(ValueError, match='training_chief_hooks returned by '
                     'EstimatorSpec is not supported in TPUEstimator.If you '
                     'want to pass training hooks, please pass via '
                     'training_hooks.'):
    estimators.option_estimator(tmp_path, 'plain_spec_chief_hook').train(
        inputs.contract_input_fn('sparse'), max_steps=2)


@pytest.mark.parametrize('iterations_per_loop', [1, 2])
def test_a_plain_specs_scaffold_is_ignored_with_tfs_warning(
    tmp_path, tf_log, iterations_per_loop):
  """Its Saver, made before the tables exist, would have left them unsaved."""
  tpu = estimators.option_estimator(tmp_path, 'plain_spec_saver',
                                    iterations_per_loop)
  tpu.train(inputs.contract_input_fn('sparse'), max_steps=2)
  assert TABLE_AND_SLOT <= set(dict(tf.train.list_variables(
      tpu.latest_checkpoint())))
  assert ('EstimatorSpec.Scaffold is ignored by TPU train/eval. Please use '
          'TPUEstimatorSpec.') in tf_log


def test_an_evaluation_hook_on_a_model_fn_tensor_is_told_why(tmp_path):
  tpu = estimators.option_estimator(tmp_path, 'eval_hook_on_loss')
  tpu.train(inputs.contract_input_fn('sparse'), max_steps=1)
  with pytest.raises(ValueError, match='(?s)inside the TPU evaluation loop .*'
                     'evaluation_hooks cannot fetch its tensors .*Pass them '
                     'to eval_metrics instead'):
    tpu.evaluate(inputs.contract_input_fn('sparse'), steps=2)


def _metric_ops_model_fn(features, labels, mode, params):
  """`tpu_estimator_evaluation_test.py`'s model_fn with eval_metric_ops: an
  EstimatorSpec in evaluation, its metrics built in every mode (TF's builds
  them in training too: each emulated shard then has their local variables)."""
  del params
  predictions = tf.compat.v1.layers.dense(features['x'], 1)
  loss = tf.compat.v1.losses.mean_squared_error(labels, predictions)
  eval_metric_ops = {
      'mse': tf.compat.v1.metrics.mean_absolute_error(labels, predictions)}
  if mode == tpu_fc.ModeKeys.EVAL:
    return tpu_fc.EstimatorSpec(mode, loss=loss, eval_metric_ops=eval_metric_ops)
  return models.tpu_spec(mode, loss)


@pytest.mark.parametrize('eval_on_tpu', [True, False])
def test_tpu_evaluation_needs_a_tpu_estimator_spec(tmp_path, eval_on_tpu):
  """`test_eval_metrics_ops_tpu_training_failure` and `..._tpu_training`
  (iterations_per_loop=2, 2 shards): on the CPU the metric is the checkpoint's
  model's mean absolute error over the batch."""
  estimator = tpu_fc.TPUEstimator(
      model_fn=_metric_ops_model_fn, train_batch_size=4, eval_batch_size=4,
      eval_on_tpu=eval_on_tpu,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path), tpu_config=tpu_fc.TPUConfig(
          iterations_per_loop=2, num_shards=2)))
  estimator.train(inputs.dense_x, steps=1)
  if not eval_on_tpu:
    kernel, bias = (estimator.get_variable_value('dense/' + name)
                    for name in ('kernel', 'bias'))
    x = np.arange(8, dtype=np.float32).reshape(4, 2) / 8
    expected = np.mean(np.abs(2 * x.sum(1, keepdims=True) - (x @ kernel + bias)))
    assert estimator.evaluate(inputs.dense_x, steps=1)['mse'] == pytest.approx(
        expected, rel=1e-6)
    return
  with pytest.raises(RuntimeError, match=(
      'estimator_spec used by TPU evaluation must have type`TPUEstimatorSpec`. '
      "Got <class 'tpu_fc.estimator.model_fn.EstimatorSpec'>")):
    estimator.evaluate(inputs.dense_x, steps=1)
