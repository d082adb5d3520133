"""`RunConfig` of the Estimator: tensorflow-estimator 2.15's `run_config.py`.

Same arguments, fields, defaults and error texts (tensorflow-estimator does not
import on TF >= 2.16).  The cluster roles (task type and id, chief, master, ps
and worker counts) come from `TF_CONFIG` exactly as `tf.estimator.RunConfig`
read them; the TPU's `RunConfig` (`tpu_fc.estimator.tpu.tpu_config.RunConfig`,
with `tpu_config`) may take them from a `ClusterResolver` instead.
"""
from __future__ import annotations

import copy
import json
import os
from typing import Any, Callable

from tpu_fc import _tf_internals as internals
from tpu_fc._tf import tf


_TF_CONFIG_ENV = 'TF_CONFIG'
_LOCAL_MASTER = ''
_GRPC_SCHEME = 'grpc://'


class TaskType(object):
  """The task types of a cluster, as `TF_CONFIG` names them (TF's)."""
  MASTER = 'master'
  PS = 'ps'
  WORKER = 'worker'
  CHIEF = 'chief'
  EVALUATOR = 'evaluator'


def read_tf_config():
  """The `TF_CONFIG` environment variable, parsed ({} when unset or empty)."""
  return json.loads(os.environ.get(_TF_CONFIG_ENV) or '{}')


def _model_dir_in(tf_config, model_dir):
  """`model_dir`, or TF_CONFIG's `model_dir` (which must then agree), as Estimator."""
  if model_dir == '':  # pylint: disable=g-explicit-bool-comparison
    raise ValueError('model_dir should be non-empty.')
  in_tf_config = tf_config.get('model_dir')
  if in_tf_config == '':  # pylint: disable=g-explicit-bool-comparison
    raise ValueError('model_dir in TF_CONFIG should be non-empty.')
  if not in_tf_config:
    return model_dir
  if model_dir and in_tf_config != model_dir:
    raise ValueError(
        '`model_dir` provided in RunConfig construct, if set, '
        'must have the same value as the model_dir in TF_CONFIG. '
        'model_dir: {}\nTF_CONFIG["model_dir"]: {}.\n'.format(
            model_dir, in_tf_config))
  tf.compat.v1.logging.info('Using model_dir in TF_CONFIG: %s', in_tf_config)
  return in_tf_config


def _checked_task(cluster_spec, task_type, task_id, chief_task_type):
  """Estimator's checks of the task against the cluster; returns (type, id)."""
  if chief_task_type not in cluster_spec.jobs:
    raise ValueError(
        'If "cluster" is set in TF_CONFIG, it must have one "%s" node.' %
        chief_task_type)
  if len(cluster_spec.job_tasks(chief_task_type)) > 1:
    raise ValueError(
        'The "cluster" in TF_CONFIG must have only one "%s" node.' %
        chief_task_type)
  if not task_type:
    raise ValueError('If "cluster" is set in TF_CONFIG, task type must be set.')
  if task_id is None:
    raise ValueError(
        'If "cluster" is set in TF_CONFIG, task index must be set.')
  task_id = int(task_id)
  if task_id < 0:
    raise ValueError('Task index must be non-negative number.')
  if task_type == TaskType.EVALUATOR:  # not part of the training cluster
    return task_type, task_id
  if task_type not in cluster_spec.jobs:
    raise ValueError(
        '%s is not a valid task_type in the cluster_spec:\n%s\n\nNote that '
        'these values may be coming from the TF_CONFIG environment variable.' %
        (task_type, cluster_spec))
  if not 0 <= task_id < len(cluster_spec.job_tasks(task_type)):
    raise ValueError(
        '%d is not a valid task_id for task_type %s in the cluster_spec:\n%s'
        '\n\nNote that these values may be coming from the TF_CONFIG '
        'environment variable.' % (task_id, task_type, cluster_spec))
  return task_type, task_id


def _global_id_in_cluster(cluster_spec, task_type, task_id, chief_task_type):
  """Chief 0, then other jobs alphabetically, ps last (Estimator's order):
  the tasks of the jobs before `task_type`'s, plus `task_id`."""
  others = sorted(set(cluster_spec.jobs) - {chief_task_type, TaskType.PS})
  ordered = ([chief_task_type] + others +
             ([TaskType.PS] if TaskType.PS in cluster_spec.jobs else []))
  before = ordered[:ordered.index(task_type)]
  return sum(len(cluster_spec.job_tasks(job)) for job in before) + task_id


def _session_master(cluster_spec, task_type, task_id, tf_config):
  """TF_CONFIG's session_master, '' for a one-task cluster, else the task's grpc address."""
  if 'session_master' in tf_config:
    return tf_config['session_master']
  jobs = cluster_spec.jobs
  if len(jobs) == 1 and len(cluster_spec.job_tasks(jobs[0])) == 1:
    return _LOCAL_MASTER
  return _GRPC_SCHEME + cluster_spec.job_tasks(task_type)[task_id]


def cluster_settings(cluster_spec, task_type, task_id, tf_config=None):
  """The cluster-role properties of one task, as `tf.estimator.RunConfig` set them.

  An empty `cluster_spec` is local mode (one worker, the chief).  A cluster with
  a `master` job is the legacy layout, where `master` is the chief.
  """
  tf_config = tf_config or {}
  if not cluster_spec:
    task_type = task_type or TaskType.WORKER
    task_id = int(task_id or 0)
    if task_type != TaskType.WORKER:
      raise ValueError(
          'If "cluster" is not set in TF_CONFIG, task type must be WORKER.')
    if task_id != 0:
      raise ValueError(
          'If "cluster" is not set in TF_CONFIG, task index must be 0.')
    return dict(
        cluster_spec=cluster_spec, task_type=task_type, task_id=task_id,
        master=tf_config.get('session_master', _LOCAL_MASTER),
        evaluation_master=tf_config.get('eval_session_master', _LOCAL_MASTER),
        is_chief=True, num_ps_replicas=0, num_worker_replicas=1,
        global_id_in_cluster=0)
  chief_task_type = TaskType.CHIEF
  if TaskType.MASTER in cluster_spec.jobs:
    if TaskType.CHIEF in cluster_spec.jobs:
      raise ValueError('If `master` node exists in `cluster`, job '
                       '`chief` is not supported.')
    chief_task_type = TaskType.MASTER
  task_type, task_id = _checked_task(cluster_spec, task_type, task_id,
                                     chief_task_type)
  if task_type == TaskType.EVALUATOR:
    if chief_task_type == TaskType.MASTER:
      raise ValueError('If `master` node exists in `cluster`, task_type '
                       '`evaluator` is not supported.')
    return dict(
        cluster_spec=tf.train.ClusterSpec({}), task_type=task_type,
        task_id=task_id, master=_LOCAL_MASTER,
        evaluation_master=tf_config.get('eval_session_master', _LOCAL_MASTER),
        is_chief=False, num_ps_replicas=0, num_worker_replicas=0,
        global_id_in_cluster=None)
  jobs = cluster_spec.as_dict()
  return dict(
      cluster_spec=cluster_spec, task_type=task_type, task_id=task_id,
      master=_session_master(cluster_spec, task_type, task_id, tf_config),
      evaluation_master=_LOCAL_MASTER,
      is_chief=task_type == chief_task_type,
      num_ps_replicas=len(jobs.get(TaskType.PS, [])),
      num_worker_replicas=(len(jobs.get(TaskType.WORKER, [])) +
                           len(jobs.get(chief_task_type, []))),
      global_id_in_cluster=_global_id_in_cluster(cluster_spec, task_type,
                                                 task_id, chief_task_type))


def _settings_from_tf_config(tf_config):
  """The cluster roles and `service` of this task, from TF_CONFIG."""
  service = tf_config.get('service')
  if service is not None and not isinstance(service, dict):
    raise TypeError(
        'If "service" is set in TF_CONFIG, it must be a dict. Given %s' %
        type(service))
  task = tf_config.get('task', {})
  return dict(cluster_settings(
      tf.train.ClusterSpec(tf_config.get('cluster', {})), task.get('type'),
      task.get('index'), tf_config), service=service)


def distributed_session_config(task_type, task_id):
  """Estimator's default session config for a task of a between-graph cluster.

  Device filters let each trainer talk only to the ps tasks and itself, so a
  worker that is down or restarting stalls nobody else.  None for evaluators.
  """
  filters = {
      TaskType.MASTER: ['/job:ps', '/job:master'],
      TaskType.CHIEF: ['/job:ps', '/job:chief'],
      TaskType.WORKER: ['/job:ps', '/job:worker/task:%d' % task_id],
      TaskType.PS: ['/job:ps', '/job:worker', '/job:chief', '/job:master'],
  }.get(task_type)
  if filters is None:
    return None
  session_config = default_session_config()
  session_config.device_filters.extend(filters)
  return session_config


_USE_DEFAULT = object()
_SAVE_CKPT_ERR = (
    '`save_checkpoints_steps` and `save_checkpoints_secs` cannot be both set.')

# Estimator's distribution strategies: tpu_fc runs none (only None is taken).
_STRATEGY_FIELDS = ('train_distribute', 'eval_distribute',
                    'experimental_distribute')
_NO_STRATEGY = (
    'RunConfig({}=...): tpu_fc runs no tf.distribute strategy; a TPUEstimator '
    'splits its batch over TPUConfig(num_shards=...) emulated cores, and trains '
    'with parameter servers from TF_CONFIG (docs/scaling.md). Leave {} None.')
# The keyword arguments `replace` takes, in TF's order (its error lists them),
# and tpu_fc's `sync_replicas`.
REPLACEABLE_FIELDS = (
    'model_dir', 'tf_random_seed', 'save_summary_steps',
    'save_checkpoints_steps', 'save_checkpoints_secs', 'session_config',
    'keep_checkpoint_max', 'keep_checkpoint_every_n_hours',
    'log_step_count_steps', 'train_distribute', 'device_fn', 'protocol',
    'eval_distribute', 'experimental_distribute',
    'experimental_max_worker_delay_secs', 'session_creation_timeout_secs',
    'checkpoint_save_graph_def', 'sync_replicas')
# The cluster-role properties: from TF_CONFIG or a parameter-server resolver.
CLUSTER_FIELDS = ('cluster_spec', 'task_type', 'task_id', 'master',
                  'evaluation_master', 'is_chief', 'num_ps_replicas',
                  'num_worker_replicas', 'global_id_in_cluster', 'service')

# (field, predicate, message): estimator run_config._validate_properties, in
# its order, applied to every non-None value; then tpu_fc's refusal of
# distribution strategies.
_PROPERTY_CHECKS = (
    ('model_dir', bool, 'model_dir should be non-empty'),
    ('save_summary_steps', lambda v: v >= 0,
     'save_summary_steps should be >= 0'),
    ('save_checkpoints_steps', lambda v: v >= 0,
     'save_checkpoints_steps should be >= 0'),
    ('save_checkpoints_secs', lambda v: v >= 0,
     'save_checkpoints_secs should be >= 0'),
    ('session_config', lambda v: isinstance(v, tf.compat.v1.ConfigProto),
     'session_config must be instance of ConfigProto'),
    ('keep_checkpoint_max', lambda v: v >= 0,
     'keep_checkpoint_max should be >= 0'),
    ('keep_checkpoint_every_n_hours', lambda v: v > 0,
     'keep_checkpoint_every_n_hours should be > 0'),
    ('log_step_count_steps', lambda v: v > 0,
     'log_step_count_steps should be > 0'),
    ('tf_random_seed', lambda v: isinstance(v, int),
     'tf_random_seed must be integer.'),
    ('experimental_max_worker_delay_secs', lambda v: isinstance(v, int),
     'experimental_max_worker_delay_secs must be an integer if set.'),
    ('session_creation_timeout_secs', lambda v: v > 0,
     'session_creation_timeout_secs should be > 0'),
    ('device_fn', lambda v: callable(v) and internals.fn_args(v) == ('op',),
     'device_fn must be callable with exactly one argument "op".'),
    ('protocol', lambda v: v in ('grpc', 'grpc+verbs'),
     'protocol should be grpc or grpc+verbs'),
) + tuple((name, lambda v: False, _NO_STRATEGY.format(name, name))
          for name in _STRATEGY_FIELDS)


def validate(config):
  """Raises TF's ValueError for the first property of `config` out of range."""
  for name, ok, message in _PROPERTY_CHECKS:
    value = getattr(config, name)
    if value is not None and not ok(value):
      raise ValueError(message)


def _refuse_parameter_server_strategy_v2(*strategies):
  """TF's first check: the TF2 ParameterServerStrategy is not Estimator's."""
  v2_strategy = tf.compat.v2.distribute.experimental.ParameterServerStrategy
  if any(strategy is not None and strategy.__class__ == v2_strategy
         for strategy in strategies):
    raise ValueError('Please use `tf.compat.v1.distribute.experimental.Param'
                     'eterServerStrategy` for parameter server strategy with '
                     'estimator.')


_TF_RUN_CONFIG = ('tensorflow_estimator.python.estimator.run_config',
                  'RunConfig')


def is_run_config(config):
  """Whether an Estimator takes `config`: tpu_fc's `RunConfig`, or TF 2.15's
  (`install()` leaves `tf.estimator.RunConfig` TF's there), a subclass too."""
  return isinstance(config, RunConfig) or any(
      (cls.__module__, cls.__name__) == _TF_RUN_CONFIG
      for cls in type(config).__mro__)


def synchronous(config):
  """`config.sync_replicas`, tpu_fc's own (False for TF 2.15's RunConfig)."""
  return getattr(config, 'sync_replicas', False)


# Accepts `pathlib` paths wherever TF took a directory string.
path_to_str = tf.compat.path_to_str


def field(name):
  """The read-only property `name` of a `RunConfig`, held as `_<name>` (as
  TF's, so a subclass may set or read that attribute)."""
  return property(lambda self: getattr(self, '_' + name))


class RunConfig(object):
  """Run configuration of an `Estimator`: `tf.estimator.RunConfig` (TF 2.15).

  Same arguments, defaults, checks and error texts.  Every argument and the
  cluster roles read from `TF_CONFIG` are read-only attributes:
  `cluster_spec`, `task_type`, `task_id`, `master`, `evaluation_master`
  (TF_CONFIG's `session_master` and `eval_session_master`, else '' locally;
  in a cluster this task's `grpc://` address and ''), `is_chief`,
  `num_ps_replicas`, `num_worker_replicas`, `global_id_in_cluster` and
  `service` (TF_CONFIG's `service` dict, None without one).  As TF's, the
  values live in `_<name>` attributes: `replace`, `Estimator.config` and the
  config a model_fn receives are deep copies, so a subclass's own state and
  attributes set on an instance carry over.

  `TPUEstimator` takes the TPU's `RunConfig` (`tpu_fc.RunConfig`), which adds
  `tpu_config`, `master`, `evaluation_master` and `cluster`.

  Args:
    model_dir: where checkpoints and summaries go (a `pathlib` path too);
      None: TF_CONFIG's `model_dir`, else the estimator's `model_dir`
      argument, else a new temporary directory.
    tf_random_seed: the graph-level seed of every graph built (same seed,
      same initial values); None: none.
    save_summary_steps: training summaries every this many steps; 0 or None:
      none.
    save_checkpoints_steps: a checkpoint every this many steps; not with
      `save_checkpoints_secs`.
    save_checkpoints_secs: a checkpoint every this many seconds (600 when
      neither is given); both None: no checkpoints while training.
    session_config: the `tf.compat.v1.ConfigProto` of every session; None:
      the Estimator's (soft placement, one Grappler pass; in a cluster the
      task's device filters; the emulated TPU also turns Grappler's
      arithmetic optimizer off unless it is set).
    keep_checkpoint_max: the newest checkpoints kept; 0 or None: all.
    keep_checkpoint_every_n_hours: also keep one checkpoint every this many
      hours.
    log_step_count_steps: the step rate (and an Estimator's loss) is logged
      every this many steps (a `TPUEstimator`'s on the emulated TPU rounded
      up to whole loops of `iterations_per_loop`); None: never.
    train_distribute, eval_distribute, experimental_distribute: must be None:
      tpu_fc runs no `tf.distribute` strategy.
    device_fn: `op -> device` placing every op of the training graph; None:
      Estimator's replica device setter in a parameter-server cluster.
    protocol: the protocol of this task's server in a cluster ('grpc' or
      'grpc+verbs'); None: TF's default.
    experimental_max_worker_delay_secs: the longest a worker waits before it
      starts training in `train_and_evaluate` (default 60 s).
    session_creation_timeout_secs: how long a session may wait to become
      available (a worker for the chief's) before failing.
    checkpoint_save_graph_def: whether checkpoints and summaries write the
      graph.
    sync_replicas: tpu_fc's own: in a parameter-server cluster, aggregate the
      gradients of all training tasks every step, with
      `SyncReplicasOptimizer` semantics, instead of training asynchronously
      (Estimator's default).

  Raises:
    ValueError: both checkpoint intervals set, an empty `model_dir` or one
      other than TF_CONFIG's, a value out of its range (negative steps,
      seconds or counts; `keep_checkpoint_every_n_hours`,
      `log_step_count_steps` or `session_creation_timeout_secs` <= 0), a
      `tf_random_seed` or `experimental_max_worker_delay_secs` that is no
      int, a `session_config` that is no `ConfigProto`, a `device_fn` not
      taking exactly `op`, another `protocol`, a distribution strategy, or a
      TF_CONFIG whose cluster and task do not fit (TF 2.15's checks).
    TypeError: TF_CONFIG's `service` is not a dict.
  """

  # The keyword arguments `replace` takes.
  REPLACEABLE = REPLACEABLE_FIELDS

  def __init__(self,
               model_dir: str | os.PathLike | None = None,
               tf_random_seed: int | None = None,
               save_summary_steps: int | None = 100,
               save_checkpoints_steps: int | None = _USE_DEFAULT,
               save_checkpoints_secs: int | None = _USE_DEFAULT,
               session_config: tf.compat.v1.ConfigProto | None = None,
               keep_checkpoint_max: int | None = 5,
               keep_checkpoint_every_n_hours: float = 10000,
               log_step_count_steps: int | None = 100,
               train_distribute: None = None,
               device_fn: Callable[[tf.Operation], Any] | None = None,
               protocol: str | None = None,
               eval_distribute: None = None,
               experimental_distribute: None = None,
               experimental_max_worker_delay_secs: int | None = None,
               session_creation_timeout_secs: float = 7200,
               checkpoint_save_graph_def: bool = True,
               *,
               sync_replicas: bool = False):
    if (save_checkpoints_steps is _USE_DEFAULT and
        save_checkpoints_secs is _USE_DEFAULT):
      save_checkpoints_steps, save_checkpoints_secs = None, 600
    elif save_checkpoints_secs is _USE_DEFAULT:
      save_checkpoints_secs = None
    elif save_checkpoints_steps is _USE_DEFAULT:
      save_checkpoints_steps = None
    elif (save_checkpoints_steps is not None and
          save_checkpoints_secs is not None):
      raise ValueError(_SAVE_CKPT_ERR)
    _refuse_parameter_server_strategy_v2(train_distribute, eval_distribute)
    tf_config = read_tf_config()
    if tf_config:
      tf.compat.v1.logging.info('TF_CONFIG environment variable: %s', tf_config)
    self._set(
        model_dir=_model_dir_in(tf_config, path_to_str(model_dir)),
        tf_random_seed=tf_random_seed,
        save_summary_steps=save_summary_steps,
        save_checkpoints_steps=save_checkpoints_steps,
        save_checkpoints_secs=save_checkpoints_secs,
        session_config=session_config,
        keep_checkpoint_max=keep_checkpoint_max,
        keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
        log_step_count_steps=log_step_count_steps,
        train_distribute=train_distribute,
        device_fn=device_fn,
        protocol=protocol,
        eval_distribute=eval_distribute,
        experimental_distribute=experimental_distribute,
        experimental_max_worker_delay_secs=experimental_max_worker_delay_secs,
        session_creation_timeout_secs=session_creation_timeout_secs,
        checkpoint_save_graph_def=checkpoint_save_graph_def,
        sync_replicas=sync_replicas)
    validate(self)
    self._set(**_settings_from_tf_config(tf_config))
    self._maybe_overwrite_session_config_for_distributed_training()

  def _set(self, **values):
    for name, value in values.items():
      setattr(self, '_' + name, value)

  def _maybe_overwrite_session_config_for_distributed_training(self):
    """Estimator's: a between-graph cluster's task gets its device filters
    unless a session_config was given."""
    if not self._session_config and self._cluster_spec:
      self._session_config = distributed_session_config(self._task_type,
                                                        self._task_id)

  model_dir = field('model_dir')
  tf_random_seed = field('tf_random_seed')
  save_summary_steps = field('save_summary_steps')
  save_checkpoints_steps = field('save_checkpoints_steps')
  save_checkpoints_secs = field('save_checkpoints_secs')
  session_config = field('session_config')
  keep_checkpoint_max = field('keep_checkpoint_max')
  keep_checkpoint_every_n_hours = field('keep_checkpoint_every_n_hours')
  log_step_count_steps = field('log_step_count_steps')
  session_creation_timeout_secs = field('session_creation_timeout_secs')
  checkpoint_save_graph_def = field('checkpoint_save_graph_def')
  device_fn = field('device_fn')
  protocol = field('protocol')
  sync_replicas = field('sync_replicas')
  experimental_max_worker_delay_secs = field(
      'experimental_max_worker_delay_secs')
  train_distribute = field('train_distribute')
  eval_distribute = field('eval_distribute')
  experimental_distribute = field('experimental_distribute')
  master = field('master')
  evaluation_master = field('evaluation_master')
  cluster_spec = field('cluster_spec')
  is_chief = field('is_chief')
  task_type = field('task_type')
  task_id = field('task_id')
  global_id_in_cluster = field('global_id_in_cluster')
  num_ps_replicas = field('num_ps_replicas')
  num_worker_replicas = field('num_worker_replicas')
  service = field('service')

  def replace(self, **kwargs: Any) -> RunConfig:
    """A deep copy with some keyword arguments changed, as `tf.estimator.RunConfig`'s.

    Setting one checkpoint interval to a value clears the other.

    Args:
      **kwargs: keyword arguments of the constructor by name (of the TPU's
        `RunConfig`, also `tpu_config`).

    Returns:
      A copy of this config (its class, its other attributes) with those
      values.

    Raises:
      ValueError: a name that is not a keyword argument (the cluster roles
        cannot be replaced), both checkpoint intervals set, or a value the
        constructor refuses.
    """
    for key in kwargs:
      if key not in self.REPLACEABLE:
        raise ValueError(
            'Replacing {} is not supported. Allowed properties are {}.'.format(
                key, list(self.REPLACEABLE)))
    config = copy.deepcopy(self)
    config._set(**self._coerced(kwargs))  # pylint: disable=protected-access
    steps, secs = config.save_checkpoints_steps, config.save_checkpoints_secs
    if 'save_checkpoints_steps' in kwargs and 'save_checkpoints_secs' in kwargs:
      if steps is not None and secs is not None:
        raise ValueError(_SAVE_CKPT_ERR)
    elif 'save_checkpoints_steps' in kwargs and steps is not None:
      config._save_checkpoints_secs = None  # pylint: disable=protected-access
    elif 'save_checkpoints_secs' in kwargs and secs is not None:
      config._save_checkpoints_steps = None  # pylint: disable=protected-access
    validate(config)
    return config

  def _coerced(self, values):
    """`values` of fields as stored (a subclass converts its own fields)."""
    if 'model_dir' in values:
      return dict(values, model_dir=path_to_str(values['model_dir']))
    return values

  def __repr__(self):
    return '{}({})'.format(type(self).__name__, ', '.join(
        '{}={!r}'.format(name.lstrip('_'), value)
        for name, value in vars(self).items()))


def default_session_config():
  """Estimator's session config: soft placement, one Grappler pass."""
  session_config = tf.compat.v1.ConfigProto(allow_soft_placement=True)
  rewrite_options = session_config.graph_options.rewrite_options
  rewrite_options.meta_optimizer_iterations = rewrite_options.ONE
  return session_config


def without_table_copy_rewrite(session_config):
  """A copy of `session_config` with Grappler's arithmetic optimizer off.

  Its SimplifyEmbeddingLookup stage turns every gather-then-segment lookup into a
  dense read of the table, which copies the whole table each step once the table
  has had a sparse update (PERFORMANCE_NOTES: half the step time on Criteo-like
  models).  Its other stages reorder dense arithmetic, so values may differ in
  the last bits; a user's explicit setting is kept.
  """
  result = tf.compat.v1.ConfigProto()
  result.CopyFrom(session_config)
  rewrite_options = result.graph_options.rewrite_options
  if rewrite_options.arithmetic_optimization == rewrite_options.DEFAULT:
    rewrite_options.arithmetic_optimization = rewrite_options.OFF
  return result
