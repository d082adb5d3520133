"""use_tpu=True without a TPU: the model_fn on emulated shards behaves as TPU replicas."""
import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf
from tpu_fc.estimator.tpu import tpu_context

pytestmark = pytest.mark.filterwarnings('ignore:`tf.layers.dense` is deprecated')

N, BATCH = 16, 8
X = np.linspace(-1, 1, 3 * N).astype(np.float32).reshape(N, 3)
Y = (X[:, :1] * 2 - X[:, 1:2] > 0).astype(np.float32)


def input_fn(params):
  dataset = tf.data.Dataset.from_tensor_slices(({'x': X}, Y))
  return dataset.repeat().batch(params['batch_size'], drop_remainder=True)


def make_model_fn(seen_batch_sizes, reduction):
  def model_fn(features, labels, mode, params):
    seen_batch_sizes.append(params['batch_size'])
    hidden = tf.compat.v1.layers.dense(
        features['x'], 4, activation=tf.nn.tanh,
        kernel_initializer=tf.compat.v1.constant_initializer(
            np.linspace(-0.5, 0.5, 12).reshape(3, 4)))
    logits = tf.compat.v1.layers.dense(
        hidden, 1, kernel_initializer=tf.compat.v1.ones_initializer())
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(
        labels, logits, reduction=reduction)
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.5)
    if params['use_tpu']:
      optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
    train_op = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
    return tpu_fc.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)
  return model_fn


def _train(tmp_path, use_tpu, num_shards, reduction, steps=3):
  seen = []
  estimator = tpu_fc.TPUEstimator(
      model_fn=make_model_fn(seen, reduction), use_tpu=use_tpu,
      train_batch_size=BATCH,
      config=tpu_fc.RunConfig(
          model_dir=str(tmp_path / '{}_{}'.format(use_tpu, num_shards)),
          tpu_config=tpu_fc.TPUConfig(num_shards=num_shards)))
  estimator.train(input_fn, max_steps=steps)
  return {name: estimator.get_variable_value(name)
          for name in estimator.get_variable_names()}, seen


@pytest.mark.parametrize('num_shards', [2, 4])
def test_cross_shard_optimizer_averages_like_one_global_batch(tmp_path,
                                                              num_shards):
  """Mean losses: the average of shard gradients is the global-batch gradient."""
  mean = tf.compat.v1.losses.Reduction.MEAN
  emulated, seen = _train(tmp_path, True, num_shards, mean)
  reference, _ = _train(tmp_path, False, None, mean)
  assert set(seen) == {BATCH // num_shards}
  assert sorted(emulated) == sorted(reference)  # one set of variables
  for name, value in reference.items():
    np.testing.assert_allclose(emulated[name], value, rtol=1e-5, atol=1e-6,
                               err_msg=name)


def test_sum_losses_scale_as_on_tpu(tmp_path):
  """Sum losses: each shard's gradient is divided by num_shards, then summed."""
  emulated, _ = _train(tmp_path, True, 2, tf.compat.v1.losses.Reduction.SUM,
                       steps=1)
  reference, _ = _train(tmp_path, False, None,
                        tf.compat.v1.losses.Reduction.SUM, steps=1)
  start = np.linspace(-0.5, 0.5, 12).reshape(3, 4)
  # One step from the same start: the emulated update is half the global one.
  np.testing.assert_allclose(emulated['dense/kernel'] - start,
                             (reference['dense/kernel'] - start) / 2,
                             rtol=1e-5, atol=1e-7)


def test_batch_not_divisible_by_shards_is_a_clear_error(tmp_path):
  estimator = tpu_fc.TPUEstimator(
      model_fn=make_model_fn([], tf.compat.v1.losses.Reduction.MEAN),
      use_tpu=True, train_batch_size=6,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path),
                              tpu_config=tpu_fc.TPUConfig(num_shards=4)))
  with pytest.raises(ValueError, match='train batch size 6 must be divisible '
                     'by number of replicas 4'):
    estimator.train(input_fn, max_steps=1)


def test_host_call_sees_tensors_of_all_shards(tmp_path):
  """As on a TPU, host_call tensors arrive concatenated over the shards."""
  seen = {}

  def host_fn(step, loss):
    seen['shapes'] = (step.shape.as_list(), loss.shape.as_list())
    return [tf.compat.v1.assign_add(
        tf.compat.v1.get_variable('host_calls', [], tf.int64,
                                  tf.compat.v1.zeros_initializer(),
                                  trainable=False), 1)]

  def model_fn(features, labels, mode, params):
    spec = make_model_fn([], tf.compat.v1.losses.Reduction.MEAN)(
        features, labels, mode, params)
    step = tf.compat.v1.train.get_global_step()
    return spec._replace(host_call=(host_fn, [
        tf.reshape(step, [1]), tf.reshape(spec.loss, [1])]))

  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn, use_tpu=True, train_batch_size=BATCH,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path),
                              tpu_config=tpu_fc.TPUConfig(num_shards=2)))
  estimator.train(input_fn, max_steps=3)
  assert seen['shapes'] == ([2], [2])
  assert estimator.get_variable_value('host_calls') == 3


def test_params_context_describes_the_emulated_system(tmp_path):
  """As TF 2.15's TPUContext (`tpu_context.py`): the device assignment is
  None without model parallelism, and model_fn's only."""
  seen = {}

  def sharded_input_fn(params):
    context = params['context']
    seen['input'] = (context.current_input_fn_deployment()[1:],
                     context.num_hosts, context.current_host)
    with pytest.raises(RuntimeError, match='must not be called from input_fn'):
      context.device_assignment  # pylint: disable=pointless-statement
    return input_fn(params)

  def model_fn(features, labels, mode, params):
    seen['model'] = (params['context'].num_replicas,
                     params['context'].device_assignment)
    with pytest.raises(RuntimeError, match='must not be called from model_fn'):
      params['context'].current_host  # pylint: disable=pointless-statement
    return make_model_fn([], tf.compat.v1.losses.Reduction.MEAN)(
        features, labels, mode, params)

  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn, use_tpu=True, train_batch_size=BATCH,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path),
                              tpu_config=tpu_fc.TPUConfig(num_shards=4)))
  estimator.train(sharded_input_fn, max_steps=1)
  assert seen == {'input': ((0, 1, 4), 1, 0), 'model': (4, None)}
  # Model parallelism, whose device assignment TF gave, is not emulated.
  with pytest.raises(NotImplementedError, match='num_cores_per_replica=2'):
    tpu_context.TPUContext(  # pylint: disable=expression-not-assigned
        4, call_from_input_fn=False, num_cores_per_replica=2).device_assignment


# Each TPU core runs the whole model_fn with its own copy of the variables.
# Shard 0's features are x = 1, shard 1's x = 3 (2 shards, batch 8).
CORE_X = np.array([[1.0]] * 4 + [[3.0]] * 4, np.float32)


def core_input_fn(params):
  dataset = tf.data.Dataset.from_tensor_slices(({'x': CORE_X},
                                                np.ones((8, 1), np.float32)))
  return dataset.repeat().batch(params['batch_size'], drop_remainder=True)


def _replicated(tmp_path, model_fn, steps=1):
  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn, use_tpu=True, train_batch_size=8, eval_batch_size=8,
      predict_batch_size=8, config=tpu_fc.RunConfig(
          model_dir=str(tmp_path), tpu_config=tpu_fc.TPUConfig(
              iterations_per_loop=1, num_shards=2)))
  estimator.train(core_input_fn, max_steps=steps)
  return estimator


def _spec(mode, loss, train_op=None, update_ops=(), **kwargs):
  if mode == tpu_fc.ModeKeys.TRAIN:
    with tf.control_dependencies(update_ops):  # (TF1's batch norm pattern)
      train_op = tf.compat.v1.tpu.CrossShardOptimizer(
          tf.compat.v1.train.GradientDescentOptimizer(0.1)).minimize(
              loss, tf.compat.v1.train.get_global_step())
  return tpu_fc.TPUEstimatorSpec(mode, loss=loss, train_op=train_op, **kwargs)


def test_every_shard_has_its_layers_regularization_loss(tmp_path):
  """l2(1.0) on a kernel of ones: each core's gradient is 2, their mean 2, so
  one SGD(0.1) step leaves 0.8 (not 0.9: the penalty of one shard only)."""
  def model_fn(features, labels, mode, params):
    del labels, params
    tf.compat.v1.layers.dense(
        features['x'], 1, use_bias=False,
        kernel_initializer=tf.compat.v1.ones_initializer(),
        kernel_regularizer=tf.keras.regularizers.l2(1.0))
    return _spec(mode, tf.compat.v1.losses.get_regularization_loss())

  estimator = _replicated(tmp_path, model_fn)
  np.testing.assert_allclose(estimator.get_variable_value('dense/kernel'),
                             [[0.8]], rtol=1e-6)
  assert estimator.evaluate(core_input_fn, steps=1)['loss'] == pytest.approx(
      0.8 ** 2)  # shard 0's loss holds the penalty too


def test_batch_norm_statistics_are_core_0s(tmp_path):
  """Each core updates its own moving mean from its batch (momentum 0.9, from
  0): core 0's, 0.1 * 1, is what the checkpoint holds (core 1's would be 0.3,
  both applied to one variable 0.4)."""
  def model_fn(features, labels, mode, params):
    del labels, params
    normalized = tf.compat.v1.layers.batch_normalization(
        features['x'], momentum=0.9, training=mode == tpu_fc.ModeKeys.TRAIN,
        name='bn')
    return _spec(mode, tf.reduce_mean(normalized), update_ops=(
        tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)))

  estimator = _replicated(tmp_path, model_fn)
  np.testing.assert_allclose(estimator.get_variable_value('bn/moving_mean'),
                             [0.1], rtol=1e-6)
  assert not any('core_copy' in name
                 for name in estimator.get_variable_names())


def test_partitioned_variables_are_whole_as_on_a_tpu(tmp_path, tf_log):
  """TF's TPU replication drops a partitioner (with its warning): the
  checkpoint holds whole variables, which predict's CPU graph, partitioned
  again, restores."""
  def model_fn(features, labels, mode, params):
    del labels, params
    with tf.compat.v1.variable_scope(
        'dnn', partitioner=tf.compat.v1.fixed_size_partitioner(2)):
      out = tf.compat.v1.layers.dense(
          features['x'], 2, kernel_initializer=tf.compat.v1.ones_initializer())
    return _spec(mode, tf.reduce_mean(out), predictions={'out': out})

  estimator = _replicated(tmp_path, model_fn)
  saved = dict(tf.train.list_variables(estimator.latest_checkpoint()))
  assert saved['dnn/dense/kernel'] == [1, 2] and not any(
      'part_' in name for name in saved)
  assert any(line.startswith('Partitioned variables are not supported on TPU')
             for line in tf_log)
  kernel = estimator.get_variable_value('dnn/dense/kernel')
  bias = estimator.get_variable_value('dnn/dense/bias')
  predicted = [p['out'] for p in estimator.predict(
      lambda params: core_input_fn(params).take(1))]
  np.testing.assert_allclose(predicted, CORE_X @ kernel + bias, rtol=1e-6)
