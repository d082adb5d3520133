"""`tpu_embedding_core` without a TPU: the host engine that emulates the TPU embedding core.

As on a TPU, the tables belong to the engine, not to the model: the model_fn sees only
activations in `features[key]` (`[B, dim]`, or `[B, max_sequence_length, dim]` plus
`features[key + '_seq_length_']`); the gradient of the loss with respect to each
activation is captured while the model's own optimizer builds its gradients, and the
engine applies it to the looked-up rows with the spec's optimizer and the TPU update
rules (`tpu_fc.reference`, implemented with TF's sparse kernels in `sparse_update`).

Per table and step the engine gathers the rows of all its features' ids in one gather,
de-duplicates those ids once, sums their gradients per unique id and applies them as the
TPU does (`tpu_fc.reference.apply_update_by_core`): with gradient accumulation (the
default) one sparse update of the whole batch's sums, without it one per core turn in the
TPU's per-core order; no step reads a whole table.

A table created partitioned (in a parameter-server cluster the driver creates
every table in row-wise `div` parts, one per ps task) is gathered with
`embedding_lookup` and updated part by part on the device holding the part.
"""
import collections

import numpy as np

from tpu_fc import _tf_internals as internals
from tpu_fc import naming
from tpu_fc import reference
from tpu_fc._tf import tf
from tpu_fc.lookup import sparse_update

SEQUENCE_LENGTH_SUFFIX = '_seq_length_'
DUMMY_VARIABLE_COLLECTION = 'tpu_embedding_dummy_table_variables'
STRING_IDS_ERROR = (
    'SparseTensor with string as values are not supported. If you are using '
    'categorical_column_with_vocabulary_file or '
    'categorical_column_with_vocabulary_list, please call '
    'your_column.categorical_column._transform_feature({{your_column.key: '
    'features[your_column.key]}}) in your input_fn() to convert string to int. '
    'feature_key = {}.')
# The op of every input check (`input_check`): the driver shows its message alone.
INPUT_CHECK_NAME = 'tpu_fc_input_check'


# TF's text; TF's enqueue pops each weight feature, so a second column reading
# the same weights finds them gone: weight-sharing gets the same error.
MISSING_WEIGHTS_ERROR = (
    'Cannot find weights {} for weighted_categorical_column. Please check if '
    'the weights are present in feature dict. Also note weight-sharing among '
    'weighted_categorical_column is not supported on TPU.')


def as_sparse(name, value, keep_zero_ids, multivalent=False):
  """Ids of one feature as a rank-2 SparseTensor, TPU-style.

  Dense ids are enqueued through `tf.where(x)` (id 0 dropped), except for tables
  with `combiner=None`, whose dense ids go one per example, 0 included; their
  negative entries are padding, never entries (a dense sequence's length ends at
  its last id).  With `multivalent` (sequence features), rank 3 is accepted too:
  `[batch, position, ids]`, several ids at one position.
  """
  if isinstance(value, tf.RaggedTensor):
    value = value.to_sparse()
  elif not isinstance(value, tf.SparseTensor):
    value = tf.convert_to_tensor(value)
    if value.shape.rank == 1:
      value = value[:, tf.newaxis]
    if keep_zero_ids:
      value = tf.RaggedTensor.from_tensor(value).to_sparse()
    else:
      value = tf.sparse.from_dense(
          tf.maximum(value, 0) if value.dtype.is_integer else value)
  ranks = (2, 3) if multivalent else (2,)
  if value.shape.rank is not None and value.shape.rank not in ranks:
    raise ValueError(
        'Feature {} must have rank {} for the TPU embedding, got rank {}.'
        .format(name, ' or '.join(
            {2: '2 ([batch, ids])', 3: '3 ([batch, position, ids])'}[rank]
            for rank in ranks), value.shape.rank))
  return value


def sequence_lengths(ids, max_sequence_length):
  """Per example of sparse `ids`, 1 + its last id position, capped (TPUEstimator's)."""
  lengths = tf.math.unsorted_segment_max(
      ids.indices[:, 1] + 1, ids.indices[:, 0],
      tf.cast(ids.dense_shape[0], tf.int32))
  return tf.clip_by_value(lengths, 0, max_sequence_length)


def input_check(ok, message_fn):
  """An op failing the step unless `ok`, with the string tensor `message_fn()`.

  The message is built only when the check fails; the op's name
  (`INPUT_CHECK_NAME`) lets the driver show it alone, without TF's listing.
  """
  return tf.cond(ok, tf.no_op, lambda: tf.raw_ops.Assert(
      condition=ok, data=[message_fn()], name=INPUT_CHECK_NAME))


def check_ids(feature_name, table_name, ids, vocabulary_size):
  """`ids` as int64, failing the step (naming feature and ids) if out of range."""
  ids = tf.cast(ids, tf.int64)
  too_big = ids >= vocabulary_size
  check = input_check(
      tf.logical_not(tf.reduce_any(too_big)),
      lambda: tf.strings.format(
          'Feature {} (table {}): ids {{}} are out of range [0, {}); use a '
          'vocabulary size above the largest id, or hash or clip the ids in '
          'input_fn.'.format(feature_name, table_name, vocabulary_size),
          tf.sort(tf.unique(tf.boolean_mask(ids, too_big))[0]), summarize=8))
  with tf.control_dependencies([check]):
    return tf.identity(ids)


def cut_as_enqueued(features, layout, tensor_core_widths):
  """`features` cut as the TPU enqueues them, ragged ones made sparse.

  Each sequence feature (and its weights) at its max_sequence_length, each
  tensor-core feature at its `tensor_core_shape[1]` ids (`tensor_core_widths`:
  feature name -> width).  For the CPU lookups of predict and serving of a TPU
  model: they then compute what the TPU does (sparse ids padded to `[batch,
  max_sequence_length, ...]`, lengths capped; a tensor-core example's first ids),
  in memory bounded by the batch and those lengths whatever a request holds;
  the feature columns of that lookup take no RaggedTensor.
  """
  if not isinstance(features, dict):
    return features
  lengths = dict(tensor_core_widths)  # key -> its length, or None: not cut
  for feature in layout.features:
    for key in (feature.name, feature.weight_key):
      if key:
        lengths[key] = feature.max_sequence_length or None
  result = dict(features)
  for key, length in lengths.items():
    value = result.get(key)
    if isinstance(value, tf.RaggedTensor):
      value = result[key] = value.to_sparse()
    if value is not None and length is not None:
      result[key] = _cut(value, length)
  return result


def _cut(value, length):
  """`value`'s positions (axis 1) past `length` dropped; sparse ones padded."""
  if isinstance(value, tf.SparseTensor):
    shape = tf.concat([value.dense_shape[:1], [length], value.dense_shape[2:]],
                      axis=0)
    return tf.sparse.reset_shape(
        tf.sparse.slice(value, tf.zeros_like(value.dense_shape), shape), shape)
  value = tf.convert_to_tensor(value)
  return value[:, :length] if value.shape.rank != 1 else value


def _static_batch(features, embedding_features):
  """(feature, batch size) the input gives an embedding feature statically, or
  (None, None).

  As on a TPU, whose infeed gives every tensor a static shape, activations then
  have a static batch dimension (model code such as `tf.zeros(logits.shape)`
  relies on it).
  """
  for feature in embedding_features:
    value = features.get(feature.name)
    if value is not None and value.shape.rank:
      batch = tf.compat.dimension_value(value.shape[0])
      if batch is not None:
        return feature.name, batch
  return None, None


def _check_weights(feature, ids, weights):
  """`weights`, failing (naming the feature) unless one finite weight per id."""
  # A column's weight feature (from input_fn), or the weights given to a
  # mid-level enqueue.
  source, fix_in = (('weights ' + feature.weight_key, 'input_fn')
                    if feature.weight_key else
                    ('the weights given to enqueue', 'the input'))
  mismatch = ('Feature {}: {} must hold one weight per id, at the same '
              'indices; got {{}} weights for {{}} ids.'.format(
                  feature.name, source))
  count, expected = weights.shape[0], ids.values.shape[0]
  if count is not None and expected is not None and count != expected:
    raise ValueError(mismatch.format(count, expected))
  count, expected = tf.shape(weights)[0], tf.shape(ids.values)[0]
  finite = tf.math.is_finite(weights)
  checks = [
      input_check(tf.equal(count, expected),
                  lambda: tf.strings.format(mismatch, (count, expected))),
      input_check(tf.reduce_all(finite), lambda: tf.strings.format(
          'Feature {}: {} must be finite; got {{}}. Drop or replace them in '
          '{}.'.format(feature.name, source, fix_in),
          tf.boolean_mask(weights, tf.logical_not(finite)), summarize=8)),
  ]
  with tf.control_dependencies(checks):
    return tf.identity(weights)


def _ids_in_range(layout, parsed):
  """One check of every id of the step; only on failure the per-feature checks
  run, naming the feature and its ids (`check_ids`)."""
  too_big = [tf.reduce_any(p.ids.values >= table.vocabulary_size)
             for table in layout.tables for p in parsed[table.name]]
  if not too_big:
    return tf.no_op()

  def report():
    checks = [check_ids(p.feature.name, table.name, p.ids.values,
                        table.vocabulary_size)
              for table in layout.tables for p in parsed[table.name]]
    with tf.control_dependencies(checks):
      return tf.constant(False)

  return tf.cond(tf.reduce_any(tf.stack(too_big)), report,
                 lambda: tf.constant(True))


def check_batch_divides(name, batch, num_shards):
  """An input check, naming `name` ('Feature ids', 'Labels'), that a batch of
  `batch` examples splits into the shards (as a TPU requires)."""
  return input_check(
      tf.equal(tf.math.floormod(batch, num_shards), 0),
      lambda: tf.strings.format(
          '{}: batch size {{}} does not divide into num_shards={} TPU shards; '
          'make every batch of input_fn a multiple of {} examples, e.g. with '
          'Dataset.batch(batch_size, drop_remainder=True).'.format(
              name, num_shards, num_shards), batch))


BATCH_SIZE_MISMATCH = (
    'input_fn gave the embedding features a batch of {} examples, but the '
    'configured batch size (train_batch_size / eval_batch_size) is {}; as on a '
    'TPU, whose embedding config fixes the batch, batch the input by '
    "params['batch_size'].")


def check_static_batch(name, batch, batch_size):
  """Raises unless feature `name`'s static `batch` (None: unknown) is the
  configured `batch_size` (None: any)."""
  if batch_size is not None and batch not in (None, batch_size):
    raise ValueError('Feature {}: {}'.format(
        name, BATCH_SIZE_MISMATCH.format(batch, batch_size)))


def check_batch_size(name, rows, batch_size):
  """An input check that feature `name` has `batch_size` rows (`rows`, known
  only at run time)."""
  return input_check(
      tf.equal(rows, batch_size),
      lambda: tf.strings.format('Feature {}: {}'.format(
          name, BATCH_SIZE_MISMATCH.format('{}', batch_size)), rows))


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


def _retain(ids, weights, keep):
  """`ids` (SparseTensor) and their `weights` (or None) where `keep`; copied
  only when an entry goes (the common input drops none)."""
  def dropped():
    kept = tf.sparse.retain(ids, keep)
    return kept if weights is None else (kept,
                                         tf.boolean_mask(weights, keep))

  def as_given():
    return ids if weights is None else (ids, weights)

  result = tf.cond(tf.reduce_all(keep), as_given, dropped)
  return (result, None) if weights is None else result


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

  `lookup` / `activations` return it and `apply_gradients` takes it: the
  engine keeps no state of a step.  `num_shards` cores; `read_step` is the
  global step read before the lookup (None: no learning_rate_fn or gradient
  multiplier reads it); per table its ids, unique ids, rows per id and
  per-feature `_Lookup`s; per feature its pooling norm, (unweighted pooled
  features) whether the step gave it one id per example, which skips the
  pooling both ways, and (legacy lookup) its per-shard activations;
  `captured`: the activation gradients the ties record while the model is
  differentiated.
  """

  def __init__(self, num_shards, read_step):
    self.num_shards = num_shards
    self.read_step = read_step
    self.all_ids, self.unique_ids, self.gathered, self.lookups = {}, {}, {}, {}
    self.norms, self.shards, self.captured = {}, {}, {}
    self.one_id_each = {}
    self.batch = None

  def statistics(self):
    """Per table, this step's looked-up ids: {'ids', 'unique_ids', 'examples'}
    (for `profile_data_directory`)."""
    return {name: {'ids': ids, 'unique_ids': self.unique_ids[name],
                   'examples': self.batch}
            for name, ids in self.all_ids.items()}


class _Parsed(collections.namedtuple(
    '_Parsed', ['feature', 'ids', 'weights', 'lengths'])):
  """One feature's validated ids, weights and (sequence) lengths."""


class HostEmbeddingEngine:
  """The TPU embedding core, emulated on the host in a TF1 graph.

  Lifecycle per graph: `create_variables(training)`; per step `lookup(features,
  num_shards)` before the model_fn calls, `apply_gradients(step)` after them
  (training), given the `LookupStep` the lookup returned.
  """

  def __init__(self, layout, optimization_parameters,
               gradient_multiplier_fn=None, named_by_columns=False):
    self.layout = layout
    self.optimization_parameters = optimization_parameters
    self.gradient_multiplier_fn = gradient_multiplier_fn
    self._named_by_columns = named_by_columns
    self.tables = {}
    self.slots = {}
    self._handles = {}
    self._dummies = {}
    self._queues = {}

  # Variables -----------------------------------------------------------------

  def table_parameters(self, table):
    return table.optimizer or self.optimization_parameters

  def create_variables(self, training):
    """Tables (and, for training, optimizer slots and dummy variables).

    With `named_by_columns`, the tables and slots are created by
    `name_variables` once the model_fn has run, under the graph names TF's TPU
    mode gave them (`<column scope>/embedding_weights/part_0`, slots
    `.../embedding_weights/Adagrad/part_0`), which only the columns know; until
    then lookups read them through a handle bound to them there.
    """
    self._training = training
    for table in self.layout.tables:
      if self._named_by_columns:
        with tf.init_scope():  # outside any training loop, as the variables
          self._handles[table.name] = tf.raw_ops.VarHandleOp(
              dtype=tf.float32, shape=[table.vocabulary_size, table.dimension],
              shared_name='tpu_fc_unnamed_' + table.name,
              name='tpu_embedding_handle_' + table.name)
      else:
        self._create_table(table, naming.engine_table(table.name))
      if training:
        self._dummies[table.name] = tf.compat.v1.get_variable(
            naming.DUMMY_VARIABLE_PREFIX + table.name, shape=[1],
            dtype=tf.float32,
            initializer=tf.compat.v1.zeros_initializer(), use_resource=True,
            collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES,
                         tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES,
                         DUMMY_VARIABLE_COLLECTION])

  def _create_table(self, table, name, slot_names=None):
    """The table variable `name` and, in training, its slots.

    Slots are `name/<mid-level slot name>` unless `slot_names` names them.
    """
    self.tables[table.name] = tf.compat.v1.get_variable(
        name, shape=[table.vocabulary_size, table.dimension],
        dtype=tf.float32, initializer=table.initializer, trainable=False,
        use_resource=True)
    if self._training:
      self.slots[table.name] = sparse_update.create_slot_variables(
          self.table_parameters(table), self.tables[table.name], name,
          slot_names)

  def use_variables(self, tables, slots):
    """Trains the given variables: {table name: table}, {table name: {slot
    name: slot}} (a backend that creates its own, as the mid-level API)."""
    self.tables, self.slots = dict(tables), dict(slots)

  def name_variables(self, graph):
    """Creates the tables and slots of `named_by_columns` (see `create_variables`)."""
    if not self._handles:
      return
    names = naming.recorded_table_names(self.layout, graph)
    with tf.init_scope():
      for table in self.layout.tables:
        full_name = names[table.name]
        slot_names = {slot: '{}/{}'.format(full_name, suffix)
                      for suffix, slot in self.table_parameters(table).SLOTS}
        self._create_table(table, full_name + '/part_0',
                           {slot: name + '/part_0'
                            for slot, name in slot_names.items()})
        internals.mark_as_only_part(self.tables[table.name], full_name)
        for slot, variable in self.slots.get(table.name, {}).items():
          internals.mark_as_only_part(variable, slot_names[slot])
        sparse_update.bind_variable_handle(self._handles[table.name],
                                           self.tables[table.name])

  def checkpoint_variables(self, graph):
    """Legacy checkpoint name -> variable for every table and slot."""
    names = {}
    for table, full_name in naming.recorded_table_names(
        self.layout, graph).items():
      names[full_name] = self.tables[table]
      for suffix, slot in self.table_parameters(
          self.layout.table(table)).SLOTS:
        if table in self.slots:
          names['{}/{}'.format(full_name, suffix)] = self.slots[table][slot]
    return names

  # Lookups -------------------------------------------------------------------

  def lookup(self, features, num_shards=1, batch_size=None):
    """Activations of every embedding-core feature, split into `num_shards` slices.

    Returns the step's `LookupStep` and one dict per shard: feature name ->
    activation, plus
    `<name>_seq_length_` for sequence features; each activation is tied to its
    table's dummy variable when training (see `_tie`).  Raises on a missing
    feature or weight, naming it.  The batch dimension is static: `batch_size`
    (the configured global batch, as a TPU's embedding config fixes it), else
    the input's, when known.
    """
    step, combined = self.activations(
        features, num_shards,
        read_step=tf.compat.v1.train.get_or_create_global_step().read_value())
    name, batch = _static_batch(features, self.layout.features)
    check_static_batch(name, batch, batch_size)
    batch = batch or batch_size
    shards = [dict() for _ in range(num_shards)]
    for name, value in combined.items():
      rows = tf.shape(value, out_type=tf.int64)[0]
      checks = []
      if batch_size is not None:  # (configured to divide into the shards)
        checks.append(check_batch_size(name, rows, batch_size))
      elif num_shards > 1:
        checks.append(check_batch_divides('Feature ' + name, rows, num_shards))
      with tf.control_dependencies(checks):
        value = tf.identity(value) if checks else value
      if batch is not None and batch % num_shards == 0:  # else checked above
        value.set_shape([batch] + value.shape[1:])
      pieces = tf.split(value, num_shards, axis=0) if num_shards > 1 else [value]
      for shard, piece in enumerate(pieces):
        shards[shard][name] = piece
    for feature in self.layout.features:
      step.shards[feature.name] = [shard[feature.name] for shard in shards]
      if self._dummies:
        for index, shard in enumerate(shards):
          shard[feature.name] = self._tie(
              self._dummies[feature.table], shard[feature.name],
              (feature.name, index), step)
    return step, shards

  def activations(self, features, num_shards=1, weights=None, read_step=None):
    """The step's `LookupStep`, and feature name -> activation (whole batch)
    of every embedding-core feature.

    Its ids are de-duplicated and gathered here, and `apply_gradients(step)`
    updates them.  `weights` maps feature names to weights given apart from
    the features (the mid-level `enqueue`'s); `read_step` (a tensor, or None)
    is what `learning_rate_fn` and the gradient multiplier read, and the
    lookup runs after it is read.
    """
    step = LookupStep(num_shards, read_step)
    weight_readers = collections.Counter(
        feature.weight_key for feature in self.layout.features
        if feature.weight_key)
    for weight_key, readers in weight_readers.items():
      if readers > 1:
        raise ValueError(MISSING_WEIGHTS_ERROR.format(weight_key))
    parsed = {table.name: [self._parse(table, feature, features, weights or {})
                           for feature in self.layout.features_of(table.name)]
              for table in self.layout.tables}
    ids_checked = _ids_in_range(self.layout, parsed)
    combined = {}
    for table in self.layout.tables:
      for lookup in self._table_lookups(table, parsed[table.name], ids_checked,
                                        step):
        combined.update(self._combine(table, lookup, step))
    return step, combined

  def _table_lookups(self, table, parsed, ids_checked, step):
    """One gather of the rows of all features' ids of `table`, and one
    de-duplication of those ids (for the update)."""
    all_ids = tf.concat([tf.cast(p.ids.values, tf.int64) for p in parsed],
                        axis=0)
    step.all_ids[table.name] = all_ids
    step.batch = parsed[0].ids.dense_shape[0]
    unique_ids, rows = tf.unique(all_ids, out_idx=tf.int64)
    with tf.control_dependencies([ids_checked] + (
        [] if step.read_step is None else [step.read_step])):
      if table.name in self._handles:
        gathered = tf.raw_ops.ResourceGather(
            resource=self._handles[table.name], indices=all_ids,
            dtype=tf.float32)
      else:
        gathered = _gather(self.tables[table.name], all_ids)
    step.unique_ids[table.name] = unique_ids
    step.gathered[table.name] = gathered
    if table.quantization is not None:
      gathered = _quantized(gathered, *table.quantization)
    if len(parsed) == 1:
      feature_rows, feature_values = [rows], [gathered]
    else:
      sizes = [tf.size(p.ids.values, out_type=tf.int64) for p in parsed]
      feature_rows = tf.split(rows, sizes)
      feature_values = tf.split(gathered, sizes)
    lookups = [_Lookup(feature=p.feature, rows=r, values=v, weights=p.weights,
                       positions=(p.ids.indices if p.ids.shape.rank == 2 else
                                  p.ids.indices[:, :2]),
                       examples=p.ids.indices[:, 0],
                       batch=p.ids.dense_shape[0],
                       lengths=p.lengths,
                       multivalent=p.ids.shape.rank != 2)
               for p, r, v in zip(parsed, feature_rows, feature_values)]
    step.lookups[table.name] = lookups
    return lookups

  def _parse(self, table, feature, features, weights):
    """A feature's ids as the TPU enqueues them, checked, with its weights.

    Negative ids are padding, as in TF's safe lookups: dropped.  A sequence
    feature's entries past `max_sequence_length` are dropped too (never
    looked up, never updated); its lengths come from the ids before that.
    """
    if feature.name not in features:
      raise KeyError('Feature {} (table {}) is missing from the features '
                     'given to the TPU embedding; got {}.'.format(
                         feature.name, table.name, sorted(features)))
    ids = as_sparse(feature.name, features[feature.name],
                    keep_zero_ids=table.combiner is None,
                    multivalent=feature.is_sequence)
    if not ids.dtype.is_integer:
      raise ValueError(STRING_IDS_ERROR.format(feature.name))
    weights = weights.get(feature.name)  # values, one per id
    if weights is None:
      weights = self._weights(table, feature, features)
    if weights is not None:
      weights = _check_weights(feature, ids, weights)
    keep = ids.values >= 0
    lengths = None
    if feature.is_sequence:
      lengths = sequence_lengths(ids, feature.max_sequence_length)
      keep = tf.logical_and(keep,
                            ids.indices[:, 1] < feature.max_sequence_length)
    ids, weights = _retain(ids, weights, keep)
    return _Parsed(feature, ids, weights, lengths)

  @staticmethod
  def _weights(table, feature, features):
    """A weighted feature's weights (values of a SparseTensor), else None."""
    if not feature.weight_key:
      return None
    if feature.weight_key not in features:
      raise ValueError(MISSING_WEIGHTS_ERROR.format(feature.weight_key))
    weights = features[feature.weight_key]
    if table.combiner is None:
      raise ValueError(
          'Found weights {} for weighted_categorical_column, which is not'
          'compatible with sparse feature {} enqueued as dense tensor.'.format(
              feature.weight_key, feature.name))
    if isinstance(weights, tf.RaggedTensor):
      weights = weights.to_sparse()
    if not isinstance(weights, tf.SparseTensor):
      raise ValueError(
          'weighted_categorical_column with weight key name {} has dense '
          'weights. Dense weights are not supported on TPU. Please use sparse '
          'weights instead.'.format(feature.weight_key))
    return tf.cast(weights.values, tf.float32)

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
              feature.name + SEQUENCE_LENGTH_SUFFIX: lookup.lengths}
    weights = lookup.weights
    combiner = table.combiner or 'sum'
    if weights is None:
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

  def _tie(self, dummy, activation, key, step):
    """Ties an activation to a (trainable) dummy variable to capture d(loss)/d(act).

    The model's optimizer differentiates with respect to the dummy variable, as
    on a TPU; the gradient function of the tie records the gradient of the
    activation for `apply_gradients` and gives the dummy a zero gradient.
    """
    gradients = step.captured

    @tf.custom_gradient
    def tie(dummy_value, value):
      def grad(dy):
        if key in gradients:
          raise RuntimeError(
              'Duplicate gradients (w.r.t. TPUEmbedding activations) generated '
              'for feature {} on shard {}: the loss was differentiated twice.'
              .format(*key))
        gradients[key] = dy
        # The model's step increment waits for this gradient, so the step this
        # lookup read (for learning_rate_fn) is the pre-increment one.
        with tf.control_dependencies([step.read_step]):
          return tf.zeros_like(dummy_value), None
      return tf.identity(value), grad

    return tie(dummy.read_value(), activation)

  def apply_gradients(self, step, pipelined=False, activation_gradients=None,
                      aggregate_rows=None):
    """The embedding optimizer step for every table of `step` (a `LookupStep`),
    from the gradients its ties captured.

    `activation_gradients` ({feature name: d(loss)/d(activation)}, whole
    batch) are given by the caller instead (the mid-level `apply_gradients`).
    `aggregate_rows(variable, rows, apply)` (synchronous replicas) returns the
    op that puts a table part's row gradients (`IndexedSlices`) in with the
    other replicas' and has `apply(their aggregate)` run when all are in; by
    default each step applies its own.

    With `pipelined` (the spec's `pipeline_execution_with_tensor_core`), each
    table's update is parked and applied right after the *next* step's lookup,
    so, as on a TPU whose lookups for step N+1 run while step N's model does,
    step N+1 misses step N's update.  `flush_op()` applies a parked update.
    """
    given = activation_gradients or {}
    updates = []
    for table in self.layout.tables:
      # After this step's gather, also where no gradient depends on it (a
      # feature the loss ignores): the update must not change what was looked up.
      cores = self._cores_applied_in_turn(table, step.num_shards)
      with tf.control_dependencies([step.gathered[table.name]]):
        ids, row_gradients, turns = self._summed_gradients(table, step, given,
                                                           cores)
      if self.gradient_multiplier_fn is not None:
        row_gradients *= tf.cast(self.gradient_multiplier_fn(step.read_step),
                                 tf.float32)
      update = _Update(ids, row_gradients,
                       self._learning_rate(table, step.read_step), turns)
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

  def _summed_gradients(self, table, step, given, cores):
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
        [self._id_gradients(table, lookup, step, given) for lookup in lookups],
        axis=0)
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

  def _id_gradients(self, table, lookup, step, given):
    """d(loss)/d(row) for each id of one feature: the chain rule of `_combine`."""
    feature = lookup.feature
    dy = given.get(feature.name)
    if dy is None:
      dy = self._captured_gradient(table, feature.name, step)
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
    parts = sparse_update.table_parts(self.tables[table.name])
    slot_parts = {name: sparse_update.table_parts(slot)
                  for name, slot in self.slots[table.name].items()}

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
    queue, _ = self._pending(table, cores)
    with tf.control_dependencies([step.gathered[table.name]]):
      applied = self._apply_parked(table)  # after this step's lookup
    with tf.control_dependencies([applied]):
      return queue.enqueue([value for value in update if value is not None])

  def flush_op(self):
    """Applies every parked update (end of pipelined training)."""
    return tf.group(*[self._apply_parked(table) for table in self.layout.tables
                      if table.name in self._queues])

  @staticmethod
  def _captured_gradient(table, name, step):
    """d(loss)/d(activation) of one feature over all shards, as the ties
    captured it (zeros where unused)."""
    per_shard = []
    for shard, piece in enumerate(step.shards[name]):
      dy = step.captured.get((name, shard))
      if dy is None:
        tf.compat.v1.logging.warning(
            'Table %s has undefined gradients for feature %s on shard %d: the '
            'loss does not depend on it.', table.name, name, shard)
        dy = tf.zeros_like(piece)
      per_shard.append(dy)
    return tf.concat(per_shard, axis=0)

  def _learning_rate(self, table, read_step):
    """Legacy precedence: table rate if truthy, else learning_rate_fn, else optimizer.

    Built free of the control dependencies around the update: it reads only the
    step, and the chief of synchronous training computes it in its own run.
    """
    with tf.control_dependencies(None):
      if table.learning_rate:
        rate = table.learning_rate
      elif table.learning_rate_fn is not None:
        rate = table.learning_rate_fn(read_step)
      else:
        rate = self.table_parameters(table).learning_rate
        if callable(rate):
          rate = rate()
      return tf.cast(rate, tf.float32)
