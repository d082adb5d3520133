"""Legacy TPU embedding columns: `embedding_column` and `shared_embedding_columns`.

The columns are thin subclasses of TF's own TPU feature columns (which subclass the
core `EmbeddingColumn` / `SharedEmbeddingColumn`), so `DenseFeatures`, `input_layer`,
`SequenceFeatures` and TF 2.15's real `TPUEstimator` accept them, and they keep TF's
column names, variable names and lookup branches.  What tpu_fc adds:

* validation is TF's own factory, so argument checks, their order and error texts are
  exactly TF 2.15's on every TF version;
* the lookup device and tensor-core shape are kept per instance (TF stores them on the
  class, where the last column built wins) and read through `embedding_lookup_device`
  and `tensor_core_shape`;
* a column on `embedding_lookup_device='cpu'` looks up on the host when tpu_fc builds
  an evaluation, prediction or export graph (`tpu_fc.build_context`); in training it
  raises TF's error, as TF 2.15 does.

Put the columns in a model_fn's `tf.keras.layers.DenseFeatures` (TF's
`input_layer` refuses shared columns) or `SequenceFeatures` (sequence columns),
and in `EmbeddingConfigSpec(feature_columns=...)`.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

from tpu_fc import _tf_internals as internals
from tpu_fc import naming
from tpu_fc._tf import tf
from tpu_fc import build_context

CPU = 'cpu'
TPU_TENSOR_CORE = 'tpu_tensor_core'
TPU_EMBEDDING_CORE = 'tpu_embedding_core'
_DEVICE_NAMES = {
    internals.EmbeddingDevice.CPU: CPU,
    internals.EmbeddingDevice.TPU_TENSOR_CORE: TPU_TENSOR_CORE,
    internals.EmbeddingDevice.TPU_EMBEDDING_CORE: TPU_EMBEDDING_CORE,
}
TENSOR_CORE_MASK_KEY_SUFFIX = internals.TENSOR_CORE_MASK_KEY_SUFFIX


def embedding_column(categorical_column: Any,
                     dimension: int,
                     combiner: str = 'mean',
                     initializer: Callable[..., Any] | None = None,
                     max_sequence_length: int = 0,
                     learning_rate_fn: Callable[[Any], Any] | None = None,
                     embedding_lookup_device: str | None = None,
                     tensor_core_shape: Sequence[int | None] | None = None,
                     use_safe_embedding_lookup: bool = True
                     ) -> EmbeddingColumn | DeviceSpecificEmbeddingColumn:
  """TPU embedding column; same contract as TF 2.15's `tpu.experimental.embedding_column`.

  Args:
    categorical_column: an identity, hashed or vocabulary categorical column
      (optionally weighted, or a sequence categorical column) whose ids index
      the table.
    dimension: the embedding width.
    combiner: 'mean', 'sqrtn' or 'sum': how an example's several ids combine
      into one activation (sequence features are not combined).
    initializer: the table's initializer; default truncated normal with
      stddev 1/sqrt(dimension).
    max_sequence_length: 0 for a pooled feature; else the sequence length the
      TPU pads or cuts each example's ids to (sequence columns only, which
      need it > 0).
    learning_rate_fn: `global_step -> learning rate` for this table, in place
      of the optimizer's; None: the optimizer's.
    embedding_lookup_device: None (train on the embedding core, serve on the
      CPU), 'cpu', 'tpu_tensor_core' or 'tpu_embedding_core' (tpu_fc's lookup
      paths: README, "What runs where").
    tensor_core_shape: with 'tpu_tensor_core', `[batch or None, max ids per
      example]`: the ids are padded or cut to that width.
    use_safe_embedding_lookup: the CPU lookup drops invalid ids and weights
      (TF's `safe_embedding_lookup_sparse`); False is faster when the input is
      known to be clean.

  Returns:
    An `EmbeddingColumn` (or `DeviceSpecificEmbeddingColumn` when
    `embedding_lookup_device` is set): a subclass of TF's own TPU embedding
    column, named `<categorical column's name>_embedding`.

  Raises:
    TypeError: `categorical_column` of a type TF's TPU columns do not take.
    ValueError: `dimension` None or < 1, a `tensor_core_shape` not of two
      elements, an `initializer` that is not callable, another
      `embedding_lookup_device`, 'tpu_tensor_core' without
      `tensor_core_shape` or on a sequence column, or a
      `max_sequence_length` that does not fit the column (> 0 for sequence
      columns, 0 for others).
  """
  checked = internals.tpu_embedding_column_v2(
      categorical_column, dimension, combiner=combiner, initializer=initializer,
      max_sequence_length=max_sequence_length, learning_rate_fn=learning_rate_fn,
      embedding_lookup_device=embedding_lookup_device,
      tensor_core_shape=tensor_core_shape,
      use_safe_embedding_lookup=use_safe_embedding_lookup)
  return _on_device(DeviceSpecificEmbeddingColumn, checked,
                    embedding_lookup_device, tensor_core_shape)


def shared_embedding_columns(
    categorical_columns: Sequence[Any],
    dimension: int,
    combiner: str = 'mean',
    initializer: Callable[..., Any] | None = None,
    shared_embedding_collection_name: str | None = None,
    max_sequence_lengths: Sequence[int] | None = None,
    learning_rate_fn: Callable[[Any], Any] | None = None,
    embedding_lookup_device: str | None = None,
    tensor_core_shape: Sequence[int | None] | None = None,
    use_safe_embedding_lookup: bool = True
) -> list[SharedEmbeddingColumn | SharedDeviceSpecificEmbeddingColumn]:
  """TPU shared embedding columns; same contract as TF 2.15's.

  Args:
    categorical_columns: the categorical columns that read one table (same
      number of buckets).
    dimension, combiner, initializer, learning_rate_fn,
      embedding_lookup_device, tensor_core_shape, use_safe_embedding_lookup:
      as in `embedding_column`, for the shared table.
    shared_embedding_collection_name: the table's name (its checkpoint name);
      default the columns' names, sorted, joined by '_', plus
      '_shared_embedding'.
    max_sequence_lengths: one `max_sequence_length` per column (None: all 0).

  Returns:
    A list of `SharedEmbeddingColumn` (or `SharedDeviceSpecificEmbeddingColumn`), in
    the order of `categorical_columns`, all reading one table.

  Raises:
    TypeError: a categorical column of a type TF's TPU columns do not take.
    ValueError: `max_sequence_lengths` of another length than
      `categorical_columns`, columns of different numbers of buckets, and
      `embedding_column`'s checks of the other arguments.
  """
  checked = internals.tpu_shared_embedding_columns_v2(
      categorical_columns, dimension, combiner=combiner, initializer=initializer,
      shared_embedding_collection_name=shared_embedding_collection_name,
      max_sequence_lengths=max_sequence_lengths,
      learning_rate_fn=learning_rate_fn,
      embedding_lookup_device=embedding_lookup_device,
      tensor_core_shape=tensor_core_shape,
      use_safe_embedding_lookup=use_safe_embedding_lookup)
  return [_on_device(SharedDeviceSpecificEmbeddingColumn, column,
                     embedding_lookup_device, tensor_core_shape)
          for column in checked]


def _on_device(device_class, column, embedding_lookup_device,
               tensor_core_shape):
  """TF's TPU `column` rebuilt as a `device_class` column pinned to
  `embedding_lookup_device`, or without one as its column without a device
  (`_UNDEVICED`)."""
  arguments = device_class._UNDEVICED._new_args(column)  # pylint: disable=protected-access
  if not embedding_lookup_device:
    return device_class._UNDEVICED(**arguments)  # pylint: disable=protected-access
  return device_class(embedding_lookup_device=embedding_lookup_device,
                      tensor_core_shape=tensor_core_shape, **arguments)


_SEGMENT_REDUCTIONS = {'sum': tf.sparse.segment_sum,
                       'mean': tf.sparse.segment_mean,
                       'sqrtn': tf.sparse.segment_sqrt_n}


def _inference_lookup(column, sparse_tensors, table, tf_lookup):
  """A column's CPU lookup in an inference graph: TF's safe lookup, in fewer ops.

  For unweighted 2-D ids (the served case) this computes what TF's
  `safe_embedding_lookup_sparse` does, bit for bit — ids below 0 dropped, one
  segment reduction of the table's rows per example in the ids' order, an
  example without ids all zeros — without its reshapes, empty-row filling and
  masking, which cost more than the lookup at serving batch sizes.  Every other
  case (weights, sequence ids, max_norm, combiner None, a partitioned table or
  one on another device than the lookup's ops — TF's own segment path has that
  rule —, training) is `tf_lookup()`, TF's own.
  """
  ids = sparse_tensors.id_tensor
  if (not build_context.is_inference() or sparse_tensors.weight_tensor is not None
      or column.combiner not in _SEGMENT_REDUCTIONS
      or tf.compat.dimension_value(ids.dense_shape.shape[0]) != 2
      or not column.use_safe_embedding_lookup
      or getattr(column, 'max_norm', None) is not None
      or getattr(column, 'ckpt_to_load_from', None) is not None
      or not hasattr(table, 'read_value_no_copy')):  # one resource variable
    return tf_lookup()
  with tf.name_scope('%s_weights' % column.name):
    ids = tf.sparse.retain(ids, ids.values >= 0)
    examples = tf.cast(ids.indices[:, 0], tf.int32)
    if examples.device != table.device:  # else the whole table moves here
      return tf_lookup()
    return _SEGMENT_REDUCTIONS[column.combiner](
        table.read_value_no_copy(), ids.values, examples,
        num_segments=tf.cast(ids.dense_shape[0], tf.int32),
        name='embedding_lookup')  # the node input_errors names


class _TpuFcColumnMixin:
  """What every tpu_fc column adds to TF's: the lookup device as a plain string."""

  @property
  def embedding_lookup_device(self):
    """'cpu', 'tpu_tensor_core', 'tpu_embedding_core', or None (the default split)."""
    return lookup_device(self)

  @property
  def tensor_core_shape(self):
    return tensor_core_shape(self)

  def _new_args(self):
    """Constructor keyword arguments that rebuild this column."""
    raise NotImplementedError

  def _get_dense_tensor_internal_helper(self, sparse_tensors,
                                        embedding_weights):
    return _inference_lookup(
        self, sparse_tensors, embedding_weights,
        lambda: super(_TpuFcColumnMixin, self)._get_dense_tensor_internal_helper(
            sparse_tensors, embedding_weights))

  def __deepcopy__(self, memo):
    return type(self)(**{k: copy.deepcopy(v, memo)
                         for k, v in self._new_args().items()})

  def __reduce__(self):
    return _rebuild, (type(self), self._new_args())


def _rebuild(cls, arguments):
  return cls(**arguments)


class _SharedTpuFcColumnMixin(_TpuFcColumnMixin):
  """A shared column's CPU lookup, through `_inference_lookup` (TF's shared
  column calls the safe lookup itself, not through the helper)."""

  def __deepcopy__(self, memo):
    """The creator owns the one table, so copies keep sharing it."""
    memo[id(self.shared_embedding_column_creator)] = (
        self.shared_embedding_column_creator)
    return super().__deepcopy__(memo)

  def _looks_up_on_cpu(self):
    """Whether this is an inference graph where TF's column would run its CPU
    lookup (elsewhere, training graphs included, TF's code runs unchanged)."""
    return build_context.is_inference() and internals.is_running_on_cpu()

  def _get_dense_tensor_internal(self, transformation_cache, state_manager):
    if not self._looks_up_on_cpu():
      return super()._get_dense_tensor_internal(transformation_cache,
                                                state_manager)
    with tf.compat.v1.name_scope(None, default_name=self.name):  # as TF's
      sparse_tensors = self.categorical_column.get_sparse_tensors(
          transformation_cache, state_manager)
    return _inference_lookup(
        self, sparse_tensors,
        self.shared_embedding_column_creator.embedding_weights,
        lambda: internals.shared_embedding_column_dense_tensor(
            self, transformation_cache, state_manager))


class _DeviceMixin(_TpuFcColumnMixin):
  """Per-instance lookup device; host lookup for 'cpu' columns outside training.

  A subclass names its column without a device in `_UNDEVICED`, whose
  constructor it runs: TF's device-specific one stores the device on the class.
  """
  _UNDEVICED = None

  def __new__(cls, embedding_lookup_device, tensor_core_shape=None, **arguments):
    del embedding_lookup_device, tensor_core_shape  # kept per instance, in __init__
    return cls._UNDEVICED.__new__(cls, **arguments)

  def __init__(self, embedding_lookup_device, tensor_core_shape=None, **arguments):
    self._UNDEVICED.__init__(self, **arguments)
    self._embedding_lookup_device = {
        name: device for device, name in _DEVICE_NAMES.items()
    }[embedding_lookup_device]
    self._tensor_core_shape = tensor_core_shape

  def _new_args(self):
    return dict(self._UNDEVICED._new_args(self),
                embedding_lookup_device=self.embedding_lookup_device,
                tensor_core_shape=self.tensor_core_shape)

  def _host_lookup_allowed(self):
    return (self._embedding_lookup_device == internals.EmbeddingDevice.CPU and
            build_context.is_inference())


def _tpu_table_scope(column, state_manager):
  """The scope of the name the TPU gives this column's table (see
  `_record_table_name`): the variable scope `create_state` runs in, below it
  the layer's and the column's names unless that scope is the column's own
  (v1 `DenseFeatures`, `SequenceFeatures`)."""
  scope = tf.compat.v1.get_variable_scope().name
  if scope.endswith(column.name):
    return scope
  layer = getattr(state_manager, '_layer', None)
  return '/'.join(part for part in (
      scope, layer.name if layer is not None else None, column.name) if part)


def _record_table_name(column, state_manager, validate_scope=False):
  """Records, in TPU mode, the name the CPU path gives this column's table.

  DenseFeatures calls `create_state` outside the layer's scope, so TF's own
  record there (the bare enclosing scope) would name every such table
  `embedding_weights`.  On the CPU the table is
  `<scope>/<layer>/<column>/embedding_weights`; that is recorded instead, so TPU
  and CPU checkpoints share their names.  With `validate_scope`, TF's check runs
  on the bare scope as TF records it: a second, different scope is an error.
  The bare scopes are kept beside the names, in the collection's second entry
  (TF reads the first only), so the shards' replication resets both.
  """
  graph = tf.compat.v1.get_default_graph()
  bare_scope = tf.compat.v1.get_variable_scope().name
  var_name = column.get_embedding_var_name()
  recorded = graph.get_collection_ref(naming.COLUMN_SCOPES)
  while len(recorded) < 2:
    recorded.append({})
  names, bare_scopes = recorded
  first = bare_scopes.setdefault(var_name, bare_scope)
  if validate_scope and first != bare_scope:
    raise ValueError(
        'For embedding var name {}, the variable scope name is different, '
        'got {}; expected {}'.format(var_name, bare_scope, first))
  scope = _tpu_table_scope(column, state_manager)
  if validate_scope and names.get(var_name, (scope,))[0] != scope:
    raise ValueError(
        'Column {} is used by two layers ({} and {}): on the CPU each layer '
        'makes a table of its own, on a TPU one table serves both, so neither '
        'the checkpoints nor predict and export could carry over between the '
        'two. Look the column up in one layer and pass its output to both '
        'towers, or make one column per layer.'.format(
            column.name, names[var_name][0], scope))
  names[var_name] = (scope, naming.COLUMN_TABLE)


def _create_embedding_core_state(column, state_manager, tf_create_state):
  """An embedding-core column's `create_state`: in TPU mode, the table's name
  recorded; on the CPU path, TF's `tf_create_state`.

  In a CPU graph of a TPU-trained model (`build_context.tables_named_as_on_tpu`),
  the table gets the name its TPU training recorded: TF2's `DenseFeatures`
  names its variables by the enclosing name scopes (a Keras `Sequential`'s, a
  subclassed model's, a `tf.name_scope`'s), which a TPU's record, by variable
  scope, leaves out; the table is made in that record's name scope instead.
  (Layers naming by variable scope, v1 `DenseFeatures` and `SequenceFeatures`,
  already give that name.)
  """
  if not internals.is_running_on_cpu():
    return _record_table_name(
        column, state_manager,
        validate_scope=not column._bypass_scope_validation)  # pylint: disable=protected-access
  if not build_context.names_tables_as_on_tpu():
    return tf_create_state(state_manager)
  with tf.compat.v1.name_scope(_tpu_table_scope(column, state_manager) + '/'):
    return tf_create_state(state_manager)


class EmbeddingColumn(_TpuFcColumnMixin, internals.TPUEmbeddingColumnV2):
  """`embedding_column` without a lookup device: embedding core to train, CPU to serve."""

  def create_state(self, state_manager):
    return _create_embedding_core_state(self, state_manager,
                                        super().create_state)

  def _new_args(self):
    """Constructor keyword arguments that rebuild this column, or TF's TPU
    embedding column `self`, its lookup device aside."""
    return dict(
        categorical_column=self.categorical_column, dimension=self.dimension,
        combiner=self.combiner, initializer=self.initializer,
        max_sequence_length=self.get_max_sequence_length(),
        learning_rate_fn=self.get_learning_rate_fn(),
        use_safe_embedding_lookup=self.use_safe_embedding_lookup,
        bypass_scope_validation=self._bypass_scope_validation)


class DeviceSpecificEmbeddingColumn(_DeviceMixin,
                                    internals.TPUDeviceSpecificEmbeddingColumnV2):
  """`embedding_column` pinned to one lookup device."""
  _UNDEVICED = EmbeddingColumn

  def get_dense_tensor(self, transformation_cache, state_manager):
    if self._host_lookup_allowed():
      return internals.fc_lib.EmbeddingColumn.get_dense_tensor(
          self, transformation_cache, state_manager)
    return super().get_dense_tensor(transformation_cache, state_manager)

  def _get_dense_tensor(self, inputs, weight_collections=None, trainable=None):
    if self._host_lookup_allowed():
      return internals.embedding_column_dense_tensor_v1(
          self, inputs, weight_collections, trainable)
    return super()._get_dense_tensor(inputs, weight_collections, trainable)

  def create_state(self, state_manager):
    if self._host_lookup_allowed():
      return internals.fc_lib.EmbeddingColumn.create_state(self, state_manager)
    if (self._embedding_lookup_device !=
        internals.EmbeddingDevice.TPU_EMBEDDING_CORE):  # no TPU record
      return super().create_state(state_manager)
    return _create_embedding_core_state(self, state_manager,
                                        super().create_state)


class SharedEmbeddingColumn(_SharedTpuFcColumnMixin,
                            internals.TPUSharedEmbeddingColumnV2):
  """One of `shared_embedding_columns` without a lookup device."""

  def _new_args(self):
    """Constructor keyword arguments that rebuild this column, or TF's TPU
    shared embedding column `self`, its lookup device aside."""
    return dict(
        categorical_column=self.categorical_column,
        shared_embedding_column_creator=self.shared_embedding_column_creator,
        combiner=self.combiner, initializer=self.get_initializer(),
        shared_embedding_collection_name=self.get_embedding_var_name(),
        max_sequence_length=self.get_max_sequence_length(),
        learning_rate_fn=self.get_learning_rate_fn(),
        use_safe_embedding_lookup=self.use_safe_embedding_lookup)


class SharedDeviceSpecificEmbeddingColumn(
    _DeviceMixin, _SharedTpuFcColumnMixin,
    internals.TPUSharedDeviceSpecificEmbeddingColumnV2):
  """One of `shared_embedding_columns` pinned to one lookup device."""
  _UNDEVICED = SharedEmbeddingColumn

  def _looks_up_on_cpu(self):
    # TF's own refuses a 'cpu' column outside inference, also on a CPU.
    return self._host_lookup_allowed()


TPU_COLUMN_TYPES = (internals.TPUEmbeddingColumnV2,
                    internals.TPUSharedEmbeddingColumnV2)


def lookup_device(column):
  """The lookup device of any TPU column, TF's own or tpu_fc's, as a string or
  None (both keep it per instance, as TF's enum)."""
  return _DEVICE_NAMES.get(getattr(column, '_embedding_lookup_device', None))


def tensor_core_shape(column):
  """The tensor-core shape of any TPU column, TF's own or tpu_fc's."""
  return getattr(column, '_tensor_core_shape', None)


def ids_column(column):
  """The categorical column that gives an embedding column its ids (inside a
  weighted or sequence one), or None for a column that is no embedding one."""
  categorical = getattr(column, 'categorical_column', None)
  while hasattr(categorical, 'categorical_column'):  # weighted, sequence
    categorical = categorical.categorical_column
  return categorical
