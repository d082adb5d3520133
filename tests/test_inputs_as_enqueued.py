"""A TPU model's predict and export see the ids its training saw, for every input kind.

The TPU enqueues a tensor-core example's first `tensor_core_shape[1]` ids, a
sequence up to its last id (a dense sequence's -1 entries are padding), and takes
RaggedTensor ids; predict and export look up on the CPU through the feature
columns, so they get the ids cut the same way (ragged ones made sparse).  Table
row i is [2i, 2i + 1] / 10, so a sum of rows is hand-derived.  Also: a column used
by two layers, which a TPU cannot carry over to the CPU, is refused; integer
vocabulary and hash columns log that the TPU does not transform their ids.
"""
import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf

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
  return tpu_fc.TPUEstimatorSpec(mode, loss=loss, train_op=train_op_of(
      mode, loss), predictions={'net': net})


def train_op_of(mode, loss):
  """In TRAIN, a step that moves no variable (learning rate 0); else None."""
  if mode != tpu_fc.ModeKeys.TRAIN:
    return None
  return tf.compat.v1.tpu.CrossShardOptimizer(
      tf.compat.v1.train.GradientDescentOptimizer(0.0)).minimize(
          loss, tf.compat.v1.train.get_global_step())


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
    return tpu_fc.TPUEstimatorSpec(mode, loss=loss,
                                   train_op=train_op_of(mode, loss),
                                   eval_metrics=(
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
    tmp_path, tf_log):
  vocabulary = tf.feature_column.categorical_column_with_vocabulary_list(
      'ids', list(range(VOCAB - 1, -1, -1)), dtype=tf.int64)
  tpu = estimator(tmp_path, column(vocabulary))
  tpu.train(input_fn_of('sparse'), max_steps=1)
  assert any(line.startswith('Column ids_embedding: on a TPU its ids are '
                             'looked up as the input gives them')
             for line in tf_log)
