"""Features as the TPU embedding enqueues them, and every check of them.

The host engine (`host_engine`) looks up an `Enqueued`: per feature its
`FeatureInput` (sparse ids, their weights, a sequence feature's lengths) and
one check that every id is inside its table.  Two adapters make it, one per
enqueue semantics of TF:

* `legacy` (TPUEstimator's TPU): ids by feature name in the features dict;
  dense ids go through `tf.where` (id 0 dropped), except for `combiner=None`
  tables, whose dense ids go one per example; a weighted column's weights are
  its weight feature, which must be sparse.
* `mid_level` (TF's `TPUEmbedding.enqueue`): ids and the weights given beside
  them by feature path, with TF's checks and texts; dense ids go one per
  example (and position: `[batch, n, 1]`), sparse ones are combined over
  their last dimension (`[batch, n, ids]`: high-dimensional inputs); each
  input is read against its feature's recorded output shape (TF's rules),
  which its activation then takes.  `tpu_fc.mid_level` parses no input.

Both drop negative ids (padding) with their weights, and a sequence feature's
entries past its `max_sequence_length`.  The batch checks of a step and the
cut of a TPU model's CPU lookups (`cut_as_enqueued`) are here too: every input
error text of the lookup paths lives in this module.
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import re
from typing import TYPE_CHECKING, Any, NamedTuple

from tpu_fc import _tf_internals as internals
from tpu_fc._tf import tf

if TYPE_CHECKING:
  from tpu_fc.spec import EmbeddingLayout, FeatureSpec

SEQUENCE_LENGTH_SUFFIX = '_seq_length_'
STRING_IDS_ERROR = (
    'SparseTensor with string as values are not supported. If you are using '
    'categorical_column_with_vocabulary_file or '
    'categorical_column_with_vocabulary_list, please call '
    'your_column.categorical_column._transform_feature({{your_column.key: '
    'features[your_column.key]}}) in your input_fn() to convert string to int. '
    'feature_key = {}.')
# The op of every input check (`input_check`): the driver shows its message
# alone (`failed_check`).
INPUT_CHECK_NAME = 'tpu_fc_input_check'
_FAILED_CHECK = re.compile(
    r'^assertion failed: \[(.*)\]\n\s*\[\[\{\{node (?:[^{}]*/)?' +
    INPUT_CHECK_NAME + r'(?:_\d+)?\}\}', re.MULTILINE)


# TF's text; TF's enqueue pops each weight feature, so a second column reading
# the same weights finds them gone: weight-sharing gets the same error.
MISSING_WEIGHTS_ERROR = (
    'Cannot find weights {} for weighted_categorical_column. Please check if '
    'the weights are present in feature dict. Also note weight-sharing among '
    'weighted_categorical_column is not supported on TPU.')

BATCH_SIZE_MISMATCH = (
    'input_fn gave the embedding features a batch of {} examples, but the '
    'configured batch size (train_batch_size / eval_batch_size) is {}; as on a '
    'TPU, whose embedding config fixes the batch, batch the input by '
    "params['batch_size'].")


class FeatureInput(NamedTuple):
  """One feature as enqueued: its `FeatureSpec`, its ids (a SparseTensor
  `[batch, slot]`, or `[batch, position, slot]` for a multivalent sequence),
  their float32 weights (one per id, or None) and, for a sequence feature,
  its lengths (else None)."""
  feature: FeatureSpec
  ids: tf.SparseTensor
  weights: tf.Tensor | None
  lengths: tf.Tensor | None


class Enqueued(NamedTuple):
  """What one step enqueues: `inputs` {feature name: `FeatureInput`} and
  `ids_checked`, the op that fails the step (naming the feature) if an id is
  outside its table; lookups run after it."""
  inputs: dict[str, FeatureInput]
  ids_checked: tf.Operation | tf.Tensor


# The legacy enqueue (TPUEstimator's) --------------------------------------------


def legacy(layout: EmbeddingLayout, features: dict[str, Any]) -> Enqueued:
  """The `Enqueued` of `features` (a dict) as TPUEstimator's TPU enqueues them.

  Raises on a missing feature or weight, naming it.
  """
  weight_readers = collections.Counter(
      feature.weight_key for feature in layout.features if feature.weight_key)
  for weight_key, readers in weight_readers.items():
    if readers > 1:
      raise ValueError(MISSING_WEIGHTS_ERROR.format(weight_key))
  inputs = {}
  for table in layout.tables:
    for feature in layout.features_of(table.name):
      inputs[feature.name] = _legacy_feature(table, feature, features)
  return Enqueued(inputs, _ids_in_range(layout, inputs))


def _legacy_feature(table, feature, features):
  if feature.name not in features:
    raise KeyError('Feature {} (table {}) is missing from the features '
                   'given to the TPU embedding; got {}.'.format(
                       feature.name, table.name, sorted(features)))
  ids = as_sparse(feature.name, features[feature.name],
                  keep_zero_ids=table.combiner is None,
                  multivalent=feature.is_sequence)
  if not ids.dtype.is_integer:
    raise ValueError(STRING_IDS_ERROR.format(feature.name))
  return _feature_input(feature, ids, _weight_feature(table, feature, features))


def _weight_feature(table, feature, features):
  """A weighted column's weights (values of a SparseTensor), else None."""
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


def as_sparse(name, value, keep_zero_ids, multivalent=False):
  """Ids of one feature as a rank-2 SparseTensor, TPU-style.

  Dense ids are enqueued through `tf.where(x)` (id 0 dropped), except for tables
  with `combiner=None`, whose dense ids go one per example, 0 included; their
  negative entries are padding, never entries (a dense sequence's length ends at
  its last id).  With `multivalent` (sequence features), rank 3 is accepted too:
  `[batch, position, ids]`, several ids at one position.
  """
  if isinstance(value, tf.RaggedTensor):
    value = _ragged_as_sparse(value)
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


def _ragged_as_sparse(value):
  """A rank-2 RaggedTensor as a SparseTensor; under XLA, which has no kernel
  of TF's conversion, from its row splits."""
  if not internals.compiling_with_xla() or value.shape.rank != 2:
    return value.to_sparse()
  rows = value.value_rowids()
  slots = tf.range(tf.size(rows, out_type=rows.dtype)) - tf.gather(
      value.row_splits, rows)
  return tf.SparseTensor(
      tf.cast(tf.stack([rows, slots], axis=1), tf.int64), value.values,
      tf.cast(tf.stack([value.nrows(), tf.reduce_max(
          tf.concat([value.row_lengths(), [0]], 0))]), tf.int64))


# The mid-level enqueue (TF's TPUEmbedding.enqueue) ------------------------------


def check_output_shape_configs(named_configs):
  """Raises for a `FeatureConfig.output_shape` (of the (path, config) pairs)
  the activations cannot take; one not fully defined gets TF's error from
  `build` (`check_output_shapes_defined`)."""
  for path, config in named_configs:
    shape = config.output_shape
    if shape and (shape.rank < 1 or shape.num_elements() == 0):
      raise ValueError(
          'Feature {}: output_shape {} must have a batch dimension first and '
          'hold an example, e.g. [batch] or [batch, sequence_length].'.format(
              path, shape))


def check_output_shapes_defined(paths, output_shapes, every_shape_known):
  """TF's error for a recorded output shape that is not fully defined (TF's
  `build`, with `every_shape_known`); else one of unknown rank or batch
  passes (tpu_fc's build at the first enqueue: each enqueue's input gives
  them)."""
  for path, shape in zip(paths, output_shapes):
    if every_shape_known:
      known = shape.is_fully_defined()
    else:
      known = shape.rank is None or shape[1:].is_fully_defined()
    if not known:
      raise _not_fully_defined(path, shape)


def _not_fully_defined(path, output_shape):
  return ValueError(  # TF's text
      'Input Feature {} has output shape set as {} which is not fully '
      'defined. Please specify the fully defined shape in either '
      'FeatureConfig or for the build method.'.format(path, output_shape))


def mid_level(layout, configs, values, weights, recorded, num_cores,
              first_lengths, check_output_shapes, dense_weights=False):
  """What a mid-level `enqueue` on `num_cores` cores gives the engine, with
  TF's checks and texts: its `Enqueued`, and {path: a function of the
  feature's looked-up rows giving the activation `dequeue` returns}.

  `configs`, `values`, `weights` and `recorded` map each feature path, in
  the feature config's order, to its `FeatureConfig`, its ids, the weights
  given for them (or None) and its recorded per-core output shape (TF's
  `_output_shapes`: a `FeatureConfig`'s or `build`'s); `check_output_shapes`
  is TF's check of the output shapes the inputs give (a list in that order)
  against the recorded ones.  `first_lengths` {path: sequence length} keeps
  what the first enqueue made of a recorded output shape (a TPU's build
  fixes it); this call adds its own.  A high-dimensional input's examples
  are its `[batch, n, ...]` positions, one after another.  `dense_weights`:
  dense ids take weights (a SparseCore's enqueue; TF's TPUEmbedding refuses
  them).
  """
  read = {path: _mid_level_shape(path, values[path], config, num_cores,
                                 recorded[path])
          for path, config in configs.items()}
  check_output_shapes([output_shape for output_shape, _ in read.values()])
  recorded = {path: _with_batch_given(recorded[path], read[path][0])
              for path in configs}
  lengths = {path: _sequence_length(path, values[path], config, read[path][1],
                                    recorded[path], num_cores, first_lengths)
             for path, config in configs.items()}
  given = {path: (_mid_level_weights(path, weights[path], values[path], config,
                                     lengths[path], dense_weights),
                  _mid_level_ids(path, values[path], config, read[path][1]))
           for path, config in configs.items()}
  features = {}
  for table in layout.tables:
    for feature in layout.features_of(table.name):
      feature_weights, ids = given[feature.name]
      feature = dataclasses.replace(feature,
                                    max_sequence_length=lengths[feature.name])
      features[feature.name] = _feature_input(
          feature, as_sparse(feature.name, ids,
                             keep_zero_ids=table.combiner is None,
                             multivalent=feature.is_sequence),
          feature_weights)
  enqueued = Enqueued(features, _ids_in_range(layout, features))
  activations = {}
  for path, (output_shape, examples) in read.items():
    if not recorded[path] and not output_shape[1:].is_fully_defined():
      raise _not_fully_defined(path, output_shape)  # (TF's first enqueue
      # builds with it; an unknown batch alone is accepted here)
    activations[path] = _mid_level_activation(
        path, examples, recorded[path], lengths[path], num_cores)
  return enqueued, activations


def _with_batch_given(recorded, incoming):
  """A recorded output shape whose batch is unknown (a keras-rs
  `FeatureConfig` without one) with the batch of the `incoming` output
  shape; unknown (no rank) where that leaves it not fully defined."""
  if recorded.rank and recorded[0] is None and incoming.rank:
    recorded = incoming[:1].concatenate(recorded[1:])
  return recorded if recorded.is_fully_defined() else tf.TensorShape(None)


def _mid_level_shape(path, value, config, num_cores, recorded):
  """(per-core output shape, examples) of a feature's input on `num_cores`
  cores, with TF's errors for a type or rank no TPU's enqueue takes.

  The output shape is TF's (its `_get_input_shapes` and
  `_get_output_shapes_from_input_shapes`); `examples` is the static shape
  (whole batch) of the examples the engine looks up: `[batch]`, `[batch, n,
  ...]` for a high-dimensional input, or `[]` for a single example without a
  batch dimension.  Every TPU generation's forms are taken, each by its
  arithmetic (`docs/tfrs.md`):

  * dense ids hold one id per example and position: `[batch]`, `[batch, 1]`,
    `[batch, n, 1]` (TF's TPUEmbedding), `[batch, n]` (a TPU without
    embedding cores, `TPUEmbeddingV0`, and a SparseCore given that output
    shape), a rank-0 id (`TPUEmbeddingV0`: one example); but `[batch, n]`
    read against a `recorded` output shape without its last dimension is
    `[batch]` examples of n ids, combined by the table's combiner (a
    SparseCore's `TPUEmbeddingV2`);
  * sparse ones are combined over their last dimension (`[batch, ids]`,
    `[batch, n, ids]`, ...; a rank-1 one is one example, as TF's CPU and
    tensor-core lookups read it);
  * ragged ones are `[batch, ids]`.

  A rank-2 sparse or ragged input of a sequence feature without an
  `output_shape` is `[batch, max_sequence_length]`.  A batch that does not
  split into the cores leaves the per-core batch unknown (the step's check
  names it).
  """
  if not isinstance(value, (tf.Tensor, tf.SparseTensor, tf.RaggedTensor)):
    raise ValueError('Input {} is of unknown type {}. Please only pass Tensor, '
                     'SparseTensor or RaggedTensor as input to enqueue.'.format(
                         path, type(value)))
  shape = value.shape
  if shape.rank is None:
    raise ValueError(
        'Input {} has an unknown rank: TF\'s enqueue reads the output shape '
        'from the static shape of the input. Give it a static rank.'.format(
            path))
  if isinstance(value, tf.Tensor):
    combined = shape.rank > 1 and (
        shape[-1] == 1 or (recorded and recorded.rank == shape.rank - 1))
    examples = shape[:-1] if combined else shape
  elif isinstance(value, tf.SparseTensor):
    examples = shape[:-1]
    if examples.rank and examples[0] is None:  # (e.g. a dense shape
      # tf.stack-ed of constants)
      examples = tf.TensorShape([tf.get_static_value(
          value.dense_shape[0])]).concatenate(examples[1:])
  else:
    if shape.rank != 2:
      raise ValueError(
          'Only rank 2 ragged tensor is supported, find rank {} ragged tensor '
          'for input {}: pass [batch, ids] (a ragged row per example), or a '
          'SparseTensor [batch, n, ids] to look up n bags per example.'.format(
              shape.rank, path))
    examples = shape[:1]
  output = examples.as_list()
  if output:
    output[0] = (output[0] // num_cores if output[0] is not None and
                 output[0] % num_cores == 0 else None)
  if (examples.rank == 1 and not isinstance(value, tf.Tensor) and
      not config.output_shape and config.max_sequence_length > 0):
    output.append(config.max_sequence_length)
  return tf.TensorShape(output), examples


def _sequence_length(path, value, config, examples, output_shape, num_cores,
                     first_lengths):
  """The sequence length a feature is looked up with (0: combined per
  example).

  A feature whose `FeatureConfig` sets the output shape (`max_sequence_length`
  is then ignored, as TF does), or whose RaggedTensor is read against a
  recorded `output_shape`, takes what that shape makes of its input (TF's
  rule, `_output_sequence_length`), as the first enqueue made it; else a
  high-dimensional input or a single example (`examples` of rank other than
  1) takes 0, any other its `max_sequence_length`.
  """
  if isinstance(value, tf.RaggedTensor) and output_shape and (
      config.output_shape or not config.max_sequence_length):
    length = _output_sequence_length(path, output_shape, value, num_cores)
  elif config.output_shape:
    length = 0
  else:
    return 0 if examples.rank != 1 else config.max_sequence_length
  if path not in first_lengths:
    # (assigned, not setdefault: the dict is its TPUEmbedding's, whose
    # checkpoint refuses a tracked dict changed behind TF's wrapper)
    first_lengths[path] = length
  first = first_lengths[path]
  if length != first:
    raise ValueError(
        'Feature {}: the first enqueue made its output_shape {} {}, this '
        'one {}: the batch size changed. As on a TPU, whose build fixes '
        'the output shapes, keep one batch size (drop_remainder=True).'
        .format(path, output_shape, _reading(first), _reading(length)))
  return length


def _output_sequence_length(path, shape, value, num_cores):
  """The sequence length an output shape (per core) makes of a RaggedTensor.

  TF's rule (its CPU lookups'; a TPU reads the shape alike): a RaggedTensor
  whose per-core batch is the output size is combined per example (0); one
  whose per-core batch divides a larger output size is a sequence of output
  size / batch ids per example (cut or padded to it).  A batch not known
  until the step (a replica's share) is read against a rank-1 shape as one
  activation per example.
  """
  size = shape.num_elements()
  batch = value.shape[0]
  if batch is None and shape.rank == 1:
    return 0  # (one activation per example: no other reading has rank 1;
    # the step checks the examples' count)
  if batch is None:
    raise ValueError(
        'Feature {}: its output_shape {} is read against the batch size of its '
        'RaggedTensor (one activation per example, or a sequence per example), '
        'but that batch size is not static. Batch the input with '
        'drop_remainder=True, as a TPU needs.'.format(path, shape))
  per_core = batch // num_cores
  if size == per_core:
    return 0
  if size > per_core and per_core and size % per_core == 0:
    return size // per_core
  raise ValueError(
      'Output shape set in the FeatureConfig should be the factor of the input '
      'data batch size. But instead got output shape {}, input data batch size '
      '{} (feature {}, per core of {}).'.format(shape, per_core, path,
                                                num_cores))


def _reading(sequence_length):
  return ('a sequence of {} ids per example'.format(sequence_length)
          if sequence_length else 'one combined activation per example')


@functools.lru_cache(maxsize=None)
def _log_max_sequence_length_ignored(path, rank):
  tf.compat.v1.logging.warning(  # TF's text, naming the feature
      'Feature %s: input tensor is rank %d which is %s 2, the '
      'max_sequence_length setting will be ignored.', path, rank,
      'above' if rank > 2 else 'not')


def _mid_level_ids(path, value, config, examples):
  """A feature's ids: ragged as given, sparse ones `[examples, ids]`, dense
  ones `[examples, ids]` too: one per example, or, where `examples` (from
  `_mid_level_shape`) drop their last dimension, that dimension's ids."""
  if not value.dtype.is_integer:  # TF's text (its CPU lookup's), naming the input
    raise ValueError(
        'Input {}: the values contained by the inputs have type {} and cannot '
        'be processed. All values should be indices, either of type `int32` or '
        '`int64`.'.format(path, value.dtype))
  if isinstance(value, tf.RaggedTensor):
    return value
  if isinstance(value, tf.SparseTensor):
    if value.shape.rank == 2:
      return value
    if config.max_sequence_length:  # (TF's rule: combined over the last
      # dimension)
      _log_max_sequence_length_ignored(path, value.shape.rank)
    return tf.sparse.reshape(value, tf.stack(
        [tf.constant(-1, tf.int64), value.dense_shape[-1]]))
  if config.max_sequence_length > 0:
    raise ValueError('Feature {} is a sequence feature but a dense tensor was '
                     'passed.'.format(path))
  ids = tf.reshape(tf.cast(value, tf.int64), [-1])
  size = tf.size(ids, out_type=tf.int64)
  positions = tf.range(size)
  if examples.rank == value.shape.rank or value.shape[-1] == 1:
    return tf.SparseTensor(tf.stack([positions, tf.zeros_like(positions)],
                                    axis=1), ids, tf.stack([size, 1]))
  width = tf.shape(value, out_type=tf.int64)[-1]
  return tf.SparseTensor(tf.stack([positions // width, positions % width],
                                  axis=1), ids, tf.stack([size // width,
                                                          width]))


def _mid_level_weights(path, weight, value, config, sequence_length,
                       dense_weights):
  """The float32 weights of one feature's ids, or None (TF's checks, texts;
  a sequence feature's are refused as TF's CPU lookup refuses them, also
  those of an `output_shape` sequence, which TF's CPU lookup drops).  Those
  of dense ids only with `dense_weights` (a SparseCore's enqueue)."""
  if weight is None:
    return None
  if isinstance(value, tf.Tensor) and not dense_weights:
    raise ValueError('Weight specified for dense input {}, which is not '
                     'allowed. Weight will always be 1 in this case.'.format(
                         path))
  if not isinstance(weight, type(value)):
    raise ValueError('Weight for {} is type {} which does not match type input '
                     'which is {}.'.format(path, type(weight),
                                           type(value).__name__))
  if config.max_sequence_length > 0 or sequence_length:
    raise ValueError('Weight specified for {}, but this is a sequence '
                     'feature.'.format(path))
  if isinstance(value, tf.Tensor):  # (in the dense ids' order)
    return tf.reshape(tf.cast(weight, tf.float32), [-1])
  return tf.cast(weight.values, tf.float32)


def _mid_level_activation(path, examples, output_shape, length, num_cores):
  """The function making a feature's activation, as `dequeue` gives it, of
  its looked-up rows (the tape sees it only from there on, as on a TPU,
  whose tables are not in the model's graph).

  The rows are checked to split into the emulated cores and, for a recorded
  per-core `output_shape`, to be its examples (here already if `examples`,
  the input's static shape, tells: the traced graph's own check could be
  optimized away on them); they take that output shape (the cores' outputs
  one after another), or a high-dimensional input's `[batch, n, ..., dim]`.
  """
  # (a single example's one row is its activation, without a batch dimension)
  shape = {0: [], 1: None}.get(examples.rank, [-1] + examples[1:].as_list())
  # Every dimension the input gives statically, as a TPU's dequeue gives them
  # (its enqueue records the output shapes from the input).
  static = examples.as_list() + ([length] if examples.rank == 1 and length
                                 else [])
  if output_shape:
    expected = num_cores * output_shape.num_elements() // max(length, 1)
    mismatch = (
        'Feature {}: its output_shape {} holds {} examples on each of {} '
        'core(s), but this batch has {{}} examples; batch the input to match '
        'it.'.format(path, output_shape, expected // num_cores, num_cores))
    if examples.num_elements() not in (None, expected):
      raise ValueError(mismatch.format(examples.num_elements()))
    shape = static = [num_cores * output_shape[0]] + output_shape[1:].as_list()
  positions = examples[1:].num_elements() or 1  # (per example)

  def activation(rows_looked_up):
    rows = tf.shape(rows_looked_up, out_type=tf.int64)[0]
    checks = batch_checks(path, rows // positions if positions > 1 else rows,
                          num_cores)
    if output_shape:
      checks.append(input_check(tf.equal(rows, expected),
                                lambda: tf.strings.format(mismatch, rows)))
    if checks:
      with tf.control_dependencies(checks):
        rows_looked_up = tf.identity(rows_looked_up)
    if shape is not None:
      rows_looked_up = tf.reshape(
          rows_looked_up, shape + rows_looked_up.shape[-1:].as_list())
    rows_looked_up.set_shape(static + rows_looked_up.shape[-1:].as_list())
    return tf.stop_gradient(rows_looked_up)

  return activation


# What both enqueue -------------------------------------------------------------


def _feature_input(feature, ids, weights):
  """A feature's ids as the TPU looks them up, checked, with its weights.

  Negative ids are padding, as in TF's safe lookups: dropped.  A sequence
  feature's entries past `max_sequence_length` are dropped too (never
  looked up, never updated); its lengths come from the ids before that.
  """
  if weights is not None:
    weights = _check_weights(feature, ids, weights)
  keep = ids.values >= 0
  lengths = None
  if feature.is_sequence:
    # Per example, 1 + its last id position, capped (TPUEstimator's).
    lengths = tf.clip_by_value(tf.math.unsorted_segment_max(
        ids.indices[:, 1] + 1, ids.indices[:, 0],
        tf.cast(ids.dense_shape[0], tf.int32)), 0, feature.max_sequence_length)
    keep = tf.logical_and(keep,
                          ids.indices[:, 1] < feature.max_sequence_length)
  ids, weights = _retain(ids, weights, keep)
  return FeatureInput(feature, ids, weights, lengths)


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
      lazy_input_check(tf.reduce_all(finite), lambda: tf.strings.format(
          'Feature {}: {} must be finite; got {{}}. Drop or replace them in '
          '{}.'.format(feature.name, source, fix_in),
          tf.boolean_mask(weights, tf.logical_not(finite)), summarize=8)),
  ]
  with tf.control_dependencies(checks):
    return tf.identity(weights)


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


def _ids_in_range(layout, inputs):
  """One check of every id of the step; only on failure the per-feature checks
  run, naming the feature and its ids (`check_ids`)."""
  tables = [(table, inputs[feature.name])
            for table in layout.tables
            for feature in layout.features_of(table.name)]
  too_big = [tf.reduce_any(enqueued.ids.values >= table.vocabulary_size)
             for table, enqueued in tables]
  if not too_big:
    return tf.no_op()

  def report():
    checks = [check_ids(enqueued.feature.name, table.name,
                        enqueued.ids.values, table.vocabulary_size,
                        enqueued.feature.ids_column, lazy=False)
              for table, enqueued in tables]
    with tf.control_dependencies(checks):
      return tf.constant(False)

  return tf.cond(tf.reduce_any(tf.stack(too_big)), report,
                 lambda: tf.constant(True))


# Checks -------------------------------------------------------------------------


def input_check(ok, message_fn):
  """An op failing the step unless `ok`, with the string tensor `message_fn()`,
  formatted every step: for messages of a few scalars (`lazy_input_check`
  builds the others only on failure).

  The op's name (`INPUT_CHECK_NAME`) lets the driver show the message alone,
  without TF's listing.  XLA compiles asserts away and formats no strings: a
  compiled step has only the checks made while it is traced.
  """
  if internals.compiling_with_xla():
    return tf.no_op()
  return tf.raw_ops.Assert(condition=ok, data=[message_fn()],
                           name=INPUT_CHECK_NAME)


def lazy_input_check(ok, message_fn):
  """An `input_check` whose message, computed from the input (its bad ids,
  its weights), is built only when the check fails: a cond, dearer to build
  than a plain assert."""
  if internals.compiling_with_xla():
    return tf.no_op()
  return tf.cond(ok, tf.no_op, lambda: input_check(ok, message_fn))


def failed_check(message):
  """The message of the `input_check` whose failure TF's `message` reports
  (for the driver to show alone), or None."""
  check = _FAILED_CHECK.search(message)
  # (TF's listing escapes the quotes of the data it prints)
  return check and check.group(1).replace("\\'", "'").replace('\\"', '"')


def check_ids(feature_name, table_name, ids, vocabulary_size,
              ids_column=None, lazy=True):
  """`ids` as int64, failing the step (naming feature and ids) if out of range.

  `ids_column`: the categorical column giving the feature's ids, if any; for a
  vocabulary or hash column, whose transform a TPU does not apply to an
  embedding feature's values, the error says to map them in input_fn.
  `lazy=False`: the message is built even when the ids are in range (where
  the caller runs the check only on failure).
  """
  ids = tf.cast(ids, tf.int64)
  too_big = ids >= vocabulary_size
  message = 'Feature {} (table {}): ids {{}} are out of range [0, {}); '.format(
      feature_name, table_name, vocabulary_size)
  transform = _untransformed(ids_column)
  if transform is None:
    message += ('use a vocabulary size above the largest id, or hash or clip '
                'the ids in input_fn.')
  else:
    message += (
        'its column {0} has a {1}, which a TPU does not apply to the values '
        'of an embedding feature (they are looked up as ids, as in TF 2.15). '
        'Map the values to indices in input_fn, in TRAIN and EVAL: '
        "features['{2}'] = <the embedding column>.categorical_column."
        "_transform_feature({{'{2}': features['{2}']}})".format(
            ids_column.name, transform, feature_name))
  check = (lazy_input_check if lazy else input_check)(
      tf.logical_not(tf.reduce_any(too_big)),
      lambda: tf.strings.format(
          message, tf.sort(tf.unique(tf.boolean_mask(ids, too_big))[0]),
          summarize=8))
  with tf.control_dependencies([check]):
    return tf.identity(ids)


def _untransformed(ids_column):
  """What an integer categorical column would do to its values that the TPU's
  enqueue does not ('vocabulary', 'hash'), or None."""
  if (getattr(ids_column, 'vocabulary_list', None) is not None or
      getattr(ids_column, 'vocabulary_file', None) is not None):
    return 'vocabulary'
  if getattr(ids_column, 'hash_bucket_size', None) is not None:
    return 'hash'
  return None


def static_batch(features, embedding_features):
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


def check_static_batch(name, batch, batch_size):
  """Raises unless feature `name`'s static `batch` (None: unknown) is the
  configured `batch_size` (None: any)."""
  if batch_size is not None and batch not in (None, batch_size):
    raise ValueError('Feature {}: {}'.format(
        name, BATCH_SIZE_MISMATCH.format(batch, batch_size)))


def batch_checks(name, rows, num_shards, batch_size=None):
  """The input checks that feature `name`'s `rows` (known at run time) are the
  configured `batch_size`, or else (None) split into `num_shards` cores."""
  if batch_size is not None:  # (configured to divide into the shards)
    return [check_batch_size(name, rows, batch_size)]
  if num_shards > 1:
    return [check_batch_divides('Feature ' + name, rows, num_shards)]
  return []


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


def check_batch_size(name, rows, batch_size):
  """An input check that feature `name` has `batch_size` rows (`rows`, known
  only at run time)."""
  return input_check(
      tf.equal(rows, batch_size),
      lambda: tf.strings.format('Feature {}: {}'.format(
          name, BATCH_SIZE_MISMATCH.format('{}', batch_size)), rows))


# The CPU lookups of a TPU model ---------------------------------------------------


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
