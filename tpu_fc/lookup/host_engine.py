"""The TPU embedding core, emulated on the host: lookups and updates over tables it is handed.

Its owner creates the tables and slots, enqueues the features (`inputs`) and
gives the activation gradients: `backends.EmbeddingCoreBackend` for the
emulated TPUEstimator (whose model_fn sees only activations; the gradients come
through ties to dummy variables), `tpu_fc.mid_level.TPUEmbedding` for TF's
mid-level API (whose `apply_gradients` takes them).  The engine applies them to
the looked-up rows with the TPU update rules (`tpu_fc.reference`, implemented
with TF's sparse kernels in `sparse_update`).

Per table and step the engine gathers the rows of all its features' ids in one gather,
de-duplicates those ids once, sums their gradients per unique id and applies them as the
TPU does (`tpu_fc.reference.apply_update_by_core`): with gradient accumulation (the
default) one sparse update of the whole batch's sums, without it one per core turn in the
TPU's per-core order; no step reads a whole table.

A table created partitioned (in a parameter-server cluster the driver creates
every table in row-wise `div` parts, one per ps task) is gathered with
`embedding_lookup` and updated part by part on the device holding the part.
"""
from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from tpu_fc import _tf_internals as internals
from tpu_fc import reference
from tpu_fc._tf import tf
from tpu_fc.lookup import inputs as inputs_lib
from tpu_fc.lookup import sparse_update

if TYPE_CHECKING:
  from tpu_fc.optimizers import _OptimizationParameters
  from tpu_fc.spec import EmbeddingLayout


def _gather(table, ids):
  """Rows `ids` of a table, partitioned (div layout) or not."""
  parts = sparse_update.table_parts(table)
  if len(parts) == 1:
    return tf.gather(parts[0], ids)
  return tf.compat.v1.nn.embedding_lookup(parts, ids, partition_strategy='div')


def _quantized(rows, num_buckets, lower, upper):
  """`rows` clipped to [lower, upper] and rounded to the nearest of
  `num_buckets` evenly spaced values, in float32 by the formula of TF's
  `QuantizationConfig` (the TPU's simulated quantization)."""
  lower, upper = np.float32(lower), np.float32(upper)
  quantum = (upper - lower) / np.float32(num_buckets - 1)
  clipped = tf.clip_by_value(rows, lower, upper)
  return tf.floor((clipped - lower) / quantum + 0.5) * quantum + lower


def _split_div(parts, ids, *per_id):
  """[(part, ids within the part, *per_id within the part)] under the `div`
  layout; `per_id` are tensors (or None) with one entry per id."""
  ends = np.cumsum([part.shape[0] for part in parts]).astype(np.int64)
  starts = np.concatenate([[0], ends[:-1]])
  owner = tf.searchsorted(tf.constant(ends), ids, side='right')
  split_ids = tf.dynamic_partition(ids, owner, len(parts))
  split = [[None] * len(parts) if value is None else
           tf.dynamic_partition(value, owner, len(parts)) for value in per_id]
  return [(part, split_ids[i] - starts[i]) + tuple(value[i] for value in split)
          for i, part in enumerate(parts)]


def _one_id_per_example(examples, batch):
  """Whether `examples` (int64, an example per id) is 0, 1, ..., batch - 1."""
  count = tf.size(examples, out_type=tf.int64)
  return tf.logical_and(
      tf.equal(count, batch),
      tf.reduce_all(tf.equal(examples, tf.range(count, dtype=tf.int64))))


def _pool(values, examples, batch, combiner, weights=None, with_norm=False):
  """Per example, its `values` (one row per id) combined; with `with_norm`,
  `(combined, norm)`: the mean's or sqrtn's divisor (None for sum)."""
  segments = tf.cast(batch, tf.int32)
  if weights is not None:
    values = values * weights[:, tf.newaxis]
  total = tf.math.unsorted_segment_sum(values, examples, segments)
  if combiner == 'sum':
    norm = None
  elif weights is None:  # mean and sqrtn of unit weights: the id count
    norm = tf.math.unsorted_segment_sum(
        tf.ones_like(examples, dtype=tf.float32), examples, segments)
    if combiner == 'sqrtn':
      norm = tf.sqrt(norm)
  elif combiner == 'mean':
    norm = tf.math.unsorted_segment_sum(weights, examples, segments)
  else:
    norm = tf.sqrt(tf.math.unsorted_segment_sum(weights * weights, examples,
                                                segments))
  if norm is not None:
    total = tf.math.divide_no_nan(total, norm[:, tf.newaxis])
  return (total, norm) if with_norm else total


class _Lookup(collections.namedtuple(
    '_Lookup', ['feature', 'rows', 'values', 'weights', 'positions',
                'examples', 'batch', 'lengths', 'multivalent'])):
  """One feature's ids, mapped onto its table's de-duplicated rows.

  `rows` indexes the table's unique ids, `values` are the table's rows of the
  ids (one per id), `positions` is `[n, 2]` (example, slot or sequence
  position), `examples` its first column; `lengths` are the sequence lengths
  of a sequence feature (else None); `multivalent`: ids may share a sequence
  position.
  """


class _Update(collections.namedtuple(
    '_Update', ['ids', 'gradients', 'learning_rate', 'turns'])):
  """One table's step: row gradients per id (or per id and core, with `turns`,
  see `sparse_update.apply_in_core_order`) and the resolved learning rate."""


class LookupStep:
  """What one step looked up, which its update needs.

  `activations` returns it and `apply_gradients` takes it: the engine keeps
  no state of a step.  `num_shards` cores; `read_step` is the global step
  read before the lookup (None: no learning_rate_fn or gradient multiplier
  reads it); per table its ids, unique ids, rows per id and per-feature
  `_Lookup`s and, with `read_step`, its learning rate; per feature its
  pooling norm and (unweighted pooled features) whether the step gave it one
  id per example, which skips the pooling both ways.
  """

  def __init__(self, num_shards, read_step):
    self.num_shards = num_shards
    self.read_step = read_step
    self.learning_rates = {}
    self.all_ids, self.unique_ids, self.gathered, self.lookups = {}, {}, {}, {}
    self.norms, self.one_id_each = {}, {}
    self.batch = None

  def statistics(self):
    """Per table, this step's looked-up ids: {'ids', 'examples'} (for
    `profile_data_directory`)."""
    return {name: {'ids': ids, 'examples': self.batch}
            for name, ids in self.all_ids.items()}


class HostEmbeddingEngine:
  """The TPU embedding core of one graph, emulated on the host.

  Per step: `activations(enqueued, num_shards)`, then in training
  `apply_gradients(step, activation_gradients)`, given the `LookupStep` the
  lookup returned.

  The variables are its owner's: `tables` {table name: variable},
  `slots` {table name: {slot name: variable}} and `read_handles` {table
  name: resource handle}, read when the engine builds a lookup or an update
  (so an owner may create a table after the lookup was built: the
  estimator's, named after the model_fn, is gathered through its handle).
  """

  def __init__(self, layout: EmbeddingLayout,
               optimization_parameters: _OptimizationParameters | None,
               tables: dict[str, tf.Variable],
               slots: dict[str, dict[str, tf.Variable]],
               read_handles: dict[str, tf.Tensor] | None = None,
               gradient_multiplier_fn: Callable[[Any], Any] | None = None):
    self.layout = layout
    self.optimization_parameters = optimization_parameters
    self.gradient_multiplier_fn = gradient_multiplier_fn
    self._tables = tables
    self._slots = slots
    self._read_handles = {} if read_handles is None else read_handles
    self._queues = {}

  def table_parameters(self, table):
    """A table's optimizer: its own, else the default one."""
    return table.optimizer or self.optimization_parameters

  # Lookups -------------------------------------------------------------------

  def activations(self, enqueued: inputs_lib.Enqueued, num_shards: int = 1,
                  read_step: tf.Tensor | None = None
                  ) -> tuple[LookupStep, dict[str, tf.Tensor]]:
    """The step's `LookupStep`, and feature name -> activation (whole batch)
    of every feature of `enqueued` (an `inputs.Enqueued`): `[batch, dim]`,
    or for a sequence feature `[batch, max_sequence_length, dim]` and its
    lengths under `<name>_seq_length_`.

    Its ids are de-duplicated and gathered here, and `apply_gradients(step)`
    updates them.  `read_step` (a tensor, or None) is what `learning_rate_fn`
    and the gradient multiplier read, and the lookup runs after it is read;
    the tables' learning rates are built from it here, with the lookup (the
    update is built under the model's train op, in a synchronous cluster on
    the chief's side).  Without it they are built with the update (the
    mid-level API reads a callable rate at `apply_gradients`, as TF does).
    """
    step = LookupStep(num_shards, read_step)
    combined = {}
    for table in self.layout.tables:
      if read_step is not None:
        step.learning_rates[table.name] = self._learning_rate(table,
                                                              read_step)
      features = [enqueued.inputs[feature.name]
                  for feature in self.layout.features_of(table.name)]
      for lookup in self._table_lookups(table, features, enqueued.ids_checked,
                                        step):
        combined.update(self._combine(table, lookup, step))
    return step, combined

  def _table_lookups(self, table, features, ids_checked, step):
    """One gather of the rows of all ids of `table`'s features (their
    `inputs.FeatureInput`s), and one de-duplication of those ids (for the
    update)."""
    all_ids = tf.concat([tf.cast(feature.ids.values, tf.int64)
                         for feature in features], axis=0)
    step.all_ids[table.name] = all_ids
    step.batch = features[0].ids.dense_shape[0]
    unique_ids, rows = tf.unique(all_ids, out_idx=tf.int64)
    with tf.control_dependencies([ids_checked] + (
        [] if step.read_step is None else [step.read_step])):
      if table.name in self._read_handles:
        gathered = tf.raw_ops.ResourceGather(
            resource=self._read_handles[table.name], indices=all_ids,
            dtype=tf.float32)
      else:
        gathered = _gather(self._tables[table.name], all_ids)
    step.unique_ids[table.name] = unique_ids
    step.gathered[table.name] = gathered
    if table.quantization is not None:
      gathered = _quantized(gathered, *table.quantization)
    if len(features) == 1:
      feature_rows, feature_values = [rows], [gathered]
    else:
      sizes = [tf.size(feature.ids.values, out_type=tf.int64)
               for feature in features]
      feature_rows = tf.split(rows, sizes)
      feature_values = tf.split(gathered, sizes)
    lookups = [_Lookup(feature=feature.feature, rows=r, values=v,
                       weights=feature.weights,
                       positions=(feature.ids.indices if feature.ids.shape.rank
                                  == 2 else feature.ids.indices[:, :2]),
                       examples=feature.ids.indices[:, 0],
                       batch=feature.ids.dense_shape[0],
                       lengths=feature.lengths,
                       multivalent=feature.ids.shape.rank != 2)
               for feature, r, v in zip(features, feature_rows, feature_values)]
    step.lookups[table.name] = lookups
    return lookups

  def _combine(self, table, lookup, step):
    """The activation of one feature: combined rows, or a padded sequence.

    A pooled feature's norm (mean, sqrtn) is kept for its gradient.
    """
    feature = lookup.feature
    examples = lookup.examples
    dimension = table.dimension
    values = lookup.values
    if feature.is_sequence:
      length = feature.max_sequence_length
      shape = tf.stack([lookup.batch, tf.constant(length, tf.int64)])
      activation = tf.scatter_nd(
          lookup.positions, values,
          tf.concat([shape, tf.constant([dimension], tf.int64)], axis=0))
      norm = None
      if table.combiner in ('mean', 'sqrtn') and lookup.multivalent:
        # Several ids at one position: combined there, as the TPU enqueues them.
        norm = tf.scatter_nd(lookup.positions,
                             tf.ones_like(lookup.rows, tf.float32), shape)
        if table.combiner == 'sqrtn':
          norm = tf.sqrt(norm)
        activation = tf.math.divide_no_nan(activation, norm[:, :, tf.newaxis])
      step.norms[feature.name] = norm
      activation.set_shape([None, length, dimension])
      return {feature.name: activation,
              feature.name + inputs_lib.SEQUENCE_LENGTH_SUFFIX: lookup.lengths}
    weights = lookup.weights
    combiner = table.combiner or 'sum'
    # (XLA gives a tf.cond of branches of other shapes one of unknown size)
    if weights is None and not internals.compiling_with_xla():
      # One id per example, in example order: each example's row is its
      # activation (a sum of one row, a norm of 1), to the bit.
      one_id_each = _one_id_per_example(examples, lookup.batch)
      step.one_id_each[feature.name] = one_id_each
      if combiner == 'sum':
        total = tf.cond(one_id_each, lambda: values,
                        lambda: _pool(values, examples, lookup.batch, combiner))
        norm = None
      else:
        total, norm = tf.cond(
            one_id_each,
            lambda: (values, tf.ones([tf.size(examples)])),
            lambda: _pool(values, examples, lookup.batch, combiner,
                          with_norm=True))
    else:
      total, norm = _pool(values, examples, lookup.batch, combiner,
                          weights=weights, with_norm=True)
    step.norms[feature.name] = norm
    total.set_shape([None, dimension])
    return {feature.name: total}

  # Gradients -----------------------------------------------------------------

  def apply_gradients(self, step, activation_gradients, pipelined=False,
                      aggregate_rows=None):
    """The embedding optimizer step for every table of `step` (a `LookupStep`)
    from `activation_gradients` ({feature name: d(loss)/d(activation)}, whole
    batch, in the activation's shape).

    `aggregate_rows(variable, rows, apply)` (synchronous replicas) returns the
    op that puts a table part's row gradients (`IndexedSlices`) in with the
    other replicas' and has `apply(their aggregate)` run when all are in; by
    default each step applies its own.

    With `pipelined` (the spec's `pipeline_execution_with_tensor_core`), each
    table's update is parked and applied right after the *next* step's lookup,
    so, as on a TPU whose lookups for step N+1 run while step N's model does,
    step N+1 misses step N's update.  `flush_op()` applies a parked update.
    """
    updates = []
    for table in self.layout.tables:
      # After this step's gather, also where no gradient depends on it (a
      # feature the loss ignores): the update must not change what was looked up.
      cores = self._cores_applied_in_turn(table, step.num_shards)
      with tf.control_dependencies([step.gathered[table.name]]):
        ids, row_gradients, turns = self._summed_gradients(
            table, step, activation_gradients, cores)
      if self.gradient_multiplier_fn is not None:
        row_gradients *= tf.cast(self.gradient_multiplier_fn(step.read_step),
                                 tf.float32)
      learning_rate = step.learning_rates.get(table.name)
      if learning_rate is None:
        learning_rate = self._learning_rate(table, step.read_step)
      update = _Update(ids, row_gradients, learning_rate, turns)
      if pipelined:
        updates.append(self._park(table, update, step, cores))
      else:
        updates.append(self._apply(table, update, cores, aggregate_rows))
    return tf.group(*updates, name='tpu_embedding_update')

  def _cores_applied_in_turn(self, table, num_shards):
    """How many cores' gradients a step of `table` applies one after another:
    1 with gradient accumulation (one update of the whole batch's sums, as TF's
    mid-level correctness tests pin it), else `num_shards` (the per-core order
    of TF 2.15's `tpu_estimator_gradients_test.py`, which turns it off)."""
    if reference.accumulates(self.table_parameters(table)):
      return 1
    return num_shards

  def _summed_gradients(self, table, step, activation_gradients, cores):
    """`(ids, gradients, turns)` of the table's update: per id, or per (id, core).

    With `cores` > 1 (`_cores_applied_in_turn`) each id gets one entry per core
    that saw it, its gradients summed within the core, and `turns` places the
    entries in the TPU's order of application
    (`tpu_fc.reference.apply_update_by_core`): the holding core `id mod cores`
    first, then the ring (see `sparse_update.apply_in_core_order`).  With one
    core `turns` is None.
    """
    lookups = step.lookups[table.name]
    gradients = tf.concat(
        [self._id_gradients(lookup, step, activation_gradients[
            lookup.feature.name]) for lookup in lookups], axis=0)
    rows = tf.concat([lookup.rows for lookup in lookups], axis=0)
    unique_ids = step.unique_ids[table.name]
    if cores == 1:
      return unique_ids, tf.math.unsorted_segment_sum(
          gradients, rows, tf.size(unique_ids)), None
    # Example e of a batch of b lies on core floor(e·cores / b): b // cores
    # examples per core, and no division by zero for an empty batch.
    core = tf.concat([lookup.examples * cores // lookup.batch
                      for lookup in lookups], axis=0)
    pairs, pair_of = tf.unique(rows * cores + core, out_idx=tf.int64)
    pair_gradients = tf.math.unsorted_segment_sum(gradients, pair_of,
                                                  tf.size(pairs))
    pair_rows = pairs // cores
    pair_ids = tf.gather(unique_ids, pair_rows)
    ring = tf.cast(tf.math.floormod(pairs % cores - pair_ids % cores, cores),
                   tf.int32)
    first = tf.gather(tf.math.unsorted_segment_min(ring, pair_rows,
                                                   tf.size(unique_ids)),
                      pair_rows)
    return (pair_ids, pair_gradients,
            tf.where(tf.equal(ring, first), tf.zeros_like(ring), ring))

  @staticmethod
  def _id_gradients(lookup, step, dy):
    """d(loss)/d(row) for each id of one feature, from `dy` = d(loss)/d(its
    activation): the chain rule of `_combine`."""
    feature = lookup.feature
    if feature.is_sequence:
      gradients = tf.gather_nd(dy, lookup.positions)
      norm = step.norms[feature.name]
      if norm is not None:
        gradients = tf.math.divide_no_nan(
            gradients, tf.gather_nd(norm, lookup.positions)[:, tf.newaxis])
      return gradients
    examples = lookup.examples
    norm = step.norms[feature.name]

    def through_pooling():
      gradients = tf.gather(dy, examples)
      scale = lookup.weights
      if norm is not None:
        per_id = tf.gather(norm, examples)
        scale = tf.math.divide_no_nan(
            tf.ones_like(per_id) if scale is None else scale, per_id)
      if scale is not None:
        gradients *= scale[:, tf.newaxis]
      return gradients

    one_id_each = step.one_id_each.get(feature.name)
    if one_id_each is None:
      return through_pooling()

    def scaled_per_example():
      """Unweighted: an id's scale is its example's, so dy is scaled per
      example and then gathered per id (the same products, on batch rows)."""
      if norm is None:  # sum: nothing to scale
        return through_pooling()
      per_example = tf.math.divide_no_nan(tf.ones_like(norm), norm)
      return tf.gather(dy * per_example[:, tf.newaxis], examples)

    # dy has the configured batch's rows: an input of another batch takes the
    # general path, which fails on the batch check, not on a shape.
    rows_match = tf.equal(tf.shape(dy, out_type=tf.int64)[0], lookup.batch)
    return tf.cond(rows_match,
                   lambda: tf.cond(one_id_each, lambda: dy, scaled_per_example),
                   through_pooling)

  def _apply(self, table, update, cores, aggregate_rows=None):
    """The table's update, part by part on each part's device (one part
    unsplit); see `apply_gradients` for `aggregate_rows`."""
    parameters = self.table_parameters(table)
    parts = sparse_update.table_parts(self._tables[table.name])
    slot_parts = {name: sparse_update.table_parts(slot)
                  for name, slot in self._slots[table.name].items()}

    def apply(part, index, ids, gradients, turns):
      slots = {name: slot[index] for name, slot in slot_parts.items()}
      if aggregate_rows is None:
        return sparse_update.apply_in_core_order(
            parameters, part, slots, ids, gradients, update.learning_rate,
            turns, cores)
      # The replicas' aggregate sums an id's entries: one application.
      return aggregate_rows(
          part, tf.IndexedSlices(gradients, ids),
          lambda rows: sparse_update.apply_in_core_order(
              parameters, part, slots, rows.indices, rows.values,
              update.learning_rate, None, cores))

    if len(parts) == 1:
      return apply(parts[0], 0, update.ids, update.gradients, update.turns)
    applied = []
    for index, (part, ids, gradients, turns) in enumerate(
        _split_div(parts, update.ids, update.gradients, update.turns)):
      with tf.device(part.device):
        applied.append(apply(part, index, ids, gradients, turns))
    return tf.group(*applied)

  def _pending(self, table, cores):
    """The queue holding a table's parked update (pipelined execution), and
    the cores its per-core turns are for."""
    if table.name not in self._queues:
      with tf.init_scope():  # one queue for all steps, also in a training loop
        dtypes = [tf.int64, tf.float32, tf.float32]
        if cores > 1:
          dtypes.append(tf.int32)
        self._queues[table.name] = (tf.queue.FIFOQueue(
            1, dtypes, name='tpu_embedding_pending_update_' + table.name),
                                    cores)
    return self._queues[table.name]

  def _apply_parked(self, table):
    """Applies the parked update of `table`, if there is one."""
    queue, cores = self._queues[table.name]

    def apply():
      parked = queue.dequeue()
      parked[1].set_shape([None, table.dimension])
      update = _Update(*parked, *[None] * (len(_Update._fields) - len(parked)))
      with tf.control_dependencies([self._apply(table, update, cores)]):
        return tf.constant(True)

    return tf.cond(queue.size() > 0, apply, lambda: tf.constant(False))

  def _park(self, table, update, step, cores):
    if internals.compiling_with_xla():
      raise NotImplementedError(
          'pipeline_execution_with_tensor_core parks each update in a queue '
          'until the next step, which XLA cannot compile: train this '
          'embedding without jit_compile, or without pipelining.')
    queue, _ = self._pending(table, cores)
    with tf.control_dependencies([step.gathered[table.name]]):
      applied = self._apply_parked(table)  # after this step's lookup
    with tf.control_dependencies([applied]):
      return queue.enqueue([value for value in update if value is not None])

  def flush_op(self):
    """Applies every parked update (end of pipelined training)."""
    return tf.group(*[self._apply_parked(table) for table in self.layout.tables
                      if table.name in self._queues])

  def _learning_rate(self, table, read_step):
    """Legacy precedence: table rate if truthy, else learning_rate_fn, else
    optimizer."""
    if table.learning_rate:
      rate = table.learning_rate
    elif table.learning_rate_fn is not None:
      rate = table.learning_rate_fn(read_step)
    else:
      rate = self.table_parameters(table).learning_rate
      if callable(rate):
        rate = rate()
    return tf.cast(rate, tf.float32)
