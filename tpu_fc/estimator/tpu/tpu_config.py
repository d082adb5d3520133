"""The TPU's run configuration: `TPUConfig`, `InputPipelineConfig` and the
`RunConfig` that holds a `TPUConfig` (`tf.compat.v1.estimator.tpu.*` of
tensorflow-estimator 2.15, its `tpu_config.py`): same fields, defaults and
error texts.
"""
from __future__ import annotations

import collections
import copy
import re
from typing import Any, Sequence

import numpy as np

from tpu_fc._tf import tf
from tpu_fc.estimator import run_config


class InputPipelineConfig(object):
  """How `input_fn` is deployed on TPU hosts; see `TPUConfig`.

  On the emulated TPU (`docs/emulation.md`: hosts of 8 cores past 8), as TF
  2.15 deploys it: `PER_HOST_V1` (the default): input_fn is called once per
  host with the global batch size / hosts, each core takes its slice.
  `PER_HOST_V2`: called once per host with a core's batch size, it must
  return a Dataset; core k of a host of m cores takes at step s its host's
  batch s * m + k.  `PER_SHARD_V1` (training only; elsewhere as
  `PER_HOST_V1`): called once per core with a core's batch size, returning
  features and labels, not a Dataset.  `BROADCAST`: called once with the
  global batch size, every core takes the whole batch (no embedding
  features).  `SLICED` (for `eval_training_input_configuration`): evaluation
  and prediction call input_fn once with the global batch size and slice it.
  On several hosts, evaluation needs `PER_HOST_V2` or a broadcast input, and
  prediction a broadcast input, as TF's.
  """
  PER_SHARD_V1 = 1
  PER_HOST_V1 = 2
  PER_HOST_V2 = 3
  BROADCAST = 4
  SLICED = 5


_ITERATIONS_PER_LOOP_VALUE_REGEX = re.compile(
    r'^(?P<value>[1-9]\d*)((?P<suffix>[s|m|h])$|$)')

IterationsPerLoopCounter = collections.namedtuple('IterationsPerLoopCounter',
                                                  ['value', 'unit'])


def check_positive_integer(value, name):
  """Raises the legacy TypeError/ValueError unless `value` is an int > 0."""
  if not isinstance(value, (int, np.integer)):
    raise TypeError('{} must be int, got {}'.format(name, type(value)))
  if value <= 0:
    raise ValueError('{} must be positive, got {}'.format(name, value))


def parse_iterations_per_loop(iterations_per_loop):
  """Parses `N` (steps) or `'<N>s|m|h'` (seconds) into a counter."""
  m = _ITERATIONS_PER_LOOP_VALUE_REGEX.match(str(iterations_per_loop))
  if m is None:
    # The missing space in 'anypositive' is TF's.
    raise ValueError(
        'Invalid TPUConfig `iterations_per_loop` value. Value must be positive '
        'integer value or time-based value `<N><s|m|h>` where <N> is any'
        'positive integer and `s`, `m`, `h` are unit of time in seconds, '
        'minutes, hours respectively. Examples of valid values: `3600s`, `60m`,'
        ' `1h`.')
  value = int(m.group('value'))
  suffix = m.group('suffix')
  if suffix is None:
    return IterationsPerLoopCounter(value, 'count')
  return IterationsPerLoopCounter(value * {'s': 1, 'm': 60, 'h': 3600}[suffix],
                                  'seconds')


def _tpu_job_name_from_tf_config():
  tpu_job_name = run_config.read_tf_config().get('service', {}).get(
      'tpu_worker_job_name')
  if tpu_job_name:
    tf.compat.v1.logging.info('Load TPU job name from TF_CONFIG: %s',
                              tpu_job_name)
  return tpu_job_name


class TPUConfig(
    collections.namedtuple('TPUConfig', [
        'iterations_per_loop',
        'num_shards',
        'num_cores_per_replica',
        'per_host_input_for_training',
        'tpu_job_name',
        'initial_infeed_sleep_secs',
        'input_partition_dims',
        'eval_training_input_configuration',
        'experimental_host_call_every_n_steps',
        'experimental_allow_per_host_v2_parallel_get_next',
        'experimental_feed_hook',
    ])):
  """TPU settings of a `RunConfig` (legacy `tf.estimator.tpu.TPUConfig`).

  `per_host_input_for_training` True/False is stored as PER_HOST_V1 /
  PER_SHARD_V1.  Every field is taken and checked as TF 2.15 does; those
  about TPU hardware tpu_fc has none of are kept and not read (said below).

  Args:
    iterations_per_loop: training steps per `session.run` on the emulated
      TPU, in an in-graph loop (the global step moves that many per run;
      hooks see one run); or `'<N>s'`, `'<N>m'`, `'<N>h'`: a time, which runs
      one step per `session.run` and logs every N seconds.  Evaluation on the
      emulated TPU runs all its `steps` in one run instead.  With
      `use_tpu=False`, one step per run.
    num_shards: the TPU cores to emulate; None: 1.  1 itself is refused
      with an `embedding_config_spec` (and warned about otherwise), as in TF
      2.15.
    num_cores_per_replica: model parallelism, which is not emulated: checked
      (1, 2, 4, ..., 128); with more than 1, building the model on the
      emulated TPU raises `NotImplementedError` (after TF's checks of the
      configuration and the input), as does
      `params['context'].device_assignment`.
    per_host_input_for_training: how input_fn feeds the cores in training: an
      `InputPipelineConfig` value, True (`PER_HOST_V1`) or False
      (`PER_SHARD_V1`).
    tpu_job_name: kept, not read (no TPU job); None: TF_CONFIG's
      `service.tpu_worker_job_name`.
    initial_infeed_sleep_secs: kept, not read (no infeed thread); a positive
      int if given.
    input_partition_dims: no spatial partitioning (it needs
      `num_cores_per_replica`); checked as TF 2.15 does, here and against
      the input_fn's features and labels.
    eval_training_input_configuration: `PER_HOST_V1` (evaluation and
      prediction as training's pipeline decides) or `SLICED` (one input_fn
      call with the global batch, sliced over the cores; only with
      `use_tpu=True`).
    experimental_host_call_every_n_steps: in the emulated TPU's training
      loop, a `host_call` runs on a loop's first step and every this many
      after it.
    experimental_allow_per_host_v2_parallel_get_next: kept, not read: the
      emulated cores take `PER_HOST_V2` batches in order.
    experimental_feed_hook: kept, not read (no infeed or outfeed).

  Raises:
    ValueError: an `iterations_per_loop` that is neither a positive int nor
      a time, `num_shards` <= 0 or `initial_infeed_sleep_secs` <= 0,
      `input_partition_dims` of other than one or two elements or without
      `PER_HOST_V2` and `num_cores_per_replica`, another
      `num_cores_per_replica`, or another
      `eval_training_input_configuration`.
    TypeError: `num_shards` or `initial_infeed_sleep_secs` that is no int.
  """

  def __new__(cls,
              iterations_per_loop: int | str = 2,
              num_shards: int | None = None,
              num_cores_per_replica: int | None = None,
              per_host_input_for_training: bool | int = True,
              tpu_job_name: str | None = None,
              initial_infeed_sleep_secs: int | None = None,
              input_partition_dims: Sequence[Any] | None = None,
              eval_training_input_configuration: int = (
                  InputPipelineConfig.PER_HOST_V1),
              experimental_host_call_every_n_steps: int = 1,
              experimental_allow_per_host_v2_parallel_get_next: bool = False,
              experimental_feed_hook: Any = None):
    parse_iterations_per_loop(iterations_per_loop)
    if num_shards is not None:
      check_positive_integer(num_shards, 'TPUConfig num_shards')
    if input_partition_dims is not None:
      if len(input_partition_dims) not in (1, 2):
        raise ValueError(
            'input_partition_dims must be a list/tuple with one or two'
            ' elements.')
      if per_host_input_for_training is not InputPipelineConfig.PER_HOST_V2:
        raise ValueError(
            'input_partition_dims is only supported in PER_HOST_V2 mode.')
      if num_cores_per_replica is None:
        raise ValueError(
            'input_partition_dims requires setting num_cores_per_replica.')
    if num_cores_per_replica is not None and num_cores_per_replica not in (
        1, 2, 4, 8, 16, 32, 64, 128):
      raise ValueError('num_cores_per_replica must be 1, 2, 4, 8, 16, 32, 64, '
                       '128; got {}'.format(str(num_cores_per_replica)))
    if eval_training_input_configuration not in (
        InputPipelineConfig.PER_HOST_V1, InputPipelineConfig.SLICED):
      raise ValueError(
          'eval_training_input_configuration must be PER_HOST_V1 or SLICED;'
          ' got {}'.format(str(eval_training_input_configuration)))
    if per_host_input_for_training is False:
      per_host_input_for_training = InputPipelineConfig.PER_SHARD_V1
    elif per_host_input_for_training is True:
      per_host_input_for_training = InputPipelineConfig.PER_HOST_V1
    if initial_infeed_sleep_secs:
      check_positive_integer(initial_infeed_sleep_secs,
                             'TPUConfig initial_infeed_sleep_secs')
    return super(TPUConfig, cls).__new__(
        cls, iterations_per_loop, num_shards, num_cores_per_replica,
        per_host_input_for_training,
        tpu_job_name or _tpu_job_name_from_tf_config(),
        initial_infeed_sleep_secs, input_partition_dims,
        eval_training_input_configuration,
        experimental_host_call_every_n_steps,
        experimental_allow_per_host_v2_parallel_get_next,
        experimental_feed_hook)


def coerce_tpu_config(tpu_config):
  """Returns a `TPUConfig` for ours, None, or any object with its attributes."""
  if tpu_config is None:
    return TPUConfig()
  if isinstance(tpu_config, TPUConfig):
    return tpu_config
  if not all(hasattr(tpu_config, field) for field in (
      'iterations_per_loop', 'num_shards', 'per_host_input_for_training')):
    raise TypeError(
        'tpu_config must be a TPUConfig (e.g. tpu_config=TPUConfig('
        'iterations_per_loop=100, num_shards=8)), got {!r}.'.format(tpu_config))
  return TPUConfig(**{
      field: getattr(tpu_config, field)
      for field in TPUConfig._fields
      if hasattr(tpu_config, field)
  })


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


class RunConfig(run_config.RunConfig):
  """Run configuration of a `TPUEstimator` (legacy `tf.estimator.tpu.RunConfig`):
  the Estimator's, with the `TPUConfig` first.

  What `TPUEstimator(config=...)` takes; `tpu_config` and `cluster` are
  read-only attributes too.  As TF's, `evaluation_master` is `master` unless
  given (or set by TF_CONFIG), and no device filters are set for a cluster's
  task, except (tpu_fc's parameter-server training) in a cluster with ps
  tasks.

  Args:
    tpu_config: a `TPUConfig` (or an object with its fields, e.g. TF 2.15's);
      None: `TPUConfig()`.
    evaluation_master: the session target of evaluation; None: TF_CONFIG's
      `eval_session_master`, else `master`.
    master: the session target of training; None: TF_CONFIG's
      `session_master`, else '' (in process) for a one-task or no cluster,
      else this task's `grpc://` address (a TPU resolver's master with
      `cluster`).
    cluster: a `tf.distribute.cluster_resolver.ClusterResolver`: a TPU's
      gives the master and the cluster spec (copied into the session config),
      as TF takes it; a parameter-server cluster's (one with a `ps` job, e.g.
      a `SimpleClusterResolver` with task_type and task_id) stands in for
      `TF_CONFIG` (tpu_fc's).  Not with `master`.
    **kwargs: those of the Estimator's `tpu_fc.estimator.run_config.RunConfig`
      (model_dir, checkpoint and summary intervals, session_config, ...).

  Raises:
    TypeError: a `tpu_config` without `TPUConfig`'s fields.
    ValueError: see the Estimator's `RunConfig` and `TPUConfig`; both `master`
      and `cluster`; a TPU resolver with a `session_config` that has a
      cluster def.
  """

  REPLACEABLE = run_config.REPLACEABLE_FIELDS + ('tpu_config',)

  def __init__(self, tpu_config: TPUConfig | None = None,
               evaluation_master: str | None = None, master: str | None = None,
               cluster: Any = None, **kwargs: Any):
    super().__init__(**kwargs)
    self._tpu_config = coerce_tpu_config(tpu_config)
    self._cluster = cluster
    if master is not None:
      if cluster is not None:
        raise ValueError('Both master and cluster are set.')
      self._master = master
    elif (cluster is not None and
          run_config.TaskType.PS in cluster.cluster_spec().jobs):
      # A parameter-server cluster's resolver (one with a `ps` job), which
      # tpu_fc reads as TF_CONFIG (`tpu_fc.estimator.distributed`).
      self._set(**run_config.cluster_settings(
          cluster.cluster_spec(), cluster.task_type, cluster.task_id))
      self._maybe_overwrite_session_config_for_distributed_training()
    elif cluster:
      self._master = cluster.master()
      self._cluster_spec = cluster.cluster_spec()
      self._session_config = _with_cluster_def(self._session_config,
                                               self._cluster_spec)
    if evaluation_master is not None:
      self._evaluation_master = evaluation_master
    elif (not self._evaluation_master and
          self._task_type != run_config.TaskType.EVALUATOR):
      self._evaluation_master = self._master

  def _maybe_overwrite_session_config_for_distributed_training(self):
    """A TPU trains in-graph: no device filters (TF's), but for a task of a
    cluster with ps tasks (tpu_fc's parameter-server training)."""
    if not self._session_config and self._num_ps_replicas:
      self._session_config = run_config.distributed_session_config(
          self._task_type, self._task_id)

  tpu_config = run_config.field('tpu_config')
  cluster = run_config.field('cluster')

  def _coerced(self, values):
    values = super()._coerced(values)
    if 'tpu_config' in values:
      values = dict(values, tpu_config=coerce_tpu_config(values['tpu_config']))
    return values

  def __deepcopy__(self, memo):
    """A deep copy sharing the cluster resolver (it holds clients, not run
    state)."""
    config = type(self).__new__(type(self))
    memo[id(self)] = config
    memo.setdefault(id(self._cluster), self._cluster)
    config.__dict__.update(copy.deepcopy(self.__dict__, memo))
    return config


def coerce_run_config(config):
  """Returns our `RunConfig` for ours or a duck-typed TPU RunConfig.

  A tensorflow_estimator `tpu.RunConfig` is read attribute by attribute (its
  session_config already holds the cluster def, so no re-merge is done).
  """
  if isinstance(config, RunConfig):
    return config
  if config is None or not hasattr(config, 'tpu_config'):
    raise ValueError(
        '`config` must be provided with type `tpu_config.RunConfig`')
  result = RunConfig()
  result._set(**{  # pylint: disable=protected-access
      name: getattr(config, name, getattr(result, name))
      for name in run_config.REPLACEABLE_FIELDS + run_config.CLUSTER_FIELDS +
      ('cluster',)
  })
  result._set(  # pylint: disable=protected-access
      model_dir=run_config.path_to_str(result.model_dir),
      tpu_config=coerce_tpu_config(config.tpu_config))
  run_config.validate(result)
  return result
