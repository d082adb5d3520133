"""Features as the TPU enqueues them, on the emulated TPU.

To the model_fn the emulated TPU looks like a TPU: static shapes, the
configured batch, rank-3 sequence ids combined per position, weights read by
one column; features may be one Tensor, not a dict.  A TPU model's predict
and export see the ids its training saw, for every input kind (ids
transformed in the input_fn for training, TF's advice for hash columns, are
refused in predict, which takes the raw feature).

The TPU enqueues a tensor-core example's first `tensor_core_shape[1]` ids, a
sequence up to its last id (a dense sequence's -1 entries are padding), and takes
RaggedTensor ids; predict and export look up on the CPU through the feature
columns, so they get the ids cut the same way (ragged ones made sparse).  Table
row i is [2i, 2i + 1] / 10, so a sum of rows is hand-derived.  Also: a column used
by two layers, which a TPU cannot carry over to the CPU, is refused; integer
vocabulary and hash columns log that the TPU does not transform their ids.
"""
import collections

import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf
from tpu_fc.lookup import backends

from harness import estimators
from harness import inputs
from harness import lanes
from harness import models

pytestmark = pytest.mark.filterwarnings('ignore::UserWarning')
fc = tf.feature_column
VOCAB, DIM, BATCH = 10, 2, 2
ROWS = np.arange(VOCAB * DIM, dtype=np.float32).reshape(VOCAB, DIM) / 10
IDS = [[1, 2, 3, 4], [8, 9, 1]]
FIRST_TWO_SUMS = [ROWS[1] + ROWS[2], ROWS[8] + ROWS[9]]


def column(categorical=None, **kwargs):
  return tpu_fc.embedding_column(
      categorical or tf.feature_column.categorical_column_with_identity(
          'ids', VOCAB), DIM, combiner='sum',
      initializer=tf.compat.v1.constant_initializer(ROWS), **kwargs)


def tensor_core_column():
  return column(embedding_lookup_device='tpu_tensor_core',
                tensor_core_shape=[None, 2])


def model_fn(features, labels, mode, params):
  del labels
  towers = params.get('towers', 1)
  layer = params.get('layer', tf.compat.v1.keras.layers.DenseFeatures)
  nets = [layer([params['column']], name='tower{}'.format(i))(features)
          for i in range(towers)]
  net = tf.add_n(nets)
  loss = tf.reduce_sum(net) * 0
  return models.tpu_spec(mode, loss, rate=0.0, predictions={'net': net})


def estimator(model_dir, col, **params):
  return tpu_fc.TPUEstimator(
      model_fn=model_fn, use_tpu=True, train_batch_size=BATCH,
      predict_batch_size=BATCH, params=dict(params, column=col),
      config=tpu_fc.RunConfig(model_dir=str(model_dir)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=[col],
          optimization_parameters=tpu_fc.StochasticGradientDescentParameters(
              0.0)))


def ids_as(kind, ids=IDS, pad=-1):
  ragged = tf.ragged.constant(ids, tf.int64)
  return {'ragged': ragged, 'sparse': ragged.to_sparse(),
          'dense': ragged.to_tensor(default_value=pad)}[kind]


def input_fn_of(kind, repeat=True):
  def input_fn(params):
    del params
    dataset = tf.data.Dataset.from_tensors(({'ids': ids_as(kind)},
                                            tf.zeros([BATCH, 1])))
    return dataset.repeat() if repeat else dataset
  return input_fn


def served(export_dir, ids):
  """The exported model's `net` for serialized examples holding `ids`."""
  examples = [tf.train.Example(features=tf.train.Features(feature={
      'ids': tf.train.Feature(int64_list=tf.train.Int64List(value=row))}))
              .SerializeToString() for row in ids]
  loaded = tf.saved_model.load(export_dir)
  return loaded.signatures['serving_default'](
      examples=tf.constant(examples))['net'].numpy()


@pytest.mark.parametrize('kind', ['sparse', 'ragged'])
def test_tensor_core_predict_and_export_see_the_first_ids(tmp_path, kind):
  tpu = estimator(tmp_path, tensor_core_column())
  tpu.train(input_fn_of(kind), max_steps=1)
  predicted = [p['net'] for p in tpu.predict(input_fn_of(kind, repeat=False))]
  np.testing.assert_array_equal(predicted, FIRST_TWO_SUMS)
  export_dir = tpu.export_saved_model(
      str(tmp_path / 'export'), tpu_fc.export.build_parsing_serving_input_receiver_fn(
          {'ids': tf.io.VarLenFeature(tf.int64)}))
  np.testing.assert_array_equal(served(export_dir, IDS), FIRST_TWO_SUMS)


@pytest.mark.parametrize('kind', ['sparse', 'ragged', 'dense'])
def test_predict_takes_every_input_kind_training_takes(tmp_path, kind):
  """All ids of an embedding-core column, whatever the input kind."""
  tpu = estimator(tmp_path, column())
  tpu.train(input_fn_of(kind), max_steps=1)
  predicted = [p['net'] for p in tpu.predict(input_fn_of(kind, repeat=False))]
  np.testing.assert_allclose(
      predicted, [ROWS[[1, 2, 3, 4]].sum(0), ROWS[[8, 9, 1]].sum(0)],
      rtol=1e-6)


def test_a_dense_sequences_padding_is_not_counted_in_its_length(tmp_path):
  """Lengths [3, 1, 0, 2] in training (as in predict and on the CPU), not 3s."""
  ids = [[1, 2, 3], [5, -1, -1], [-1, -1, -1], [4, 9, -1]]
  col = column(tf.feature_column.sequence_categorical_column_with_identity(
      'ids', VOCAB), max_sequence_length=3)
  seen = {}

  def sequence_model_fn(features, labels, mode, params):
    del labels, params
    sequences, seen[mode] = tf.keras.experimental.SequenceFeatures([col])(
        features)
    loss = tf.reduce_sum(sequences) * 0
    return models.tpu_spec(mode, loss, rate=0.0, eval_metrics=(
        lambda lengths: {'lengths': tf.compat.v1.metrics.mean(
            tf.cast(lengths, tf.float32))}, [seen[mode]]))

  tpu = tpu_fc.TPUEstimator(
      model_fn=sequence_model_fn, use_tpu=True, train_batch_size=4,
      eval_batch_size=4, config=tpu_fc.RunConfig(model_dir=str(tmp_path)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=[col],
          optimization_parameters=tpu_fc.StochasticGradientDescentParameters(
              0.0)))

  def input_fn(params):
    del params
    return tf.data.Dataset.from_tensors(({'ids': tf.constant(ids, tf.int64)},
                                         tf.zeros([4, 1]))).repeat()

  tpu.train(input_fn, max_steps=1)
  assert tpu.evaluate(input_fn, steps=1)['lengths'] == 1.5  # (3+1+0+2)/4


@pytest.mark.parametrize('layer, message', [
    (tf.keras.layers.DenseFeatures, 'Column ids_embedding is used by two '
     'layers .*Look the column up in one layer'),
    # TF's own check of the scope it records, for the v1 layer:
    (tf.compat.v1.keras.layers.DenseFeatures, 'For embedding var name ids, the '
     'variable scope name is different, got tower1/ids_embedding; expected '
     'tower0/ids_embedding')])
def test_a_column_in_two_layers_is_refused_on_the_tpu(tmp_path, layer,
                                                      message):
  with pytest.raises(ValueError, match=message):
    estimator(tmp_path, column(), towers=2, layer=layer).train(
        input_fn_of('sparse'), max_steps=1)


def test_integer_vocabulary_ids_log_that_the_tpu_does_not_transform_them(
    tmp_path, tf_log, monkeypatch):
  monkeypatch.setattr(backends, '_LOGGED_UNTRANSFORMED', set())  # once a column
  vocabulary = tf.feature_column.categorical_column_with_vocabulary_list(
      'ids', list(range(VOCAB - 1, -1, -1)), dtype=tf.int64)
  tpu = estimator(tmp_path, column(vocabulary))
  tpu.train(input_fn_of('sparse'), max_steps=1)
  assert any(line.startswith('Column ids_embedding: on a TPU its ids are '
                             'looked up as the input gives them')
             for line in tf_log)


# To the model_fn the emulated TPU looks like a TPU. ------------------------


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
    return models.tpu_spec(mode, loss)

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
    return models.tpu_spec(mode, loss, rate=0.0, cross_shard=False)

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


@pytest.mark.parametrize('use_tpu', [True, False])
def test_weight_sharing_among_weighted_columns(tmp_path, use_tpu):
  """`test_embedding_with_weighted_categorical_column_share_weights_error`:
  TF's TPU enqueue pops each weight feature, so the second reader fails; the
  CPU path (use_tpu=False) shares them as plain feature columns do."""
  columns = models.weighted_columns()
  estimator = tpu_fc.TPUEstimator(
      model_fn=models.columns_model_fn(columns), use_tpu=use_tpu,
      train_batch_size=2,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path),
                              tpu_config=tpu_fc.TPUConfig(num_shards=2)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=columns,
          optimization_parameters=tpu_fc.AdagradParameters(0.1)))
  if not use_tpu:
    estimator.train(inputs.weighted_ids, steps=1)
    assert estimator.get_variable_value('global_step') == 1
    return
  with pytest.raises(ValueError, match=(
      'Cannot find weights values for weighted_categorical_column. Please check '
      'if the weights are present in feature dict. Also note weight-sharing '
      'among weighted_categorical_column is not supported on TPU.')):
    estimator.train(inputs.weighted_ids, steps=1)


def test_numpy_features_train_as_tensors(tmp_path):
  """An input_fn may return numpy arrays (TF converts them), on the TPU too."""
  def input_fn(params):
    features, labels = inputs.contract_tensors(params)
    return dict(features, extra=np.zeros([len(inputs.IDS), 1], np.float32)), (
        labels)

  tpu = estimators.option_estimator(tmp_path)
  tpu.train(input_fn, max_steps=1)
  assert tpu.get_variable_value('global_step') == 1


def test_features_as_one_tensor_run_on_the_emulated_tpu(tmp_path):
  """TPUEstimator's input_fn may give a Tensor, not a dict (it crashed with use_tpu=True)."""
  cpu_metrics, cpu_kernel = estimators.train_linear(tmp_path / 'cpu',
                                                    use_tpu=False)
  tpu_metrics, tpu_kernel = estimators.train_linear(tmp_path / 'tpu',
                                                    use_tpu=True)
  np.testing.assert_allclose(tpu_kernel, cpu_kernel, rtol=1e-6)
  # (The eval loss is shard 0's, as on a TPU; metrics see every shard.)
  np.testing.assert_allclose(tpu_metrics['mean_logit'], cpu_metrics['mean_logit'],
                             rtol=1e-6)
  if lanes.LEGACY:  # TF's own driver agrees
    legacy_metrics, legacy_kernel = estimators.train_linear(
        tmp_path / 'legacy', use_tpu=False, driver=tf.compat.v1.estimator.tpu)
    np.testing.assert_allclose(legacy_kernel, cpu_kernel, rtol=1e-6)
    np.testing.assert_allclose(legacy_metrics['loss'], cpu_metrics['loss'], rtol=1e-6)


XY = collections.namedtuple('XY', ['x', 'y'])


def test_namedtuple_features_reach_each_core_as_the_namedtuple(tmp_path):
  """Features may be any nest TF's infeed takes (`tpu_estimator.py`,
  `_validate_model_features_and_labels`, 1982-1985: nested dict, tuple,
  namedtuple): each of 2 cores gets the namedtuple of its rows."""
  seen = []

  def model_fn(features, labels, mode, params):
    del params
    seen.append((type(features), features.x.shape.as_list()))
    logits = tf.compat.v1.layers.dense(features.x + features.y, 1)
    return models.tpu_spec(
        mode, tf.compat.v1.losses.mean_squared_error(labels, logits))

  def input_fn(params):
    return tf.data.Dataset.from_tensor_slices(
        (XY(inputs.X, 2 * inputs.X), inputs.Y)).repeat().batch(
            params['batch_size'], drop_remainder=True)

  tpu = tpu_fc.TPUEstimator(
      model_fn=model_fn, train_batch_size=4,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path), tpu_config=(
          tpu_fc.TPUConfig(num_shards=2))))
  tpu.train(input_fn, max_steps=1)
  assert seen == [(XY, [2, 2])] * 2


HASH_BUCKETS = 7
WORDS = np.array([b'a', b'b', b'c', b'd'] * (inputs.N // 4))


def _hashed_column():
  return tpu_fc.embedding_column(
      tf.feature_column.categorical_column_with_hash_bucket('word', HASH_BUCKETS),
      2, initializer=tf.compat.v1.constant_initializer(0.1))


def _word_input_fn(params, mode):
  """TF's advice for hash columns on the TPU: integer ids made in the input_fn."""
  def parse(words, labels):
    features = {'word': tf.sparse.from_dense(words[:, tf.newaxis])}
    if params['transform_in_predict'] or mode != tpu_fc.ModeKeys.PREDICT:
      features['word'] = _hashed_column().categorical_column._transform_feature(  # pylint: disable=protected-access
          features)
    return features, labels
  dataset = tf.data.Dataset.from_tensor_slices((WORDS, inputs.Y))
  if mode == tpu_fc.ModeKeys.TRAIN:
    dataset = dataset.repeat()
  return dataset.batch(params['batch_size'], drop_remainder=True).map(parse)


def _word_model_fn(features, labels, mode, params):
  logits = tf.reduce_sum(
      tf.keras.layers.DenseFeatures([_hashed_column()])(features), axis=1,
      keepdims=True)
  if mode == tpu_fc.ModeKeys.PREDICT:
    return tpu_fc.TPUEstimatorSpec(mode, predictions={'logit': logits})
  loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
  optimizer = tf.compat.v1.tpu.CrossShardOptimizer(
      tf.compat.v1.train.GradientDescentOptimizer(0.1))
  return tpu_fc.TPUEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(
      loss, tf.compat.v1.train.get_global_step()))


@pytest.mark.parametrize('transform_in_predict', [False, True])
def test_predict_of_ids_transformed_for_the_tpu(tmp_path, transform_in_predict):
  """Ids transformed in the input_fn for TPU training: raw strings to predict."""
  estimator = tpu_fc.TPUEstimator(
      model_fn=_word_model_fn, use_tpu=True,
      train_batch_size=estimators.LINEAR_BATCH,
      predict_batch_size=estimators.LINEAR_BATCH,
      params={'transform_in_predict': transform_in_predict},
      config=tpu_fc.RunConfig(model_dir=str(tmp_path)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=[_hashed_column()],
          optimization_parameters=tpu_fc.StochasticGradientDescentParameters(
              0.1)))
  estimator.train(_word_input_fn, max_steps=2)
  predictions = estimator.predict(_word_input_fn, yield_single_examples=False)
  if transform_in_predict:
    with pytest.raises(ValueError, match='Feature word holds int64 ids, but its '
                       'column word takes strings: with use_tpu=True, predict'):
      next(predictions)
    return
  table = estimator.get_variable_value(
      'dense_features/word_embedding/embedding_weights')
  ids = tf.strings.to_hash_bucket_fast(WORDS[:estimators.LINEAR_BATCH], HASH_BUCKETS).numpy()
  np.testing.assert_allclose(next(predictions)['logit'][:, 0],
                             table[ids].sum(axis=1), rtol=1e-6)
