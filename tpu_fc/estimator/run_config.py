"""`RunConfig` of the Estimator: tensorflow-estimator 2.15's `run_config.py`.

Same fields, defaults and error texts (tensorflow-estimator does not import on
TF >= 2.16).  The cluster roles (task type and id, chief, master, ps and worker
counts) come from `TF_CONFIG` exactly as `tf.estimator.RunConfig` read them, or
from a `ClusterResolver` passed as `cluster`: a parameter-server cluster (one
with a `ps` job; see `tpu_fc.estimator.distributed`) stands in for `TF_CONFIG`,
another (a TPU's) gives the master and cluster spec.  The TPU's `RunConfig`
(with `tpu_config`) is `tpu_fc.estimator.tpu.tpu_config.RunConfig`.
"""
from __future__ import annotations

import copy
import inspect
import json
import os
from typing import Any, Callable

from tpu_fc._tf import tf


_TF_CONFIG_ENV = 'TF_CONFIG'
_LOCAL_MASTER = ''
_GRPC_SCHEME = 'grpc://'
CHIEF, WORKER, PS, EVALUATOR, MASTER = (
    'chief', 'worker', 'ps', 'evaluator', 'master')


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
  if task_type == EVALUATOR:  # not part of the training cluster
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
  others = sorted(set(cluster_spec.jobs) - {chief_task_type, PS})
  ordered = ([chief_task_type] + others +
             ([PS] if PS in cluster_spec.jobs else []))
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
    task_type = task_type or WORKER
    task_id = int(task_id or 0)
    if task_type != WORKER:
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
  chief_task_type = CHIEF
  if MASTER in cluster_spec.jobs:
    if CHIEF in cluster_spec.jobs:
      raise ValueError('If `master` node exists in `cluster`, job '
                       '`chief` is not supported.')
    chief_task_type = MASTER
  task_type, task_id = _checked_task(cluster_spec, task_type, task_id,
                                     chief_task_type)
  if task_type == EVALUATOR:
    if chief_task_type == MASTER:
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
      num_ps_replicas=len(jobs.get(PS, [])),
      num_worker_replicas=(len(jobs.get(WORKER, [])) +
                           len(jobs.get(chief_task_type, []))),
      global_id_in_cluster=_global_id_in_cluster(cluster_spec, task_type,
                                                 task_id, chief_task_type))


def _settings_from_tf_config(tf_config):
  service = tf_config.get('service')
  if service is not None and not isinstance(service, dict):
    raise TypeError(
        'If "service" is set in TF_CONFIG, it must be a dict. Given %s' %
        type(service))
  task = tf_config.get('task', {})
  return cluster_settings(tf.train.ClusterSpec(tf_config.get('cluster', {})),
                          task.get('type'), task.get('index'), tf_config)


def distributed_session_config(task_type, task_id):
  """Estimator's default session config for a task of a between-graph cluster.

  Device filters let each trainer talk only to the ps tasks and itself, so a
  worker that is down or restarting stalls nobody else.  None for evaluators.
  """
  filters = {
      MASTER: ['/job:ps', '/job:master'],
      CHIEF: ['/job:ps', '/job:chief'],
      WORKER: ['/job:ps', '/job:worker/task:%d' % task_id],
      PS: ['/job:ps', '/job:worker', '/job:chief', '/job:master'],
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
# Keyword fields of `RunConfig.__init__`, all replaceable as in Estimator.
KWARG_FIELDS = (
    'model_dir', 'tf_random_seed', 'save_summary_steps',
    'save_checkpoints_steps', 'save_checkpoints_secs', 'session_config',
    'keep_checkpoint_max', 'keep_checkpoint_every_n_hours',
    'log_step_count_steps', 'session_creation_timeout_secs',
    'checkpoint_save_graph_def', 'device_fn', 'protocol', 'sync_replicas',
    'experimental_max_worker_delay_secs') + _STRATEGY_FIELDS
# The cluster-role properties: from TF_CONFIG or a parameter-server resolver.
CLUSTER_FIELDS = ('cluster_spec', 'task_type', 'task_id', 'master',
                   'evaluation_master', 'is_chief', 'num_ps_replicas',
                   'num_worker_replicas', 'global_id_in_cluster')

# (field, predicate, message): estimator run_config._validate_properties,
# applied to every non-None value.
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
    ('session_creation_timeout_secs', lambda v: v > 0,
     'session_creation_timeout_secs should be > 0'),
    ('device_fn', lambda v: callable(v) and _fn_args(v) == ('op',),
     'device_fn must be callable with exactly one argument "op".'),
    ('experimental_max_worker_delay_secs', lambda v: isinstance(v, int),
     'experimental_max_worker_delay_secs must be an integer if set.'),
) + tuple((name, lambda v: False, _NO_STRATEGY.format(name, name))
          for name in _STRATEGY_FIELDS)


def _fn_args(fn):
  return tuple(inspect.signature(fn).parameters)


def validate(values):
  for name, ok, message in _PROPERTY_CHECKS:
    if values[name] is not None and not ok(values[name]):
      raise ValueError(message)


def path_to_str(path):
  """Accepts `pathlib` paths wherever TF took a directory string."""
  return os.fspath(path) if hasattr(path, '__fspath__') else path


def field(name):
  # pylint: disable-next=protected-access
  return property(lambda self: self._values[name])


class RunConfig(object):
  """Immutable run configuration (`tf.estimator.RunConfig`'s fields).

  Keyword arguments are those of `tf.estimator.RunConfig` that the driver uses;
  `save_checkpoints_secs` defaults to 600 when neither it nor
  `save_checkpoints_steps` is given.  `cluster` is a `ClusterResolver` whose
  master and cluster spec are taken as TF takes a TPU's, or a resolver of a
  parameter-server cluster (one with a `ps` job, e.g. a `SimpleClusterResolver`
  with task_type and task_id), which then stands in for `TF_CONFIG`.

  `sync_replicas` (tpu_fc's own): in a parameter-server cluster, aggregate the
  gradients of all training tasks every step, with `SyncReplicasOptimizer`
  semantics, instead of training asynchronously (Estimator's default).

  The cluster roles are read-only attributes: `cluster_spec`, `task_type`,
  `task_id`, `master`, `evaluation_master`, `is_chief`, `num_ps_replicas`,
  `num_worker_replicas`, `global_id_in_cluster`; so is every argument.
  `TPUEstimator` takes the TPU's `RunConfig` (`tpu_fc.RunConfig`), whose
  keyword arguments these are.

  Args:
    evaluation_master: the session target of evaluation; None: TF_CONFIG's
      `eval_session_master`, else `master`.
    master: the session target of training; None: TF_CONFIG's
      `session_master`, else '' (in process) for a one-task or no cluster,
      else this task's `grpc://` address (a TPU resolver's master with
      `cluster`).
    cluster: a `tf.distribute.cluster_resolver.ClusterResolver` (see above);
      not with `master`.
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
      the Estimator's (soft placement, one Grappler pass; the emulated TPU
      also turns Grappler's arithmetic optimizer off unless it is set).
    keep_checkpoint_max: the newest checkpoints kept; 0 or None: all.
    keep_checkpoint_every_n_hours: also keep one checkpoint every this many
      hours.
    log_step_count_steps: `TPUEstimator` logs the step rate (on the emulated
      TPU also the loss) every this many steps, rounded up to whole loops of
      `iterations_per_loop`; None: never.
    session_creation_timeout_secs: how long a session may wait to become
      available (a worker for the chief's) before failing.
    checkpoint_save_graph_def: whether checkpoints and summaries write the
      graph.
    device_fn: `op -> device` placing every op of the training graph; None:
      Estimator's replica device setter in a parameter-server cluster.
    protocol: the protocol of this task's server in a cluster (e.g. 'grpc');
      None: TF's default.
    sync_replicas: see above (False: asynchronous training).
    experimental_max_worker_delay_secs: the longest a worker waits before it
      starts training in `train_and_evaluate` (default 60 s).
    train_distribute, eval_distribute, experimental_distribute: must be None:
      tpu_fc runs no `tf.distribute` strategy.

  Raises:
    ValueError: both checkpoint intervals set, an empty `model_dir` or one
      other than TF_CONFIG's, both `master` and `cluster`, a value out of its
      range (negative steps, seconds or counts; `keep_checkpoint_every_n_hours`,
      `log_step_count_steps` or `session_creation_timeout_secs` <= 0), a
      `tf_random_seed` or `experimental_max_worker_delay_secs` that is no int,
      a `session_config` that is no `ConfigProto`, a `device_fn` not taking
      exactly `op`, a distribution strategy, a TPU resolver with a
      `session_config` that has a cluster def, or a TF_CONFIG whose cluster
      and task do not fit (TF 2.15's checks).
    TypeError: TF_CONFIG's `service` is not a dict.
  """

  # Fields `replace` takes, all of the keyword arguments, as in Estimator.
  REPLACEABLE = KWARG_FIELDS

  def __init__(self,
               evaluation_master: str | None = None,
               master: str | None = None,
               cluster: Any = None,
               *,
               model_dir: str | os.PathLike | None = None,
               tf_random_seed: int | None = None,
               save_summary_steps: int | None = 100,
               save_checkpoints_steps: int | None = _USE_DEFAULT,
               save_checkpoints_secs: int | None = _USE_DEFAULT,
               session_config: tf.compat.v1.ConfigProto | None = None,
               keep_checkpoint_max: int | None = 5,
               keep_checkpoint_every_n_hours: float = 10000,
               log_step_count_steps: int | None = 100,
               session_creation_timeout_secs: float = 7200,
               checkpoint_save_graph_def: bool = True,
               device_fn: Callable[[tf.Operation], Any] | None = None,
               protocol: str | None = None,
               sync_replicas: bool = False,
               experimental_max_worker_delay_secs: int | None = None,
               train_distribute: None = None,
               eval_distribute: None = None,
               experimental_distribute: None = None):
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
    tf_config = read_tf_config()
    if tf_config:
      tf.compat.v1.logging.info('TF_CONFIG environment variable: %s', tf_config)
    model_dir = _model_dir_in(tf_config, path_to_str(model_dir))
    if master is not None and cluster is not None:
      raise ValueError('Both master and cluster are set.')
    tpu_cluster = cluster is not None and PS not in cluster.cluster_spec().jobs
    if cluster is not None and not tpu_cluster:  # as if given by TF_CONFIG
      settings = cluster_settings(cluster.cluster_spec(), cluster.task_type,
                                  cluster.task_id)
    else:
      settings = _settings_from_tf_config(tf_config)
    if master is not None:
      settings['master'] = master
    elif tpu_cluster:
      settings['master'] = cluster.master()
    if evaluation_master is not None:
      settings['evaluation_master'] = evaluation_master
    elif (not settings['evaluation_master'] and
          settings['task_type'] != EVALUATOR):
      settings['evaluation_master'] = settings['master']
    if tpu_cluster:
      settings['cluster_spec'] = cluster.cluster_spec()
      session_config = _with_cluster_def(session_config,
                                         settings['cluster_spec'])
    elif session_config is None and settings['num_ps_replicas']:
      session_config = distributed_session_config(settings['task_type'],
                                                  settings['task_id'])
    self._values = dict(
        model_dir=model_dir,
        tf_random_seed=tf_random_seed,
        save_summary_steps=save_summary_steps,
        save_checkpoints_steps=save_checkpoints_steps,
        save_checkpoints_secs=save_checkpoints_secs,
        session_config=session_config,
        keep_checkpoint_max=keep_checkpoint_max,
        keep_checkpoint_every_n_hours=keep_checkpoint_every_n_hours,
        log_step_count_steps=log_step_count_steps,
        session_creation_timeout_secs=session_creation_timeout_secs,
        checkpoint_save_graph_def=checkpoint_save_graph_def,
        device_fn=device_fn,
        protocol=protocol,
        sync_replicas=sync_replicas,
        experimental_max_worker_delay_secs=experimental_max_worker_delay_secs,
        train_distribute=train_distribute,
        eval_distribute=eval_distribute,
        experimental_distribute=experimental_distribute,
        cluster=cluster,
        **settings)
    validate(self._values)

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
  cluster = field('cluster')
  cluster_spec = field('cluster_spec')
  is_chief = field('is_chief')
  task_type = field('task_type')
  task_id = field('task_id')
  global_id_in_cluster = field('global_id_in_cluster')
  num_ps_replicas = field('num_ps_replicas')
  num_worker_replicas = field('num_worker_replicas')

  def replace(self, **kwargs: Any) -> RunConfig:
    """A copy with some keyword arguments changed, as `tf.estimator.RunConfig`'s.

    Setting one checkpoint interval to a value clears the other.

    Args:
      **kwargs: keyword arguments of the constructor by name (of the TPU's
        `RunConfig`, also `tpu_config`).

    Returns:
      A new `RunConfig` of this class.

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
    values = dict(self._values, **self._coerced(kwargs))
    if 'model_dir' in kwargs:
      values['model_dir'] = path_to_str(kwargs['model_dir'])
    steps = values['save_checkpoints_steps']
    secs = values['save_checkpoints_secs']
    if 'save_checkpoints_steps' in kwargs and 'save_checkpoints_secs' in kwargs:
      if steps is not None and secs is not None:
        raise ValueError(_SAVE_CKPT_ERR)
    elif 'save_checkpoints_steps' in kwargs and steps is not None:
      values['save_checkpoints_secs'] = None
    elif 'save_checkpoints_secs' in kwargs and secs is not None:
      values['save_checkpoints_steps'] = None
    validate(values)
    return self._from_values(values)

  def _coerced(self, values):
    """`values` of fields as stored (a subclass converts its own fields)."""
    return values

  @classmethod
  def _from_values(cls, values):
    config = cls.__new__(cls)
    config._values = values  # pylint: disable=protected-access
    return config

  def __deepcopy__(self, memo):
    # The cluster resolver is shared: it holds clients, not run state.
    values = {k: v if k == 'cluster' else copy.deepcopy(v, memo)
              for k, v in self._values.items()}
    return self._from_values(values)

  def __repr__(self):
    return 'RunConfig({})'.format(', '.join(
        '{}={!r}'.format(k, v) for k, v in self._values.items()))


def _with_cluster_def(session_config, cluster_spec):
  """Copies `cluster_spec` into (a copy of) `session_config`, as TF does."""
  if session_config is None:
    session_config = tf.compat.v1.ConfigProto(
        allow_soft_placement=True, isolate_session_state=True)
  elif session_config.HasField('cluster_def'):
    raise ValueError('You cannot provide a ClusterResolver and '
                     'session_config.cluster_def.')
  else:
    session_config = copy.deepcopy(session_config)
  if cluster_spec:
    session_config.cluster_def.CopyFrom(cluster_spec.as_cluster_def())
  return session_config


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
