"""What legacy TPUEstimator scripts tripped on, through the public API."""
import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import TF_VERSION
from tpu_fc._tf import tf

N, BATCH = 16, 4
X = np.linspace(-1, 1, N * 2).astype(np.float32).reshape(N, 2)
Y = (X[:, :1] > 0).astype(np.float32)
pytestmark = pytest.mark.filterwarnings('ignore:`tf.layers.dense` is deprecated')


def input_fn(params):
  return tf.data.Dataset.from_tensor_slices((X, Y)).repeat().batch(
      params['batch_size'], drop_remainder=True)


def model_fn(features, labels, mode, params):
  """Features as one Tensor (not a dict), as in TF's MNIST/ResNet TPU models."""
  logits = tf.compat.v1.layers.dense(
      features, 1, kernel_initializer=tf.compat.v1.constant_initializer(0.3))
  loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
  if mode == tpu_fc.ModeKeys.EVAL:
    return params['spec'](mode, loss=loss, eval_metrics=(
        lambda labels, logits: {'mean_logit': tf.compat.v1.metrics.mean(logits)},
        [labels, logits]))
  optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
  if params['use_tpu']:
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
  hooks = [tf.compat.v1.train.LoggingTensorHook({'loss': loss}, every_n_iter=1)
          ] if params['hook_on_loss'] else []
  return params['spec'](
      mode, loss=loss, training_hooks=hooks,
      train_op=optimizer.minimize(loss, tf.compat.v1.train.get_global_step()))


def _train(model_dir, use_tpu, hook_on_loss=False, driver=tpu_fc):
  """Trains 2 steps and evaluates, with `driver`'s TPUEstimator (tpu_fc or TF's)."""
  estimator = driver.TPUEstimator(
      model_fn=model_fn, use_tpu=use_tpu, train_batch_size=BATCH,
      eval_batch_size=BATCH,
      params={'hook_on_loss': hook_on_loss, 'spec': driver.TPUEstimatorSpec},
      config=driver.RunConfig(model_dir=str(model_dir), tpu_config=driver.TPUConfig(
          iterations_per_loop=2, num_shards=2 if use_tpu else None)))
  estimator.train(input_fn, max_steps=2)
  metrics = estimator.evaluate(
      lambda params: input_fn(params).take(N // BATCH), steps=None)
  return metrics, estimator.get_variable_value('dense/kernel')


def test_features_as_one_tensor_run_on_the_emulated_tpu(tmp_path):
  """TPUEstimator's input_fn may give a Tensor, not a dict (it crashed with use_tpu=True)."""
  cpu_metrics, cpu_kernel = _train(tmp_path / 'cpu', use_tpu=False)
  tpu_metrics, tpu_kernel = _train(tmp_path / 'tpu', use_tpu=True)
  np.testing.assert_allclose(tpu_kernel, cpu_kernel, rtol=1e-6)
  # (The eval loss is shard 0's, as on a TPU; metrics see every shard.)
  np.testing.assert_allclose(tpu_metrics['mean_logit'], cpu_metrics['mean_logit'],
                             rtol=1e-6)
  if TF_VERSION == (2, 15):  # TF's own driver agrees
    legacy_metrics, legacy_kernel = _train(
        tmp_path / 'legacy', use_tpu=False, driver=tf.compat.v1.estimator.tpu)
    np.testing.assert_allclose(legacy_kernel, cpu_kernel, rtol=1e-6)
    np.testing.assert_allclose(legacy_metrics['loss'], cpu_metrics['loss'], rtol=1e-6)


def test_hook_on_a_model_fn_tensor_says_to_use_host_call(tmp_path, tf_log):
  """The hook works on the CPU; under the TPU loop the error says why and what to do."""
  _train(tmp_path / 'cpu', use_tpu=False, hook_on_loss=True)
  assert any(m.startswith('loss = ') for m in tf_log)
  with pytest.raises(ValueError, match='training_hooks cannot fetch its '
                     'tensors .*Pass them to host_call instead'):
    _train(tmp_path / 'tpu', use_tpu=True, hook_on_loss=True)
