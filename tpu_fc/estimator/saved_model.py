"""`TPUEstimator.export_saved_model`: a SavedModel whose embedding lookups run on the host.

The PREDICT graph is built with every embedding column looking up on the CPU,
whatever its training lookup device (tables restored from the checkpoint under
their legacy names), and written with `tf.compat.v1.saved_model.Builder` into a
timestamped directory, as Estimator does: serving signatures from the spec's
`export_outputs` (default `serving_default`: the predictions).
"""
import os

from tpu_fc import _tf_internals as internals
from tpu_fc._tf import tf
from tpu_fc.estimator import checkpoints
from tpu_fc.estimator.model_fn import ModeKeys


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
            .format(ModeKeys.PREDICT, checkpoints.original_path(
                checkpoint_path), e)) from e
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
