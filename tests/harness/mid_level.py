"""The contract model migrated to `tpu_fc.mid_level`: its `TPUEmbedding` and
training loop (each core's loss scaled as `CrossShardOptimizer` scales it)."""
import functools
import tempfile

import tpu_fc
from tpu_fc._tf import tf

from harness import estimators
from harness import inputs
from harness import models

# The spec's optimizers that have a `tf.tpu.experimental.embedding` twin.
MID_LEVEL_OPTIMIZERS = tuple(
    name for name, params in estimators.EMBEDDING_OPTIMIZERS.items()
    if params.MID_LEVEL is not None)


def tpu_embedding(optimizer_name, num_cores, pipelined=False,
                  output_shape=None):
  """`tpu_fc.mid_level.TPUEmbedding` of the migrated model: one table 'ids'
  (the column's), trained by `optimizer_name`'s mid-level twin; the feature's
  `output_shape` (per core) as given."""
  table = tf.tpu.experimental.embedding.TableConfig(
      vocabulary_size=models.VOCAB, dim=models.DIM, combiner='mean',
      name='ids', initializer=tf.constant_initializer(models.START))
  return tpu_fc.mid_level.TPUEmbedding(
      {'ids': tf.tpu.experimental.embedding.FeatureConfig(
          table=table, output_shape=output_shape)},
      estimators.EMBEDDING_OPTIMIZERS[optimizer_name].to_mid_level(),
      pipeline_execution_with_tensor_core=pipelined, num_cores=num_cores)


def _batches(kind):
  """() -> the step's IDS as `kind`; iterator_tensors: the next element of a
  Dataset's iterator (sparse ids), as a migrated loop takes its batch."""
  if kind != 'iterator_tensors':
    return lambda: inputs.contract_ids(kind)
  iterator = iter(tf.data.Dataset.from_tensors(
      inputs.contract_ids('sparse')).repeat())
  return lambda: next(iterator)


def step(embedding, kind, num_cores, squared=False, scale_gradients=None):
  """One step of the migrated loop (untraced): the model's loss on IDS as
  `kind`, its gradient scaled as `CrossShardOptimizer` scales each core's
  (then by `scale_gradients`, e.g. `MidLevelConfig.scale_gradients`)."""
  batch = _batches(kind)

  def run_step():
    embedding.enqueue({'ids': batch()})
    with tf.GradientTape() as tape:
      activations = embedding.dequeue()
      tape.watch(activations)
      loss = models.contract_loss(activations['ids'], squared) / num_cores
    gradients = tape.gradient(loss, activations)
    embedding.apply_gradients(scale_gradients(gradients) if scale_gradients
                              else gradients)

  return run_step


def train(embedding, kind, steps, num_cores, function=True, squared=False):
  """The migrated training loop: `steps` steps of `step`."""
  run_step = step(embedding, kind, num_cores, squared)
  run_step = tf.function(run_step) if function else run_step
  for _ in range(steps):
    run_step()
  with tempfile.TemporaryDirectory() as directory:
    # As a checkpoint holds them (a saved checkpoint gets the update a
    # pipelined step parked for the next lookup).
    tf.train.Checkpoint(embedding=embedding).save(directory + '/ckpt')
  table = embedding.embedding_tables
  variables = embedding._variables['ids']  # pylint: disable=protected-access
  return (next(iter(table.values())).numpy(),
          {slot: variables[slot].numpy() for slot in variables
           if slot != 'parameters'})


@functools.lru_cache(maxsize=None)
def mirrored():
  """`MirroredStrategy` over this process's two logical CPUs
  (tests/conftest.py): two replicas, each a TPU core.  One for all tests, as
  a program has one: TF keys the collectives of every strategy over the same
  devices alike, so a second one's would meet the first's."""
  return tf.distribute.MirroredStrategy(['/cpu:0', '/cpu:1'])
