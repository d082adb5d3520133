"""`tpu_fc.mid_level.TPUEmbedding` under `MirroredStrategy`: its replicas as
the cores of one TPU, as TF's guide writes the loop (`strategy.run` of
enqueue, dequeue, apply_gradients), over the two logical CPUs
tests/conftest.py makes.

A TPU of N cores looks each core's slice of the global batch up in one copy
of each table and applies one update per table from all cores' gradients.
Judged by the reference oracle on 2 cores (`oracle.expected_step`, each id's
gradient derived by hand there), which the same model on one replica with
`num_cores=2` also meets; the tables and slots are one variable each.
"""
import functools

import numpy as np
import pytest

from harness import inputs
from harness import mid_level
from harness import models
from harness import oracle
from tpu_fc._tf import tf

REPLICAS = 2
pytestmark = pytest.mark.filterwarnings('ignore::UserWarning')


def _replica_ids(kind):
  """The contract's ids as `kind`, each replica its half of the batch."""
  half = len(inputs.IDS) // REPLICAS

  def ids(context):
    rows = slice(context.replica_id_in_sync_group * half,
                 (context.replica_id_in_sync_group + 1) * half)
    return inputs.contract_ids('ragged')[rows] if kind == 'ragged' else (
        tf.sparse.from_dense(inputs.contract_ids('dense')[rows] + 1)
        if kind == 'sparse' else inputs.contract_ids('dense')[rows])

  return ids


def _replicated(optimizer, kind, pipelined=False):
  """(strategy, its embedding: one table 'ids', one core a replica; dense
  padded ids are combined against an output shape of the replica's
  examples)."""
  strategy = mid_level.mirrored()
  with strategy.scope():
    embedding = mid_level.tpu_embedding(
        optimizer, 1, pipelined, output_shape=[len(inputs.IDS) // REPLICAS]
        if kind == 'dense' else None)
  return strategy, embedding


def _train(strategy, embedding, kind, steps, function=True, squared=False):
  """`steps` of the migrated loop in `strategy.run`: each replica's loss on
  its examples, scaled as `CrossShardOptimizer` scales a core's; the
  activations each replica dequeued, by step."""
  ids = strategy.experimental_distribute_values_from_function(
      _replica_ids(kind))
  if kind == 'sparse':  # (ids + 1 above: from_dense drops the -1 padding
    # and id 0, which IDS lacks; shift back)
    ids = strategy.run(lambda x: tf.SparseTensor(x.indices, x.values - 1,
                                                 x.dense_shape), args=(ids,))

  def replica_step(ids):
    embedding.enqueue({'ids': ids})
    with tf.GradientTape() as tape:
      activations = embedding.dequeue()
      tape.watch(activations)
      loss = models.contract_loss(activations['ids'], squared) / REPLICAS
    embedding.apply_gradients(tape.gradient(loss, activations))
    return activations['ids']

  def step():
    return strategy.run(replica_step, args=(ids,))

  step = tf.function(step) if function else step
  return [np.concatenate(strategy.experimental_local_results(step()))
          for _ in range(steps)]


@functools.lru_cache(maxsize=None)
def _trained(optimizer, kind):
  """(embedding, its activations by step) after two replicated steps; one
  training for the tests that read it, none of which changes it."""
  strategy, embedding = _replicated(optimizer, kind)
  return embedding, _train(strategy, embedding, kind, steps=2)


def _table_and_slots(embedding):
  variables = embedding._variables['ids']  # pylint: disable=protected-access
  return variables['parameters'].numpy(), {
      slot: variable.numpy() for slot, variable in variables.items()
      if slot != 'parameters'}


@pytest.mark.parametrize('kind', ['dense', 'sparse', 'ragged'])
@pytest.mark.parametrize('optimizer', ['sgd', 'adagrad', 'adam_per_core'])
def test_replicas_train_as_the_cores_of_one_tpu(optimizer, kind):
  """Two steps: the oracle's 2-core step (one update of the summed
  gradients; without gradient accumulation each core's in turn, the core
  holding the id first), as one replica with `num_cores=2`."""
  embedding, _ = _trained(optimizer, kind)
  table, slots = _table_and_slots(embedding)
  want = oracle.expected_step('mid_level', optimizer, steps=2, num_shards=2)
  want.assert_matches(table, {slot: slots[slot] for _, slot in
                              want.params.SLOTS}, err_msg=optimizer)
  one_table, one_slots = mid_level.train(
      mid_level.tpu_embedding(optimizer, 2, output_shape=[2] if kind == 'dense'
                              else None), kind, 2, 2)
  np.testing.assert_allclose(table, one_table, rtol=1e-6, atol=1e-7)
  for slot, value in one_slots.items():
    np.testing.assert_allclose(slots[slot], value, rtol=1e-6, atol=1e-7)


def test_an_eager_loop_trains_as_a_traced_one():
  strategy, embedding = _replicated('adagrad', 'ragged')
  _train(strategy, embedding, 'ragged', steps=2, function=False)
  oracle.expected_step('mid_level', 'adagrad', steps=2,
                       num_shards=2).assert_matches(
                           _table_and_slots(embedding)[0])


def test_each_table_and_slot_is_one_variable_on_the_host():
  """Not one per replica (a MirroredVariable): the replicas share it."""
  strategy, embedding = _replicated('adagrad', 'ragged')
  embedding.build({'ids': tf.TensorShape([2, None])})
  variables = embedding._variables['ids']  # pylint: disable=protected-access
  assert sorted(variables) == ['accumulators', 'parameters']
  for variable in variables.values():
    assert type(variable).__name__ == 'ResourceVariable', type(variable)
    assert len(strategy.experimental_local_results(variable)) == 1
    assert variable.device.endswith('CPU:0')


def test_no_replica_sees_an_update_of_its_own_step():
  """Both replicas look id 4 up (examples 1 and 3): each dequeues the rows as
  they were before the step's one update; the next step's lookups see it."""
  _, (first, second) = _trained('sgd', 'ragged')
  after_one = oracle.expected_step('mid_level', 'sgd', steps=1,
                                   num_shards=2).table
  for table, activations in ((models.START, first), (after_one, second)):
    np.testing.assert_allclose(
        activations, [table[ids].mean(axis=0) for ids in inputs.IDS],
        rtol=1e-6, atol=1e-7)


def test_pipelined_replicas_train_as_pipelined_cores(tmp_path):
  """Pipelined execution: each step's update lands after the next step's
  lookup, on two replicas as on one replica's two cores (a loss whose
  gradient is the activation sees which rows a lookup read); a checkpoint
  applies the parked one."""
  def trained(pipelined):
    strategy, embedding = _replicated('adagrad', 'ragged', pipelined)
    _train(strategy, embedding, 'ragged', steps=3, squared=True)
    tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / 'ckpt'))
    return _table_and_slots(embedding)

  table, slots = trained(pipelined=True)
  one_table, one_slots = mid_level.train(
      mid_level.tpu_embedding('adagrad', 2, True), 'ragged', 3, 2,
      squared=True)
  np.testing.assert_allclose(table, one_table, rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(slots['accumulators'], one_slots['accumulators'],
                             rtol=1e-6, atol=1e-7)
  assert not np.allclose(table, trained(pipelined=False)[0], atol=1e-4)


def test_a_checkpoint_moves_between_replicas_and_one(tmp_path):
  """`tf.train.Checkpoint` of the replicated embedding restores into one
  replica's, and that one's back into a replicated one."""
  embedding, _ = _trained('adagrad', 'ragged')
  saved = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / 'a'))
  single = mid_level.tpu_embedding('adagrad', 2)
  status = tf.train.Checkpoint(embedding=single).restore(saved)
  single.embedding_tables  # pylint: disable=pointless-statement  (builds,
  # restoring on creation)
  status.assert_consumed()
  for (name, got), want in zip(sorted(_table_and_slots(single)[1].items()),
                               [_table_and_slots(embedding)[1][name] for name
                                in sorted(_table_and_slots(single)[1])]):
    np.testing.assert_array_equal(got, want, err_msg=name)
  np.testing.assert_array_equal(_table_and_slots(single)[0],
                                _table_and_slots(embedding)[0])
  mid_level.train(single, 'ragged', 1, 2)
  back = tf.train.Checkpoint(embedding=single).save(str(tmp_path / 'b'))
  _, again = _replicated('adagrad', 'ragged')
  status = tf.train.Checkpoint(embedding=again).restore(back)
  again.embedding_tables  # pylint: disable=pointless-statement
  status.assert_consumed()
  np.testing.assert_array_equal(_table_and_slots(again)[0],
                                _table_and_slots(single)[0])


def test_strategies_of_other_replicas_are_refused_at_once():
  """A central device's or parameter servers' variables are no TPU's
  engine: refused when the embedding is made, naming the strategy."""
  strategy = tf.distribute.experimental.CentralStorageStrategy(
      ['/cpu:0', '/cpu:1'])
  with strategy.scope():
    with pytest.raises(ValueError, match='MirroredStrategy .*'
                       'MultiWorkerMirroredStrategy .*CentralStorageStrategy'):
      mid_level.tpu_embedding('sgd', 1)


def test_one_example_without_a_batch_is_refused_under_replicas():
  strategy, embedding = _replicated('sgd', 'ragged')
  with pytest.raises(ValueError, match='rank-0 input .* give it a batch '
                     'dimension'):
    strategy.run(tf.function(lambda: embedding.enqueue(
        {'ids': tf.constant(1, tf.int64)})))


def test_num_cores_per_replica_multiplies_the_cores():
  """`num_cores=2` on each of 2 replicas: the oracle's 4 cores, each id's
  gradients applied core by core without gradient accumulation."""
  strategy = mid_level.mirrored()
  with strategy.scope():
    embedding = mid_level.tpu_embedding('adam_per_core', 2)
  ids = strategy.experimental_distribute_values_from_function(
      _replica_ids('ragged'))

  @tf.function
  def step():
    def replica_step(ids):
      embedding.enqueue({'ids': ids})
      with tf.GradientTape() as tape:
        activations = embedding.dequeue()
        tape.watch(activations)
        loss = models.contract_loss(activations['ids']) / 4
      embedding.apply_gradients(tape.gradient(loss, activations))
    strategy.run(replica_step, args=(ids,))

  step()
  oracle.expected_step('mid_level', 'adam_per_core', steps=1,
                       num_shards=4).assert_matches(
                           _table_and_slots(embedding)[0])
