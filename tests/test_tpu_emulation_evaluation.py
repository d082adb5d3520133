"""Evaluation and prediction on the emulated TPU, as on a TPU: evaluation is
inference (no update) whose metrics see every shard and step and whose loss is
shard 0's; predict looks up the trained tables on the CPU, in padded batches
of a static shape.  A metric_fn's metrics are (value, update_op) pairs there:
a Keras metric object, which the CPU takes, is refused."""
import re

import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf

from harness import estimators
from harness import inputs
from harness import lanes
from harness import models
from harness import oracle

pytestmark = pytest.mark.filterwarnings('ignore::UserWarning')
fc = tf.feature_column
D, B, L = inputs.DIM, inputs.BATCH, inputs.MAX_LENGTH
NS = estimators.NUM_SHARDS


def test_evaluate_is_inference_and_predict_uses_the_trained_tables(tmp_path):
  fa = inputs.Feature('a', inputs.A_SP, combiner='sqrtn', weights=inputs.A_W)
  fb = inputs.Feature('b', inputs.B_SP, combiner='sum')
  init_a, init_b = models.init_table(9), models.init_table(10)
  params = tpu_fc.AdagradParameters(0.3)

  def column_fn():
    return [fa.column(init_a), fb.column(init_b)], []

  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=column_fn()[0],
                                    optimization_parameters=params)
  estimator = estimators.user_estimator(
      tmp_path, models.user_model_fn(column_fn), spec)
  c = inputs.coefficients(9, 2 * D)
  estimator.train(inputs.input_fn([fa, fb], c), steps=2)
  names = ['dense_features/a_weighted_by_a_w_embedding/embedding_weights',
           'dense_features/b_embedding/embedding_weights', 'bias']
  before = {n: estimator.get_variable_value(n)
            for n in estimator.get_variable_names()}
  checkpoint = estimator.latest_checkpoint()
  table_a, table_b, bias = (before[n] for n in names)
  out = np.concatenate([fa.activation(table_a), fb.activation(table_b)],
                       1) + bias
  per_example = (out * c).sum(1)

  # Two batches: an update between them would change the second one's values.
  result = estimator.evaluate(inputs.input_fn([fa, fb], c, repeat=2), steps=2)
  assert result['global_step'] == 2
  np.testing.assert_allclose(result['mean_per_example'], per_example.mean(),
                             **oracle.TOL)
  # Loss: shard 0's sum loss, as TF 2.15's TPU evaluation reports it.
  np.testing.assert_allclose(result['loss'],
                             per_example[:len(per_example) // NS].sum(),
                             **oracle.TOL)
  assert estimator.latest_checkpoint() == checkpoint
  after = {n: estimator.get_variable_value(n)
           for n in estimator.get_variable_names()}
  assert sorted(after) == sorted(before)
  for name, value in before.items():
    np.testing.assert_array_equal(after[name], value, err_msg=name)

  predictions = list(estimator.predict(inputs.input_fn([fa, fb], c, repeat=1)))
  assert len(predictions) == B
  np.testing.assert_allclose(np.stack([p['out'] for p in predictions]), out,
                             **oracle.TOL)


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
    return models.tpu_spec(mode, loss, rate=0.0)

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


def test_predict_sequence_features_on_the_cpu(tmp_path):
  """Predict looks up on the CPU, ids from the trained table, the sequence cut
  at max_sequence_length first, as the TPU enqueues it: lengths capped."""
  fs = inputs.Feature('s', inputs.S_SP, seq_len=L)
  init = models.init_table(11)

  def column_fn():
    return [], [fs.column(init)]

  spec = tpu_fc.EmbeddingConfigSpec(
      feature_columns=column_fn()[1],
      optimization_parameters=tpu_fc.StochasticGradientDescentParameters(0.5))
  estimator = estimators.user_estimator(
      tmp_path, models.user_model_fn(column_fn), spec)
  cs = inputs.coefficients(11, L, D)
  input_fn = inputs.input_fn([fs], cs=cs)
  estimator.train(input_fn, steps=1)
  table = estimator.get_variable_value(
      'sequence_features/s_embedding/embedding_weights')
  predictions = list(estimator.predict(inputs.input_fn([fs], cs=cs, repeat=1)))
  assert len(predictions) == B
  np.testing.assert_allclose(np.stack([p['seq'] for p in predictions]),
                             fs.activation(table), **oracle.TOL)
  # Last index + 1 (3, 1, 0, 2), capped at L = 2.
  assert L == 2
  assert [int(p['seq_length']) for p in predictions] == [2, 1, 0, 2]


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
    return models.tpu_spec(mode, tf.reduce_mean(logits))

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
  # The predict graph's features: padded, split over the 2 cores, static.
  assert seen[-1] == [2, 1]
  table = estimator.get_variable_value(
      'dense_features/u_embedding/embedding_weights')
  kernel, bias = (estimator.get_variable_value('dense/' + name)
                  for name in ('kernel', 'bias'))
  logits = np.concatenate([table[ids + 1], x[:, None]], 1) @ kernel + bias
  np.testing.assert_allclose(predicted, 1 / (1 + np.exp(-logits[:, 0])),
                             rtol=1e-5)


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
    return models.tpu_spec(mode, tf.reduce_sum(features['f']), rate=0.0)

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


def _keras_auc(labels, logits):
  """A Keras metric object, as TF's EstimatorSpec takes it."""
  auc = tf.keras.metrics.AUC()
  auc.update_state(labels, tf.sigmoid(logits))
  return {'auc': auc}


def test_a_keras_metric_from_metric_fn_counts_on_the_cpu_and_is_refused_on_a_tpu(
    tmp_path):
  """As TF 2.15: with use_tpu=False its EstimatorSpec takes a Keras metric
  object; its TPU evaluation fails on one (it takes each metric's [0] and
  [1]): the same TypeError, saying what a metric_fn returns, in an
  evaluation loop and in a one-step evaluation alike."""
  metrics, _ = estimators.train_linear(tmp_path / 'cpu', use_tpu=False,
                                       metric_fn=_keras_auc)
  assert 0 < metrics['auc'] <= 1
  if lanes.LEGACY:
    legacy, _ = estimators.train_linear(
        tmp_path / 'legacy', use_tpu=False, metric_fn=_keras_auc,
        driver=tf.compat.v1.estimator.tpu)
    assert legacy['auc'] == metrics['auc']
  for eval_steps in (estimators.LINEAR_EVAL_STEPS, 1):
    with pytest.raises(TypeError, match=re.escape(
        "'AUC' object is not subscriptable: metric_fn returned it for metric "
        "'auc'. On a TPU (use_tpu=True, eval_on_tpu=True), a metric_fn returns "
        'a dict of name -> (value, update_op) pairs, e.g. from '
        'tf.compat.v1.metrics.*')):
      estimators.train_linear(tmp_path / 'tpu_{}'.format(eval_steps),
                              use_tpu=True, metric_fn=_keras_auc,
                              eval_steps=eval_steps)
