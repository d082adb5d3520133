"""tensorflow-recommenders' `TPUEmbedding` layer on the CPU, trained by the TPU's rules.

Outside a `TPUStrategy`, TFRS's `tfrs.layers.embedding.TPUEmbedding` builds TF's
`TPUEmbeddingForServing`, whose tables the Keras model's optimizer trains: a layer
given an embedding optimizer of its own trains by the model's, silently.
`TPUEmbedding` here builds `tpu_fc.mid_level.TPUEmbedding` instead and takes
TFRS's own TPU path: each call looks its ids up on the host engine inside a
`tf.custom_gradient` over a trainable helper weight, and the gradient function
applies d(loss)/d(activations) to the looked-up rows by the TPU rules of the
layer's optimizer (or a table's own).  Whoever differentiates the loss by the
model's trainable weights (`model.fit`, a `GradientTape` loop) so trains the
tables; the Keras optimizer sees only the helper's zero gradient, never a table.
Under a `TPUStrategy` the class is TFRS's own.

`restore` and `save` carry the layer's tables and slots, by table name, from a
legacy TPUEstimator checkpoint or a mid-level one, and into the mid-level layout
(`tpu_fc.checkpoint_conversion.restore_embedding`, `save_embedding`).

This module imports TFRS only when `TPUEmbedding` is first used.
"""
from __future__ import annotations

import functools
import sys
from typing import Any

from tpu_fc import _tf_internals as internals
from tpu_fc import checkpoint_conversion
from tpu_fc import mid_level
from tpu_fc import spec as spec_lib
from tpu_fc._tf import tf


def __getattr__(name):
  if name == 'TPUEmbedding':
    return _layer_class()
  raise AttributeError("module 'tpu_fc.tfrs' has no attribute {!r}".format(name))


@functools.lru_cache(maxsize=None)
def _layer_class():
  """`tpu_fc.tfrs.TPUEmbedding`, defined on TFRS's layer at first use."""
  from tensorflow_recommenders.layers.embedding import tpu_embedding_layer  # pylint: disable=g-import-not-at-top

  tfrs_layer = tpu_embedding_layer.TPUEmbedding  # (install() rebinds the name)
  helper_name = tpu_embedding_layer._DUMMY_NAME  # pylint: disable=protected-access

  class TPUEmbedding(tfrs_layer):
    """`tfrs.layers.embedding.TPUEmbedding`, trained on the CPU by the TPU's rules.

    TFRS's constructor, `call`, `embedding_tables` and checkpoint.  Created
    outside a `TPUStrategy`, its tables live in a `tpu_fc.mid_level.TPUEmbedding`
    and train by the layer's optimizer (or a table's own, from its
    `TableConfig`) with the TPU update rules when the loss is differentiated by
    the model's trainable weights, which hold a helper weight the layer's
    activations hang on (its gradient is zero; it is not checkpointed); the
    model's optimizer, its slots and weight decay never touch a table.
    `model.evaluate`, `predict` and a call without a gradient leave the tables
    as they are.  A SavedModel (`tf.saved_model.save`, Keras's `save`) exports
    TF's CPU lookup of the tables, as does `call(..., serving_config=...)`.
    Under a `TPUStrategy`, it is TFRS's class.  TFRS's constructor
    arguments; `batch_size` is not needed (each call's inputs give the
    output shapes, which may vary).
    """
    __qualname__ = 'TPUEmbedding'

    def _create_tpu_embedding_mid_level_api(
        self, using_tpu, embedding_feature,
        pipeline_execution_with_tensor_core, sparse_core_embedding_config):
      if using_tpu:
        return super()._create_tpu_embedding_mid_level_api(
            using_tpu, embedding_feature, pipeline_execution_with_tensor_core,
            sparse_core_embedding_config)
      return mid_level.TPUEmbedding(
          self._feature_config, self._optimizer,
          pipeline_execution_with_tensor_core=(
              pipeline_execution_with_tensor_core))

    def build(self, input_shape):
      if self._using_tpu:
        super().build(input_shape)
        return
      super(tfrs_layer, self).build(input_shape)  # Keras's, not TFRS's
      # The tables and slots, built without output shapes: each call's
      # inputs give theirs, so a model may predict on another batch size.
      self._tpu_embedding.embedding_tables  # pylint: disable=pointless-statement
      setattr(self, helper_name, self.add_weight(
          name=helper_name, shape=(1,), initializer=tf.zeros_initializer(),
          trainable=True, dtype=tf.float32))

    def call(self, features, weights=None, serving_config=None):
      if (self._using_tpu or serving_config is not None or
          mid_level.under_tpu_strategy()):  # (TFRS refuses the last)
        return super().call(features, weights, serving_config)
      if internals.in_saved_model_export():
        return tf.tpu.experimental.embedding.serving_embedding_lookup(
            features, weights, self._tpu_embedding.embedding_tables,
            self._feature_config)
      return self._tpu_embedding._lookup_for_layer(  # pylint: disable=protected-access
          features, weights, getattr(self, helper_name))

  return TPUEmbedding


def bind_layer_names():
  """Binds TFRS's layer, wherever a loaded TFRS module holds it
  (`tfrs.layers.embedding.TPUEmbedding`, ...), to tpu_fc's (`install()`)."""
  layer = _layer_class()
  _rebind(*layer.__bases__, layer)


def unbind_layer_names():
  """Gives TFRS's modules their own layer back (`uninstall()`)."""
  layer = _layer_class()
  _rebind(layer, *layer.__bases__)


def _rebind(old, new):
  for name, module in list(sys.modules.items()):
    if (name.split('.')[0] == 'tensorflow_recommenders' and
        getattr(module, '__dict__', {}).get('TPUEmbedding') is old):
      module.TPUEmbedding = new


def restore(layer: Any, checkpoint: str,
            spec: spec_lib.EmbeddingConfigSpec | None = None) -> int:
  """Loads a TFRS `TPUEmbedding` layer's tables and slots, by table name.

  Args:
    layer: a `tfrs.layers.embedding.TPUEmbedding` (tpu_fc's or TFRS's own).
    checkpoint: a legacy TPUEstimator checkpoint or a mid-level one (prefix or
      directory: its latest).
    spec: the `EmbeddingConfigSpec` that trained a legacy checkpoint, where
      its tables' names are ambiguous.

  Returns:
    The checkpoint's global step (0 if it has none).

  Raises:
    CheckpointConversionError: a table of the layer missing from the
      checkpoint, of another shape or vocabulary, or slots of another
      optimizer; the layer is left as it was.
  """
  return checkpoint_conversion.restore_embedding(layer._tpu_embedding,  # pylint: disable=protected-access
                                                 checkpoint, spec)


def save(layer: Any, path: str, global_step: int | None = None) -> str:
  """Writes a TFRS `TPUEmbedding` layer's tables and slots in the mid-level layout.

  Args:
    layer: a `tfrs.layers.embedding.TPUEmbedding` (tpu_fc's or TFRS's own).
    path: the directory to write `ckpt-<global step>` into.
    global_step: the step to record (None: 0).

  Returns:
    The written prefix.

  Raises:
    CheckpointConversionError: a directory holding a checkpoint of this
      global step or later, or a legacy model_dir.
  """
  return checkpoint_conversion.save_embedding(layer._tpu_embedding, path,  # pylint: disable=protected-access
                                              global_step)
