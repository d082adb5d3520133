"""`TPUEstimator`: TF 2.15's TPUEstimator on the Estimator driver.

`use_tpu=False` runs every mode's model_fn as a plain CPU graph, exactly as TF
2.15's `TPUEstimator(use_tpu=False)` did.  `use_tpu=True` emulates the TPU on
the host: TRAIN and EVAL build the model_fn once per shard around the spec's
lookup backends (`emulation`), in TF's in-graph loops (`loops`); PREDICT and
export look up on the CPU, as TPUEstimator's default lookup device does for
inference.  What it adds to the Estimator is in `_build_mode_graph` and the
hooks it overrides: batch sizes and `params['context']`, the TPU's checks, the
spec's tables split over a ps cluster's tasks (`_partitioned_tables`) and
updated through its synchronous replicas, failed input checks shown as their
message.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import math
import os
from typing import Any, Callable, Mapping

from tpu_fc._tf import tf
from tpu_fc import _tf_internals as internals
from tpu_fc import build_context
from tpu_fc import columns as columns_lib
from tpu_fc import naming
from tpu_fc.estimator import distributed
from tpu_fc.estimator import estimator
from tpu_fc.estimator import input_errors
from tpu_fc.estimator import model_fn as model_fn_lib
from tpu_fc.estimator import run_config
from tpu_fc.estimator.hooks import ExamplesPerSecondHook
from tpu_fc.estimator.model_fn import ModeKeys
from tpu_fc.estimator.tpu import emulation
from tpu_fc.estimator.tpu import input_pipeline
from tpu_fc.estimator.tpu import loops
from tpu_fc.estimator.tpu import replication
from tpu_fc.estimator.tpu import tpu_config
from tpu_fc.estimator.tpu import tpu_context
from tpu_fc.estimator.tpu.tpu_config import check_positive_integer
from tpu_fc.estimator.tpu.tpu_config import InputPipelineConfig
from tpu_fc.estimator.tpu.tpu_estimator_spec import HostCallHook
from tpu_fc.estimator.tpu.tpu_estimator_spec import to_estimator_spec
from tpu_fc.lookup import backends as lookup_backends
from tpu_fc.lookup import inputs as lookup_inputs

_BATCH_SIZE_KEY = 'batch_size'
_USE_TPU_KEY = 'use_tpu'
_CONTEXT_KEY = 'context'
_RESERVED_PARAMS_KEYS = [_BATCH_SIZE_KEY, _CONTEXT_KEY]
# TF 2.15's switch of the same name (`tpu_estimator.py` 107): True builds the
# TPU's infeed in a while loop, which refuses an input pipeline of queue
# runners; False (TF's default) warns of one.
_WRAP_INPUT_FN_INTO_WHILE_LOOP = False


def _check_arguments(tpu_config, params, use_tpu, train_batch_size,
                     eval_batch_size, predict_batch_size, eval_on_tpu,
                     embedding_config_spec):
  """TPUEstimator's constructor checks, in TF's order and words."""
  if params is not None and any(k in params for k in _RESERVED_PARAMS_KEYS):
    raise ValueError('{} are reserved keys but existed in params {}.'.format(
        _RESERVED_PARAMS_KEYS, params))
  if use_tpu:
    if train_batch_size is None:
      raise ValueError('`train_batch_size` cannot be `None`')
    check_positive_integer(train_batch_size, 'train_batch_size')
    if (tpu_config.per_host_input_for_training ==
        InputPipelineConfig.PER_SHARD_V1 and
        tpu_config.num_cores_per_replica):
      raise ValueError(
          'Model parallelism only supports per host input for training. '
          'Please adjust TPURunconfig.per_host_input_for_training.')
    for name, batch_size in (('eval_batch_size', eval_batch_size),
                             ('predict_batch_size', predict_batch_size)):
      if batch_size is not None:
        check_positive_integer(batch_size, name)
    if embedding_config_spec and tpu_config.per_host_input_for_training not in (
        InputPipelineConfig.PER_HOST_V1, InputPipelineConfig.PER_HOST_V2):
      raise ValueError('Only PER_HOST_V1 and PER_HOST_V2 is supported when '
                       'using TPU Embedding; got {}.'.format(
                           tpu_config.per_host_input_for_training))
  if (not (use_tpu and eval_on_tpu) and embedding_config_spec and
      getattr(embedding_config_spec, 'partition_strategy', None) == 'mod'):
    raise ValueError('Mod sharding of embedding tables not supported on '
                     'CPU.')


def _check_no_queue_runners():
  """TF 2.15's check of a TPU's input pipeline (`tpu_estimator.py`,
  `_validate_input_pipeline`, 1614-1636), after input_fn: queue runners are
  refused in an infeed loop (`_WRAP_INPUT_FN_INTO_WHILE_LOOP`), else warned
  of."""
  if tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.QUEUE_RUNNERS):
    message = ('Input pipeline contains one or more QueueRunners. It could be '
               'slow and not scalable. Please consider converting your input '
               'pipeline to use `tf.data` instead (see '
               'https://www.tensorflow.org/guide/datasets for instructions.')
    if _WRAP_INPUT_FN_INTO_WHILE_LOOP:
      raise RuntimeError(message)
    internals.tf_logging.warn(message)


def _warn_if_tpu_unused(cluster):
  """Warns when a TPU is there: tpu_fc emulates it (building logs that once)."""
  resolver = lookup_backends.tpu_cluster_resolver(cluster)
  if resolver is not None:
    tf.compat.v1.logging.warn(
        'A TPU was found (%s), but tpu_fc does not drive TPUs yet: TPU training '
        'and evaluation are emulated on the host. For TPU training, migrate the '
        'model to the mid-level API (migration_guide/).', resolver.master())


def _check_predict_ids_untransformed(features, embedding_config_spec):
  """Refuses ids an input_fn already transformed for the TPU, naming the feature.

  On the TPU, hash and vocabulary columns need integer ids, and TF's error says
  to transform them in the input_fn.  PREDICT looks up on the CPU through the
  feature columns, which transform the raw feature themselves (as the exported
  model does), so such ids would be transformed twice.
  """
  if not isinstance(features, dict):
    return
  for column in getattr(embedding_config_spec, 'feature_columns', None) or ():
    categorical = columns_lib.ids_column(column)
    value = features.get(getattr(categorical, 'key', None))
    if (getattr(categorical, 'dtype', None) == tf.string and
        value is not None and value.dtype.is_integer):
      raise ValueError(
          'Feature {} holds {} ids, but its column {} takes strings: with '
          'use_tpu=True, predict looks up on the CPU through the feature '
          'columns, which transform the raw feature themselves (as the '
          'exported model does). Give the raw feature in PREDICT mode: '
          'transform the ids for the TPU in TRAIN and EVAL only (e.g. in an '
          'input_fn that takes `mode`).'.format(
              categorical.key, value.dtype.name, categorical.name))


def _rate_log_cadence(iterations, log_step_count_steps):
  """(every_n_steps, every_n_secs) of TPUEstimator's progress logs, CPU or TPU.

  TF 2.15's: ceil(log_step_count_steps / iterations_per_loop), counting
  session runs (TPU loops) for the loss and global steps for the rates, or N
  seconds for an 'Ns' iterations_per_loop (`iterations`, parsed).
  """
  if iterations.unit == 'seconds':
    return None, iterations.value
  if log_step_count_steps is None:
    return None, None
  return int(math.ceil(log_step_count_steps / iterations.value)), None


@contextlib.contextmanager
def _partitioned_tables(embedding_config_spec, num_parts):
  """Creates the spec's tables inside as `num_parts` row-wise parts (div layout):
  the `<table>/part_N` variables TPUEstimator created in a ps cluster, part N
  and its optimizer slots on ps N (`distributed`'s ps strategy), so each ps
  applies the updates of its own rows.  Checkpoints hold each table as one
  variable saved in slices: they restore on one host.

  Only the tables are split; a table the model_fn already partitions keeps its
  partitioner.  Tables made with `get_variable` (the host engine, `input_layer`,
  shared columns) get the partitioner through a custom getter on the root
  variable scope, as Estimator users put one on their scope; those of Keras's
  `DenseFeatures`, which bypasses variable scopes, through a variable creator
  that builds them with `get_variable` instead.
  """
  layout = embedding_config_spec.embedding_layout()
  by_name = {naming.engine_table(table.name): table.initializer
             for table in layout.tables}
  by_column = [(feature.column, layout.table(feature.table).initializer)
               for feature in layout.features if feature.column is not None]
  partitioner = tf.compat.v1.fixed_size_partitioner(num_parts)
  graph = tf.compat.v1.get_default_graph()

  def initializer_of(name):
    """A table's initializer if variable `name` is one of the spec's tables,
    else None: the host engine's (`tpu_embedding/<table>`), and those the
    feature columns create on the CPU path, under any scope."""
    of_columns = (initializer for column, initializer in by_column
                  if naming.is_column_variable(name, column))
    return by_name.get(name, next(of_columns, None))

  def partitioning_getter(getter, name, *args, **kwargs):
    if initializer_of(name) is not None and kwargs.get('partitioner') is None:
      kwargs['partitioner'] = partitioner
    return getter(name, *args, **kwargs)

  def partitioning_creator(next_creator, **kwargs):
    name = '/'.join(part for part in (graph.get_name_scope(),
                                      kwargs.get('name')) if part)
    initializer = initializer_of(name) if kwargs.get('name') else None
    if initializer is None:
      return next_creator(**kwargs)
    with graph.name_scope(None):
      return internals.default_variable_store().get_variable(
          name, shape=kwargs['shape'], dtype=kwargs.get('dtype'),
          initializer=initializer, trainable=kwargs.get('trainable', True),
          partitioner=partitioner, use_resource=True)

  with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                   custom_getter=partitioning_getter), \
      tf.compat.v1.variable_creator_scope(partitioning_creator):
    yield


class TPUEstimator(estimator.Estimator):
  """Legacy `tf.compat.v1.estimator.tpu.TPUEstimator`, same constructor.

  model_fn and input_fn must take `params`: `params['batch_size']` is the
  mode's batch size as TF 2.15 gives it (when given) and model_fn's
  `params['use_tpu']` says whether the mode runs on TPU. model_fn may return
  `TPUEstimatorSpec` or `EstimatorSpec` (tpu_fc's or tensorflow_estimator's).

  With `use_tpu=False` every mode runs the model_fn once as a plain CPU graph,
  exactly as TF 2.15's `TPUEstimator(use_tpu=False)`: the columns are plain
  feature columns, the spec's optimizer is ignored, `params['batch_size']` is
  the global batch size.  With `use_tpu=True` (no TPU is driven: it is
  emulated on the host, logged once) training and evaluation run the model_fn
  once per emulated core (`TPUConfig.num_shards`, 1 if None) on its batch,
  `params['batch_size']` per core (per `TPUConfig.per_host_input_for_training`,
  as TF 2.15 deploys input_fn; `docs/emulation.md`), `params['context']` the
  emulated system; embedding-core columns give activations and the host
  engine trains their tables with the spec's optimizer and the TPU's update
  rules; `iterations_per_loop` steps run in one `session.run`.  Prediction
  and export look up on the CPU (prediction's model_fn per core, as on a
  TPU).

  Its `config` has `log_step_count_steps` None, as TF's (its own hooks log).
  Its `model_fn`, and every export, runs the model as TF 2.15's exports it:
  on the CPU, `params['use_tpu']` False, no `params['batch_size']`, a
  `TPUEstimatorSpec` turned into its `EstimatorSpec`, every embedding looked
  up on the CPU from the trained tables, whatever the columns' training
  lookup device.  An export with `export_to_tpu=True` adds no TPU meta graph
  without a TPU (logged); one with both `export_to_cpu` and `export_to_tpu`
  False raises a `ValueError`.

  Args:
    model_fn: `(features, labels, mode, params[, config]) ->
      TPUEstimatorSpec` (or `EstimatorSpec`); it must take `params`.
    model_dir: where checkpoints, summaries and evaluations go (a `pathlib`
      path too); None: `config`'s, else a new temporary directory.
    config: a `tpu_fc.RunConfig` (or TF 2.15's `tpu.RunConfig`, read
      attribute by attribute); required, as in TF 2.15.
    params: a dict (or HParams) deep-copied into every model_fn and input_fn
      call; its keys `batch_size` and `context` are the estimator's.
    use_tpu: see above.
    train_batch_size: the global training batch size (all cores); required
      with `use_tpu=True`, divisible by the cores.
    eval_batch_size: the global evaluation batch size; required for
      evaluation on the emulated TPU.
    predict_batch_size: the global prediction batch size; required for
      prediction with `use_tpu=True`, divisible by the cores (but under
      `BROADCAST`).
    batch_axis: TF's per-feature batch dimensions for sharding; accepted, not
      read: the emulated cores split each input along its first dimension.
    eval_on_tpu: False evaluates on the CPU with `use_tpu=True` (a plain
      graph, as with `use_tpu=False`, reading the TPU-trained tables);
      ignored (logged) with `use_tpu=False`.
    export_to_tpu: TF's: add a TPU meta graph to the export; there is none
      without a TPU (logged).
    export_to_cpu: TF's: export the CPU (serving) graph; one of the two must
      be True.
    warm_start_from: a checkpoint (or its directory, or a SavedModel) path,
      or `tf.estimator.WarmStartSettings`, initializing a training that has
      no checkpoint yet.
    embedding_config_spec: the `EmbeddingConfigSpec` of the model's TPU
      embedding columns (or dict configs); None: a model without TPU
      embeddings.
    export_saved_model_api_version: 1 or 2 (or TF's enum), as TF 2.15 takes
      it; it shapes only a TPU meta graph, which no export here writes.

  Raises:
    ValueError: no `config` or one without a `tpu_config`; the model_fn's
      arguments (no `features` or `params`, an argument Estimator does not
      pass); `params` holding `batch_size` or `context`; `model_dir` other
      than `config`'s; with `use_tpu=True`, no `train_batch_size`, a batch
      size <= 0, an `embedding_config_spec` with an input pipeline other than
      `PER_HOST_V1` / `PER_HOST_V2`, or `PER_SHARD_V1` with
      `num_cores_per_replica`; `partition_strategy='mod'` evaluated on the
      CPU; `num_shards=1` with an `embedding_config_spec`; an
      `export_saved_model_api_version` other than 1 or 2; a
      `warm_start_from` of another type.
    TypeError: no `model_fn` (None is TF's default, but required), a batch
      size that is no int, or a `tpu_config` that is no `TPUConfig`.
  """

  def __init__(self,
               model_fn: Callable[..., Any] | None = None,
               model_dir: str | os.PathLike | None = None,
               config: tpu_config.RunConfig | None = None,
               params: Mapping[str, Any] | None = None,
               use_tpu: bool = True,
               train_batch_size: int | None = None,
               eval_batch_size: int | None = None,
               predict_batch_size: int | None = None,
               batch_axis: Any = None,
               eval_on_tpu: bool = True,
               export_to_tpu: bool = True,
               export_to_cpu: bool = True,
               warm_start_from: Any = None,
               embedding_config_spec: Any = None,
               export_saved_model_api_version: Any = 1):
    config = tpu_config.coerce_run_config(config)
    # (TF's enum or 1 / 2; it shapes only the TPU meta graph of an export,
    # which no TPU here writes.)
    if getattr(export_saved_model_api_version, 'value',
               export_saved_model_api_version) not in (1, 2):
      raise ValueError('export_saved_model_api_version should be 1 or 2; '
                       'got {}.'.format(export_saved_model_api_version))
    _check_arguments(config.tpu_config, params, use_tpu, train_batch_size,
                     eval_batch_size, predict_batch_size, eval_on_tpu,
                     embedding_config_spec)
    estimator.verify_model_fn_args(model_fn, params)
    # Progress is logged by this class's hooks, so, as in TF, the config that
    # model_fn sees has log_step_count_steps=None.  The emulated TPU turns
    # Grappler's table-copying rewrite off; with `use_tpu=False` TF's graph
    # runs with TF's session defaults, so its numbers are TF 2.15's to the bit
    # (the rewrite also reorders dense arithmetic).
    self._log_step_count_steps = config.log_step_count_steps
    config = config.replace(log_step_count_steps=None)
    if use_tpu:
      config = config.replace(session_config=run_config.without_table_copy_rewrite(
          config.session_config or run_config.default_session_config()))
    super().__init__(model_fn, model_dir, config, params, warm_start_from)

    iterations = tpu_config.parse_iterations_per_loop(
        config.tpu_config.iterations_per_loop)
    self._log_every_n_steps, self._log_every_n_secs = _rate_log_cadence(
        iterations, self._log_step_count_steps)
    # The steps of a TPU's training loop, or None for a time-based
    # iterations_per_loop: its loops' lengths vary.
    self._steps_per_tpu_loop = (iterations.value if iterations.unit == 'count'
                                else None)

    tpu_config_ = config.tpu_config
    if tpu_config_.num_shards == 1 and tpu_config_.num_cores_per_replica is None:
      if embedding_config_spec is not None:
        raise ValueError('Setting TPUConfig.num_shards==1 is unsupported '
                         'when embedding_config_spec is not None.')
      tf.compat.v1.logging.warn(
          'Setting TPUConfig.num_shards==1 is an unsupported behavior. '
          'Please fix as soon as possible (leaving num_shards as None.)')
    tf.compat.v1.logging.info('_TPUContext: eval_on_tpu %s', eval_on_tpu)
    if use_tpu:
      _warn_if_tpu_unused(config.cluster)
    if not use_tpu and eval_on_tpu:
      tf.compat.v1.logging.warn('eval_on_tpu ignored because use_tpu is False.')

    self._use_tpu = use_tpu
    self._eval_on_tpu = eval_on_tpu
    self._batch_sizes = {
        ModeKeys.TRAIN: train_batch_size,
        ModeKeys.EVAL: eval_batch_size,
        ModeKeys.PREDICT: predict_batch_size,
    }
    # Kept as TF keeps it; the emulation splits inputs along their first axis.
    self._export_to_tpu = export_to_tpu
    self._export_to_cpu = export_to_cpu
    self._embedding_config_spec = embedding_config_spec
    # The emulated system, under TF's name of TPUEstimator's context of it.
    self._ctx = tpu_context.EmulatedSystem(self._config)

  def _check_model_fn_args(self, model_fn, params):
    """Checked before the config's checks, after the TPU's (TF's order)."""

  # Export --------------------------------------------------------------------

  def _check_export(self, input_receiver_fn_map):
    """TF's checks and warnings (`tpu_estimator.py`, lines 2868-2917);
    `export_to_tpu` adds a TPU meta graph to PREDICT's only on a TPU system:
    without one it is skipped (logged)."""
    if not (self._export_to_cpu or self._export_to_tpu):
      raise ValueError('One of export_to_cpu and export_to_tpu must be true.')
    if not self._export_to_tpu:
      return
    for mode in input_receiver_fn_map:
      if mode != ModeKeys.PREDICT:
        tf.compat.v1.logging.warn(
            'TPUEstimator only handles mode PREDICT for exporting when '
            '`export_to_tpu` is `True`; Mode {} will be ignored for TPU.'
            .format(mode))
    if ModeKeys.PREDICT in input_receiver_fn_map:
      tf.compat.v1.logging.warn(
          'No TPU: export_to_tpu=True writes no TPU meta graph here; the '
          'SavedModel has the CPU (serving) graph only.')

  def _model_fn_as_exported(self, features, labels, mode, config):
    """As TF's TPUEstimator exports (and its `model_fn` calls) the model_fn:
    on the CPU, `params['use_tpu']` False, no batch size (`tpu_estimator.py`,
    `_augment_model_fn`'s export mode, lines 3157-3201, and
    `_call_model_fn`, 2014-2076).  PREDICT looks up every embedding on the
    CPU, its ids cut as a TPU enqueues them."""
    params = self._params_for(None, use_tpu=False)  # serving batches vary
    if mode == ModeKeys.PREDICT:
      with emulation.infeed_scope():
        features = lookup_backends.model_features(
            self._backends(mode, on_tpu=self._use_tpu, serving=True),
            features, None)
    with build_context.building(mode), replication.one_replica():
      return to_estimator_spec(self._call_model_fn(
          features, labels, mode, config, params))

  # Modes ---------------------------------------------------------------------

  # train, evaluate and predict: Estimator's (whose signatures they show), with
  # TPUEstimator's docs, a failed input check of the emulated TPU shown as its
  # message alone (`inputs.input_check`; in training also an
  # `InMemoryEvaluatorHook`'s).

  @functools.wraps(estimator.Estimator.train, assigned=(), updated=())
  def train(self, *args, **kwargs):
    """Trains from the latest checkpoint in model_dir (or from scratch).

    `steps` more steps, up to global step `max_steps`, or until input ends.
    On a ps task of a cluster, serves variables instead, until stopped (where
    TF raised, so that one script can run on every task); on an evaluator
    task, raises as TF did (`train_and_evaluate` evaluates there).

    Without a checkpoint, warm-starts from `warm_start_from` if given.  One
    run trains a (local) model_dir at a time: a second fails at once instead
    of overwriting the first's checkpoints.  A failed step loses no
    checkpoint.
    Bad input fails the step with an error naming the feature
    (`docs/bad_input.md`).

    Args:
      input_fn: `(params[, mode, config, input_context]) -> Dataset` of
        `(features, labels)` (or `features, labels` tensors); it must take
        `params` (`params['batch_size']`, and on the emulated TPU
        `params['context']`).
      hooks: `tf.compat.v1.train.SessionRunHook`s of this training.
      steps: how many steps to train this call (a positive int); None: until
        `max_steps` or the input's end.
      max_steps: the global step to stop at (a positive int); training that
        already reached it returns at once.  Not with `steps`.
      saving_listeners: `tf.compat.v1.train.CheckpointSaverListener`s called
        around each checkpoint save (need a checkpoint interval).

    Returns:
      This estimator.

    Raises:
      ValueError: on an evaluator task; both `steps` and `max_steps`, or one
        <= 0; listeners without checkpoint saving; the model_fn's or
        input_fn's arguments (they must take `params`; labels given to a
        model_fn without `labels`); a spec the mode cannot run; on the
        emulated TPU (TF's checks, before input_fn), neither `steps` nor
        `max_steps` or a batch not divisible by the cores, and (after it)
        an input of unknown static shape, `input_partition_dims` that do
        not fit it, or, under TF1 control flow, no cross-replica sum on
        several cores.
      TypeError: a hook or listener of another type; on the emulated TPU,
        `steps` or `max_steps` not an int.
      RuntimeError: another run is training this model_dir; on the emulated
        TPU, an input of queue runners where TF's switch
        `_WRAP_INPUT_FN_INTO_WHILE_LOOP` refuses them.
      NotImplementedError: on the emulated TPU, `num_cores_per_replica` > 1
        (model parallelism, not emulated).
      PermissionError: `model_dir` is not writable.
    """
    with input_errors.explained(lookup_inputs.failed_check):
      return super().train(*args, **kwargs)

  @functools.wraps(estimator.Estimator.evaluate, assigned=(), updated=())
  def evaluate(self, *args, **kwargs):
    """Evaluates `steps` batches (None: until input ends) of a checkpoint.

    Returns the metrics dict with `loss` and `global_step`; summaries go to
    `eval_dir(name)`.

    The checkpoint is held while it is read, so a trainer's
    `keep_checkpoint_max` cannot delete it meanwhile.  Without a checkpoint,
    the model is evaluated as initialized (logged).  On the emulated TPU
    (`use_tpu=True`, `eval_on_tpu=True`) it runs all `steps` in one
    `session.run`, metrics over all shards, with no table update.

    Args:
      input_fn: as in `train`.
      steps: batches to evaluate (a positive int); None: until the input
        ends.  The emulated TPU needs it.
      hooks: `tf.compat.v1.train.SessionRunHook`s of this evaluation.
      checkpoint_path: the checkpoint to evaluate; None: the latest.
      name: the evaluation's name, for evaluations on several data sets
        (summaries in `eval_dir(name)`); None: the default.

    Returns:
      Metric name -> value: the `eval_metric_ops` (or the `metric_fn`'s)
      metrics, `loss` (its mean over the batches) and `global_step`.

    Raises:
      ValueError: `steps` <= 0 (on the emulated TPU also None, and, before
        input_fn, no `eval_batch_size` or one not divisible by the cores),
        `checkpoint_path` not a checkpoint, and `train`'s checks of the
        model_fn and input_fn.
      TypeError: a hook of another type; on the emulated TPU, `steps` not an
        int.
      RuntimeError: on the emulated TPU, a model_fn returning an
        `EstimatorSpec` (evaluation there needs a `TPUEstimatorSpec`).
      PermissionError: `eval_dir(name)` is not writable.
    """
    with input_errors.explained(lookup_inputs.failed_check):
      return super().evaluate(*args, **kwargs)

  @functools.wraps(estimator.Estimator.predict, assigned=(), updated=())
  def predict(self, *args, **kwargs):
    """Yields predictions (dicts, or the tensor's values) until input ends.

    A generator: it builds, restores and raises when first iterated.  With
    `use_tpu=True` it looks up on the CPU, as TF's default lookup device does
    for inference, pads each input batch to `predict_batch_size` (dropping
    the padding's predictions) and runs the model_fn per emulated core on its
    slice, features and labels, as a TPU does (under `PER_HOST_V2` once per
    core's batch).

    Args:
      input_fn: as in `train`; labels it returns are ignored but on the
        emulated TPU, whose model_fn gets them.
      predict_keys: the keys of a predictions dict to compute; None: all.
      hooks: `tf.compat.v1.train.SessionRunHook`s of this prediction.
      checkpoint_path: the checkpoint to predict with; None: the latest (none:
        the model as initialized, logged).
      yield_single_examples: True: one example at a time (each tensor split
        along its first dimension); False: whole batches.

    Yields:
      Per example (or batch): a dict of the predictions' values, or the value
      of a single predictions tensor.

    Raises:
      ValueError: `predict_keys` with non-dict predictions or naming none of
        them, predictions of different batch sizes (single examples),
        `checkpoint_path` not a checkpoint, and `train`'s checks of the
        model_fn and input_fn; on the emulated TPU, no `predict_batch_size`
        or one not divisible by the cores, an input of unknown static shape
        (besides the batch), or a `TPUEstimatorSpec`'s predictions of
        unknown batch.
      TypeError: a hook of another type; on the emulated TPU, a
        `TPUEstimatorSpec`'s predictions that are no dict.
      NotImplementedError: on the emulated TPU, `num_cores_per_replica` > 1.
    """
    with input_errors.explained(lookup_inputs.failed_check):
      yield from super().predict(*args, **kwargs)

  # Training ------------------------------------------------------------------

  def _check_training_steps(self, steps, max_steps):
    """TF's checks on a TPU, before input_fn: the configuration, then the
    steps (`tpu_estimator.py` 2967-2987)."""
    if self._running_on_cpu(ModeKeys.TRAIN):
      return
    self._check_tpu_configuration(ModeKeys.TRAIN)
    if steps is None and max_steps is None:
      raise ValueError('For TPU training, one of `steps` or `max_steps` must '
                       'be set. Cannot be both `None`.')
    if steps is not None:
      check_positive_integer(steps, 'Train steps')
    if max_steps is not None:
      check_positive_integer(max_steps, 'Train max_steps')

  def _stop_hooks(self, built, steps, max_steps):
    """Estimator's, and for an in-graph loop the hook feeding its length."""
    hooks = super()._stop_hooks(built, steps, max_steps)
    if hooks and built.loop_iterations is not None:
      hooks.append(loops.LoopIterationsHook(
          built.loop_iterations, built.steps_per_run, steps, max_steps))
    return hooks

  def _with_progress_logging(self, built):
    """The spec with the hooks logging loss, step and rates, as TF placed them.

    On CPU, exactly TF 2.15's TPUEstimator(use_tpu=False): its rates after
    the model's hooks and no loss line (it turned Estimator's off).  On the
    emulated TPU, as
    TPUEstimator on a TPU: both before the model's hooks, the loss with the
    step the loop ended at every ceil(log_step_count_steps /
    iterations_per_loop) loops (every N seconds for an 'Ns' loop).
    """
    spec = built.spec
    rates = self._rate_hooks(built.steps_per_run)
    if self._running_on_cpu(ModeKeys.TRAIN):
      return spec._replace(training_hooks=spec.training_hooks + rates)
    if not rates:
      return spec
    every_n_runs = self._log_every_n_steps
    if every_n_runs is not None:  # loops, whether or not one run makes a loop
      every_n_runs *= self._steps_per_tpu_loop // built.steps_per_run
    with tf.control_dependencies([spec.train_op]):
      step = tf.compat.v1.train.get_global_step().read_value()
    loss_logging = tf.compat.v1.train.LoggingTensorHook(
        {'loss': spec.loss, 'step': step}, every_n_iter=every_n_runs,
        every_n_secs=self._log_every_n_secs)
    return spec._replace(
        training_hooks=(loss_logging,) + rates + spec.training_hooks)

  def _rate_hooks(self, steps_per_run):
    """TPUEstimator's global_step/sec and examples/sec hook, if it logs."""
    if self._log_every_n_steps is None and self._log_every_n_secs is None:
      return ()
    hook = ExamplesPerSecondHook(
        self._batch_sizes[ModeKeys.TRAIN],
        every_n_steps=self._log_every_n_steps,
        every_n_secs=self._log_every_n_secs,
        output_dir=(self._model_dir if self._config.save_summary_steps and
                    self._config.is_chief else None))
    internals.set_steps_per_run(hook, steps_per_run)
    return (hook,)

  # Evaluation ----------------------------------------------------------------

  def _check_evaluation_steps(self, steps):
    """TF's checks on a TPU, before input_fn: the configuration, then the
    steps evaluation needs (`tpu_estimator.py` 2989-3000)."""
    if not self._running_on_cpu(ModeKeys.EVAL):
      self._check_tpu_configuration(ModeKeys.EVAL)
      if steps is None:
        raise ValueError(
            'Evaluate `steps` must be set on TPU. Cannot be `None`.')
      check_positive_integer(steps, 'Eval steps')

  # Graphs --------------------------------------------------------------------

  def _build_mode_graph(self, mode, inputs, sync, eval_steps):
    """The model of `mode`: a plain CPU graph, or the emulated TPU's step,
    `iterations_per_loop` (training) or all `eval_steps` (evaluation) of them
    in an in-graph loop when the input gives a new batch each step."""
    iterations = (self._loop_iterations(mode, eval_steps)
                  if inputs.next_batch_per_step else 1)
    build_step = lambda f, l, loop_body: self._build_model(f, l, mode, sync,
                                                           loop_body)
    every_n_steps = (
        self._config.tpu_config.experimental_host_call_every_n_steps)
    if iterations > 1 and mode == ModeKeys.TRAIN:
      built = loops.training_loop(build_step, inputs.next_batch_per_step,
                                  iterations, every_n_steps)
    elif iterations > 1:
      built = loops.evaluation_loop(build_step, inputs.next_batch_per_step,
                                    iterations)
    else:
      built = self._build_model(*inputs.next_batch(), mode, sync)
      if mode == ModeKeys.TRAIN and not self._running_on_cpu(mode):
        built = built._replace(spec=built.spec._replace(training_hooks=[
            HostCallHook(hook.tensors, every_n_steps, self._steps_per_tpu_loop)
            if isinstance(hook, HostCallHook) else hook
            for hook in built.spec.training_hooks]))
    # The columns' record of their tables' names was read by the build: it
    # holds Python objects no checkpoint's meta graph can serialize.
    naming.forget_recorded_scopes(tf.compat.v1.get_default_graph())
    if mode == ModeKeys.PREDICT and not self._running_on_cpu(mode):
      # A TPU step predicts its cores' batches, joined (`tpu_estimator.py`,
      # 2297-2301); each run here predicts one of them (under PER_HOST_V2
      # a core's: 1016-1021).
      pipeline = self._deployment(mode)
      if pipeline.kind == input_pipeline.PER_HOST_V2:
        built = built._replace(runs_per_prediction_batch=pipeline.num_cores)
    return built

  @contextlib.contextmanager
  def _cluster_training(self, mode):
    """Estimator's, with the tables split over the ps tasks."""
    spec = self._embedding_config_spec
    partitioned = (spec is not None and mode == ModeKeys.TRAIN and
                   distributed.is_parameter_server_cluster(self._config))
    if (partitioned and self._config.sync_replicas and
        spec.pipeline_execution_with_tensor_core):
      raise ValueError(
          'RunConfig(sync_replicas=True) does not support '
          'pipeline_execution_with_tensor_core=True: its parked table updates '
          'cannot be aggregated across workers.')
    with (_partitioned_tables(spec, self._config.num_ps_replicas)
          if partitioned else contextlib.nullcontext()), \
        super()._cluster_training(mode) as sync:
      yield sync

  def _build_model(self, features, labels, mode, sync=None, loop_body=None):
    """Builds the model for `mode`; returns its `BuiltGraph`.

    `sync`: the `SyncReplicas` through which training updates the tables, or
    None; `loop_body`: the in-graph loop's, when the model is its body.

    On CPU (use_tpu=False, or eval with eval_on_tpu=False) the model_fn runs as a
    plain graph, exactly as TF 2.15's TPUEstimator(use_tpu=False) (but for
    the order of a step's global step reads and increment).  Otherwise the
    TPU is emulated (`emulation`): PREDICT looks up on the CPU, as
    TPUEstimator's default lookup device does for inference.
    """
    config = self.config
    if self._running_on_cpu(mode):
      tf.compat.v1.logging.info('Running %s on CPU/GPU', mode)
      graph = tf.compat.v1.get_default_graph()
      ops_before = len(graph.get_operations())
      with build_context.building(mode), replication.one_replica():
        spec = to_estimator_spec(self._call_model_fn(
            features, labels, mode, config,
            self._params_for(self._batch_sizes[mode], use_tpu=False)))
      # (a host_call's global step: its step's, as the hook runs it in the
      # step's session.run)
      replication.global_step_read_at_step_start(graph, ops_before)
      return model_fn_lib.BuiltGraph(spec)
    tpu_context.refuse_model_parallelism(
        self._config.tpu_config.num_cores_per_replica)
    backends = self._backends(mode, on_tpu=True)
    pipeline = self._deployment(mode)
    with self._ctx.with_mode(mode) as system:  # params['context'], as on a TPU
      params = self._params_for(pipeline.model_fn_batch_size, use_tpu=True,
                                context=tpu_context.TPUContext(system))
    call_model_fn = lambda f, l: self._call_model_fn(f, l, mode, config, params)
    if mode == ModeKeys.PREDICT:
      if lookup_backends.predicts_in_model_graph(backends):
        _check_predict_ids_untransformed(features, self._embedding_config_spec)
      # Each input batch is a TPU step's: padded, then split over the cores
      # as in training (one core's batch under PER_HOST_V2, the whole one
      # under BROADCAST); the model_fn gets the labels too (1929-1936).
      cores = pipeline.num_cores if pipeline.kind == input_pipeline.SPLIT else 1
      return emulation.predict_padded(
          lambda f, l: emulation.build(call_model_fn, f, l, mode, backends,
                                       cores, pipeline.input_fn_batch_size),
          features, labels, pipeline.input_fn_batch_size)
    return emulation.build(
        call_model_fn, features, labels, mode, backends, pipeline.num_cores,
        self._batch_sizes[mode], pipeline.kind == input_pipeline.WHOLE,
        aggregate_rows=sync.aggregate_rows if sync is not None else None,
        loop_body=loop_body)

  def _backends(self, mode, on_tpu, serving=False):
    """The lookup backends of a `mode` graph: the one dispatch of the driver."""
    return lookup_backends.backends_for(
        self._embedding_config_spec, mode, on_tpu,
        partitioned_tables=distributed.is_parameter_server_cluster(
            self._config), serving=serving)

  def _loop_iterations(self, mode, eval_steps=None):
    """Steps per session.run on the emulated TPU, in an in-graph loop.

    As on a TPU: training runs TPUConfig.iterations_per_loop steps, evaluation
    all its `steps`, with the graph's control flow (v1 or v2).  Elsewhere, for
    a time-based iterations_per_loop ('30s'), or while profiling lookups (the
    profiler reads each step's ids), or in a ps cluster (each step's variables
    and tokens go through the ps tasks), one step per run.
    """
    spec = self._embedding_config_spec
    if (mode == ModeKeys.PREDICT or self._running_on_cpu(mode) or
        distributed.is_parameter_server_cluster(self._config) or
        (spec is not None and spec.profile_data_directory)):
      return 1
    if mode == ModeKeys.EVAL:
      return eval_steps or 1
    return self._steps_per_tpu_loop or 1

  def _deployment(self, mode):
    """How input_fn feeds the emulated cores in `mode` (`input_pipeline`)."""
    return input_pipeline.deployment(self._config.tpu_config, mode,
                                     self._ctx.num_replicas,
                                     self._ctx.num_hosts,
                                     self._batch_sizes[mode])

  def _check_tpu_configuration(self, mode):
    """TF 2.15's checks of the configuration of `mode` on a TPU, in its order
    and words (`tpu_context.py`, `_validate_tpu_configuration`, 692-794):
    evaluation and prediction need their batch size, the cores split the
    batch (unless each takes all of it), and on several hosts evaluation and
    prediction need an input pipeline that feeds them all.  TF makes them
    before input_fn in training and evaluation, after input_fn's `params`
    check in prediction.  The emulated system has the `num_shards` cores, so
    TF's check of num_shards against the system's never fails here.
    """
    names = {ModeKeys.EVAL: ('eval_batch_size', '.evaluate'),
             ModeKeys.PREDICT: ('predict_batch_size', '.predict')}
    batch_size = self._batch_sizes[mode]
    if mode in names and batch_size is None:
      raise ValueError('{} in TPUEstimator constructor cannot be `None` if {} '
                       'is running on TPU.'.format(*names[mode]))
    pipeline = self._deployment(mode)
    if (pipeline.kind != input_pipeline.WHOLE and
        batch_size % pipeline.num_cores):
      raise ValueError('{} batch size {} must be divisible by number of '
                       'replicas {}'.format(
                           'predict' if mode == ModeKeys.PREDICT else mode,
                           batch_size, pipeline.num_cores))
    if mode in names and pipeline.num_hosts > 1 and not pipeline.broadcast:
      # (TF's third condition for prediction, PER_HOST_V2 with one replica,
      # cannot hold on several hosts of the emulated system's.)
      if mode == ModeKeys.EVAL and pipeline.kind == input_pipeline.PER_HOST_V2:
        tf.compat.v1.logging.warn('Running TPUEstimator.evaluate for input '
                                  'mode PER_HOST_V2 and num_hosts %d',
                                  pipeline.num_hosts)
      else:
        raise ValueError(
            'TPUEstimator{} is only supported under three conditions: 1. '
            'num_hosts=1; 2. BROADCAST mode; 3. PER_HOST_V2 mode{}. mode: {}; '
            'num_hosts: {}; num_replicas=1:{}'.format(
                names[mode][1], '' if mode == ModeKeys.EVAL else
                ' with num_replicas=1',
                self._config.tpu_config.per_host_input_for_training,
                pipeline.num_hosts, pipeline.num_cores))

  def _running_on_cpu(self, mode):
    return not self._use_tpu or (mode == ModeKeys.EVAL and
                                 not self._eval_on_tpu)

  def _params_for(self, batch_size, use_tpu=None, context=None):
    """A fresh copy of params with `batch_size` (unless None); `use_tpu` for
    model_fn calls (unless None) and `context` (unless None)."""
    params = copy.deepcopy(self._params)
    for key, value in ((_BATCH_SIZE_KEY, batch_size), (_USE_TPU_KEY, use_tpu),
                       (_CONTEXT_KEY, context)):
      if value is not None:
        estimator.add_item_to_params(params, key, value)
    return params

  def _call_input_fn(self, input_fn, mode):
    """TPUEstimator's checks, then input_fn called as the mode's input
    pipeline calls it (`input_pipeline`): on the emulated TPU, once per core
    (PER_SHARD_V1 training), once per host or once (a broadcast input), each
    step's batches joined in core order."""
    if 'params' not in internals.fn_args(input_fn):
      raise ValueError('input_fn ({}) does not include params argument, '
                       'required by TPUEstimator to pass batch size as '
                       'params["batch_size"]'.format(input_fn))
    if self._running_on_cpu(mode):
      if (mode != ModeKeys.TRAIN and
          self._config.tpu_config.eval_training_input_configuration ==
          InputPipelineConfig.SLICED):
        raise ValueError('Invalid TPUConfig `eval_training_input_configuration`'
                         ' value. SLICED mode only works on use_tpu = True.')
      return super()._call_input_fn(input_fn, mode)
    if mode == ModeKeys.PREDICT:  # (training and evaluation checked it)
      self._check_tpu_configuration(mode)
    pipeline = self._deployment(mode)
    if mode == ModeKeys.TRAIN and self._embedding_config_spec is not None:
      # TF builds the embedding config before its input pipeline calls input_fn
      # in training (`tpu_estimator.py` 3209-3217): a column error comes first.
      self._embedding_config_spec.embedding_layout()
    # Each call's batch size and a `context` saying which call it is, as TF
    # 2.15 gives them per input pipeline.
    calls = []
    for invocation in range(pipeline.input_fn_calls):
      call = pipeline.call(invocation)
      with self._ctx.with_mode(mode) as system, system.input_pipeline_of_host(
          call.host_id, pipeline.broadcast):
        params = self._params_for(
            pipeline.input_fn_batch_size,
            context=tpu_context.TPUContext(system, call))
        calls.append(pipeline.checked(
            self._invoke_input_fn(input_fn, mode, params, keep_labels=True)))
    _check_no_queue_runners()
    if self._config.tpu_config.input_partition_dims:
      input_pipeline.check_input_partition_dims(self._config.tpu_config,
                                                *calls[0].next_batch())
    # (a PREDICT step takes one batch of the input)
    return input_pipeline.per_step_input(
        calls, 1 if mode == ModeKeys.PREDICT else pipeline.batches_per_call)

  def _validate_features_in_predict_input(self, result):
    """None of Estimator's warning, as TF's TPUEstimator skips it."""

  def _input_fn_params(self, mode):
    """On the CPU: the mode's global batch size (`_call_input_fn` gives the
    emulated TPU's)."""
    return self._params_for(self._batch_sizes[mode])

  def _call_model_fn(self, features, labels, mode, config, params):
    """The Estimator's call; with use_tpu=True the CPU graphs (prediction,
    export, evaluation with eval_on_tpu=False) name the tables as the TPU's
    training recorded them, so they restore its checkpoints (with
    use_tpu=False every name is TF 2.15's CPU name)."""
    with (build_context.tables_named_as_on_tpu() if self._use_tpu else
          contextlib.nullcontext()):
      return super()._call_model_fn(features, labels, mode, config, params)

  def _checkpoint_alias(self, name):
    """A use_tpu=True model also restores a real TPU's checkpoints, whose TF2
    `DenseFeatures` tables TF named otherwise."""
    return naming.tf_tpu_layer_table_name(name) if self._use_tpu else None

  def _check_model_fn_without_params(self):
    raise ValueError('model_fn ({}) does not include params argument, '
                     'required by TPUEstimator to pass batch size as '
                     'params[\'batch_size\']'.format(self._model_fn))

