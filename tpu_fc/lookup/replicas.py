"""The replicas of a `tf.distribute` strategy as the cores of one TPU.

A TPU is N replicas over one embedding engine: each core looks up its slice of
the global batch, each table exists once, and one update per table and step
takes every core's gradients.  Under `MirroredStrategy` (one machine) and
`MultiWorkerMirroredStrategy` (several, TF's collectives) the mid-level
`TPUEmbedding` is that engine with `num_cores` = the replicas in sync: each
replica's inputs and activation gradients are gathered into the global batch
with the strategy's own `all_gather` (replica order is core order), the lookup
and the update run once, in cross-replica context (`merge_call`), and each
replica takes its slice of the activations.

Tables and slots are one variable each on the host, not one per replica: on
several machines each keeps its own copy, started from the first worker's
values and kept equal by applying the same global update.  Strategies whose
variables or steps live elsewhere (parameter servers, a central device) are
refused at once.
"""
from __future__ import annotations

import functools
from typing import Any

from tpu_fc import _tf_internals as internals
from tpu_fc._tf import tf

_REPLICATED = (tf.distribute.MirroredStrategy,
               tf.distribute.MultiWorkerMirroredStrategy)


def check_strategy(strategy: Any) -> None:
  """Raises for a strategy of several replicas whose replicas cannot be TPU
  cores here, naming it and what to use instead."""
  if strategy.num_replicas_in_sync == 1 or isinstance(strategy, _REPLICATED):
    return
  raise ValueError(
      'tpu_fc emulates a TPU\'s embedding over the replicas of '
      'MirroredStrategy (several devices of one machine) or '
      'MultiWorkerMirroredStrategy (several machines), each replica a TPU '
      'core; {} keeps variables or steps elsewhere (parameter servers, a '
      'central device), which a TPU\'s embedding does not. Create the model '
      'under one of those two, or under the default strategy.'.format(
          type(strategy).__name__))


def replica_context() -> Any:
  """The replica context of a strategy with several replicas in sync, where
  a call runs as one TPU core of several; else None (one replica, or cross-
  replica context: the call looks up all it is given)."""
  strategy = tf.distribute.get_strategy()
  context = tf.distribute.get_replica_context()
  if context is None or strategy.num_replicas_in_sync == 1:
    return None
  check_strategy(strategy)
  return context


def one_copy_creator(strategy: Any):
  """A variable creator making a variable of `strategy` one plain variable
  on the host, not one per replica (its replicas share a table, as a TPU's
  cores do)."""
  host = tf.DeviceSpec.from_string(strategy.extended.worker_devices[0]).replace(
      device_type='CPU', device_index=0).to_string()

  def creator(next_creator, **kwargs):
    del next_creator
    with tf.device(host):
      return internals.plain_variable(strategy, **kwargs)

  return creator


def same_on_every_machine(strategy: Any, variables: list[tf.Variable]) -> None:
  """Gives every worker's copy of `variables` the first replica's values,
  with an all-reduce each (each machine's initializer drew its own)."""
  if (strategy.num_replicas_in_sync == 1 or
      strategy.num_replicas_in_sync == len(strategy.extended.worker_devices)):
    return  # one machine
  for variable in variables:
    first = strategy.experimental_distribute_values_from_function(
        lambda context, variable=variable: variable.read_value()
        if context.replica_id_in_sync_group == 0 else tf.zeros_like(variable))
    variable.assign(strategy.reduce(tf.distribute.ReduceOp.SUM, first,
                                    axis=None))


class Slice:
  """Where one replica's examples of a feature lie in the global batch:
  rows `[offset, offset + batch)`; `static_batch` as its input gives it."""

  def __init__(self, offset, batch, static_batch):
    self.offset = offset
    self.batch = batch
    self.static_batch = static_batch

  def of(self, activation):
    """This replica's rows of a global activation."""
    rows = activation[self.offset:self.offset + self.batch]
    rows.set_shape([self.static_batch] + activation.shape[1:].as_list())
    return rows


def _batch(value):
  if isinstance(value, tf.SparseTensor):
    return value.dense_shape[0], tf.compat.dimension_value(value.shape[0])
  if isinstance(value, tf.RaggedTensor):
    return value.nrows(out_type=tf.int64), tf.compat.dimension_value(
        value.shape[0])
  if value.shape.rank == 0:
    raise ValueError(
        'A rank-0 input (one example, no batch dimension) cannot be split '
        'over the {} replicas of the strategy, each a TPU core: give it a '
        'batch dimension.'.format(
            tf.distribute.get_strategy().num_replicas_in_sync))
  return tf.shape(value, out_type=tf.int64)[0], tf.compat.dimension_value(
      value.shape[0])


def gather_inputs(context: Any, paths: list[str], values: dict[str, Any],
                  weights: dict[str, Any]):
  """(global values, global weights, {path: `Slice`}): each feature's input
  (and weights) of every replica, in replica order, on every replica.

  One `all_gather` of every feature's batch size gives each replica its
  offsets; then one per component (dense values, a SparseTensor's indices,
  values and shape, a RaggedTensor's values and row lengths).
  """
  batches = {path: _batch(values[path]) for path in paths}
  for path in paths:
    if isinstance(values[path], tf.SparseTensor) and values[path].shape.rank < 2:
      raise ValueError(
          'Input {}: a rank-1 SparseTensor is one example, which cannot be '
          'split over the replicas of the strategy, each a TPU core: give it '
          'a batch dimension, [batch, ids].'.format(path))
  every = _all_gather(context, tf.stack([batches[path][0]
                                         for path in paths])[tf.newaxis])
  offsets = tf.math.cumsum(every, axis=0, exclusive=True)[
      context.replica_id_in_sync_group]
  replicas = context.num_replicas_in_sync
  slices, global_values, global_weights = {}, {}, {}
  for index, path in enumerate(paths):
    batch, static_batch = batches[path]
    slices[path] = Slice(offsets[index], batch, static_batch)
    whole = None if static_batch is None else static_batch * replicas
    global_values[path] = _gathered(context, values[path], offsets[index],
                                    whole)
    global_weights[path] = (None if weights[path] is None else _gathered(
        context, weights[path], offsets[index], whole))
  return global_values, global_weights, slices


def _gathered(context, value, offset, whole):
  """`value` of every replica, its rows at `offset` in the global batch of
  `whole` rows (None: not static)."""
  gather = functools.partial(_all_gather, context)
  if isinstance(value, tf.RaggedTensor):
    return tf.RaggedTensor.from_row_lengths(
        gather(value.values), gather(value.row_lengths()), validate=False)
  if isinstance(value, tf.SparseTensor):
    shift = tf.one_hot(0, value.shape.rank, on_value=offset,
                       dtype=tf.int64)
    shapes = gather(value.dense_shape[tf.newaxis])
    result = tf.SparseTensor(
        gather(value.indices + shift), gather(value.values),
        tf.concat([tf.reduce_sum(shapes[:, :1], axis=0),
                   tf.reduce_max(shapes[:, 1:], axis=0)], axis=0))
    result.set_shape([whole] + value.shape[1:].as_list())
    return result
  return gather(value)


def gather(context: Any, tensors: list[Any]) -> list[Any]:
  """Each tensor of every replica, concatenated in replica order (the
  activation gradients of the global batch)."""
  return [_all_gather(context, tensor) for tensor in tensors]


def _all_gather(context, tensor):
  """The strategy's `all_gather` along the batch.  A tensor placed nowhere
  (the one replica of a machine of several, built without a device scope)
  goes to the replica's device first: TF gathers to the tensor's device."""
  if not tensor.device:
    with tf.device(tf.distribute.get_strategy().extended.worker_devices[0]):
      tensor = tf.identity(tensor)
  return context.all_gather(tensor, axis=0)
