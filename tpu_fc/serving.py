"""Export with CPU lookup: a SavedModel whose embedding lookups run on the host.

Two forms.  `export_saved_model` (behind `TPUEstimator.export_saved_model`): the
PREDICT graph is built with every embedding column looking up on the CPU,
whatever its training lookup device (tables restored from the checkpoint under their
legacy names), and written with `tf.compat.v1.saved_model.Builder` into a timestamped
directory, as Estimator does: serving signatures from the spec's `export_outputs`
(default `serving_default`: the predictions).  `export_mid_level_saved_model`:
the form a fully migrated model has, a TF2 object SavedModel of a
`TPUEmbeddingForServing` (tables restored from a mid-level or legacy checkpoint)
followed by the migrated dense model.
"""
import os
import tempfile

from tpu_fc import _tf_internals as internals
from tpu_fc import checkpoint_conversion
from tpu_fc._tf import tf
from tpu_fc.estimator import checkpoints
from tpu_fc.estimator.spec import ModeKeys
from tpu_fc.lookup.embedding_core import check_ids


def export_saved_model(build_predict, export_dir_base, serving_input_receiver_fn,
                       checkpoint_path, assets_extra=None, as_text=False,
                       random_seed=None):
  """Writes the SavedModel; returns its directory (bytes, as Estimator does).

  Args:
    build_predict: `features -> EstimatorSpec` of the PREDICT graph (CPU lookup).
    export_dir_base: the parent of the timestamped export directory.
    serving_input_receiver_fn: `() -> ServingInputReceiver` (tpu_fc's or
      tensorflow_estimator's).
    checkpoint_path: the checkpoint whose values are exported.
    assets_extra: {destination relative path: source path} copied to
      `assets.extra`.
    as_text: write the SavedModel proto as text.
    random_seed: the graph seed (RunConfig.tf_random_seed).
  """
  export_dir = internals.get_timestamped_export_dir(export_dir_base)
  temp_dir = internals.get_temp_export_dir(export_dir)
  try:
    _write_saved_model(temp_dir, build_predict, serving_input_receiver_fn,
                       checkpoint_path, as_text, random_seed)
    _copy_assets_extra(temp_dir, assets_extra)
  except BaseException:
    # A retry in the same second would find it and fail: "already exists".
    if tf.io.gfile.exists(temp_dir):
      tf.io.gfile.rmtree(temp_dir)
    raise
  tf.io.gfile.rename(temp_dir, export_dir)
  return export_dir


def _write_saved_model(temp_dir, build_predict, serving_input_receiver_fn,
                       checkpoint_path, as_text, random_seed):
  """Builds the PREDICT graph, restores `checkpoint_path` and writes it to
  `temp_dir`."""
  with tf.Graph().as_default():
    tf.compat.v1.random.set_random_seed(random_seed)
    tf.compat.v1.train.get_or_create_global_step()
    receiver = serving_input_receiver_fn()
    spec = build_predict(receiver.features)
    export_outputs = internals.export_outputs_for_mode(
        ModeKeys.PREDICT, serving_export_outputs=spec.export_outputs,
        predictions=spec.predictions)
    signatures = internals.build_all_signature_defs(
        receiver.receiver_tensors, export_outputs,
        getattr(receiver, 'receiver_tensors_alternatives', None),
        serving_only=True)
    saver = spec.scaffold.saver
    if saver is None:
      checkpoints.check_restorable(
          checkpoint_path, internals.op_list_to_dict(
              tf.compat.v1.global_variables()))
      saver = tf.compat.v1.train.Saver(sharded=True)
    local_init = (spec.scaffold.local_init_op or
                  tf.compat.v1.train.Scaffold.default_local_init_op())
    with tf.compat.v1.Session() as session:
      try:
        saver.restore(session, checkpoint_path)
      except tf.errors.NotFoundError as e:
        raise ValueError(
            'Could not load all requested variables from checkpoint. Please '
            'make sure your model_fn does not expect variables that were not '
            'saved in the checkpoint.\n\nEncountered error with mode `{}` '
            'while restoring checkpoint from: `{}`. Full Traceback:\n\n{}'
            .format(ModeKeys.PREDICT, checkpoint_path, e)) from e
      builder = tf.compat.v1.saved_model.Builder(temp_dir)
      builder.add_meta_graph_and_variables(
          session, [tf.saved_model.SERVING], signature_def_map=signatures,
          assets_collection=tf.compat.v1.get_collection(
              tf.compat.v1.GraphKeys.ASSET_FILEPATHS),
          main_op=local_init, saver=saver, strip_default_attrs=True)
      builder.save(as_text)


def _copy_assets_extra(export_dir, assets_extra):
  for destination, source in (assets_extra or {}).items():
    target = os.path.join(tf.compat.as_bytes(export_dir),
                          tf.compat.as_bytes('assets.extra'),
                          tf.compat.as_bytes(destination))
    tf.io.gfile.makedirs(os.path.dirname(target))
    tf.io.gfile.copy(source, target)


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


def _restore_tables(embedding, spec, checkpoint):
  """Loads `embedding`'s tables from a mid-level checkpoint, or a legacy one."""
  prefix = checkpoint_conversion.checkpoint_prefix(checkpoint)
  if not checkpoint_conversion.is_mid_level_checkpoint(prefix):
    prefix = checkpoint_conversion.to_mid_level_checkpoint(
        spec, prefix, tempfile.mkdtemp(), fresh_slots=True)
  status = tf.train.Checkpoint(embedding=embedding).read(prefix)
  embedding.embedding_tables  # pylint: disable=pointless-statement  (builds them)
  status.assert_existing_objects_matched()


def export_mid_level_saved_model(export_dir, spec, dense_model, feature_spec,
                                 checkpoint):
  """Writes a TF2 SavedModel: CPU embedding lookup + `dense_model`; returns its model.

  Args:
    export_dir: where to write the SavedModel.
    spec: the `EmbeddingConfigSpec` (its `to_mid_level()` configs are served).
    dense_model: trackable callable `(activations, features) -> {name: tensor}`
      (e.g. a `tf.Module` or Keras model holding the trained dense weights).
    feature_spec: `tf.io.parse_example` spec of the request's `tf.Example`s.
    checkpoint: the tables: a mid-level or legacy checkpoint prefix or model_dir.

  The `serving_default` signature takes serialized `tf.Example`s (`examples`).
  """
  model = MidLevelServingModel(spec, dense_model)
  _restore_tables(model.embedding, spec, checkpoint)

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name='examples')])
  def serve_examples(examples):
    return model(tf.io.parse_example(examples, feature_spec))

  tf.saved_model.save(model, export_dir,
                      signatures={'serving_default': serve_examples})
  return model
