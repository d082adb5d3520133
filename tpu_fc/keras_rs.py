"""keras-rs's `DistributedEmbedding` trained on a CPU as a TPU's SparseCore trains it.

keras-rs 0.4 on a CPU places every table on the default device as a plain Keras
variable: the model's optimizer trains it with Keras' rules (one update per
occurrence of a repeated id, Adagrad's epsilon, Adam's bias correction, weight
decay on every row) and no `TableConfig.optimizer` is used.  On a TPU with a
SparseCore (TensorFlow backend, embedding feature V1) keras-rs looks its tables up
with TF's mid-level `TPUEmbedding` instead, and a `tf.custom_gradient` over a
trainable dummy variable hands the activation gradients to its
`apply_gradients` when the model's gradients are computed: each table is
trained by its own optimizer, whatever the model's.

`DistributedEmbedding` here takes that same path on a CPU, its SparseCore
emulated by `tpu_fc.mid_level.TPUEmbedding` (the host engine, with the TPU
update rules of `tpu_fc.reference`) and its gradient trap, which applies each
call's gradients to that call's lookup, as keras-rs's call ids pair them on a
TPU; under a `TPUStrategy` it is keras-rs's own layer.  `EmbeddingConfigSpec.to_keras_rs()` gives a legacy spec's tables as
its configs, refusing what keras-rs cannot carry (`docs/keras_rs.md`).

keras and keras-rs (Keras 3, on TensorFlow) are imported here and, lazily, in
`to_keras_rs`; keras-rs needs Python >= 3.11 and is on the latest lane only.
"""
from __future__ import annotations

from typing import Any

import keras
import keras_rs
# keras-rs's TensorFlow backend: its config conversion (what its SparseCore
# path runs) and the name of its gradient-trap dummy; tests/test_keras_rs.py
# checks that they are there.
from keras_rs.src.layers.embedding.tensorflow import config_conversion
from keras_rs.src.layers.embedding.tensorflow import distributed_embedding
from keras_rs.src.utils import keras_utils

from tpu_fc import _tf_internals as internals
from tpu_fc import checkpoint_conversion
from tpu_fc import mid_level
from tpu_fc._tf import tf


class _EmulatedSparseCore(mid_level.TPUEmbedding):
  """The host engine behind keras-rs's SparseCore path: TF's `TPUEmbedding`,
  but dense ids take weights, as a SparseCore's enqueue applies them."""
  _weighs_dense_ids = True


@keras.saving.register_keras_serializable(package='tpu_fc')
class DistributedEmbedding(keras_rs.layers.DistributedEmbedding):
  """`keras_rs.layers.DistributedEmbedding`, its SparseCore emulated off a TPU.

  Under a `TPUStrategy` every method is keras-rs's.  Elsewhere (a CPU, the
  default strategy) the tables keras-rs would put on a SparseCore -- placement
  'auto' or 'sparsecore', and every `tf.tpu.experimental.embedding.FeatureConfig`
  -- are looked up and trained by `tpu_fc.mid_level.TPUEmbedding` on keras-rs's
  SparseCore path: its configs converted as keras-rs converts them, a gradient
  trap (a `tf.custom_gradient` over keras-rs's trainable dummy variable)
  handing each call's activation gradients to that call's lookup when the
  model's gradients are computed.  Each table is so trained by its `TableConfig.optimizer` with the
  TPU rules (repeated ids summed per row, callable learning rates read then,
  gradient clipping, weight decay of the looked-up rows) in `model.fit` and in
  a custom loop whose tape takes the gradient of the model's trainable
  variables (the dummy among them); the model's optimizer sees the dummy only.
  'default_device' tables stay keras-rs's (Keras variables, trained by the
  model's optimizer).

  The emulated tables are no Keras variables: `get_embedding_tables()` gives
  them by table name; a `tf.train.Checkpoint` of the layer (or of a model
  holding it) holds them and their slots as `embedding/<table>` and
  `embedding/<table>/<slot>`, and `save_weights` / `model.save` by those names
  (keras-rs on a TPU keeps them in neither); `keras.models.load_model` finds
  the class once `tpu_fc.keras_rs` is imported.

  Args:
    feature_configs: a nest of `keras_rs.layers.FeatureConfig` (or of
      `tf.tpu.experimental.embedding.FeatureConfig`), as keras-rs takes it.
    **kwargs: keras-rs's (`table_stacking`, `update_stats`, its TensorFlow
      backend's `optimizer` and `pipeline_execution_with_tensor_core`, a
      layer's); `sparse_core_embedding_config` is refused off a TPU (the
      emulated SparseCore is TF's `TPUEmbedding`, which takes none).

  Raises:
    ValueError: keras-rs's checks of the configs (an optimizer or an option
      keras-rs cannot convert, ...), or a `sparse_core_embedding_config`
      off a TPU.
    NotImplementedError: a table the host engine cannot train (a combiner
      other than 'mean', 'sum', 'sqrtn').
  """

  def _emulated(self) -> bool:
    return isinstance(getattr(self, '_tpu_embedding', None),
                      mid_level.TPUEmbedding)

  def _on_tpu(self) -> bool:
    return self._is_tpu_strategy(tf.distribute.get_strategy())

  def _has_sparsecore(self) -> bool:
    """keras-rs's answer under a `TPUStrategy`; elsewhere the emulated one."""
    return super()._has_sparsecore() if self._on_tpu() else True

  @keras_utils.no_automatic_dependency_tracking
  def _sparsecore_init(self, feature_configs: dict[str, Any],
                       table_stacking: Any) -> None:
    if self._on_tpu():
      super()._sparsecore_init(feature_configs, table_stacking)
      return
    if self._sparse_core_embedding_config is not None:
      raise ValueError(
          'sparse_core_embedding_config is not taken off a TPU: the emulated '
          'SparseCore is TF\'s TPUEmbedding (embedding feature V1), which takes '
          'none, as keras-rs on such a TPU. Leave it out.')
    self._table_stacking = table_stacking  # (keras-rs's get_config reads it)
    first = next(iter(feature_configs.values()))
    self._using_keras_rs_configuration = isinstance(
        first, keras_rs.layers.FeatureConfig)
    if self._using_keras_rs_configuration:
      # (the output shapes per replica, each a TPU core, as keras-rs has them)
      configs, _ = config_conversion.keras_to_tf_tpu_configuration(
          feature_configs, table_stacking, num_replicas_in_sync=(
              tf.distribute.get_strategy().num_replicas_in_sync))
    else:
      configs = config_conversion.clone_tf_tpu_feature_configs(feature_configs)
    self._tpu_feature_configs = configs
    self._tpu_optimizer = config_conversion.to_tf_tpu_optimizer(
        self._optimizer)
    self._tpu_embedding = _EmulatedSparseCore(
        self._tpu_feature_configs, self._tpu_optimizer,
        self._pipeline_execution_with_tensor_core)
    self._gradient_trap_dummy = self.add_weight(
        name=distributed_embedding.GRADIENT_TRAP_DUMMY_NAME, shape=(1,),
        initializer='zeros', trainable=True, dtype='float32')

  def _sparsecore_build(self, input_shapes: dict[str, Any]) -> None:
    if not self._emulated():
      super()._sparsecore_build(input_shapes)
      return
    # Built without them: a functional model builds with the batch unknown,
    # and each enqueue checks its inputs against the configs' output shapes.
    # (Reading the tables builds them.)
    self._tpu_embedding.embedding_tables  # pylint: disable=pointless-statement

  def _sparsecore_call(self, inputs: dict[str, Any], weights: Any = None,
                       training: bool = False) -> dict[str, Any]:
    if not self._emulated():
      return super()._sparsecore_call(inputs, weights, training)
    # keras-rs's SparseCore lookup (`_tpu_embedding_lookup_v1`), each call's
    # gradients applied to that call's lookup, as keras-rs's call ids pair
    # them on a TPU (a model may call the layer more than once a step).
    return self._tpu_embedding._lookup_for_layer(  # pylint: disable=protected-access
        inputs, weights, self._gradient_trap_dummy.value)

  def _sparsecore_get_embedding_tables(self) -> dict[str, Any]:
    if not self._emulated():
      return super()._sparsecore_get_embedding_tables()
    return {table.name: tf.convert_to_tensor(variable)
            for table, variable in self._tpu_embedding.embedding_tables.items()}

  def _trackable_children(self, save_type: str = 'checkpoint',
                          **kwargs: Any) -> dict[str, Any]:
    children = super()._trackable_children(save_type, **kwargs)
    if self._emulated():
      children['embedding'] = self._tpu_embedding
    return children

  def _emulated_variables(self) -> dict[str, tf.Variable]:
    """The emulated tables and slots by their checkpoint keys (`<table>`,
    `<table>.S<slot>`), built."""
    _, variables = checkpoint_conversion._built(self._tpu_embedding)  # pylint: disable=protected-access
    return {internals.escape_checkpoint_name(name): variable
            for name, variable in variables.items()}

  def save_own_variables(self, store: Any) -> None:
    """keras-rs's under a `TPUStrategy`; emulated, the tables and slots by
    their checkpoint keys (`<table>`, `<table>.S<slot>`), not the dummy.

    Args:
      store: Keras' store of this layer's weights (`save_weights`,
        `model.save`).
    """
    if not self._emulated():
      super().save_own_variables(store)
      return
    for key, variable in self._emulated_variables().items():
      store[key] = variable.numpy()

  def load_own_variables(self, store: Any) -> None:
    """keras-rs's under a `TPUStrategy`; emulated, what `save_own_variables`
    stored, every table and slot.

    Args:
      store: Keras' store of this layer's weights (`load_weights`,
        `keras.models.load_model`).

    Raises:
      ValueError: the store holds other keys than the emulated tables and
        slots (e.g. weights saved by keras-rs's own layer on a CPU), or a
        value of another shape.
    """
    if not self._emulated():
      super().load_own_variables(store)
      return
    variables = self._emulated_variables()
    if sorted(store.keys()) != sorted(variables):
      raise ValueError(
          'Layer {}: the weights hold {}, but its emulated SparseCore tables '
          'and slots are {}. Load weights this class saved with the same '
          'TableConfigs; tables from elsewhere come in by '
          'tpu_fc.keras_rs.restore (a legacy or mid-level checkpoint).'.format(
              self.name, sorted(store.keys()), sorted(variables)))
    for key, variable in variables.items():
      value = store[key]
      if tuple(value.shape) != tuple(variable.shape):
        raise ValueError(
            'Layer {}: {} has shape {} in the weights, {} in the layer (its '
            'vocabulary_size or embedding_dim changed?).'.format(
                self.name, key, list(value.shape), variable.shape.as_list()))
      variable.assign(value)


def _embedding_of(layer: DistributedEmbedding) -> Any:
  """The layer's mid-level API object: the emulated SparseCore's, or on a TPU
  keras-rs's own `TPUEmbedding`."""
  if not isinstance(layer, keras_rs.layers.DistributedEmbedding):
    raise TypeError('{!r} is no keras_rs.layers.DistributedEmbedding.'.format(
        layer))
  embedding = getattr(layer, '_tpu_embedding', None)
  if embedding is None:
    raise ValueError(
        'Layer {}: every table has placement \'default_device\': they are Keras '
        'variables, which model.save_weights / load_weights keep; restore and '
        'save carry SparseCore tables (placement \'auto\' or \'sparsecore\').'
        .format(layer.name))
  return embedding


def restore(layer: DistributedEmbedding, checkpoint: str,
            spec: Any = None) -> int:
  """Loads the layer's SparseCore tables and slots, by table name, from a
  legacy TPUEstimator checkpoint or a mid-level one.

  `checkpoint_conversion.restore_embedding` on the layer's `TPUEmbedding`:
  the tables of `spec.to_keras_rs()` are named as the spec's, found in a
  legacy checkpoint by tpu_fc's naming rules (or `spec`), their slots by the
  legacy suffixes of each table's optimizer; all or nothing.  Its
  'default_device' tables are Keras variables, left to Keras' weights.

  Args:
    layer: a `tpu_fc.keras_rs.DistributedEmbedding` (or keras-rs's own on a
      TPU, not run here), built on the first call if it is not.
    checkpoint: a checkpoint prefix, or a directory (its latest checkpoint).
    spec: the `EmbeddingConfigSpec` that trained a legacy checkpoint, which
      names its tables where the naming rules find none or several.

  Returns:
    The checkpoint's global step (0 if it has none): give it to the counter
    a `learning_rate_fn` reads (`to_keras_rs(global_step=...)`).

  Raises:
    TypeError: `layer` is no keras-rs `DistributedEmbedding`.
    ValueError: the layer has no SparseCore tables.
    tpu_fc.checkpoint_conversion.CheckpointConversionError: a table missing
      from the checkpoint, ambiguous, of another shape, or slots of another
      optimizer (nothing is assigned then).
  """
  return checkpoint_conversion.restore_embedding(_embedding_of(layer),
                                                 checkpoint, spec)


def save(layer: DistributedEmbedding, path: str,
         global_step: int | None = None) -> str:
  """Writes the layer's SparseCore tables and slots in the mid-level layout.

  `checkpoint_conversion.save_embedding` on the layer's `TPUEmbedding`:
  `embedding/<table>`, `embedding/<table>/<slot>` and `global_step` in
  `path/ckpt-<global step>`, which `python -m tpu_fc convert-checkpoint --to
  legacy --spec ...` turns into a TPUEstimator checkpoint and `restore`
  reads.  Its 'default_device' tables are Keras variables, not written.

  Args:
    layer: a `tpu_fc.keras_rs.DistributedEmbedding` (or keras-rs's own on a
      TPU, not run here).
    path: the directory to write to.
    global_step: the global step to record (None: 0).

  Returns:
    The written checkpoint prefix.

  Raises:
    TypeError: `layer` is no keras-rs `DistributedEmbedding`.
    ValueError: the layer has no SparseCore tables.
    tpu_fc.checkpoint_conversion.CheckpointConversionError: `path` is a
      file, a legacy model_dir, or holds a checkpoint of this global step or
      later (never overwritten).
  """
  return checkpoint_conversion.save_embedding(_embedding_of(layer), path,
                                              global_step)
