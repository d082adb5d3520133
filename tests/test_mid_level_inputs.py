"""High-dimensional inputs of `tpu_fc.mid_level.TPUEmbedding`, and its output
shapes, as TF's TPU `enqueue` and `build` read them (`tpu_embedding_v2.py`,
the same in TF 2.15 and 2.21).

Judged by what we did not write: activations against TF's own CPU lookup
(`serving_embedding_lookup` combines a rank-3 SparseTensor over its last
dimension, as the TPU does, and looks a dense `[batch, n, 1]` input up into
`[batch, n, 1, dim]`, the TPU's `[batch, n, dim]` with the size-1 axis kept)
and against the combiners by hand; one training step's tables against the
reference oracle (`oracle.ReferenceSteps`), each id's gradient derived here by
the chain rule; checkpoints restored into TF's own class; shapes and error
texts as TF's code gives them.  The cases are those of TF's
tpu_embedding_v2_hd_valid_input_test, _hd_invalid_input_test,
_correctness_hd_{sparse,ragged}_{forward,training}_test and
_correctness_dense_lookup_test, on the host with 1 or 2 emulated cores.
"""
import functools

import numpy as np
import pytest

from harness import estimators
from harness import models
from harness import oracle
import tpu_fc
from tpu_fc import reference
from tpu_fc._tf import tf

embedding_api = tf.tpu.experimental.embedding
pytestmark = pytest.mark.filterwarnings('ignore::UserWarning')

# Per example, per position: its ids and their weights (positive: TF's CPU
# lookup of a rank-3 input prunes the others, a TPU does not).
IDS = [[[1, 2], [3]], [[], [4, 4, 5]], [[0], [2]], [[5, 1], []]]
WEIGHTS = [[[0.5, 2.0], [1.0]], [[], [0.25, 1.0, 2.0]], [[4.0], [0.5]],
           [[1.0, 1.5], []]]
DENSE_IDS = [[1, 3], [4, 5], [0, 2], [5, 1]]  # one id per position, 0 kept
BATCH, POSITIONS, WIDTH = 4, 2, 3
# d(loss)/d(activation) of every example and position.
COEF = (np.arange(BATCH * POSITIONS * models.DIM, dtype=np.float32).reshape(
    BATCH, POSITIONS, models.DIM) - 7) / 4


def _sparse(values, dtype):
  """`values` (one per id of IDS) as a `[BATCH, POSITIONS, WIDTH]` SparseTensor."""
  indices = [(b, n, k) for b, example in enumerate(IDS)
             for n, position in enumerate(example) for k in range(len(position))]
  flat = [v for example in values for position in example for v in position]
  return tf.SparseTensor(indices, tf.constant(flat, dtype),
                         [BATCH, POSITIONS, WIDTH])


SPARSE_IDS = functools.partial(_sparse, IDS, tf.int64)
SPARSE_WEIGHTS = functools.partial(_sparse, WEIGHTS, tf.float32)


def _dense_ids():
  return tf.constant(DENSE_IDS, tf.int64)[:, :, tf.newaxis]  # [4, 2, 1]


def _table(combiner='mean'):
  return embedding_api.TableConfig(
      vocabulary_size=models.VOCAB, dim=models.DIM, combiner=combiner,
      name='t', initializer=tf.constant_initializer(models.START))


def _embedding(table=None, optimizer='adagrad', num_cores=1, **feature):
  """(feature config {'f': ...}, tpu_fc's TPUEmbedding of it)."""
  config = {'f': embedding_api.FeatureConfig(table=table or _table(),
                                             name='f', **feature)}
  return config, tpu_fc.mid_level.TPUEmbedding(
      config, estimators.EMBEDDING_OPTIMIZERS[optimizer].to_mid_level(),
      num_cores=num_cores)


def _train_step(embedding, features, weights=None):
  """One step of the loss sum(activations * COEF); its activations."""
  embedding.enqueue(features, weights)
  with tf.GradientTape() as tape:
    activations = embedding.dequeue()
    tape.watch(activations)
    loss = tf.reduce_sum(activations['f'] * COEF)
  embedding.apply_gradients(tape.gradient(loss, activations))
  return activations['f'].numpy()


def _by_hand(combiner, weights):
  """(activations [BATCH, POSITIONS, DIM], ids, their examples, their
  d(loss)/d(row)) of IDS combined over the last dimension, by the chain rule
  of `combiner`'s weighted sum / norm."""
  activations = np.zeros(COEF.shape)
  ids, examples, gradients = [], [], []
  for b, example in enumerate(IDS):
    for n, position in enumerate(example):
      w = np.array(weights[b][n] if weights else [1.0] * len(position))
      norm = {'sum': 1.0, 'mean': w.sum(),
              'sqrtn': np.sqrt((w * w).sum())}[combiner] if position else 1.0
      for i, weight in zip(position, w):
        activations[b, n] += weight * models.START[i] / norm
        ids.append(i)
        examples.append(b)
        gradients.append(COEF[b, n] * weight / norm)
  return activations, np.array(ids), np.array(examples), np.array(gradients)


def _reference(optimizer, ids, examples, gradients, num_cores):
  params = estimators.EMBEDDING_OPTIMIZERS[optimizer]
  want = oracle.ReferenceSteps(
      params, models.START, reference.init_slots(params, models.START.shape),
      gradient_roundings=oracle.ENGINE_GRADIENT_ROUNDINGS)
  return want.step(ids, gradients, models.LR,
                   cores=examples // (BATCH // num_cores), num_cores=num_cores)


def _table_and_slots(embedding):
  variables = embedding._variables['t']  # pylint: disable=protected-access
  return variables['parameters'].numpy(), {
      slot: variable.numpy() for slot, variable in variables.items()
      if slot != 'parameters'}


SPARSE_CASES = [(combiner, weighted, 'adagrad', 1)
                for combiner in ('sum', 'mean', 'sqrtn')
                for weighted in (False, True)] + [
                    ('mean', True, 'adam_per_core', 2),
                    ('sqrtn', False, 'adagrad', 2)]


@pytest.mark.parametrize('combiner, weighted, optimizer, cores', SPARSE_CASES)
def test_rank_3_sparse_ids_are_combined_over_their_last_dimension(
    combiner, weighted, optimizer, cores):
  config, embedding = _embedding(_table(combiner), optimizer, cores)
  weights = {'f': SPARSE_WEIGHTS()} if weighted else None
  want, ids, examples, gradients = _by_hand(combiner,
                                            WEIGHTS if weighted else None)
  tf_lookup = embedding_api.serving_embedding_lookup(
      {'f': SPARSE_IDS()}, weights, embedding.embedding_tables, config)['f']
  got = _train_step(embedding, {'f': SPARSE_IDS()}, weights)
  assert got.shape == (BATCH, POSITIONS, models.DIM)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(got, tf_lookup, rtol=1e-6, atol=1e-7)
  _reference(optimizer, ids, examples, gradients, cores).assert_matches(
      *_table_and_slots(embedding))


@pytest.mark.parametrize('combiner', ['sum', 'mean', 'sqrtn'])
@pytest.mark.parametrize('cores', [1, 2])
@pytest.mark.parametrize('last_of_1', [True, False],
                         ids=['[batch, n, 1]', '[batch, n]'])
def test_dense_ids_are_one_per_example_and_position(combiner, cores, last_of_1):
  """`[batch, n, 1]` as TF's TPU reads it; `[batch, n]` (which TF's TPU
  refuses) as a TPU without embedding cores (`TPUEmbeddingV0`, TF's CPU
  lookup) and a SparseCore given that output shape read it."""
  config, embedding = _embedding(_table(combiner), num_cores=cores)
  ids = _dense_ids() if last_of_1 else tf.constant(DENSE_IDS, tf.int64)
  tf_lookup = embedding_api.serving_embedding_lookup(
      {'f': ids}, None, embedding.embedding_tables, config)['f']
  got = _train_step(embedding, {'f': ids})
  np.testing.assert_array_equal(got, models.START[np.array(DENSE_IDS)])
  np.testing.assert_array_equal(  # (TF's [4, 2, 1, dim] of [4, 2, 1])
      got, tf_lookup[:, :, 0] if last_of_1 else tf_lookup)
  _reference('adagrad', np.array(DENSE_IDS).reshape(-1),
             np.repeat(np.arange(BATCH), POSITIONS),
             COEF.reshape(-1, models.DIM), cores).assert_matches(
                 *_table_and_slots(embedding))


@pytest.mark.parametrize('combiner', ['sum', 'mean', 'sqrtn'])
def test_dense_ids_read_against_an_output_shape_of_examples_are_combined(
    combiner):
  """A SparseCore's `TPUEmbeddingV2`: dense `[batch, n]` ids whose output
  shape is `[batch]` are n ids per example, combined by the table's combiner
  (id 0 too); TF's CPU lookup of the same ids as a SparseTensor agrees."""
  config, embedding = _embedding(_table(combiner), output_shape=[BATCH])
  ids = np.array(DENSE_IDS)
  as_sparse = tf.RaggedTensor.from_tensor(ids).to_sparse()
  norm = {'sum': 1.0, 'mean': POSITIONS, 'sqrtn': np.sqrt(POSITIONS)}[combiner]
  coef = COEF[:, 0]  # d(loss)/d(activation), [BATCH, DIM]
  embedding.enqueue({'f': tf.constant(ids)})
  with tf.GradientTape() as tape:
    activations = embedding.dequeue()
    tape.watch(activations)
    loss = tf.reduce_sum(activations['f'] * coef)
  want = embedding_api.serving_embedding_lookup(
      {'f': as_sparse}, None, embedding.embedding_tables, config)['f']
  embedding.apply_gradients(tape.gradient(loss, activations))
  np.testing.assert_allclose(activations['f'], want, rtol=1e-6)
  np.testing.assert_allclose(activations['f'],
                             models.START[ids].sum(axis=1) / norm, rtol=1e-6)
  _reference('adagrad', ids.reshape(-1), np.repeat(np.arange(BATCH), POSITIONS),
             np.repeat(coef, POSITIONS, axis=0) / norm, 1).assert_matches(
                 *_table_and_slots(embedding))


@pytest.mark.parametrize('ids', [
    tf.constant(3, tf.int64),
    tf.SparseTensor([[0], [2]], tf.constant([3, 1], tf.int64), [4])
], ids=['rank-0 id', 'rank-1 SparseTensor'])
def test_a_single_example_without_a_batch_dimension(ids):
  """A rank-0 id and a rank-1 SparseTensor (Keras' `Input(shape=(),
  sparse=True)`), which TF's TPU refuses, as a TPU without embedding cores
  (`TPUEmbeddingV0`) and TF's CPU lookup read them: one example, its
  activation `[dim]`; its rows train."""
  config, embedding = _embedding(_table('sum'), optimizer='sgd')
  rows = tf.sparse.to_dense(ids).numpy() if isinstance(
      ids, tf.SparseTensor) else None
  looked_up = [3, 1] if rows is not None else [3]
  want = embedding_api.serving_embedding_lookup(
      {'f': ids}, None, embedding.embedding_tables, config)['f']
  embedding.enqueue({'f': ids})
  with tf.GradientTape() as tape:
    activations = embedding.dequeue()
    tape.watch(activations)
    loss = tf.reduce_sum(activations['f'] * models.COEF)
  embedding.apply_gradients(tape.gradient(loss, activations))
  assert activations['f'].shape == (models.DIM,)
  np.testing.assert_allclose(activations['f'], want, rtol=1e-6)
  np.testing.assert_allclose(activations['f'],
                             models.START[looked_up].sum(axis=0), rtol=1e-6)
  _reference('sgd', np.array(looked_up), np.zeros(len(looked_up), int),
             np.tile(models.COEF, (len(looked_up), 1)), 1).assert_matches(
                 *_table_and_slots(embedding))


def _static_shape_cases():
  ragged = tf.ragged.constant([[1, 2], [3], [4, 0], [5]] * 2, tf.int64)
  return [
      ('dense', {}, tf.constant([1, 2, 3, 4] * 2, tf.int64), [8, models.DIM]),
      ('sparse', {}, ragged.to_sparse(), [8, models.DIM]),
      ('ragged', {}, ragged, [8, models.DIM]),
      ('sequence', {'max_sequence_length': 3}, ragged, [8, 3, models.DIM]),
      ('high-dimensional', {}, tf.sparse.concat(0, [SPARSE_IDS()] * 2),
       [8, POSITIONS, models.DIM]),
  ]


@pytest.mark.parametrize('kind, feature, ids, shape', _static_shape_cases(),
                         ids=[case[0] for case in _static_shape_cases()])
def test_activations_keep_every_static_dimension_of_their_input(
    kind, feature, ids, shape):
  """In a `tf.function`, as a TPU's dequeue gives them (its enqueue records
  the output shapes from the input; TFRS's ranking model squeezes them);
  the batch may change from call to call."""
  del kind
  _, embedding = _embedding(**feature)

  @tf.function
  def lookup(ids):
    embedding.enqueue({'f': ids}, training=False)
    return embedding.dequeue()['f']

  assert lookup.get_concrete_function(ids).structured_outputs.shape == shape
  half = (tf.sparse.slice(ids, [0] * ids.shape.rank, [4] + ids.shape[1:])
          if isinstance(ids, tf.SparseTensor) else ids[:4])
  assert lookup(half).shape == [4] + shape[1:]


def test_built_shapes_read_dense_sparse_and_ragged_inputs_on_two_cores():
  """TF's test_enqueue_dense_sparse_ragged: per-core input shapes given to
  `build` (the sparse one's last dimension unknown, as in TF's
  correctness_hd_ragged tests); a ragged input of 2 examples per core read
  against the output shape [2, 2] is a sequence of 2 ids per example (TF's
  rule)."""
  table = _table('sum')
  config = [embedding_api.FeatureConfig(table=table, name=name)
            for name in ('dense', 'sparse', 'ragged')]
  embedding = tpu_fc.mid_level.TPUEmbedding(
      config, embedding_api.SGD(models.LR), num_cores=2)
  embedding.build([tf.TensorShape([2, POSITIONS, 1]),
                   tf.TensorShape([2, POSITIONS, None]),
                   tf.TensorShape([2, POSITIONS, None])])
  assert embedding._output_shapes == [tf.TensorShape([2, POSITIONS])] * 3  # pylint: disable=protected-access
  ragged = tf.ragged.constant([[1, 2, 3], [4], [5, 0], []], tf.int64)
  embedding.enqueue([_dense_ids(), SPARSE_IDS(), ragged])
  dense, sparse, sequence = embedding.dequeue()
  tables = embedding.embedding_tables
  np.testing.assert_array_equal(dense, models.START[np.array(DENSE_IDS)])
  np.testing.assert_allclose(sparse, _by_hand('sum', None)[0], rtol=1e-6)
  whole_batch = embedding_api.FeatureConfig(table=table,
                                            output_shape=[BATCH, POSITIONS])
  np.testing.assert_array_equal(sequence, embedding_api.serving_embedding_lookup(
      ragged, None, tables, whole_batch))


def test_output_shapes_come_from_the_config_then_build():
  """TF's test_output_shapes_priority_over_feature_config_and_build, and
  `per_replica_batch_size` (a sequence feature's is [batch, length])."""
  _, embedding = _embedding(output_shape=[2, 4])
  embedding.build([tf.TensorShape([2, None, None])])
  assert embedding._output_shapes == [tf.TensorShape([2, 4])]  # pylint: disable=protected-access
  _, embedding = _embedding(max_sequence_length=3)
  embedding.build(per_replica_batch_size=4)
  assert embedding._output_shapes == [tf.TensorShape([4, 3])]  # pylint: disable=protected-access


def test_rank_3_sparse_ids_ignore_max_sequence_length_as_tf_does(tf_log):
  config, embedding = _embedding(max_sequence_length=3)
  embedding.enqueue({'f': SPARSE_IDS()})
  np.testing.assert_allclose(embedding.dequeue()['f'], _by_hand('mean', None)[0],
                             rtol=1e-6)
  np.testing.assert_allclose(
      embedding.dequeue()['f'], embedding_api.serving_embedding_lookup(
          {'f': SPARSE_IDS()}, None, embedding.embedding_tables, config)['f'],
      rtol=1e-6)
  assert [m for m in tf_log if 'Feature f: input tensor is rank 3 which is '
          'above 2, the max_sequence_length setting will be ignored.' in m]


def test_a_checkpoint_of_high_dimensional_training_restores_into_tfs_classes(
    tmp_path):
  """Into TF's `TPUEmbedding` (tables and slots), and into its
  `TPUEmbeddingForServing`, whose CPU lookup of the same input gives what
  tpu_fc's dequeue does."""
  _, embedding = _embedding()
  _train_step(embedding, {'f': SPARSE_IDS()}, {'f': SPARSE_WEIGHTS()})
  path = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / 'ckpt'))
  tf_config = {'f': embedding_api.FeatureConfig(table=_table(), name='f')}
  optimizer = estimators.EMBEDDING_OPTIMIZERS['adagrad'].to_mid_level()
  tfs = embedding_api.TPUEmbedding(tf_config, optimizer)
  status = tf.train.Checkpoint(embedding=tfs).restore(path)
  tfs.build()
  status.assert_consumed()
  table, slots = _table_and_slots(embedding)
  np.testing.assert_array_equal(tfs._variables['t']['parameters'], table)  # pylint: disable=protected-access
  np.testing.assert_array_equal(tfs._variables['t']['accumulators'],  # pylint: disable=protected-access
                                slots['accumulators'])
  serving = embedding_api.TPUEmbeddingForServing(tf_config, optimizer)
  tf.train.Checkpoint(embedding=serving).restore(path)
  embedding.enqueue({'f': SPARSE_IDS()}, training=False)
  np.testing.assert_allclose(
      embedding.dequeue()['f'],
      serving.embedding_lookup({'f': SPARSE_IDS()})['f'], rtol=1e-6)


def _misuses():
  def rank_3_ragged():
    _embedding()[1].enqueue({'f': tf.ragged.constant(
        [[[1], [2, 3]], [[4]]], tf.int64)})

  def dense_sequence():
    _embedding(max_sequence_length=2)[1].enqueue({'f': _dense_ids()})

  def weights_of_a_sequence():  # (TF's CPU lookup's check, whatever the rank)
    _embedding(max_sequence_length=2)[1].enqueue(
        {'f': SPARSE_IDS()}, weights={'f': SPARSE_WEIGHTS()})

  def positions_unknown():  # (nothing built: TF's error at its first enqueue)
    _, embedding = _embedding()
    tf.function(lambda ids: embedding.enqueue({'f': ids}), input_signature=[
        tf.SparseTensorSpec([BATCH, None, WIDTH], tf.int64)
    ]).get_concrete_function()

  def built_inconsistent_with_the_config():
    _embedding(output_shape=[2, 4])[1].build([tf.TensorShape([1, 1, 1])])

  def built_not_fully_defined():
    _embedding()[1].build([tf.TensorShape([1, None, None])])

  def built_of_rank_0():
    _embedding()[1].build([tf.TensorShape([])])

  def enqueued_inconsistent_with_the_build():
    _, embedding = _embedding()
    embedding.build([tf.TensorShape([1, 1, 1])])
    embedding.enqueue({'f': SPARSE_IDS()})

  def sequence_inconsistent_with_the_build():
    _, embedding = _embedding(max_sequence_length=3)
    embedding.build([tf.TensorShape([BATCH, 5, WIDTH])])
    embedding.enqueue({'f': tf.sparse.from_dense(tf.constant(
        [[1, 2], [3, 0], [4, 4], [5, 1]], tf.int64))})

  def unbuilt_apply():
    _embedding()[1].apply_gradients({'f': np.zeros([BATCH, 2], np.float32)})

  def non_tensor_gradient_before_any_enqueue():  # (TF's order)
    _, embedding = _embedding()
    embedding.build({'f': tf.TensorShape([BATCH, 2])})
    embedding.apply_gradients({'f': np.zeros([BATCH, 2], np.float32)})

  def gradients_of_another_structure_before_any_enqueue():
    _, embedding = _embedding()
    embedding.build({'f': tf.TensorShape([BATCH, 2])})
    embedding.apply_gradients([tf.zeros([BATCH, 2])])

  def slots_not_created_as_a_tpu_can():
    def slot_variable_creation_fn(table, slot_names, slot_initializers):
      return {name: tf.Variable(init(table.shape), name=name)
              for name, init in zip(slot_names, slot_initializers)}
    tpu_fc.mid_level.TPUEmbedding(
        {'f': embedding_api.FeatureConfig(table=_table())},
        embedding_api.Adagrad(
            0.1, slot_variable_creation_fn=slot_variable_creation_fn)).build(
                {'f': tf.TensorShape([BATCH, 2])})

  return [
      (rank_3_ragged, ValueError, 'Only rank 2 ragged tensor is supported, '
       'find rank 3 ragged tensor for input f'),
      (dense_sequence, ValueError, 'Feature f is a sequence feature but a '
       'dense tensor was passed.'),
      (weights_of_a_sequence, ValueError, 'Weight specified for f, but this is '
       'a sequence feature.'),
      (positions_unknown, ValueError, r'Input Feature f has output shape set '
       r'as \(4, None\) which is not fully defined. Please specify the fully '
       'defined shape in either FeatureConfig or for the build method.'),
      (built_inconsistent_with_the_config, ValueError, r'Inconsistent shape '
       r'founded for input feature f, Output shape is set to be \(2, 4\), But '
       r'got incoming output shape \(1, 1\)'),
      (built_not_fully_defined, ValueError, r'Input Feature f has output '
       r'shape set as \(1, None\) which is not fully defined.'),
      (built_of_rank_0, ValueError, r'Received input tensor of shape \(\). '
       'Rank must be 1 and above'),
      (enqueued_inconsistent_with_the_build, ValueError, r'Inconsistent shape '
       r'founded for input feature f, Output shape is set to be \(1, 1\), But '
       r'got incoming output shape \(4, 2\)'),
      (sequence_inconsistent_with_the_build, ValueError, r'Inconsistent shape '
       r'founded for input feature f, Output shape is set to be \(4, 5\), But '
       r'got incoming output shape \(4, 3\)'),
      (unbuilt_apply, RuntimeError, 'apply_gradients called on unbuilt '
       'TPUEmbedding object. Please either call enqueue first or manually '
       'call the build method.'),
      (non_tensor_gradient_before_any_enqueue, ValueError, "found non-tensor "
       "type: <class 'numpy.ndarray'> at path f."),
      (gradients_of_another_structure_before_any_enqueue, (ValueError,
                                                           TypeError),
       "structure"),
      (slots_not_created_as_a_tpu_can, ValueError, 'Unable to extract '
       'initializer function and shape from'),
  ]


@pytest.mark.parametrize('misuse, error, text', _misuses(),
                         ids=[case[0].__name__ for case in _misuses()])
def test_misuse_gets_tfs_error_in_tfs_order(misuse, error, text):
  with pytest.raises(error, match=text):
    misuse()
