"""`Estimator.export_saved_model` and `experimental_export_all_saved_models`.

Each mode's graph is built by the estimator's exported model_fn (`TPUEstimator`'s
looks up every embedding on the CPU, whatever its training lookup device, tables
restored under their legacy names), restored from the checkpoint and written with
`tf.compat.v1.saved_model.Builder` into a timestamped directory, as Estimator does:
one meta graph per mode, tagged as TF tags it, one set of variables (the first
mode's, in the order TRAIN, EVAL, PREDICT), signatures from the spec's
`export_outputs` (PREDICT; default `serving_default`: the predictions) or its loss,
predictions and metrics (TRAIN, EVAL).
"""
import os

from tpu_fc import _tf_internals as internals
from tpu_fc._tf import tf
from tpu_fc.estimator import checkpoints
from tpu_fc.estimator.model_fn import ModeKeys

# The order in which modes are exported: the first saves the variables.
_MODES = (ModeKeys.TRAIN, ModeKeys.EVAL, ModeKeys.PREDICT)


def export_all_saved_models(build_model, export_dir_base, input_receiver_fn_map,
                            checkpoint_path, assets_extra=None, as_text=False,
                            random_seed=None, checkpoint_alias=None,
                            session_config=None):
  """Writes the SavedModel; returns its directory (bytes, as Estimator does).

  Args:
    build_model: `(features, labels, mode) -> EstimatorSpec` of a mode's graph.
    export_dir_base: the parent of the timestamped export directory.
    input_receiver_fn_map: {mode: `() -> receiver`}: a `ServingInputReceiver`
      (PREDICT) or `SupervisedInputReceiver` (TRAIN, EVAL), tpu_fc's or
      tensorflow_estimator's.
    checkpoint_path: the checkpoint whose values are exported.
    assets_extra: {destination relative path: source path} copied to
      `assets.extra`.
    as_text: write the SavedModel proto as text.
    random_seed: the graph seed (RunConfig.tf_random_seed).
    checkpoint_alias: `checkpoints.restored_names`' `alias`.
    session_config: the `ConfigProto` of the sessions restoring the
      checkpoint (the estimator's, as TF's: soft placement lets ops pinned to
      a device the machine lacks export).
  """
  modes = [mode for mode in _MODES if input_receiver_fn_map.get(mode)]
  if not modes:
    raise ValueError('No valid modes for exporting found. Got {}.'.format(
        input_receiver_fn_map.keys()))
  export_dir = internals.get_timestamped_export_dir(export_dir_base)
  temp_dir = internals.get_temp_export_dir(export_dir)
  try:
    builder = tf.compat.v1.saved_model.Builder(temp_dir)
    for mode in modes:
      _add_meta_graph(builder, build_model, input_receiver_fn_map[mode], mode,
                      checkpoint_path, mode == modes[0], random_seed,
                      checkpoint_alias, session_config)
    builder.save(as_text)
    _copy_assets_extra(temp_dir, assets_extra)
  except BaseException:
    # A retry in the same second would find it and fail: "already exists".
    if tf.io.gfile.exists(temp_dir):
      tf.io.gfile.rmtree(temp_dir)
    raise
  tf.io.gfile.rename(temp_dir, export_dir)
  return export_dir


def _add_meta_graph(builder, build_model, input_receiver_fn, mode,
                    checkpoint_path, save_variables, random_seed,
                    checkpoint_alias, session_config):
  """Builds `mode`'s graph, restores `checkpoint_path` and adds the graph
  (with the variables if `save_variables`) to `builder`."""
  with tf.Graph().as_default():
    tf.compat.v1.random.set_random_seed(random_seed)
    tf.compat.v1.train.get_or_create_global_step()
    receiver = input_receiver_fn()
    spec = build_model(receiver.features, getattr(receiver, 'labels', None),
                       mode)
    export_outputs = internals.export_outputs_for_mode(
        mode, serving_export_outputs=spec.export_outputs,
        predictions=spec.predictions, loss=spec.loss,
        metrics=spec.eval_metric_ops)
    signatures = internals.build_all_signature_defs(
        receiver.receiver_tensors, export_outputs,
        getattr(receiver, 'receiver_tensors_alternatives', None),
        serving_only=mode == ModeKeys.PREDICT)
    saver = restorer = spec.scaffold.saver
    if saver is None:
      renamed = checkpoints.renaming_saver(
          checkpoint_path, internals.op_list_to_dict(
              tf.compat.v1.global_variables()), checkpoint_alias)
      saver = tf.compat.v1.train.Saver(sharded=True)
      restorer = renamed or saver
    local_init = (spec.scaffold.local_init_op or
                  tf.compat.v1.train.Scaffold.default_local_init_op())
    with tf.compat.v1.Session(config=session_config) as session:
      try:
        restorer.restore(session, checkpoint_path)
      except tf.errors.NotFoundError as e:
        raise ValueError(
            'Could not load all requested variables from checkpoint. Please '
            'make sure your model_fn does not expect variables that were not '
            'saved in the checkpoint.\n\nEncountered error with mode `{}` '
            'while restoring checkpoint from: `{}`. Full Traceback:\n\n{}'
            .format(mode, checkpoints.original_path(checkpoint_path), e)
        ) from e
      internals.add_train_op(builder, spec.train_op)
      meta_graph = dict(
          tags=internals.EXPORT_TAG_MAP[mode], signature_def_map=signatures,
          assets_collection=tf.compat.v1.get_collection(
              tf.compat.v1.GraphKeys.ASSET_FILEPATHS),
          main_op=local_init, saver=saver, strip_default_attrs=True)
      if save_variables:
        builder.add_meta_graph_and_variables(session, **meta_graph)
      else:
        builder.add_meta_graph(**meta_graph)


def _copy_assets_extra(export_dir, assets_extra):
  for destination, source in (assets_extra or {}).items():
    target = os.path.join(tf.compat.as_bytes(export_dir),
                          tf.compat.as_bytes('assets.extra'),
                          tf.compat.as_bytes(destination))
    tf.io.gfile.makedirs(os.path.dirname(target))
    tf.io.gfile.copy(source, target)
