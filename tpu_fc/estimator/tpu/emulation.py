"""`use_tpu=True` without a TPU: one TRAIN or EVAL step as the TPU would run it.

The spec's lookup backends (`tpu_fc.lookup.backends`) prepare the features over
the global batch: the host engine looks up every embedding-core feature,
tensor-core features are densified with their mask; the model_fn is built once
per emulated shard on its slice of the batch (`replication`); after it, the
engine applies the captured embedding gradients with the spec's optimizer.
Checkpoints keep the legacy names: tables and slots under the names the columns
recorded, dense variables under their own, TPU dummy variables left out.
"""
import functools

from tpu_fc._tf import tf
from tpu_fc import build_context
from tpu_fc import naming
from tpu_fc.estimator import model_fn
from tpu_fc.estimator.tpu import replication
from tpu_fc.estimator.tpu import tpu_estimator_spec
from tpu_fc.lookup import backends as lookup_backends
from tpu_fc.lookup import sparse_update

def infeed_scope():
  """The name scope of what the emulated TPU builds before a model_fn (lookups,
  per-shard slices, prediction padding): as TF's infeed and dataset functions,
  it takes no root name, so the model's scopes and variables get the names
  they get elsewhere (a root `sub` op would make a model named `Sub` `Sub_1`).
  """
  return tf.name_scope('tpu_fc_infeed')


def predict_padded(build, features, labels, batch_size):
  """The PREDICT graph as TPUEstimator builds it on a TPU: every feature (and
  label, which the model_fn gets too) padded with zeros to `batch_size`
  examples (a static batch, the last, short batch too), the predictions sliced
  back to the real examples.

  Args:
    build: `(features, labels) -> BuiltGraph` of the PREDICT model.
    features, labels: one batch of input_fn (a SparseTensor gets the batch in
      its dense shape, no entries; a RaggedTensor empty rows).
    batch_size: the batch an input_fn call gives the TPU's step.
  """
  leaves = [leaf for leaf in tf.nest.flatten(features)
            if isinstance(leaf, (tf.Tensor, tf.SparseTensor, tf.RaggedTensor))
            and leaf.shape.rank]
  if not leaves:
    return build(features, labels)
  with infeed_scope():
    real = tf.cast(replication.batch_size_of(leaves[0]), tf.int32)
    check = tf.debugging.assert_less_equal(
        real, batch_size,
        message='The real batch size should not be greater than batch_size.')
    with tf.control_dependencies([check]):
      missing = batch_size - real

    def padded(value):
      if isinstance(value, tf.SparseTensor):
        return tf.sparse.reset_shape(value, tf.concat(
            [[batch_size], value.dense_shape[1:]], axis=0))
      if isinstance(value, tf.RaggedTensor):  # empty rows
        splits = value.row_splits
        return tf.RaggedTensor.from_row_splits(value.values, tf.concat(
            [splits, tf.fill([missing], splits[-1])], axis=0))
      if not isinstance(value, tf.Tensor) or not value.shape.rank:
        return value
      result = tf.pad(value, [[0, missing]] + [[0, 0]] * (value.shape.rank - 1))
      result.set_shape([batch_size] + value.shape[1:])
      return result

    features, labels = tf.nest.map_structure(padded, (features, labels))
  built = build(features, labels)
  return built._replace(spec=built.spec._replace(
      predictions=tf.nest.map_structure(lambda prediction: prediction[:real],
                                        built.spec.predictions)))


def _check_static_shapes(features, labels, unchecked=()):
  """TF 2.15's check (`tpu_estimator.py`, `_validate_model_features_and_labels`,
  1975-2011): a TPU's infeed carries only statically shaped tensors.

  Run on what the model_fn receives, as TPUEstimator does before calling it on
  the TPU; the features named in `unchecked` are left out (embedding ids the
  TPU enqueues to its embedding engine, not to the model_fn).
  """
  for name, value in (('features', features), ('labels', labels)):
    items = (value.items() if isinstance(value, dict) else [(None, value)])
    for key, tensor in items:
      leaves = tf.nest.flatten(tensor) if key not in unchecked else []
      for leaf in leaves:
        if (leaf is not None and
            not tf.TensorShape(leaf.shape).is_fully_defined()):
          raise ValueError(
              'The {} to the model returned by input_fn must have static '
              'shape. Tensor: {}.{} A TPU (and its emulation) needs every '
              'dimension known: batch the Dataset with drop_remainder=True, '
              'or set the shape in input_fn.'.format(
                  name, leaf, '' if key is None else ' {} {!r} has shape '
                  '{}.'.format(name[:-1].capitalize(), key, leaf.shape)))


def _concat_shards(values):
  """Per-shard eval_metrics / host_call tensors (list or dict), joined on axis 0."""
  first = values[0]
  if isinstance(first, dict):
    return {k: tf.concat([v[k] for v in values], axis=0) for k in first}
  return [tf.concat(list(parts), axis=0) for parts in zip(*values)]


def _merged_spec(raw_specs, mode, loop_body, static_predictions=True):
  """Shard 0's spec, with `eval_metrics` / `host_call` tensors (and
  predictions) of all shards.

  As on a TPU, the host functions see each tensor concatenated over the shards
  along the batch axis, as do the predictions, and the loss is shard 0's (TF
  2.15's TPU loops run with `outputs_from_all_shards=False`).  In an in-graph
  loop (`loop_body`, see `loops.LoopBody`) scaffold_fn is left to run after
  the loop and an evaluation's metric_fn is recorded to be replayed outside
  it.  Predictions must have a static batch, as a TPU's, unless not
  `static_predictions` (the columns' lookups on the CPU give none, where a
  TPU's activations have one).
  """
  tpu_specs = [tpu_estimator_spec.as_tpu_estimator_spec(raw)
               for raw in raw_specs]
  if tpu_specs[0] is None:
    return _verified_estimator_spec(raw_specs[0], mode)
  if mode == model_fn.ModeKeys.PREDICT:
    tpu_specs[0] = tpu_specs[0]._replace(predictions=_concat_shards(
        [_verified_predictions(spec.predictions, static_predictions)
         for spec in tpu_specs]))
  if loop_body is not None and tpu_specs[0].scaffold_fn is not None:
    loop_body.scaffold_fns.append(tpu_specs[0].scaffold_fn)
    tpu_specs[0] = tpu_specs[0]._replace(scaffold_fn=None)
  if mode == model_fn.ModeKeys.TRAIN:  # metric_fn is for evaluation only
    tpu_specs[0] = tpu_specs[0]._replace(eval_metrics=None)
  field = 'eval_metrics' if mode == model_fn.ModeKeys.EVAL else 'host_call'
  host_call = getattr(tpu_specs[0], field)
  if host_call is None:
    return tpu_specs[0].as_estimator_spec()
  tensors = _concat_shards([getattr(spec, field)[1] for spec in tpu_specs])
  host_call = (_refusing_v1_summaries(host_call[0]), tensors)
  if mode == model_fn.ModeKeys.EVAL:
    host_call = (_refusing_non_pairs(host_call[0]), tensors)
  if loop_body is None:
    return tpu_specs[0]._replace(**{field: host_call}).as_estimator_spec()
  if mode == model_fn.ModeKeys.EVAL:
    host_call = (loop_body.metrics.recorded_host_call(*host_call), tensors)
  else:
    host_call = loop_body.host_call_on_its_steps(host_call)
  with loop_body.in_outer_name_scope():  # host_call's summary tags, as on a TPU
    return tpu_specs[0]._replace(**{field: host_call}).as_estimator_spec()


def _verified_estimator_spec(raw_spec, mode):
  """A model_fn's plain `EstimatorSpec`, as TPUEstimator takes it on a TPU.

  TF 2.15's `_verify_estimator_spec`: chief hooks are refused, the scaffold
  ignored (a TPU's scaffold comes from `scaffold_fn`); evaluation needs the
  TPU's metric_fn.  (Prediction takes it: tpu_fc predicts as on the CPU,
  where TF's TPU refused it, `docs/choices.md`.)
  """
  if mode == model_fn.ModeKeys.EVAL:
    raise RuntimeError(
        'estimator_spec used by TPU evaluation must have type'
        '`TPUEstimatorSpec`. Got {}'.format(type(raw_spec)))
  if raw_spec.training_chief_hooks:
    raise ValueError(
        'training_chief_hooks returned by EstimatorSpec is not supported in '
        'TPUEstimator.If you want to pass training hooks, please pass via '
        'training_hooks.')
  tf.compat.v1.logging.warn('EstimatorSpec.Scaffold is ignored by TPU '
                            'train/eval. Please use TPUEstimatorSpec.')
  return model_fn.to_estimator_spec(raw_spec)._replace(
      scaffold=tf.compat.v1.train.Scaffold())


def _verified_predictions(predictions, static=True):
  """TF 2.15's checks of a TPU's predictions (`tpu_estimator.py`,
  `_verify_tpu_spec_predictions`, 1960-1972): a dict of tensors whose batch
  is `static`."""
  if not isinstance(predictions, dict):
    raise TypeError('TPUEstimatorSpec.predictions must be dict of Tensors.')
  for key, tensor in predictions.items():
    if static and tf.compat.dimension_value(tensor.shape[0]) is None:
      raise ValueError(
          'The tensor with key ({}) in TPUEstimatorSpec.predictions has '
          'dynamic shape (should be static). Tensor: {}'.format(key, tensor))
  return predictions


# What a TPU's host_call refuses (TF 2.15's `CatchInvalidHostcallFunctions`).
_V1_SUMMARY_OPS = frozenset((
    'AudioSummary', 'AudioSummaryV2', 'HistogramSummary', 'ImageSummary',
    'MergeSummary', 'ScalarSummary', 'TensorSummary', 'TensorSummaryV2'))


def _refusing_v1_summaries(host_fn):
  """`host_fn`, raising TF's error if it makes a `tf.compat.v1.summary` op.

  On a TPU such a summary has no writer in the host loop; TF refuses it, in
  every loop length (tpu_fc's one-step runs could write it, its loops not).
  """
  @functools.wraps(host_fn)
  def refusing(*args, **kwargs):
    graph = tf.compat.v1.get_default_graph()
    ops_before = len(graph.get_operations())
    result = host_fn(*args, **kwargs)
    if any(op.type in _V1_SUMMARY_OPS
           for op in graph.get_operations()[ops_before:]):
      raise ValueError('Please use tf.contrib.summary instead of tf.summary '
                       'inside of host_calls.')
    return result

  return refusing


def _refusing_non_pairs(metric_fn):
  """`metric_fn`, raising TF's TypeError, explained, for a metric that is not
  a `(value, update_op)` pair (a Keras metric object).

  TF 2.15's TPU evaluation takes `v[0]` and `v[1]` of each metric
  (`tpu_estimator.py`, lines 3426-3428), so a Keras metric fails there
  (`'AUC' object is not subscriptable`); on the CPU, `EstimatorSpec` takes it.
  """
  @functools.wraps(metric_fn)
  def refusing(*args, **kwargs):
    metrics = metric_fn(*args, **kwargs)
    for name, metric in getattr(metrics, 'items', lambda: ())():
      if not (isinstance(metric, (tuple, list)) and len(metric) == 2):
        raise TypeError(
            "'{kind}' object is not subscriptable: metric_fn returned it for "
            "metric {name!r}. On a TPU (use_tpu=True, eval_on_tpu=True), a "
            'metric_fn returns a dict of name -> (value, update_op) pairs, '
            'e.g. from tf.compat.v1.metrics.*; TF 2.15\'s TPUEstimator fails '
            'the same way on a Keras metric object. Use such a pair (e.g. '
            'tf.compat.v1.metrics.auc), or evaluate on the CPU (use_tpu=False '
            'or eval_on_tpu=False), which takes Keras metrics.'.format(
                kind=type(metric).__name__, name=name))
    return metrics

  return refusing


def _localize_dummies(graph):
  """Makes the TPU dummy variables and their model-optimizer slots local.

  They only carry the activation gradients (always zero themselves), so they are
  not model state: not saved, and re-initialized whenever a session starts, also
  after a restore.
  """
  global_variables = graph.get_collection_ref(
      tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
  dummies = [v for v in global_variables if naming.is_dummy(v.op.name)]
  global_variables[:] = [v for v in global_variables
                         if not naming.is_dummy(v.op.name)]
  graph.get_collection_ref(tf.compat.v1.GraphKeys.LOCAL_VARIABLES).extend(
      dummies)


def _checkpoint_names(backends, graph):
  """Legacy checkpoint name -> variable: the backends' tables and slots, the
  model's variables under their own names."""
  names = {}
  for backend in backends:
    names.update(backend.checkpoint_variables(graph))
  owned = {id(part) for v in names.values()
           for part in sparse_update.table_parts(v)}
  for variable in tf.compat.v1.global_variables():
    if id(variable) not in owned:
      names[variable.op.name] = variable
  return names


def build(call_model_fn, features, labels, mode, backends, num_shards,
          batch_size, broadcast=False, aggregate_rows=None, loop_body=None):
  """The `BuiltGraph` of an emulated TPU step: TRAIN, EVAL or PREDICT (of a
  batch `predict_padded` pads).

  Args:
    call_model_fn: `(features, labels) -> model_fn result` for one shard, with
      the per-shard batch size in params.
    features, labels: the global batch from input_fn.  Like TPUEstimator,
      raises unless what the model_fn receives has static shapes (the
      features the backends look up aside).
    mode: a ModeKeys value.
    backends: the spec's lookup backends (`lookup.backends.backends_for`).
    num_shards: emulated TPU cores.
    batch_size: the mode's global batch size (TPUEstimator's train or eval
      batch size), the static batch of the activations, lengths and masks.
    broadcast: `InputPipelineConfig.BROADCAST`: every shard gets the whole
      batch (TPUEstimator refuses it with embedding features).
    aggregate_rows: the synchronous replicas' aggregation of the tables' row
      gradients (`EmbeddingBackend.apply_gradients`), or None.
    loop_body: the `loops.LoopBody` when the step is an in-graph loop's body.

  Returns:
    A `BuiltGraph` whose checkpoint names are the legacy ones (the backends'
    tables and slots under the names the columns recorded, the model's
    variables under their own) and whose `before_save` has the backends'.
  """
  tf.compat.v1.logging.log_first_n(
      tf.compat.v1.logging.WARN,
      'No TPU: tpu_fc emulates the TPU (embedding core on the host with the '
      'TPU update rules, model_fn per shard).', 1)
  training = mode == model_fn.ModeKeys.TRAIN
  graph = tf.compat.v1.get_default_graph()
  ops_before = len(graph.get_operations())
  steps, activations = [], [{} for _ in range(num_shards)]
  for backend in backends:
    backend.create_variables(training)
  with infeed_scope():
    for backend in backends:
      step, per_shard = backend.lookup(features, num_shards, batch_size)
      steps.append(step)
      for shard, values in zip(activations, per_shard):
        shard.update(values)
    model_features = lookup_backends.model_features(backends, features,
                                                    batch_size)
  _check_static_shapes(model_features, labels,
                      lookup_backends.embedding_feature_keys(backends))

  if not broadcast:  # each shard gets its slice of the batch
    with infeed_scope():
      split_features = replication.batch_splitter(model_features, num_shards,
                                                  'features')
      split_labels = replication.batch_splitter(labels, num_shards)

  def build_shard(shard):
    shard_features, shard_labels = model_features, labels
    if not broadcast:
      with infeed_scope():
        shard_features = split_features(shard)
        shard_labels = split_labels(shard)
    if activations[shard]:
      shard_features.update(activations[shard])
    with build_context.building(mode):
      return call_model_fn(shard_features, shard_labels)

  raw_specs = replication.replicate(
      build_shard, num_shards, [creator for backend in backends
                                for creator in backend.shared_table_creators()],
      training=training, sliced=not broadcast,
      in_tpu_context=mode != model_fn.ModeKeys.PREDICT)
  _localize_dummies(graph)
  # The tables exist before scaffold_fn runs (its Saver, init_from_checkpoint),
  # as TPUEstimator creates them first.
  checkpoint_names = _checkpoint_names(backends, graph)
  estimator_spec = _merged_spec(
      raw_specs, mode, loop_body, static_predictions=not (
          backends and lookup_backends.predicts_in_model_graph(backends)))
  if training:
    replication.global_step_read_at_step_start(graph, ops_before)
  if not training or not backends:
    return model_fn.BuiltGraph(estimator_spec, checkpoint_names)
  updates, hooks = [], list(estimator_spec.training_hooks)
  with tf.control_dependencies([estimator_spec.train_op]):
    for backend, step in zip(backends, steps):
      updates.append(backend.apply_gradients(step, aggregate_rows))
      hooks.extend(backend.training_hooks(step))
  return model_fn.BuiltGraph(
      estimator_spec._replace(
          train_op=tf.group(estimator_spec.train_op,
                            *[update for update in updates
                              if update is not None]),
          training_hooks=tuple(hooks)),
      checkpoint_names,
      before_save=tuple(build_op for build_op in (backend.before_save()
                                                  for backend in backends)
                        if build_op is not None))
