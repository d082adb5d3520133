"""Behaviours TF 2.15's own TPUEstimator tests pin, beyond the update rules.

Each test names the TF test (tensorflow/estimator r2.15,
`tensorflow_estimator/python/estimator/tpu/`) whose behaviour it checks.
"""
import os
import re
import subprocess
import sys
import types

import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf

pytestmark = pytest.mark.filterwarnings('ignore::UserWarning')
fc = tf.feature_column


def _trained(mode, loss, rate=0.1, cross_shard=True, driver=tpu_fc):
  """The spec of a model_fn training `loss` by SGD (cross-shard, as on a TPU)."""
  optimizer = tf.compat.v1.train.GradientDescentOptimizer(rate)
  if cross_shard:
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
  return driver.TPUEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(
      loss, tf.compat.v1.train.get_global_step()))


def _shared_weighted_columns():
  """Two weighted columns reading one weight feature, 'values'."""
  return tpu_fc.shared_embedding_columns(
      [fc.weighted_categorical_column(
          fc.categorical_column_with_identity(key, 5), 'values')
       for key in ('ids1', 'ids2')], 4)


def _weighted_input_fn(params):
  indices = ((0, 0), (0, 2), (1, 0), (1, 1))
  ids = tf.SparseTensor(indices, tf.constant((2, 1, 1, 0), tf.int64), (2, 5))
  weights = tf.SparseTensor(indices, (0.5, 1.0, 0.2, 0.0), (2, 5))
  features = {'ids1': ids, 'ids2': ids, 'values': weights}
  dataset = tf.data.Dataset.from_tensor_slices((features, np.zeros((2, 1))))
  return dataset.repeat().batch(params['batch_size'], drop_remainder=True)


def _model_fn(columns):
  def model_fn(features, labels, mode, params):
    del params
    net = tf.compat.v1.keras.layers.DenseFeatures(columns)(features)
    loss = tf.compat.v1.losses.mean_squared_error(
        labels, tf.compat.v1.layers.dense(net, 1))
    return _trained(mode, loss, cross_shard=False)
  return model_fn


@pytest.mark.parametrize('use_tpu', [True, False])
def test_weight_sharing_among_weighted_columns(tmp_path, use_tpu):
  """`test_embedding_with_weighted_categorical_column_share_weights_error`:
  TF's TPU enqueue pops each weight feature, so the second reader fails; the
  CPU path (use_tpu=False) shares them as plain feature columns do."""
  columns = _shared_weighted_columns()
  estimator = tpu_fc.TPUEstimator(
      model_fn=_model_fn(columns), use_tpu=use_tpu, train_batch_size=2,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path),
                              tpu_config=tpu_fc.TPUConfig(num_shards=2)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=columns,
          optimization_parameters=tpu_fc.AdagradParameters(0.1)))
  if not use_tpu:
    estimator.train(_weighted_input_fn, steps=1)
    assert estimator.get_variable_value('global_step') == 1
    return
  with pytest.raises(ValueError, match=(
      'Cannot find weights values for weighted_categorical_column. Please check '
      'if the weights are present in feature dict. Also note weight-sharing '
      'among weighted_categorical_column is not supported on TPU.')):
    estimator.train(_weighted_input_fn, steps=1)


def _dense_model_fn(driver, cross_shard):
  def model_fn(features, labels, mode, params):
    del params
    logits = tf.compat.v1.layers.dense(
        features['x'], 1, kernel_initializer=tf.compat.v1.ones_initializer())
    loss = tf.compat.v1.losses.mean_squared_error(labels, logits)
    return _trained(mode, loss, cross_shard=cross_shard, driver=driver)
  return model_fn


def _dense_input_fn(params):
  x = np.arange(8, dtype=np.float32).reshape(4, 2) / 8
  dataset = tf.data.Dataset.from_tensor_slices(({'x': x}, 2 * x.sum(1, keepdims=True)))
  return dataset.repeat().batch(params['batch_size'], drop_remainder=True)


def _train_dense(driver, model_dir, cross_shard):
  estimator = driver.TPUEstimator(
      model_fn=_dense_model_fn(driver, cross_shard), use_tpu=False, train_batch_size=4,
      config=driver.RunConfig(model_dir=str(model_dir)))
  estimator.train(_dense_input_fn, steps=2)
  return estimator.get_variable_value('dense/kernel')


def test_cross_shard_optimizer_without_tpu_is_one_replica(tmp_path):
  """Beyond TF: with use_tpu=False, CrossShardOptimizer sums over one replica,
  so it trains as the optimizer it wraps (TF 2.15 fails: no CrossReplicaSum
  kernel on a CPU)."""
  wrapped = _train_dense(tpu_fc, tmp_path / 'cross_shard', cross_shard=True)
  plain = _train_dense(tpu_fc, tmp_path / 'plain', cross_shard=False)
  np.testing.assert_array_equal(wrapped, plain)
  assert np.all(wrapped != 1.0)  # it trained


_TF_REFERENCE = """
import sys, types
sys.path.insert(0, sys.argv[1])
import numpy as np
import test_tpu_exact as t
from tensorflow_estimator.python.estimator.tpu import tpu_config, tpu_estimator
legacy = types.SimpleNamespace(TPUEstimator=tpu_estimator.TPUEstimator,
                               TPUEstimatorSpec=tpu_estimator.TPUEstimatorSpec,
                               RunConfig=tpu_config.RunConfig)
try:
  t._train_dense(legacy, sys.argv[2] + '/cross_shard', cross_shard=True)
except t.tf.errors.InvalidArgumentError as error:
  print('TF raised:', ' '.join(str(error).split()))
np.save(sys.argv[2] + '/plain.npy',
        t._train_dense(legacy, sys.argv[2] + '/plain', cross_shard=False))
"""


@pytest.mark.legacy_only
def test_tf_cross_shard_optimizer_without_tpu_fails(tmp_path):
  """TF 2.15's own TPUEstimator, in a fresh process (a test suite's earlier
  bindings cannot reach it): CrossShardOptimizer fails without a TPU; without
  it TF trains as tpu_fc does."""
  result = subprocess.run(
      [sys.executable, '-c', _TF_REFERENCE, os.path.dirname(__file__),
       str(tmp_path)], capture_output=True, text=True, timeout=600,
      check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "TF raised:" in result.stdout
  assert ("No OpKernel was registered to support Op 'CrossReplicaSum'"
          in result.stdout)
  np.testing.assert_array_equal(
      _train_dense(tpu_fc, tmp_path / 'ours', cross_shard=False),
      np.load(tmp_path / 'plain.npy'))


def _metric_ops_model_fn(features, labels, mode, params):
  """`tpu_estimator_evaluation_test.py`'s model_fn with eval_metric_ops: an
  EstimatorSpec in evaluation."""
  del params
  predictions = tf.compat.v1.layers.dense(features['x'], 1)
  loss = tf.compat.v1.losses.mean_squared_error(labels, predictions)
  if mode == tpu_fc.ModeKeys.EVAL:
    return tpu_fc.EstimatorSpec(mode, loss=loss, eval_metric_ops={
        'mse': tf.compat.v1.metrics.mean_absolute_error(labels, predictions)})
  return _trained(mode, loss)


@pytest.mark.parametrize('eval_on_tpu', [True, False])
def test_tpu_evaluation_needs_a_tpu_estimator_spec(tmp_path, eval_on_tpu):
  """`test_eval_metrics_ops_tpu_training_failure` and `..._tpu_training`."""
  estimator = tpu_fc.TPUEstimator(
      model_fn=_metric_ops_model_fn, train_batch_size=4, eval_batch_size=4,
      eval_on_tpu=eval_on_tpu,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path),
                              tpu_config=tpu_fc.TPUConfig(num_shards=2)))
  estimator.train(_dense_input_fn, steps=1)
  if not eval_on_tpu:
    assert 'mse' in estimator.evaluate(_dense_input_fn, steps=1)
    return
  with pytest.raises(RuntimeError, match=(
      'estimator_spec used by TPU evaluation must have type`TPUEstimatorSpec`. '
      "Got <class 'tpu_fc.estimator.model_fn.EstimatorSpec'>")):
    estimator.evaluate(_dense_input_fn, steps=1)


@pytest.mark.parametrize('steps,error,text', [
    (None, ValueError, 'Evaluate `steps` must be set on TPU. Cannot be `None`.'),
    (12.3, TypeError, "Eval steps must be int, got <class 'float'>"),
    (-321, ValueError, 'Eval steps must be positive, got -321'),
])
def test_tpu_evaluation_steps_are_checked(tmp_path, steps, error, text):
  """`test_error_out_if_steps_is_float` and `..._is_invalid`."""
  estimator = tpu_fc.TPUEstimator(
      model_fn=_dense_model_fn(tpu_fc, cross_shard=True), train_batch_size=4,
      eval_batch_size=4, config=tpu_fc.RunConfig(model_dir=str(tmp_path)))
  with pytest.raises(error) as raised:
    estimator.evaluate(_dense_input_fn, steps=steps)
  assert str(raised.value) == text


@pytest.mark.parametrize('mode', ['evaluate', 'predict'])
def test_tpu_evaluate_and_predict_need_their_batch_size(mode, tmp_path):
  """TF 2.15's `_InternalTPUContext._validate_tpu_configuration` (its text),
  checked before input_fn, whose params['batch_size'] would be missing.  (TF's
  own class fails earlier without a TPU: 'Cannot find any TPU cores'.)"""
  def input_fn(params):
    raise AssertionError('input_fn called with {}'.format(params))

  estimator = tpu_fc.TPUEstimator(
      model_fn=_model_fn([]), use_tpu=True, train_batch_size=2,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path)))
  name, method = (('eval_batch_size', 'evaluate') if mode == 'evaluate' else
                  ('predict_batch_size', 'predict'))
  with pytest.raises(ValueError, match=re.escape(
      '{} in TPUEstimator constructor cannot be `None` if .{} is running on '
      'TPU.'.format(name, method))):
    if mode == 'evaluate':
      estimator.evaluate(input_fn, steps=1)
    else:
      next(estimator.predict(input_fn))


def test_broadcast_input_gives_every_shard_the_whole_batch(tmp_path):
  """`test_eval_batch_size_with_non_divisible_num_shards_broadcast_mode`: a
  batch of 7 on 2 shards; each shard's model_fn gets all 7 examples, and
  CrossShardOptimizer's mean over the shards trains as one batch does."""
  seen = []

  def model_fn(features, labels, mode, params):
    seen.append((params['batch_size'], features['x'].shape[0]))
    return _dense_model_fn(tpu_fc, cross_shard=True)(features, labels, mode,
                                                      params)

  def input_fn(params):
    x = np.arange(14, dtype=np.float32).reshape(7, 2) / 14
    dataset = tf.data.Dataset.from_tensors(({'x': x}, 2 * x.sum(1, keepdims=True)))
    return dataset.repeat()

  results = {}
  for name, pipeline, use_tpu in (
      ('broadcast', tpu_fc.InputPipelineConfig.BROADCAST, True),
      ('cpu', tpu_fc.InputPipelineConfig.PER_HOST_V2, False)):
    estimator = tpu_fc.TPUEstimator(
        model_fn=model_fn, use_tpu=use_tpu, train_batch_size=7,
        eval_batch_size=7,
        config=tpu_fc.RunConfig(
            model_dir=str(tmp_path / name),
            tpu_config=tpu_fc.TPUConfig(
                num_shards=2, per_host_input_for_training=pipeline)))
    estimator.train(input_fn, steps=2)
    metrics = estimator.evaluate(input_fn, steps=1)
    results[name] = (estimator.get_variable_value('dense/kernel'),
                     metrics['loss'])
  assert set(seen) == {(7, 7)}
  np.testing.assert_allclose(results['broadcast'][0], results['cpu'][0],
                             rtol=1e-6)
  np.testing.assert_allclose(results['broadcast'][1], results['cpu'][1],
                             rtol=1e-6)


# To the model_fn the emulated TPU looks like a TPU: static shapes. ------------

@pytest.mark.parametrize('num_shards', [None, 2])
def test_model_fn_sees_static_shapes(tmp_path, num_shards):
  """Every shard sees static activations, sequence lengths, tensor-core ids and
  masks, features and labels, as a TPU's infeed gives them (the embedding
  shapes from the configured batch, even where the ids' batch is not static);
  model code such as `tf.zeros(logits.shape)` (a two-class softmax) relies on
  it."""
  user = tpu_fc.embedding_column(fc.categorical_column_with_identity('u', 10), 4)
  history = tpu_fc.embedding_column(
      fc.sequence_categorical_column_with_identity('h', 10), 3,
      max_sequence_length=5)
  tag = tpu_fc.embedding_column(
      fc.categorical_column_with_identity('t', 10), 2,
      embedding_lookup_device='tpu_tensor_core', tensor_core_shape=[None, 3])
  seen = {}

  def model_fn(features, labels, mode, params):
    del params
    net = tf.compat.v1.keras.layers.DenseFeatures([user, tag])(features)
    sequence, lengths = tf.keras.experimental.SequenceFeatures([history])(
        features)
    seen.update(sequence=sequence.shape.as_list(),
                lengths=lengths.shape.as_list(),
                u=features['u'].shape.as_list(),
                x=features['x'].shape.as_list(),
                t=features['t'].shape.as_list(),
                t_mask=features['t__TENSOR_CORE_MASK'].shape.as_list(),
                labels=labels.shape.as_list(), net=net.shape.as_list(),
                h=features['h'].shape.as_list(),
                h_length=features['h_seq_length_'].shape.as_list())
    logits = tf.compat.v1.layers.dense(tf.concat(
        [net, features['x'], tf.reduce_sum(sequence, 1)], 1), 1)
    two_class = tf.concat([tf.zeros(logits.shape), logits], axis=1)
    loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(
        tf.cast(labels[:, 0], tf.int32), two_class)
    return _trained(mode, loss)

  def input_fn(params):
    features = {
        'u': tf.SparseTensor([[0, 0], [1, 0], [2, 0], [3, 0]],
                             tf.constant([1, 2, 3, 4], tf.int64), [4, 1]),
        'h': tf.SparseTensor([[0, 0], [0, 1], [2, 0]],
                             tf.constant([5, 6, 7], tf.int64), [4, 2]),
        't': tf.SparseTensor([[0, 0], [3, 1]], tf.constant([1, 2], tf.int64),
                             [4, 2]),
        'x': tf.ones([4, 2])}
    del params

    def unknown_batch(features, labels):
      ids = features['u']  # a dense shape known only at run time
      features['u'] = tf.SparseTensor(
          ids.indices, ids.values,
          tf.compat.v1.placeholder_with_default(ids.dense_shape, [2]))
      return features, labels

    return tf.data.Dataset.from_tensors(
        (features, tf.ones([4, 1]))).repeat().map(unknown_batch)

  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn, train_batch_size=4,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path), tpu_config=tpu_fc.TPUConfig(
          num_shards=num_shards)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=[user, history, tag],
          optimization_parameters=tpu_fc.AdagradParameters(0.1)))
  estimator.train(input_fn, steps=1)
  batch = 4 // (num_shards or 1)
  assert seen == dict(u=[batch, 4], x=[batch, 2], labels=[batch, 1],
                      t=[batch, 3], t_mask=[batch, 3], net=[batch, 6],
                      h=[batch, 5, 3], h_length=[batch],
                      sequence=[batch, 5, 3], lengths=[batch])


def test_predict_pads_a_short_last_batch_as_a_tpu_does(tmp_path):
  """TPUEstimator's TPU predict pads every batch to predict_batch_size (static
  shapes, so `tf.zeros(logits.shape)` works on the last, short batch too) and
  drops the padded rows' predictions: 10 examples in batches of 4."""
  user = tpu_fc.embedding_column(fc.categorical_column_with_identity('u', 10), 2)
  ids = np.arange(10, dtype=np.int64) % 7
  x = np.linspace(-1, 1, 10).astype(np.float32)
  seen = []

  def model_fn(features, labels, mode, params):
    del labels, params
    net = tf.compat.v1.keras.layers.DenseFeatures([user])(features)
    logits = tf.compat.v1.layers.dense(
        tf.concat([net, features['x']], 1), 1,
        kernel_initializer=tf.compat.v1.constant_initializer(0.5))
    two_class = tf.concat([tf.zeros(logits.shape), logits], axis=1)
    seen.append(features['x'].shape.as_list())
    if mode == tpu_fc.ModeKeys.PREDICT:
      return tpu_fc.TPUEstimatorSpec(mode, predictions={
          'p': tf.nn.softmax(two_class)[:, 1]})
    return _trained(mode, tf.reduce_mean(logits))

  def input_fn(params):
    dataset = tf.data.Dataset.from_tensor_slices(
        ({'u': ids[:, None], 'x': x[:, None]}, x[:, None]))
    return dataset.batch(params['batch_size']).map(
        lambda f, l: (dict(f, u=tf.sparse.from_dense(f['u'] + 1)), l))

  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn, train_batch_size=4, predict_batch_size=4,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path), tpu_config=tpu_fc.TPUConfig(
          num_shards=2)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=[user],
          optimization_parameters=tpu_fc.AdagradParameters(0.1)))
  estimator.train(lambda params: input_fn(params).unbatch().repeat().batch(
      4, drop_remainder=True), steps=2)
  predicted = [p['p'] for p in estimator.predict(input_fn)]
  assert seen[-1] == [4, 1]  # the predict graph's features: padded, static
  table = estimator.get_variable_value(
      'dense_features/u_embedding/embedding_weights')
  kernel, bias = (estimator.get_variable_value('dense/' + name)
                  for name in ('kernel', 'bias'))
  logits = np.concatenate([table[ids + 1], x[:, None]], 1) @ kernel + bias
  np.testing.assert_allclose(predicted, 1 / (1 + np.exp(-logits[:, 0])),
                             rtol=1e-5)


@pytest.mark.parametrize('static', [True, False])
def test_embedding_ids_of_another_batch_than_configured_fail(tmp_path, static):
  """The configured batch fixes the activations' shape (a TPU's embedding
  config fixes it): ids of another batch fail, naming the feature, at build
  time when their batch is static, else when the step runs."""
  user = tpu_fc.embedding_column(fc.categorical_column_with_identity('u', 10), 4)

  def model_fn(features, labels, mode, params):
    del labels, params
    net = tf.compat.v1.keras.layers.DenseFeatures([user])(features)
    return _trained(mode, tf.reduce_sum(net))

  def input_fn(params):
    del params
    ids = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([1, 2], tf.int64),
                          [2, 1])
    if not static:
      ids = tf.SparseTensor(ids.indices, ids.values,
                            tf.compat.v1.placeholder_with_default(
                                ids.dense_shape, [2]))
    return tf.data.Dataset.from_tensors({'u': ids}).repeat()

  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn, train_batch_size=4,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=[user],
          optimization_parameters=tpu_fc.AdagradParameters(0.1)))
  message = ('Feature u: input_fn gave the embedding features a batch of 2 '
             r'examples, but the configured batch size \(train_batch_size / '
             r'eval_batch_size\) is 4')
  with pytest.raises(ValueError if static else tf.errors.InvalidArgumentError,
                     match=message):
    estimator.train(input_fn, steps=1)


@pytest.mark.parametrize('num_shards', [None, 2])
def test_multivalent_sequence_ids(tmp_path, num_shards):
  """Rank-3 ids `[batch, position, ids]` of a sequence column: the ids at one
  position are combined with the column's combiner (mean), positions past
  max_sequence_length dropped, lengths capped: in training, evaluation and
  predict (a CPU lookup of the sequence cut as the TPU cuts it).
  Loss = sum(activation * C)."""
  table0 = np.arange(12, dtype=np.float32).reshape(6, 2) / 10
  coefficients = np.array([[[1., 2.], [3., 4.]], [[5., 6.], [7., 8.]]],
                          np.float32)
  history = tpu_fc.embedding_column(
      fc.sequence_categorical_column_with_identity('h', 6), 2,
      max_sequence_length=2,
      initializer=tf.compat.v1.constant_initializer(table0))
  # Example 0: position 0 holds ids 1 and 2, position 1 id 3, position 2 id 4
  # (past the maximum length); example 1: position 0 holds id 5.
  indices = [[0, 0, 0], [0, 0, 1], [0, 1, 0], [0, 2, 0], [1, 0, 0]]
  values = [1, 2, 3, 4, 5]

  def model_fn(features, labels, mode, params):
    del labels, params
    sequence, lengths = tf.keras.experimental.SequenceFeatures([history])(
        features)
    if mode == tpu_fc.ModeKeys.PREDICT:
      return tpu_fc.TPUEstimatorSpec(mode, predictions={
          'sequence': sequence, 'lengths': lengths})
    loss = tf.reduce_sum(sequence * features['c']) + tf.reduce_sum(
        tf.cast(lengths, tf.float32)) * 100  # lengths (2, 1): 300
    if mode != tpu_fc.ModeKeys.TRAIN:
      return tpu_fc.TPUEstimatorSpec(mode, loss=loss)
    return _trained(mode, loss, rate=0.0, cross_shard=False)

  def input_fn(params):
    del params
    features = {'h': tf.SparseTensor(indices, tf.constant(values, tf.int64),
                                     [2, 3, 2]),
                'c': tf.constant(coefficients)}
    return tf.data.Dataset.from_tensors((features, tf.zeros([2, 1]))).repeat()

  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn, train_batch_size=2, eval_batch_size=2,
      predict_batch_size=2,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path), tpu_config=tpu_fc.TPUConfig(
          num_shards=num_shards)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=[history],
          optimization_parameters=tpu_fc.StochasticGradientDescentParameters(
              0.1)))
  estimator.train(input_fn, steps=1)
  want = table0.copy()
  want[1] -= 0.1 * coefficients[0, 0] / 2  # mean of ids 1 and 2 at (0, 0)
  want[2] -= 0.1 * coefficients[0, 0] / 2
  want[3] -= 0.1 * coefficients[0, 1]
  want[5] -= 0.1 * coefficients[1, 0]      # id 4 is past the length: untouched
  np.testing.assert_allclose(
      estimator.get_variable_value(
          'sequence_features/h_embedding/embedding_weights'), want, rtol=1e-6)
  if num_shards is None:
    loss = estimator.evaluate(input_fn, steps=1)['loss']
    activation = np.array([[(want[1] + want[2]) / 2, want[3]],
                           [want[5], [0., 0.]]], np.float32)
    np.testing.assert_allclose(loss, (activation * coefficients).sum() + 300,
                               rtol=1e-6)
    predicted = next(estimator.predict(input_fn, yield_single_examples=False))
    np.testing.assert_allclose(predicted['sequence'], activation, rtol=1e-6)
    np.testing.assert_array_equal(predicted['lengths'], [2, 1])
    _check_serving_cuts_sequences(estimator, tmp_path, activation)


def _check_serving_cuts_sequences(estimator, tmp_path, activation):
  """The exported model serves `activation` for test_multivalent_sequence_ids'
  ids, also with 20,000 more positions in example 0: it cuts them as the TPU
  does, so a request's memory is bounded by batch x max_sequence_length x dim."""

  def receiver_fn():
    ids = tf.compat.v1.sparse_placeholder(tf.int64, [None, None, None])
    return tpu_fc.export.ServingInputReceiver({'h': ids}, {'h': ids})

  export_dir = estimator.export_saved_model(str(tmp_path / 'export'),
                                            receiver_fn)
  extra = 20000
  indices = np.array([[0, 0, 0], [0, 0, 1], [0, 1, 0], [1, 0, 0]] +
                     [[0, 2 + p, 0] for p in range(extra)], np.int64)
  values = np.array([1, 2, 3, 5] + [4] * extra, np.int64)
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    signature = tf.compat.v1.saved_model.load(
        session, ['serve'], export_dir).signature_def['serving_default']
    sparse = signature.inputs['h'].coo_sparse
    served = session.run(
        signature.outputs['sequence'].name,
        {sparse.indices_tensor_name: indices,
         sparse.values_tensor_name: values,
         sparse.dense_shape_tensor_name: [2, 2 + extra, 2]})
  np.testing.assert_allclose(served, activation, rtol=1e-6)


class _EvalRunsHook(tf.compat.v1.train.SessionRunHook):
  """Counts the runs of an evaluation and reads the eval step after each."""

  def __init__(self):
    self.eval_steps = []

  def after_run(self, run_context, run_values):
    del run_values
    self.eval_steps.append(run_context.session.run(
        tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.EVAL_STEP)[0]))


@pytest.mark.parametrize('input_kind', ['dataset', 'iterator_tensors'])
@pytest.mark.parametrize('steps', [2, 6])
def test_tpu_evaluation_runs_all_steps_in_one_run(tmp_path, steps, input_kind):
  """`test_eval_steps_not_effected_by_training_iterations`: hooks see one
  run, after which the eval step is `steps`; the metrics are those of all
  `steps` batches (here the MAE over batches whose labels grow by 1 each).
  An input_fn may return a Dataset or its iterator's `get_next()` tensors
  (a new batch each step, as a TPU's infeed enqueues them)."""
  def model_fn(features, labels, mode, params):
    del params
    predictions = tf.compat.v1.layers.dense(
        features['x'], 1, kernel_initializer=tf.compat.v1.zeros_initializer())
    loss = tf.compat.v1.losses.absolute_difference(labels, predictions)
    if mode == tpu_fc.ModeKeys.EVAL:
      return tpu_fc.TPUEstimatorSpec(mode, loss=loss, eval_metrics=(
          lambda labels, predictions: {'mae': tf.compat.v1.metrics.mean(
              tf.abs(labels - predictions))}, [labels, predictions]))
    return _trained(mode, loss, rate=0.0)

  def input_fn(params):
    del params
    batches = tf.data.Dataset.range(100).map(
        lambda i: ({'x': tf.ones([4, 2])}, tf.fill([4, 1], tf.cast(i, tf.float32))))
    if input_kind == 'dataset':
      return batches
    return tf.compat.v1.data.make_one_shot_iterator(batches).get_next()

  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn, train_batch_size=4, eval_batch_size=4,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path), tpu_config=tpu_fc.TPUConfig(
          num_shards=2, iterations_per_loop=4)))
  estimator.train(input_fn, steps=1)
  hook = _EvalRunsHook()
  metrics = estimator.evaluate(input_fn, steps=steps, hooks=[hook])
  assert hook.eval_steps == [steps]
  mean_label = (steps - 1) / 2  # labels 0, 1, ..., steps - 1; predictions 0
  assert metrics['mae'] == pytest.approx(mean_label)
  assert metrics['loss'] == pytest.approx(mean_label)  # shard 0's, per batch


def test_tpu_evaluation_metrics_updated_by_a_variable_assignment(tmp_path):
  """Metrics whose update op is a resource variable's `assign_add`
  (`true_positives`, `mean_iou`), as a TPU's host computes them over every
  shard and step (before: refused as 'not from the default graph')."""
  def model_fn(features, labels, mode, params):
    del params
    predictions = features['x'][:, :1]  # the first column predicts the label
    loss = tf.reduce_mean(tf.compat.v1.layers.dense(features['x'], 1))
    if mode == tpu_fc.ModeKeys.EVAL:
      def metric_fn(labels, predictions):
        positive = tf.equal(labels, 1.0)
        return {
            'tp': tf.compat.v1.metrics.true_positives(
                positive, tf.equal(predictions, 1.0)),
            'miou': tf.compat.v1.metrics.mean_iou(
                tf.cast(labels, tf.int64), tf.cast(predictions, tf.int64), 2)}
      return tpu_fc.TPUEstimatorSpec(mode, loss=loss, eval_metrics=(
          metric_fn, [labels, predictions]))
    return _trained(mode, loss, rate=0.0)

  def input_fn(params):
    del params
    labels = tf.constant([[1.0], [0.0], [1.0], [1.0]])
    predicted = tf.constant([[1.0], [0.0], [0.0], [1.0]])  # one false negative
    return tf.data.Dataset.from_tensors(
        ({'x': tf.concat([predicted, tf.ones([4, 1])], 1)}, labels)).repeat()

  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn, train_batch_size=4, eval_batch_size=4,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path), tpu_config=tpu_fc.TPUConfig(
          num_shards=2)))
  estimator.train(input_fn, steps=1)
  metrics = estimator.evaluate(input_fn, steps=3)
  assert metrics['tp'] == 2 * 3  # 2 true positives a batch (both shards), 3 steps
  # Per batch: class 0: 1 right + 1 missed (IoU 1/2); class 1: 2 of 3 (2/3).
  assert metrics['miou'] == pytest.approx((1 / 2 + 2 / 3) / 2)


def test_dict_configured_features_predict_from_their_activations(tmp_path):
  """TF 2.15 builds its TPU embedding in INFERENCE mode for PREDICT too, so a
  dict-configured model_fn (no columns) gets activations there, as in TRAIN
  and EVAL (before: the raw ids, and a TypeError in the model's concat)."""
  spec = tpu_fc.EmbeddingConfigSpec(
      feature_to_config_dict={'f': tpu_fc.FeatureConfig('t')},
      table_to_config_dict={'t': tpu_fc.TableConfig(
          6, 2, combiner='mean',
          initializer=tf.compat.v1.constant_initializer(
              np.arange(12).reshape(6, 2) / 10))},
      optimization_parameters=tpu_fc.StochasticGradientDescentParameters(0.5))
  ids = [[1, 3], [2, 2], [5, 0], [4, 4]]

  def model_fn(features, labels, mode, params):
    del labels, params
    if mode == tpu_fc.ModeKeys.PREDICT:
      return tpu_fc.TPUEstimatorSpec(mode, predictions={'f': features['f']})
    return _trained(mode, tf.reduce_sum(features['f']), rate=0.0)

  def input_fn(params):
    del params
    return tf.data.Dataset.from_tensors(
        ({'f': tf.SparseTensor([[i, j] for i in range(4) for j in range(2)],
                               tf.constant(np.ravel(ids), tf.int64), [4, 2])},
         tf.zeros([4, 1]))).repeat()

  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn, train_batch_size=4, predict_batch_size=4,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path)),
      embedding_config_spec=spec)
  estimator.train(input_fn, steps=1)
  table = estimator.get_variable_value('t')
  np.testing.assert_allclose(table, np.arange(12).reshape(6, 2) / 10 -
                             0.5 * np.bincount(np.ravel(ids), minlength=6)[
                                 :, None] / 2, rtol=1e-6)  # mean: 1/2 an id
  predicted = [p['f'] for p in estimator.predict(
      lambda params: input_fn(params).take(1).map(lambda f, l: f))]
  np.testing.assert_allclose(predicted, table[ids].mean(axis=1), rtol=1e-6)


class _GraphVariablesHook(tf.compat.v1.train.SessionRunHook):
  """The global variables' graph names, as hooks and user code see them."""

  def begin(self):
    self.names = sorted(v.op.name for v in tf.compat.v1.global_variables())


@pytest.mark.parametrize('iterations_per_loop', [1, 2])
def test_tables_have_the_graph_names_of_tf_tpu_mode(tmp_path,
                                                    iterations_per_loop):
  """TF's TPU mode made `<column scope>/embedding_weights/part_0` and slots
  `.../embedding_weights/Adagrad/part_0` (one part per host); checkpoints keep
  the legacy names without the part."""
  columns = _shared_weighted_columns()[:1] + [tpu_fc.embedding_column(
      fc.categorical_column_with_identity('ids3', 5), 4)]
  hook = _GraphVariablesHook()

  def input_fn(params):
    return _weighted_input_fn(params).map(
        lambda f, l: (dict(f, ids3=f['ids1']), l))

  estimator = tpu_fc.TPUEstimator(
      model_fn=_model_fn(columns), train_batch_size=2,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path), tpu_config=tpu_fc.TPUConfig(
          num_shards=2, iterations_per_loop=iterations_per_loop)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=columns,
          optimization_parameters=tpu_fc.AdagradParameters(0.1)))
  estimator.train(input_fn, steps=2, hooks=[hook])
  shared = 'ids1_weighted_by_values_ids2_weighted_by_values_shared_embedding'
  plain = 'dense_features/ids3_embedding/embedding_weights'
  assert {shared + '/part_0', shared + '/Adagrad/part_0', plain + '/part_0',
          plain + '/Adagrad/part_0'} <= set(hook.names)
  assert not [name for name in hook.names if name.startswith('tpu_embedding/')]
  saved = {name for name, _ in tf.train.list_variables(str(tmp_path))}
  assert {shared, shared + '/Adagrad', plain, plain + '/Adagrad'} <= saved


class _InitialValuesHook(tf.compat.v1.train.SessionRunHook):
  """The values of graph variables `names` once the session is initialized."""

  def __init__(self, names):
    self._names = names

  def begin(self):
    variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
    self._variables = [variables[name] for name in self._names]

  def after_create_session(self, session, coord):
    self.values = session.run(self._variables)


@pytest.mark.parametrize('how', ['warm_start_by_names', 'init_from_checkpoint'])
def test_tables_initialize_from_a_checkpoint_as_tf_tpu_modes_parts(tmp_path, how):
  """TF's TPU mode made tables and slots as the one part of a partitioned
  variable, so TF's warm start by variable names and `init_from_checkpoint`
  in a `scaffold_fn` find them by their legacy names; so do tpu_fc's (before:
  `... Adagrad/part_0 is not found`, and a crash without a slice info)."""
  columns = [tpu_fc.embedding_column(
      fc.categorical_column_with_identity('ids3', 5), 4)]
  plain = 'dense_features/ids3_embedding/embedding_weights'

  def input_fn(params):
    return _weighted_input_fn(params).map(lambda f, l: ({'ids3': f['ids1']}, l))

  def estimator(model_dir, warm_start_from=None, init_from=None):
    def model_fn(features, labels, mode, params):
      spec = _model_fn(columns)(features, labels, mode, params)
      if init_from is None:
        return spec

      def scaffold_fn():
        tf.compat.v1.train.init_from_checkpoint(
            init_from, {'dense_features/': 'dense_features/'})
        return tf.compat.v1.train.Scaffold()
      return spec._replace(scaffold_fn=scaffold_fn)

    return tpu_fc.TPUEstimator(
        model_fn=model_fn, train_batch_size=2, warm_start_from=warm_start_from,
        config=tpu_fc.RunConfig(model_dir=str(model_dir)),
        embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
            feature_columns=columns,
            optimization_parameters=tpu_fc.AdagradParameters(0.1)))

  source = estimator(tmp_path / 'source')
  source.train(input_fn, steps=2)
  warm_start = init_from = None
  if how == 'warm_start_by_names':
    warm_start = types.SimpleNamespace(  # a tf.estimator.WarmStartSettings
        ckpt_to_initialize_from=str(tmp_path / 'source'),
        vars_to_warm_start=[plain, plain + '/Adagrad'],
        var_name_to_vocab_info=None, var_name_to_prev_var_name=None)
  else:
    init_from = str(tmp_path / 'source')
  hook = _InitialValuesHook([plain + '/part_0', plain + '/Adagrad/part_0'])
  estimator(tmp_path / 'warm', warm_start, init_from).train(
      input_fn, steps=1, hooks=[hook])
  np.testing.assert_array_equal(hook.values[0], source.get_variable_value(plain))
  np.testing.assert_array_equal(hook.values[1],
                                source.get_variable_value(plain + '/Adagrad'))


def test_shared_tensor_core_columns_on_several_shards(tmp_path):
  """`test_tensor_core_embedding_shared_*`: a shared table on the tensor core
  is created once per graph; every emulated shard uses it, and a mean loss
  trains as on the CPU."""
  table0 = np.arange(20, dtype=np.float32).reshape(10, 2) / 20
  columns = tpu_fc.shared_embedding_columns(
      [fc.categorical_column_with_identity('x', 10),
       fc.categorical_column_with_identity('y', 10)], 2,
      initializer=tf.compat.v1.constant_initializer(table0),
      embedding_lookup_device='tpu_tensor_core', tensor_core_shape=[None, 2])

  def model_fn(features, labels, mode, params):
    net = tf.compat.v1.keras.layers.DenseFeatures(columns)(features)
    logits = tf.compat.v1.layers.dense(
        net, 1, kernel_initializer=tf.compat.v1.ones_initializer())
    loss = tf.compat.v1.losses.mean_squared_error(labels, logits)
    optimizer = tf.compat.v1.train.AdagradOptimizer(0.5)
    if params['use_tpu']:
      optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
    return tpu_fc.TPUEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(
        loss, tf.compat.v1.train.get_global_step()))

  def input_fn(params):
    batch = params['batch_size']
    ids = lambda offset: tf.SparseTensor(
        [[i, j] for i in range(batch) for j in (0, 1)],
        tf.constant([(i + j + offset) % 10 for i in range(batch)
                     for j in (0, 1)], tf.int64), [batch, 2])
    labels = tf.reshape(tf.range(batch, dtype=tf.float32), [batch, 1])
    return tf.data.Dataset.from_tensors(
        ({'x': ids(0), 'y': ids(3)}, labels)).repeat()

  values = {}
  for num_shards, use_tpu in ((2, True), (None, False)):
    estimator = tpu_fc.TPUEstimator(
        model_fn=model_fn, use_tpu=use_tpu, train_batch_size=8,
        config=tpu_fc.RunConfig(
            model_dir=str(tmp_path / str(num_shards)),
            tpu_config=tpu_fc.TPUConfig(num_shards=num_shards)),
        embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
            feature_columns=columns,
            optimization_parameters=tpu_fc.AdagradParameters(0.1)))
    estimator.train(input_fn, steps=2)
    values[use_tpu] = {name: estimator.get_variable_value(name)
                       for name in estimator.get_variable_names()}
  assert sorted(values[True]) == sorted(values[False])
  for name, value in values[False].items():  # per-shard sums reassociate:
    np.testing.assert_allclose(values[True][name], value, rtol=1e-5,  # ~8 ulps
                               atol=1e-6, err_msg=name)
  assert not np.allclose(values[True]['x_y_shared_embedding'], table0)
