"""Serving a migrated model: `export_mid_level_saved_model`, a SavedModel with CPU lookup.

The form a fully migrated model has: a TF2 object SavedModel of a
`TPUEmbeddingForServing` (tables restored from a mid-level or legacy checkpoint)
followed by the migrated dense model.  (`TPUEstimator.export_saved_model` is
`tpu_fc.estimator.saved_model`.)
"""
from __future__ import annotations

from typing import Any, Mapping

from tpu_fc import checkpoint_conversion
from tpu_fc._tf import tf
from tpu_fc.lookup.inputs import check_ids


class MidLevelServingModel(tf.Module):
  """A migrated model: `serving_embedding_lookup` on the CPU, then the dense model.

  `dense_model(activations, features)` gets the activations of the spec's
  embedding-core features (by feature name, as `TPUEmbedding.dequeue` returns
  them) and the raw features, and returns a dict of output tensors.
  """

  def __init__(self, spec, dense_model):
    super().__init__()
    self._mid_level = spec.to_mid_level()
    # Tables without optimizers: serving needs no slots.
    self.embedding = tf.tpu.experimental.embedding.TPUEmbeddingForServing(
        self._mid_level.serving_feature_config(), None)
    self.dense_model = dense_model

  def __call__(self, features):
    inputs, weights = self._mid_level.split_features(features)
    inputs = {name: _checked_ids(name, config.table, value)
              for (name, value), config in zip(
                  inputs.items(), self._mid_level.feature_config.values())}
    return self.dense_model(self.embedding.embedding_lookup(inputs, weights),
                            features)


def _checked_ids(feature_name, table, ids):
  """`ids` (dense, sparse or ragged), failing the request if one is out of range."""
  def check(values):
    return check_ids(feature_name, table.name, values, table.vocabulary_size)
  if isinstance(ids, tf.SparseTensor):
    return tf.SparseTensor(ids.indices, check(ids.values), ids.dense_shape)
  if isinstance(ids, tf.RaggedTensor):
    return ids.with_flat_values(check(ids.flat_values))
  return check(ids)


def _check_integer_ids(spec, feature_spec):
  """Refuses a `feature_spec` that parses an embedding feature as other than
  integer ids: the mid-level lookup does not apply a column's string-to-id
  mapping (every request would fail)."""
  for feature in spec.embedding_layout().features:
    parsed = feature_spec.get(feature.name)
    if parsed is not None and not parsed.dtype.is_integer:
      raise ValueError(
          'Feature {}: feature_spec parses it as {}, but the mid-level lookup '
          'takes integer ids (its column\'s vocabulary or hashing is not '
          'applied). Parse the ids the column maps the strings to, or serve '
          'with TPUEstimator.export_saved_model, whose columns map them.'
          .format(feature.name, parsed.dtype.name))


def _restore_tables(embedding, spec, checkpoint):
  """Loads `embedding`'s tables from a mid-level checkpoint, or a legacy one."""
  prefix = checkpoint_conversion.checkpoint_prefix(checkpoint)
  if checkpoint_conversion.is_mid_level_checkpoint(prefix):
    status = tf.train.Checkpoint(embedding=embedding).read(prefix)
    embedding.embedding_tables  # pylint: disable=pointless-statement  (builds them)
    status.assert_existing_objects_matched()
    return
  values = checkpoint_conversion.legacy_table_values(spec, prefix)
  for table, variable in embedding.embedding_tables.items():
    variable.assign(values[table.name])


def export_mid_level_saved_model(export_dir: str, spec: Any, dense_model: Any,
                                 feature_spec: Mapping[str, Any],
                                 checkpoint: str) -> MidLevelServingModel:
  """Writes a TF2 SavedModel: CPU embedding lookup + `dense_model`; returns its model.

  The `serving_default` signature takes serialized `tf.Example`s (`examples`).
  A request with an id outside its table's vocabulary fails, naming the
  feature.  `tf.saved_model.load(export_dir)` loads it.

  Args:
    export_dir: where to write the SavedModel.
    spec: the `EmbeddingConfigSpec` (its `to_mid_level()` configs are served).
    dense_model: trackable callable `(activations, features) -> {name: tensor}`
      (e.g. a `tf.Module` or Keras model holding the trained dense weights).
    feature_spec: `tf.io.parse_example` spec of the request's `tf.Example`s;
      the embedding features must parse as integer ids (the mid-level lookup
      applies no vocabulary or hashing).
    checkpoint: the tables: a mid-level or legacy checkpoint prefix or model_dir.

  Returns:
    The `MidLevelServingModel` saved (a `tf.Module`: the
    `TPUEmbeddingForServing` as `embedding`, then `dense_model`).

  Raises:
    ValueError: `feature_spec` parses an embedding feature as other than
      integers.
    CheckpointConversionError: no checkpoint at `checkpoint`, or (legacy) a
      table missing, ambiguous or of another shape.
    NotImplementedError: an optimizer without a mid-level twin
      (`EmbeddingConfigSpec.to_mid_level`).
  """
  _check_integer_ids(spec, feature_spec)
  model = MidLevelServingModel(spec, dense_model)
  _restore_tables(model.embedding, spec, checkpoint)

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name='examples')])
  def serve_examples(examples):
    return model(tf.io.parse_example(examples, feature_spec))

  tf.saved_model.save(model, export_dir,
                      signatures={'serving_default': serve_examples})
  return model
