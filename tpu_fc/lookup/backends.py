"""The lookup paths of `embedding_lookup_device`, and the one place that picks them.

* `tpu_embedding_core`: `EmbeddingCoreBackend`, the host engine with the TPU's
  update rules (`embedding_core`); the model_fn gets activations.
* `tpu_tensor_core`: `TensorCoreBackend`; the model_fn gets padded ids and a mask
  (`tensor_core.densify`) and its columns gather from model variables.
* a TPU model's prediction and export: `CpuLookupBackend`; every column looks
  up on the host in the model_fn's graph, from sequences cut as the TPU cuts
  them.  Columns pinned to `cpu` look up so in evaluation too
  (`tpu_fc.build_context` tells them the mode).  Dict-configured features
  have no column: their prediction gets the activations from the host engine,
  as a TPU's inference mode gives them (their export stays TF's CPU graph).

The TPU's own `TPUEmbedding` (`tpu_embedding.TPUEmbeddingEngine`) is not among
them: without a TPU to run it, the driver emulates.
"""
from tpu_fc import build_context
from tpu_fc._tf import tf
from tpu_fc import columns as columns_lib
from tpu_fc.lookup import base
from tpu_fc.lookup import embedding_core
from tpu_fc.lookup import profile
from tpu_fc.lookup import tensor_core


def backends_for(spec, mode, on_tpu, partitioned_tables=False, serving=False):
  """The backends of a graph of `mode` (a ModeKeys value) for `spec`.

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
  if mode == build_context.PREDICT and (serving or spec.feature_columns or
                                        spec.tensor_core_feature_columns):
    return (CpuLookupBackend(spec.embedding_layout(),
                             spec.tensor_core_feature_columns or ()),)
  _log_untransformed_ids(tuple(spec.feature_columns or ()) +
                         tuple(spec.tensor_core_feature_columns or ()))
  return (EmbeddingCoreBackend(spec, named_by_columns=not partitioned_tables),
          TensorCoreBackend(spec.tensor_core_feature_columns or ()))


_LOGGED_UNTRANSFORMED = set()


def _log_untransformed_ids(columns):
  """Says, once per column, that the TPU does not apply a column's vocabulary
  or hash to integer ids (a string column's ids fail the step, saying so)."""
  for column in columns:  # (another kind of column is refused with TF's error)
    categorical = columns_lib.ids_column(column)
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


class EmbeddingCoreBackend(base.EmbeddingBackend):
  """`tpu_embedding_core` columns, emulated by the host engine.

  With `named_by_columns` the tables get the graph names TF's TPU mode gives
  them (`<column scope>/embedding_weights/part_0`); else the engine's own
  (`tpu_embedding/<table>`), which a parameter-server partitioning recognizes.
  """

  def __init__(self, spec, named_by_columns=True):
    self.engine = embedding_core.HostEmbeddingEngine(
        spec.embedding_layout(), spec.optimization_parameters,
        spec.experimental_gradient_multiplier_fn,
        named_by_columns=named_by_columns)
    self._pipelined = spec.pipeline_execution_with_tensor_core
    self._profile_data_directory = spec.profile_data_directory

  def create_variables(self, training):
    self.engine.create_variables(training=training)

  def model_features(self, features, batch_size):
    """Without the ids and weights the engine looks up."""
    del batch_size
    result = dict(features)
    for feature in self.engine.layout.features:
      result.pop(feature.name, None)
      if feature.weight_key:
        result.pop(feature.weight_key, None)
    return result

  def lookup(self, features, num_shards, batch_size):
    return self.engine.lookup(features, num_shards, batch_size)

  def checkpoint_variables(self, graph):
    self.engine.name_variables(graph)
    return self.engine.checkpoint_variables(graph)

  def apply_gradients(self, step, aggregate_rows=None):
    return self.engine.apply_gradients(step, pipelined=self._pipelined,
                                       aggregate_rows=aggregate_rows)

  def training_hooks(self, step):
    if not self._profile_data_directory:
      return ()
    # Each emulated shard stands for one would-be host of the div partitioning.
    return (profile.LookupProfileHook(
        step.statistics(), self.engine.layout, self._profile_data_directory,
        num_hosts=step.num_shards),)

  def before_save(self):
    # Checkpoints hold every update: parked ones are applied before each save.
    return self.engine.flush_op if self._pipelined else None


class TensorCoreBackend(base.EmbeddingBackend):
  """`tpu_tensor_core` columns: densified ids for a gather in the model graph,
  whose variables the model's optimizer trains."""

  def __init__(self, columns):
    self._columns = tuple(columns)

  def model_features(self, features, batch_size):
    """Each tensor-core feature as padded ids and a mask, `[batch_size, width]`
    as TF 2.15 gives them."""
    return tensor_core.densify(features, self._columns, batch_size)

  def shared_table_creators(self):
    creators = (getattr(column, 'shared_embedding_column_creator', None)
                for column in self._columns)
    return tuple({id(creator): creator for creator in creators
                  if creator is not None}.values())


class CpuLookupBackend(base.EmbeddingBackend):
  """The columns look up on the host (a TPU model's predict and serving)."""

  def __init__(self, layout, tensor_core_columns):
    self._layout = layout
    self._tensor_core_widths = {
        column.get_feature_key_name(): columns_lib.tensor_core_shape(column)[1]
        for column in tensor_core_columns}

  def model_features(self, features, batch_size):
    """Sequences and tensor-core ids cut as the TPU enqueues them."""
    del batch_size
    return embedding_core.cut_as_enqueued(features, self._layout,
                                          self._tensor_core_widths)
