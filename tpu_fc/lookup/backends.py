"""The lookup paths of `embedding_lookup_device`, and the one place that picks them.

`backends_for` gives each path the features of the spec's layout it looks up:
on the emulated TPU by each feature's lookup device (`_TPU_PATHS`).

* `tpu_embedding_core`: `EmbeddingCoreBackend`, the host engine with the TPU's
  update rules (`host_engine`) over the tables the backend creates; the
  model_fn gets activations.
* `tpu_tensor_core`: `TensorCoreBackend`; the model_fn gets padded ids and a mask
  (`tensor_core.densify`) and its columns gather from model variables.
* a TPU model's prediction and export: `CpuLookupBackend`; every column looks
  up on the host in the model_fn's graph, from sequences cut as the TPU cuts
  them.  Columns pinned to `cpu` look up so in evaluation too
  (`tpu_fc.build_context` tells them the mode).  Dict-configured features
  have no column: their prediction gets the activations from the host engine,
  as a TPU's inference mode gives them (their export stays TF's CPU graph).

A real TPU's embedding engine is not among them: tpu_fc emulates it even where
`tpu_cluster_resolver` finds a TPU (the driver warns that it is not used).
"""
from tpu_fc import _tf_internals as internals
from tpu_fc import build_context
from tpu_fc import columns as columns_lib
from tpu_fc import naming
from tpu_fc._tf import tf
from tpu_fc.lookup import base
from tpu_fc.lookup import host_engine
from tpu_fc.lookup import inputs
from tpu_fc.lookup import profile
from tpu_fc.lookup import sparse_update
from tpu_fc.lookup import tensor_core

# TPUEstimator's collection of the dummy variables (`EmbeddingCoreBackend`).
DUMMY_VARIABLE_COLLECTION = 'tpu_embedding_dummy_table_variables'


def backends_for(spec, mode, on_tpu, partitioned_tables=False, serving=False):
  """The backends of a graph of `mode` (a ModeKeys value) for `spec`, in the
  order the driver calls them, each with its features of `spec.layout()`.

  A feature's path is its lookup device's on the emulated TPU (`_TPU_PATHS`);
  a TPU model's prediction and export look every column up on the host.

  Args:
    spec: the `EmbeddingConfigSpec`, or None (no backend).
    mode: 'train', 'eval' or 'infer'.
    on_tpu: the graph is the TPU's (emulated): TPUEstimator's `use_tpu`, for
      evaluation also `eval_on_tpu`.  Off the TPU the model_fn's graph is TF's
      CPU graph, every column looking up in it: no backend.
    partitioned_tables: the tables are split over parameter servers (the
      engine then keeps its own names, see `EmbeddingCoreBackend`).
    serving: a PREDICT graph for export: TF's CPU graph.
  """
  if spec is None or not on_tpu:
    return ()
  layout = spec.layout()

  def path(feature):
    on_host = mode == build_context.PREDICT and (serving or
                                                 feature.column is not None)
    return CpuLookupBackend if on_host else _TPU_PATHS[feature.lookup_device]

  if mode != build_context.PREDICT:
    _log_untransformed_ids(layout)
  parts = {backend: layout.where(lambda feature: path(feature) is backend)
           for backend in (EmbeddingCoreBackend, TensorCoreBackend,
                           CpuLookupBackend)}
  return tuple(
      EmbeddingCoreBackend(spec, part, named_by_columns=not partitioned_tables)
      if backend is EmbeddingCoreBackend else backend(spec, part)
      for backend, part in parts.items() if part.features)


_LOGGED_UNTRANSFORMED = set()


def _log_untransformed_ids(layout):
  """Says, once per column, that the TPU does not apply a column's vocabulary
  or hash to integer ids (a string column's ids fail the step, saying so)."""
  for feature in layout.features:
    column, categorical = feature.column, feature.ids_column
    dtype = getattr(categorical, 'dtype', None)  # vocabulary and hash columns
    if (dtype is None or not dtype.is_integer or
        column.name in _LOGGED_UNTRANSFORMED):
      continue
    _LOGGED_UNTRANSFORMED.add(column.name)
    tf.compat.v1.logging.warning(
        'Column %s: on a TPU its ids are looked up as the input gives them, '
        'without the vocabulary or hash of %s (TF 2.15 did the same); give it '
        'transformed ids in TRAIN and EVAL (`column.categorical_column.'
        '_transform_feature(...)` in input_fn) and the raw feature in PREDICT, '
        'whose CPU lookup, like the exported model, transforms it.',
        column.name, categorical.name)


def tpu_cluster_resolver(cluster=None):
  """The TPU to run on, or None when this process sees no TPU.

  A `TPUClusterResolver` given as `RunConfig(cluster=...)` (TPUEstimator's way)
  wins; else the TPU cores attached to this host (a TPU VM).  No network probe
  is made: on a machine without TPU this returns None at once.
  """
  resolver_type = tf.distribute.cluster_resolver.TPUClusterResolver
  if isinstance(cluster, resolver_type):
    return cluster
  if tf.config.list_logical_devices('TPU'):
    return resolver_type(tpu='local')
  return None


def predicts_in_model_graph(backends):
  """Whether a PREDICT graph's lookups all run in the model_fn's graph."""
  return all(isinstance(backend, CpuLookupBackend) for backend in backends)


def model_features(backends, features, batch_size):
  """`features` as the model_fn sees them, each backend's part done in turn (a
  lone Tensor, not a dict, has no embedding ids)."""
  for backend in backends:
    if isinstance(features, dict):
      features = backend.model_features(features, batch_size)
  return features


def embedding_feature_keys(backends):
  """The keys of the features (ids and weights) the backends look up."""
  return {key for backend in backends for feature in backend.layout.features
          for key in (feature.name, feature.weight_key) if key}


class EmbeddingCoreBackend(base.EmbeddingBackend):
  """`tpu_embedding_core` columns, emulated by the host engine.

  The backend owns the engine's variables.  With `named_by_columns` the tables
  get the graph names TF's TPU mode gives them (`<column scope>/
  embedding_weights/part_0`), which only the columns know once the model_fn
  has run; until then lookups read them through a handle bound to them then.
  Else the engine's own (`tpu_embedding/<table>`), which a parameter-server
  partitioning recognizes.

  The model_fn sees activations, and its optimizer minimizes over the trainable
  variables, as on a TPU: each activation is tied to its table's trainable
  dummy variable (`_tie`), whose gradient function captures d(loss)/d(
  activation) for the engine's update.  The ties live here, not in the engine:
  they are how a TF1 model_fn's gradients reach it; the mid-level API hands
  them over in `apply_gradients`.
  """

  def __init__(self, spec, layout, named_by_columns=True):
    super().__init__(spec, layout)
    self.tables, self.slots = {}, {}  # table name -> variable, {slot: variable}
    self._read_handles, self._dummies = {}, {}
    self._named_by_columns = named_by_columns
    self._training = False
    self.engine = host_engine.HostEmbeddingEngine(
        self.layout, spec.optimization_parameters, self.tables, self.slots,
        self._read_handles, spec.experimental_gradient_multiplier_fn)
    self._pipelined = spec.pipeline_execution_with_tensor_core
    self._profile_data_directory = spec.profile_data_directory

  # Variables -----------------------------------------------------------------

  def create_variables(self, training):
    """Tables (and, for training, optimizer slots and dummy variables).

    With `named_by_columns`, the tables and slots are created by
    `checkpoint_variables` once the model_fn has run, under the graph names
    TF's TPU mode gave them (`<column scope>/embedding_weights/part_0`, slots
    `.../embedding_weights/Adagrad/part_0`).
    """
    self._training = training
    for table in self.layout.tables:
      if self._named_by_columns:
        with tf.init_scope():  # outside any training loop, as the variables
          self._read_handles[table.name] = tf.raw_ops.VarHandleOp(
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
          self.engine.table_parameters(table), self.tables[table.name], name,
          slot_names)

  def _name_variables(self, graph):
    """Creates the tables and slots of `named_by_columns` (see `create_variables`)."""
    if not self._read_handles:
      return
    names = naming.recorded_table_names(self.layout, graph)
    with tf.init_scope():
      for table in self.layout.tables:
        full_name = names[table.name]
        slot_names = {slot: '{}/{}'.format(full_name, suffix)
                      for suffix, slot in
                      self.engine.table_parameters(table).SLOTS}
        self._create_table(table, full_name + '/part_0',
                           {slot: name + '/part_0'
                            for slot, name in slot_names.items()})
        internals.mark_as_only_part(self.tables[table.name], full_name)
        for slot, variable in self.slots.get(table.name, {}).items():
          internals.mark_as_only_part(variable, slot_names[slot])
        sparse_update.bind_variable_handle(self._read_handles[table.name],
                                           self.tables[table.name])

  def checkpoint_variables(self, graph):
    """Legacy checkpoint name -> variable for every table and slot."""
    self._name_variables(graph)
    names = {}
    for table, full_name in naming.recorded_table_names(
        self.layout, graph).items():
      names[full_name] = self.tables[table]
      for suffix, slot in self.engine.table_parameters(
          self.layout.table(table)).SLOTS:
        if table in self.slots:
          names['{}/{}'.format(full_name, suffix)] = self.slots[table][slot]
    return names

  # One step ------------------------------------------------------------------

  def model_features(self, features, batch_size):
    """Without the ids and weights the engine looks up."""
    del batch_size
    result = dict(features)
    for feature in self.layout.features:
      result.pop(feature.name, None)
      if feature.weight_key:
        result.pop(feature.weight_key, None)
    return result

  def lookup(self, features, num_shards=1, batch_size=None):
    """Activations of every embedding-core feature, split into `num_shards` slices.

    Returns the step (`_TiedStep`) and one dict per shard: feature name ->
    activation, plus `<name>_seq_length_` for sequence features; each
    activation is tied to its table's dummy variable when training.  Raises
    on a missing feature or weight, naming it.  The batch dimension is static:
    `batch_size` (the configured global batch, as a TPU's embedding config
    fixes it), else the input's, when known.
    """
    read_step = tf.compat.v1.train.get_or_create_global_step().read_value()
    lookup_step, combined = self.engine.activations(
        inputs.legacy(self.layout, features), num_shards, read_step)
    name, batch = inputs.static_batch(features, self.layout.features)
    inputs.check_static_batch(name, batch, batch_size)
    batch = batch or batch_size
    shards = [dict() for _ in range(num_shards)]
    for name, value in combined.items():
      checks = inputs.batch_checks(
          name, tf.shape(value, out_type=tf.int64)[0], num_shards, batch_size)
      with tf.control_dependencies(checks):
        value = tf.identity(value) if checks else value
      if batch is not None and batch % num_shards == 0:  # else checked above
        value.set_shape([batch] + value.shape[1:])
      pieces = tf.split(value, num_shards, axis=0) if num_shards > 1 else [value]
      for index, piece in enumerate(pieces):
        shards[index][name] = piece
    step = _TiedStep(lookup_step)
    for feature in self.layout.features:
      step.shards[feature.name] = [shard[feature.name] for shard in shards]
      if self._dummies:
        for index, shard in enumerate(shards):
          shard[feature.name] = self._tie(
              self._dummies[feature.table], shard[feature.name],
              (feature.name, index), step)
    return step, shards

  @staticmethod
  def _tie(dummy, activation, key, step):
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
        with tf.control_dependencies([step.lookup_step.read_step]):
          return tf.zeros_like(dummy_value), None
      return tf.identity(value), grad

    return tie(dummy.read_value(), activation)

  def apply_gradients(self, step, aggregate_rows=None):
    """The engine's update from the gradients the ties captured."""
    gradients = {feature.name: self._captured_gradient(feature, step)
                 for feature in self.layout.features}
    return self.engine.apply_gradients(
        step.lookup_step, gradients, pipelined=self._pipelined,
        aggregate_rows=aggregate_rows)

  @staticmethod
  def _captured_gradient(feature, step):
    """d(loss)/d(activation) of one feature over all shards, as the ties
    captured it (zeros where unused)."""
    per_shard = []
    for shard, piece in enumerate(step.shards[feature.name]):
      dy = step.captured.get((feature.name, shard))
      if dy is None:
        tf.compat.v1.logging.warning(
            'Table %s has undefined gradients for feature %s on shard %d: the '
            'loss does not depend on it.', feature.table, feature.name, shard)
        dy = tf.zeros_like(piece)
      per_shard.append(dy)
    return tf.concat(per_shard, axis=0)

  def training_hooks(self, step):
    if not self._profile_data_directory:
      return ()
    # Each emulated shard stands for one would-be host of the div partitioning.
    return (profile.LookupProfileHook(
        step.lookup_step.statistics(), self.layout,
        self._profile_data_directory, num_hosts=step.lookup_step.num_shards),)

  def before_save(self):
    # Checkpoints hold every update: parked ones are applied before each save.
    return self.engine.flush_op if self._pipelined else None


class _TiedStep:
  """One step of `EmbeddingCoreBackend`: the engine's `LookupStep`, each
  feature's per-shard activations and the gradients their ties captured,
  {(feature, shard): d(loss)/d(activation)}."""

  def __init__(self, lookup_step):
    self.lookup_step = lookup_step
    self.shards, self.captured = {}, {}


class TensorCoreBackend(base.EmbeddingBackend):
  """`tpu_tensor_core` columns: densified ids for a gather in the model graph,
  whose variables the model's optimizer trains."""

  def model_features(self, features, batch_size):
    """Each tensor-core feature as padded ids and a mask, `[batch_size, width]`
    as TF 2.15 gives them."""
    return tensor_core.densify(features, self.layout, batch_size)

  def shared_table_creators(self):
    return _shared_table_creators(self.layout)


def _shared_table_creators(layout):
  """The creators of the shared columns of `layout`'s features, once each."""
  creators = (getattr(feature.column, 'shared_embedding_column_creator', None)
              for feature in layout.features)
  return tuple({id(creator): creator for creator in creators
                if creator is not None}.values())


class CpuLookupBackend(base.EmbeddingBackend):
  """The columns look up on the host (a TPU model's predict and serving)."""

  def shared_table_creators(self):
    return _shared_table_creators(self.layout)

  def model_features(self, features, batch_size):
    """Sequences and tensor-core ids cut as the TPU enqueues them."""
    del batch_size
    on_tensor_core = (lambda feature: feature.lookup_device ==
                      columns_lib.TPU_TENSOR_CORE)
    return inputs.cut_as_enqueued(
        features, self.layout.where(lambda feature: not on_tensor_core(feature)),
        {feature.name: columns_lib.tensor_core_shape(feature.column)[1]
         for feature in self.layout.features if on_tensor_core(feature)})


# The path of each lookup device on the emulated TPU (training, evaluation,
# a dict spec's prediction): a new device is a backend and its entry here.
_TPU_PATHS = {
    None: EmbeddingCoreBackend,
    columns_lib.CPU: EmbeddingCoreBackend,
    columns_lib.TPU_EMBEDDING_CORE: EmbeddingCoreBackend,
    columns_lib.TPU_TENSOR_CORE: TensorCoreBackend,
}
