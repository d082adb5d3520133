"""`TPUEstimator`: TF 2.15's TPUEstimator driver rebuilt on TF core.

This module sequences modes: for each call it builds a fresh graph (global
step, input_fn, then the model through `TPUEstimator._build_model`, the one
seam where model graph construction happens) and hands the resulting spec to
`loops`, which runs the session. With use_tpu=False every mode runs the
model_fn as a plain CPU graph, exactly as TF 2.15's `TPUEstimator` did.
In a parameter-server cluster (`TF_CONFIG`, see `distributed`) training is
Estimator's between-graph replication: ps tasks serve variables, the chief and
the workers build the graph with a replica device setter and train on their
own server.
"""
import collections
import contextlib
import copy
import math
import os
import socket
import tempfile
import threading

from tpu_fc._tf import tf
from tpu_fc import _tf_internals as internals
from tpu_fc.estimator import checkpoints
from tpu_fc.estimator import distributed
from tpu_fc.estimator import loops
from tpu_fc.estimator import replication
from tpu_fc.estimator import saved_model
from tpu_fc.estimator import tpu_context
from tpu_fc.estimator import tpu_emulation
from tpu_fc.estimator.config import check_positive_integer
from tpu_fc.estimator.config import coerce_run_config
from tpu_fc.estimator.config import default_session_config
from tpu_fc.estimator.config import InputPipelineConfig
from tpu_fc.estimator.config import parse_iterations_per_loop
from tpu_fc.estimator.config import path_to_str
from tpu_fc.estimator.config import without_table_copy_rewrite
from tpu_fc.estimator.hooks import CheckpointInputPipelineHook
from tpu_fc.estimator.hooks import DatasetInitializerHook
from tpu_fc.estimator.hooks import ExamplesPerSecondHook
from tpu_fc.estimator.spec import ModeKeys
from tpu_fc.estimator.spec import to_estimator_spec
from tpu_fc import build_context
from tpu_fc import columns as columns_lib
from tpu_fc.lookup import backends as lookup_backends

_BATCH_SIZE_KEY = 'batch_size'
_USE_TPU_KEY = 'use_tpu'
_CONTEXT_KEY = 'context'
_RESERVED_PARAMS_KEYS = [_BATCH_SIZE_KEY, _CONTEXT_KEY]
# Times a reader chooses the latest checkpoint again when a trainer pruned the
# one it chose before reading it.
_PRUNED_CHECKPOINT_RETRIES = 3
_VALID_MODEL_FN_ARGS = frozenset(
    ['features', 'labels', 'mode', 'params', 'self', 'config'])


class WarmStartSettings(
    collections.namedtuple('WarmStartSettings', [
        'ckpt_to_initialize_from', 'vars_to_warm_start',
        'var_name_to_vocab_info', 'var_name_to_prev_var_name'
    ])):
  """`tf.compat.v1.train.warm_start` args (tf.estimator.WarmStartSettings)."""

  def __new__(cls,
              ckpt_to_initialize_from,
              vars_to_warm_start='.*',
              var_name_to_vocab_info=None,
              var_name_to_prev_var_name=None):
    if not ckpt_to_initialize_from:
      raise ValueError(
          '`ckpt_to_initialize_from` MUST be set in WarmStartSettings')
    return super(WarmStartSettings, cls).__new__(
        cls, ckpt_to_initialize_from, vars_to_warm_start,
        var_name_to_vocab_info or {}, var_name_to_prev_var_name or {})


def _warm_start_settings(warm_start_from):
  """A path (checkpoint, its directory or a SavedModel) or settings object."""
  if warm_start_from is None:
    return None
  if isinstance(warm_start_from, (str, bytes)):
    index = os.path.join(
        internals.saved_model_variables_dir(warm_start_from),
        'variables.index')
    if tf.io.gfile.exists(index):
      tf.compat.v1.logging.info('Warm-starting from a SavedModel')
      return WarmStartSettings(
          internals.saved_model_variables_path(warm_start_from))
    return WarmStartSettings(warm_start_from)
  if hasattr(warm_start_from, 'ckpt_to_initialize_from'):
    return WarmStartSettings(*(getattr(warm_start_from, field, None)
                               for field in WarmStartSettings._fields))
  raise ValueError('warm_start_from must be a string or a WarmStartSettings, '
                   'instead got {}'.format(type(warm_start_from)))


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
    if eval_batch_size is not None:
      check_positive_integer(eval_batch_size, 'eval_batch_size')
    if predict_batch_size is not None:
      check_positive_integer(predict_batch_size, 'predict_batch_size')
    if embedding_config_spec and tpu_config.per_host_input_for_training not in (
        InputPipelineConfig.PER_HOST_V1, InputPipelineConfig.PER_HOST_V2):
      raise ValueError('Only PER_HOST_V1 and PER_HOST_V2 is supported when '
                       'using TPU Embedding; got {}.'.format(
                           tpu_config.per_host_input_for_training))
  if (not (use_tpu and eval_on_tpu) and embedding_config_spec and
      getattr(embedding_config_spec, 'partition_strategy', None) == 'mod'):
    raise ValueError('Mod sharding of embedding tables not supported on '
                     'CPU.')


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
  columns = getattr(embedding_config_spec, 'feature_columns', None) or ()
  if not isinstance(features, dict):
    return
  for column in columns:
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


def _rate_log_cadence(iterations_per_loop, log_step_count_steps):
  """(every_n_steps, every_n_secs) of TPUEstimator's progress logs, CPU or TPU.

  TF 2.15's: ceil(log_step_count_steps / iterations_per_loop), counting
  session runs (TPU loops) for the loss and global steps for the rates, or N
  seconds for an 'Ns' iterations_per_loop.
  """
  iterations = parse_iterations_per_loop(iterations_per_loop)
  if iterations.unit == 'seconds':
    return None, iterations.value
  if log_step_count_steps is None:
    return None, None
  return int(math.ceil(log_step_count_steps / iterations.value)), None


def _verify_model_fn_args(model_fn, params):
  args = set(internals.fn_args(model_fn))
  if 'features' not in args:
    raise ValueError('model_fn (%s) must include features argument.' % model_fn)
  if params is not None and 'params' not in args:
    raise ValueError('model_fn (%s) does not include params argument, '
                     'but params (%s) is passed to Estimator.' %
                     (model_fn, params))
  if params is None and 'params' in args:
    tf.compat.v1.logging.warn(
        'Estimator\'s model_fn (%s) includes params '
        'argument, but params are not passed to Estimator.', model_fn)
  non_valid_args = list(args - _VALID_MODEL_FN_ARGS)
  if non_valid_args:
    raise ValueError('model_fn (%s) has following not expected args: %s' %
                     (model_fn, non_valid_args))


def _check_hooks_type(hooks):
  hooks = list(hooks or [])
  for hook in hooks:
    if not isinstance(hook, tf.compat.v1.train.SessionRunHook):
      raise TypeError('Hooks must be a SessionRunHook, given: {}'.format(hook))
  return hooks


def _check_listeners_type(saving_listeners):
  listeners = list(saving_listeners or [])
  for listener in listeners:
    if not isinstance(listener, tf.compat.v1.train.CheckpointSaverListener):
      raise TypeError(
          'saving_listeners must be a list of CheckpointSaverListener, '
          'given: {}'.format(listener))
  return listeners


def _add_item_to_params(params, key, value):
  if hasattr(params, 'set_hparam'):  # HParams-like params
    if key in params:
      params.set_hparam(key, value)
    else:
      params.add_hparam(key, value)
  else:
    params[key] = value


def _create_global_step(graph):
  """TPUEstimator's global step: an int64 resource variable."""
  if tf.compat.v1.train.get_global_step(graph) is not None:
    raise ValueError('"global_step" already exists.')
  with graph.as_default() as g, g.name_scope(None):
    return tf.compat.v1.get_variable(
        tf.compat.v1.GraphKeys.GLOBAL_STEP,
        shape=[],
        dtype=tf.dtypes.int64,
        initializer=tf.compat.v1.initializers.zeros(),
        trainable=False,
        use_resource=True,
        collections=[
            tf.compat.v1.GraphKeys.GLOBAL_VARIABLES,
            tf.compat.v1.GraphKeys.GLOBAL_STEP
        ])


class _Input(collections.namedtuple(
    '_Input', ['next_batch', 'hooks', 'from_dataset', 'next_batch_per_step'])):
  """What input_fn gave: `next_batch()` -> (features, labels); its hooks;
  whether it was a Dataset; and `next_batch_per_step`, whose every call takes
  a new batch (for an in-graph loop), or None where the input cannot."""


def _parse_input_fn_result(result):
  """The `_Input` of a Dataset, a pair or features alone.

  A Dataset's `next_batch` takes the next element at each call.  Tensors
  straight from one iterator's `get_next()` (as TF's tests write input_fns)
  are, like a TPU's infeed, a new batch each step of a loop: its
  `next_batch_per_step` asks the iterator again.
  """
  hooks = []
  from_dataset = isinstance(result, tf.data.Dataset)
  again = None
  if from_dataset:
    iterator = tf.compat.v1.data.make_initializable_iterator(result)
    hooks.append(DatasetInitializerHook(iterator))
    next_element = again = iterator.get_next
  else:
    next_element = lambda: result
    again = _get_next_again(result)

  def batch_of(next_element):
    def next_batch():
      element = next_element()
      if isinstance(element, (list, tuple)):
        if len(element) != 2:
          raise ValueError(
              'input_fn should return (features, labels) as a len 2 tuple.')
        return element[0], element[1]
      return element, None
    return next_batch

  return _Input(batch_of(next_element), hooks, from_dataset,
                batch_of(again) if again else None)


_GET_NEXT_OPS = ('IteratorGetNext', 'IteratorGetNextSync')


def _get_next_again(result):
  """For tensors computed from one iterator's `get_next()` by stateless ops
  (e.g. a SparseTensor's deserialization): a function building another
  `get_next()` of that iterator and those ops again, in `result`'s structure;
  else None."""
  leaves = tf.nest.flatten(result, expand_composites=True)
  if not all(isinstance(leaf, tf.Tensor) for leaf in leaves):
    return None
  get_next_ops, between = set(), {}
  pending = [leaf.op for leaf in leaves]
  while pending:
    op = pending.pop()
    if op.type in _GET_NEXT_OPS:
      get_next_ops.add(op)
    elif op.name not in between:
      if op.control_inputs or internals.is_stateful(op):
        return None
      between[op.name] = op
      pending.extend(tensor.op for tensor in op.inputs)
  if len(get_next_ops) != 1:
    return None
  get_next_op, = get_next_ops
  graph_def = tf.compat.v1.GraphDef()
  for op in sorted(between.values(), key=internals.creation_order):
    node = graph_def.node.add()
    node.CopyFrom(op.node_def)
    if '_class' in node.attr:  # colocated with the dataset: not copied
      del node.attr['_class']

  def get_next():
    outputs = tf.raw_ops.IteratorGetNext(
        iterator=get_next_op.inputs[0],
        output_types=get_next_op.get_attr('output_types'),
        output_shapes=get_next_op.get_attr('output_shapes'))
    again = {'{}:{}'.format(get_next_op.name, i): output
             for i, output in enumerate(outputs)}
    if between:
      names = [leaf.name for leaf in leaves if leaf.op.name in between]
      used = {tensor.name for op in between.values() for tensor in op.inputs}
      again.update(zip(names, tf.compat.v1.import_graph_def(
          graph_def, name='get_next_again', return_elements=names,
          input_map={name: tensor for name, tensor in again.items()
                     if name in used})))
    return tf.nest.pack_sequence_as(
        result, [again[leaf.name] for leaf in leaves], expand_composites=True)

  return get_next


def _check_writable(directory, kind='model_dir', output='checkpoint'):
  """Fails before the work, naming `directory`, if its output cannot go there."""
  try:
    tf.io.gfile.makedirs(directory)
    # (one probe per process and thread: a cluster's tasks check at once)
    probe = os.path.join(directory, '.tpu_fc_write_test.{}.{}.{}'.format(
        socket.gethostname(), os.getpid(), threading.get_ident()))
    with tf.io.gfile.GFile(probe, 'w') as f:
      f.write('')
    tf.io.gfile.remove(probe)
  except (tf.errors.OpError, OSError) as e:
    raise PermissionError('{} {} is not writable, so no {} could be saved: '
                          '{}'.format(kind, directory, output, e)) from e


def _global_step_in(model_dir):
  checkpoint = checkpoints.latest_checkpoint(model_dir)
  if not checkpoint:
    return 0
  reader = tf.compat.v1.train.NewCheckpointReader(checkpoint)
  if not reader.has_tensor(tf.compat.v1.GraphKeys.GLOBAL_STEP):
    return 0
  return reader.get_tensor(tf.compat.v1.GraphKeys.GLOBAL_STEP)


class TPUEstimator(object):
  """Legacy `tf.compat.v1.estimator.tpu.TPUEstimator`, same constructor.

  model_fn and input_fn must take `params`: `params['batch_size']` is the
  mode's global batch size (when given) and model_fn's `params['use_tpu']` says
  whether the mode runs on TPU. model_fn may return `TPUEstimatorSpec` or
  `EstimatorSpec` (tpu_fc's or tensorflow_estimator's).
  """

  def __init__(self,
               model_fn=None,
               model_dir=None,
               config=None,
               params=None,
               use_tpu=True,
               train_batch_size=None,
               eval_batch_size=None,
               predict_batch_size=None,
               batch_axis=None,
               eval_on_tpu=True,
               export_to_tpu=True,
               export_to_cpu=True,
               warm_start_from=None,
               embedding_config_spec=None,
               export_saved_model_api_version=1):
    config = coerce_run_config(config)
    # (TF's enum or 1 / 2; it shapes only the TPU meta graph of an export,
    # which no TPU here writes.)
    if getattr(export_saved_model_api_version, 'value',
               export_saved_model_api_version) not in (1, 2):
      raise ValueError('export_saved_model_api_version should be 1 or 2; '
                       'got {}.'.format(export_saved_model_api_version))
    _check_arguments(config.tpu_config, params, use_tpu, train_batch_size,
                     eval_batch_size, predict_batch_size, eval_on_tpu,
                     embedding_config_spec)
    _verify_model_fn_args(model_fn, params)

    # Progress is logged by this class's hooks, so, as in TF, the config that
    # model_fn sees has log_step_count_steps=None.
    self._log_step_count_steps = config.log_step_count_steps
    self._config = self._finalize_config(
        config.replace(log_step_count_steps=None), model_dir, use_tpu)
    self._model_dir = self._config.model_dir
    tf.compat.v1.logging.info('Using config: %s', self._config)
    self._model_fn = model_fn
    self._params = copy.deepcopy(params or {})
    self._warm_start_settings = _warm_start_settings(warm_start_from)

    self._log_every_n_steps, self._log_every_n_secs = _rate_log_cadence(
        config.tpu_config.iterations_per_loop, self._log_step_count_steps)

    tpu_config = config.tpu_config
    if tpu_config.num_shards == 1 and tpu_config.num_cores_per_replica is None:
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
    # Read by the TPU embedding engine and export only.
    self._batch_axis = batch_axis
    self._export_to_tpu = export_to_tpu
    self._export_to_cpu = export_to_cpu
    self._embedding_config_spec = embedding_config_spec

  @staticmethod
  def _finalize_config(config, model_dir, use_tpu):
    """Estimator's defaults: session config, and model_dir (else a temp dir).

    The emulated TPU turns Grappler's table-copying rewrite off; with
    `use_tpu=False` TF's graph runs with TF's session defaults, so its numbers
    are TF 2.15's to the bit (the rewrite also reorders dense arithmetic).
    """
    session_config = config.session_config or default_session_config()
    config = config.replace(session_config=(
        without_table_copy_rewrite(session_config) if use_tpu else
        session_config))
    model_dir = path_to_str(model_dir)
    if model_dir is not None and config.model_dir not in (None, model_dir):
      raise ValueError(
          '`model_dir` are set both in constructor and `RunConfig`, but with '
          "different values. In constructor: '{}', in `RunConfig`: "
          "'{}' ".format(model_dir, config.model_dir))
    if model_dir:
      return config.replace(model_dir=model_dir)
    if config.model_dir is None:
      model_dir = tempfile.mkdtemp()
      tf.compat.v1.logging.warn('Using temporary folder as model directory: %s',
                                model_dir)
      return config.replace(model_dir=model_dir)
    return config

  @property
  def model_dir(self):
    return self._model_dir

  @property
  def config(self):
    return copy.deepcopy(self._config)

  @property
  def params(self):
    return copy.deepcopy(self._params)

  def eval_dir(self, name=None):
    """Where `evaluate(name=...)` writes its summaries."""
    return os.path.join(self._model_dir, 'eval' if not name else 'eval_' + name)

  def latest_checkpoint(self):
    return checkpoints.latest_checkpoint(self._model_dir)

  def get_variable_names(self):
    return [name for name, _ in tf.train.list_variables(
        self._checkpoint_available())]

  def get_variable_value(self, name):
    return tf.train.load_variable(self._checkpoint_available(), name)

  def export_saved_model(self,
                         export_dir_base,
                         serving_input_receiver_fn,
                         assets_extra=None,
                         as_text=False,
                         checkpoint_path=None):
    """Exports the PREDICT graph, every embedding looked up on the CPU.

    Returns the timestamped export directory (bytes).  `export_to_tpu` adds a
    TPU meta graph only on a TPU system; without one it is skipped (logged).
    """
    if not checkpoint_path:
      self._checkpoint_to_export()  # TF's order: no checkpoint is told first
    if not (self._export_to_cpu or self._export_to_tpu):
      raise ValueError('One of export_to_cpu and export_to_tpu must be true.')
    if self._export_to_tpu:
      tf.compat.v1.logging.warn(
          'No TPU: export_to_tpu=True writes no TPU meta graph here; the '
          'SavedModel has the CPU (serving) graph only.')

    def build_predict(features):
      params = self._params_for(ModeKeys.PREDICT, use_tpu=False)
      params.pop(_BATCH_SIZE_KEY, None)  # serving batches vary, as in TF
      features = lookup_backends.model_features(
          self._backends(ModeKeys.PREDICT, on_tpu=self._use_tpu, serving=True),
          features, None)
      with build_context.building(ModeKeys.PREDICT):
        return to_estimator_spec(self._call_model_fn(
            features, None, ModeKeys.PREDICT, self.config, params))

    return self._reading_checkpoint(
        checkpoint_path, self._checkpoint_to_export,
        lambda checkpoint: saved_model.export_saved_model(
            build_predict, export_dir_base, serving_input_receiver_fn,
            checkpoint, assets_extra, as_text, self._config.tf_random_seed))

  def _log_if_untrained(self, checkpoint, mode):
    if not checkpoint:
      tf.compat.v1.logging.info(
          'Could not find trained model in model_dir: {}, running '
          'initialization to {}.'.format(self._model_dir, mode))

  def _reading_checkpoint(self, checkpoint_path, choose, read):
    """`read(checkpoint_path)`, or, without one, `read(choose())`, chosen again
    when the chosen checkpoint was deleted before it was read (pruned by a
    trainer's keep_checkpoint_max), a few times; then the error stands."""
    if checkpoint_path:
      if not checkpoints.exists(checkpoint_path):  # TF's Saver.restore's error
        raise ValueError('The passed save_path is not a valid checkpoint: '
                         '{}'.format(checkpoint_path))
      return read(checkpoint_path)
    for attempt in range(_PRUNED_CHECKPOINT_RETRIES):
      chosen = choose()
      try:
        return read(chosen)
      except (tf.errors.OpError, ValueError):
        if (not chosen or checkpoints.exists(chosen) or
            attempt + 1 == _PRUNED_CHECKPOINT_RETRIES):
          raise
        tf.compat.v1.logging.warning(
            'Checkpoint %s was deleted before it was read (pruned by a '
            "training run's keep_checkpoint_max?); reading the latest one.",
            chosen)

  def _checkpoint_to_export(self):
    """The latest checkpoint, else the warm-start one (as Estimator exports)."""
    checkpoint_path = self.latest_checkpoint()
    if not checkpoint_path and self._warm_start_settings:
      checkpoint_path = self._warm_start_settings.ckpt_to_initialize_from
      if tf.io.gfile.isdir(checkpoint_path):
        checkpoint_path = tf.train.latest_checkpoint(checkpoint_path)
    if not checkpoint_path:
      raise ValueError("Couldn't find trained model at {}.".format(
          self._model_dir))
    return checkpoint_path

  def export_savedmodel(self,
                        export_dir_base,
                        serving_input_receiver_fn,
                        assets_extra=None,
                        as_text=False,
                        checkpoint_path=None,
                        strip_default_attrs=False):
    """The TF1 name of `export_saved_model` (default attributes are always stripped)."""
    del strip_default_attrs
    return self.export_saved_model(export_dir_base, serving_input_receiver_fn,
                                   assets_extra, as_text, checkpoint_path)

  def _checkpoint_available(self):
    """The latest checkpoint; raises (TF's error) without one."""
    checkpoint = self.latest_checkpoint()
    if not checkpoint:
      raise ValueError('Could not find trained model in model_dir: {}.'.format(
          self._model_dir))
    return checkpoint

  def train(self,
            input_fn,
            hooks=None,
            steps=None,
            max_steps=None,
            saving_listeners=None):
    """Trains from the latest checkpoint in model_dir (or from scratch).

    `steps` more steps, up to global step `max_steps`, or until input ends.
    On a ps task of a cluster, serves variables instead, until stopped (where
    TF raised, so that one script can run on every task); on an evaluator
    task, raises as TF did (`train_and_evaluate` evaluates there).
    """
    if self._config.task_type == 'evaluator':
      raise ValueError(
          'Train has been called wrong configuration. Please use '
          'tf.estimator.train_and_evaluate which calls proper API according '
          'to given configuration. Current configuration: {}.'.format(
              self.config))
    if self._config.task_type == 'ps':
      distributed.join(self._config)
    self._start_cluster_server()
    if steps is not None and max_steps is not None:
      raise ValueError('Can not provide both steps and max_steps.')
    if steps is not None and steps <= 0:
      raise ValueError('Must specify steps > 0, given: {}'.format(steps))
    if max_steps is not None and max_steps <= 0:
      raise ValueError(
          'Must specify max_steps > 0, given: {}'.format(max_steps))
    if max_steps is not None and max_steps <= _global_step_in(self._model_dir):
      tf.compat.v1.logging.info(
          'Skipping training since max_steps has already saved.')
      return self
    hooks = _check_hooks_type(hooks)
    position_hooks = [h for h in hooks
                      if isinstance(h, CheckpointInputPipelineHook)]
    hooks = [h for h in hooks if h not in position_hooks]
    if steps is not None or max_steps is not None:
      hooks.append(tf.compat.v1.train.StopAtStepHook(steps, max_steps))
      hooks.append(tpu_emulation.LoopIterationsHook(steps, max_steps))
    saving_listeners = _check_listeners_type(saving_listeners)
    _check_writable(self._model_dir)
    with contextlib.ExitStack() as held:
      if self._config.is_chief:  # the one task that writes checkpoints
        held.enter_context(checkpoints.training_lock(self._model_dir))
        checkpoints.remove_cut_short_saves(self._model_dir)
      loss = self._train(input_fn, hooks, position_hooks, saving_listeners)
    tf.compat.v1.logging.info('Loss for final step: %s.', loss)
    return self

  def _train(self, input_fn, hooks, position_hooks, saving_listeners):
    """Builds the TRAIN graph and trains; returns the last loss."""
    with tf.Graph().as_default() as graph, graph.device(
        distributed.device_fn(self._config)):
      spec, input_hooks = self._build_graph(
          input_fn, ModeKeys.TRAIN, self.latest_checkpoint(),
          position_hooks[0] if position_hooks else None)
      spec = self._with_progress_logging(spec, graph)
      if (distributed.is_parameter_server_cluster(self._config) and
          not self._config.is_chief):
        distributed.wait_for_chief(self._config)
      return loops.train(spec, input_hooks + hooks, saving_listeners,
                         self._config)

  def _with_progress_logging(self, spec, graph):
    """`spec` with the hooks logging loss, step and rates, as TF placed them.

    On CPU, exactly TF 2.15's TPUEstimator(use_tpu=False): its rates after
    the model's hooks and no loss line (it turned Estimator's off).  On the
    emulated TPU, as
    TPUEstimator on a TPU: both before the model's hooks, the loss with the
    step the loop ended at every ceil(log_step_count_steps /
    iterations_per_loop) loops (every N seconds for an 'Ns' loop).
    """
    hooks = tuple(spec.training_hooks)
    steps_per_run = tpu_emulation.steps_per_run(graph)
    rates = self._rate_hooks(steps_per_run)
    if self._running_on_cpu(ModeKeys.TRAIN):
      return spec._replace(training_hooks=hooks + rates)
    if not rates:
      return spec
    every_n_runs = self._log_every_n_steps
    if every_n_runs is not None:  # loops, whether or not one run makes a loop
      every_n_runs *= parse_iterations_per_loop(
          self._config.tpu_config.iterations_per_loop).value // steps_per_run
    with tf.control_dependencies([spec.train_op]):
      step = tf.compat.v1.train.get_global_step().read_value()
    loss_logging = tf.compat.v1.train.LoggingTensorHook(
        {'loss': spec.loss, 'step': step}, every_n_iter=every_n_runs,
        every_n_secs=self._log_every_n_secs)
    return spec._replace(training_hooks=(loss_logging,) + rates + hooks)

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

  def evaluate(self,
               input_fn,
               steps=None,
               hooks=None,
               checkpoint_path=None,
               name=None):
    """Evaluates `steps` batches (None: until input ends) of a checkpoint.

    Returns the metrics dict with `loss` and `global_step`; summaries go to
    `eval_dir(name)`.
    """
    hooks = _check_hooks_type(hooks)
    self._start_cluster_server()
    if not self._running_on_cpu(ModeKeys.EVAL):  # TF's checks on a TPU
      if steps is None:
        raise ValueError(
            'Evaluate `steps` must be set on TPU. Cannot be `None`.')
      check_positive_integer(steps, 'Eval steps')
    if steps is not None:
      if steps <= 0:
        raise ValueError('Must specify steps > 0, given: {}'.format(steps))
      hooks.append(internals.StopAfterNEvalsHook(num_evals=steps))
    _check_writable(self.eval_dir(name), 'eval_dir', 'evaluation summary')

    def evaluate_checkpoint(checkpoint):
      self._log_if_untrained(checkpoint, 'evaluate')
      with tf.Graph().as_default():
        spec, input_hooks = self._build_graph(input_fn, ModeKeys.EVAL,
                                              checkpoint, eval_steps=steps)
        return loops.evaluate(spec, input_hooks + hooks, checkpoint,
                              self._config, self.eval_dir(name))

    return self._reading_checkpoint(checkpoint_path, self.latest_checkpoint,
                                    evaluate_checkpoint)

  def predict(self,
              input_fn,
              predict_keys=None,
              hooks=None,
              checkpoint_path=None,
              yield_single_examples=True):
    """Yields predictions (dicts, or the tensor's values) until input ends."""
    hooks = _check_hooks_type(hooks)
    self._start_cluster_server()

    def start_predicting(checkpoint):
      """The predictions' generator, its session started (restored) now."""
      self._log_if_untrained(checkpoint, 'predict')
      with tf.Graph().as_default():
        spec, input_hooks = self._build_graph(input_fn, ModeKeys.PREDICT,
                                              checkpoint)
        return loops.predict(spec, input_hooks + hooks, checkpoint,
                             self._config, predict_keys, yield_single_examples)

    predictions = self._reading_checkpoint(
        checkpoint_path, self.latest_checkpoint, start_predicting)
    yield from predictions

  def _start_cluster_server(self):
    """In a ps cluster, this task's server: its sessions run through it."""
    if distributed.is_parameter_server_cluster(self._config):
      distributed.server(self._config)

  def _build_graph(self, input_fn, mode, checkpoint_path, position_hook=None,
                   eval_steps=None):
    """Builds `mode`'s graph in the default graph; returns (spec, input hooks).

    Same op order as Estimator (seed, global step, its read for TRAIN,
    input_fn, model), so a `tf_random_seed` gives the same initial values.
    Warm-starts when there is no `checkpoint_path` to restore.  With a
    `CheckpointInputPipelineHook`, checkpoints hold the input's position.
    """
    graph = tf.compat.v1.get_default_graph()
    tf.compat.v1.random.set_random_seed(self._config.tf_random_seed)
    _create_global_step(graph)
    if mode == ModeKeys.TRAIN:
      internals.get_or_create_global_step_read(graph)
    inputs = self._call_input_fn(input_fn, mode)
    input_hooks = list(inputs.hooks)
    if position_hook is not None:
      if not inputs.from_dataset:
        tf.compat.v1.logging.warn(
            'CheckpointInputPipelineHook: input_fn returned tensors, not a '
            'Dataset; there is no input position to save.')
      for hook in input_hooks:
        hook.save_position(self._model_dir, position_hook.external_state_policy)
    iterations = (self._loop_iterations(mode, eval_steps)
                  if inputs.next_batch_per_step else 1)
    with self._cluster_training(mode) as sync:
      if iterations > 1:
        loop = (tpu_emulation.training_loop if mode == ModeKeys.TRAIN else
                tpu_emulation.evaluation_loop)
        spec = loop(
            lambda f, l: self._build_model(f, l, mode, self.config, sync),
            inputs.next_batch_per_step, iterations)
      else:
        spec = self._build_model(*inputs.next_batch(), mode, self.config, sync)
    if sync is not None:
      train_op, hook = sync.train_op(
          spec.train_op, tf.compat.v1.train.get_global_step(graph),
          self._config.is_chief)
      spec = spec._replace(train_op=train_op,
                           training_hooks=tuple(spec.training_hooks) + (hook,))
    if spec.scaffold.saver is None:
      spec = spec._replace(scaffold=checkpoints.saver_at_finalize(
          spec.scaffold, graph, checkpoint_path, self._config))
    checkpoints.drop_build_records(graph)
    if self._warm_start_settings and not checkpoint_path:
      tf.compat.v1.logging.info('Warm-starting with WarmStartSettings: %s' %
                                (self._warm_start_settings,))
      tf.compat.v1.train.warm_start(*self._warm_start_settings)
    return spec, input_hooks

  @contextlib.contextmanager
  def _cluster_training(self, mode):
    """Around the TRAIN model in a ps cluster: tables split over the ps tasks.

    Yields the `SyncReplicas` of synchronous training, else None.
    """
    if (mode != ModeKeys.TRAIN or
        not distributed.is_parameter_server_cluster(self._config)):
      yield None
      return
    with distributed.partitioned_tables(self._embedding_config_spec,
                                        self._config.num_ps_replicas):
      if not self._config.sync_replicas:
        yield None
        return
      spec = self._embedding_config_spec
      if spec is not None and spec.pipeline_execution_with_tensor_core:
        raise ValueError(
            'RunConfig(sync_replicas=True) does not support '
            'pipeline_execution_with_tensor_core=True: its parked table updates '
            'cannot be aggregated across workers.')
      sync = distributed.SyncReplicas(self._config.num_worker_replicas,
                                      self._config.global_id_in_cluster)
      with sync.building():
        yield sync

  def _build_model(self, features, labels, mode, config, sync=None):
    """Builds the model for `mode`; returns its `EstimatorSpec`.

    `sync`: the `SyncReplicas` through which training updates the tables, or None.

    On CPU (use_tpu=False, or eval with eval_on_tpu=False) the model_fn runs as a
    plain graph, exactly as TF 2.15's TPUEstimator(use_tpu=False).  Otherwise
    TRAIN and EVAL emulate the TPU (`tpu_emulation`), and PREDICT looks up on
    the CPU, as TPUEstimator's default lookup device does for inference.
    """
    if self._running_on_cpu(mode):
      tf.compat.v1.logging.info('Running %s on CPU/GPU', mode)
      with build_context.building(mode), replication.one_replica():
        return to_estimator_spec(self._call_model_fn(
            features, labels, mode, config,
            self._params_for(mode, use_tpu=False)))
    backends = self._backends(mode, on_tpu=True)
    if (mode == ModeKeys.PREDICT and
        lookup_backends.predicts_in_model_graph(backends)):
      _check_predict_ids_untransformed(features, self._embedding_config_spec)
      with build_context.building(mode):
        return tpu_emulation.predict_padded(
            lambda f: to_estimator_spec(self._call_model_fn(
                f, labels, mode, config, self._params_for(mode, use_tpu=True))),
            lookup_backends.model_features(backends, features, None),
            self._batch_sizes[mode])
    if mode == ModeKeys.PREDICT:  # looked up by the host engine, one shard
      params = self._params_for(mode, use_tpu=True)
      return tpu_emulation.predict_padded(
          lambda f: tpu_emulation.build(
              lambda f, l: self._call_model_fn(f, l, mode, config, params),
              f, labels, mode, backends, 1, self._batch_sizes[mode]),
          features, self._batch_sizes[mode])
    num_shards = self._num_shards()
    broadcast = self._broadcasts_input()
    self._check_batch_divisible(mode, 1 if broadcast else num_shards)
    params = self._params_for(mode, use_tpu=True,
                              num_shards=1 if broadcast else num_shards)
    return tpu_emulation.build(
        lambda f, l: self._call_model_fn(f, l, mode, config, params),
        features, labels, mode, backends, num_shards, self._batch_sizes[mode],
        broadcast,
        aggregate_rows=sync.aggregate_rows if sync is not None else None)

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
    iterations = parse_iterations_per_loop(
        self._config.tpu_config.iterations_per_loop)
    return iterations.value if iterations.unit == 'count' else 1

  def _num_shards(self):
    """Emulated TPU cores: TPUConfig.num_shards, or 1 when left to the system."""
    return self._config.tpu_config.num_shards or 1

  def _check_tpu_batch_size(self, mode):
    """TF 2.15's checks before input_fn: evaluate and predict on a TPU need
    their batch size, predict's divisible by the shards."""
    names = {ModeKeys.EVAL: ('eval_batch_size', '.evaluate'),
             ModeKeys.PREDICT: ('predict_batch_size', '.predict')}
    if mode in names and self._batch_sizes[mode] is None:
      raise ValueError('{} in TPUEstimator constructor cannot be `None` if {} '
                       'is running on TPU.'.format(*names[mode]))
    if mode == ModeKeys.PREDICT and not self._broadcasts_input():
      self._check_batch_divisible(mode, self._num_shards())  # (one predicts)

  def _broadcasts_input(self):
    """`InputPipelineConfig.BROADCAST`: every shard gets the whole batch."""
    return (self._config.tpu_config.per_host_input_for_training ==
            InputPipelineConfig.BROADCAST)

  def _check_batch_divisible(self, mode, num_shards):
    batch_size = self._batch_sizes[mode]
    if batch_size is not None and batch_size % num_shards:
      raise ValueError('{} batch size {} must be divisible by number of '
                       'replicas {}'.format(
                           'predict' if mode == ModeKeys.PREDICT else mode,
                           batch_size, num_shards))

  def _running_on_cpu(self, mode):
    return not self._use_tpu or (mode == ModeKeys.EVAL and
                                 not self._eval_on_tpu)

  def _params_for(self, mode, use_tpu=None, num_shards=1):
    """A fresh copy of params with the mode's batch size (per shard), when given.

    `params['use_tpu']` is set for model_fn calls (use_tpu not None) only, and
    `params['context']` for model_fn calls on the emulated TPU.
    """
    params = copy.deepcopy(self._params)
    if self._batch_sizes[mode] is not None:
      _add_item_to_params(params, _BATCH_SIZE_KEY,
                          self._batch_sizes[mode] // num_shards)
    if use_tpu is not None:
      _add_item_to_params(params, _USE_TPU_KEY, use_tpu)
    if use_tpu:
      self._add_tpu_context(params, mode, call_from_input_fn=False)
    return params

  def _add_tpu_context(self, params, mode, call_from_input_fn):
    """`params['context']` in emulated TPU training and evaluation, as on a TPU."""
    if not self._running_on_cpu(mode) and mode != ModeKeys.PREDICT:
      _add_item_to_params(params, _CONTEXT_KEY, tpu_context.TPUContext(
          self._num_shards(), call_from_input_fn))

  def _call_input_fn(self, input_fn, mode):
    """Calls input_fn on the CPU; returns its `_Input`."""
    args = internals.fn_args(input_fn)
    if 'params' not in args:
      raise ValueError('input_fn ({}) does not include params argument, '
                       'required by TPUEstimator to pass batch size as '
                       'params["batch_size"]'.format(input_fn))
    if not self._running_on_cpu(mode):
      self._check_tpu_batch_size(mode)
    kwargs = {'params': self._params_for(mode)}
    self._add_tpu_context(kwargs['params'], mode, call_from_input_fn=True)
    if 'config' in args:
      kwargs['config'] = self.config
    if 'mode' in args:
      kwargs['mode'] = mode
    if 'input_context' in args:
      kwargs['input_context'] = (
          distributed.input_context(self._config)
          if distributed.is_parameter_server_cluster(self._config) else None)
    if (mode != ModeKeys.TRAIN and self._running_on_cpu(mode) and
        self._config.tpu_config.eval_training_input_configuration ==
        InputPipelineConfig.SLICED):
      raise ValueError('Invalid TPUConfig `eval_training_input_configuration`'
                       ' value. SLICED mode only works on use_tpu = True.')
    with tf.compat.v1.device('/device:CPU:0'):
      result = input_fn(**kwargs)
    inputs = _parse_input_fn_result(result)
    if mode == ModeKeys.PREDICT:  # labels, if any, are not the model's
      return inputs._replace(next_batch=lambda: (inputs.next_batch()[0], None))
    return inputs

  def _call_model_fn(self, features, labels, mode, config, params):
    """Calls model_fn with the arguments it declares; returns its result."""
    args = internals.fn_args(self._model_fn)
    kwargs = {}
    if 'labels' in args:
      kwargs['labels'] = labels
    elif labels is not None:
      raise ValueError(
          'model_fn does not take labels, but input_fn returns labels.')
    if 'mode' in args:
      kwargs['mode'] = mode
    if 'config' in args:
      kwargs['config'] = config
    if 'params' not in args:
      raise ValueError('model_fn ({}) does not include params argument, '
                       'required by TPUEstimator to pass batch size as '
                       'params[\'batch_size\']'.format(self._model_fn))
    kwargs['params'] = params
    tf.compat.v1.logging.info('Calling model_fn.')
    result = self._model_fn(features=features, **kwargs)
    tf.compat.v1.logging.info('Done calling model_fn.')
    return result
