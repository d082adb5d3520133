"""The emulated TPU system as TPUEstimator and its users see it: its hosts.

`EmulatedSystem` is what TF 2.15's `_InternalTPUContext` (`TPUEstimator._ctx`)
answers for a TPU system of `TPUConfig.num_shards` cores, each a replica, on
hosts of 8 cores as a v2/v3 pod slice has them (one host of all the cores
when they are 8 or fewer, or not a multiple of 8): the master job TPU
computations go to, and where each host's input pipeline is placed.
`TPUContext` is `params['context']` under `use_tpu=True`: input pipelines read
it to shard their data (`current_input_fn_deployment()`, `current_host`,
`num_hosts`) and model_fns to size per-replica work (`num_replicas`,
`device_for_replica`); an input_fn call's deployment is TF 2.15's for the
input pipeline (`input_pipeline`).
"""
import contextlib
import copy

from tpu_fc import _tf_internals as internals
from tpu_fc._tf import tf
from tpu_fc.estimator.model_fn import ModeKeys

# Cores per host of a TPU v2/v3 pod slice, whose hosts TF's multi-host input
# pipelines (and TF's own tests of them) deploy input_fn on.
_CORES_PER_POD_HOST = 8
# TF's host device under a local master (no job): this process's CPU.
_LOCAL_CPU = '/replica:0/task:0/device:CPU:0'


def _model_parallelism_refused(num_cores_per_replica, what):
  return NotImplementedError(
      'TPUConfig(num_cores_per_replica={}) asks for model parallelism, which '
      'tpu_fc does not emulate: {}. Leave num_cores_per_replica=None.'.format(
          num_cores_per_replica, what))


def refuse_model_parallelism(num_cores_per_replica):
  """Raises for `TPUConfig.num_cores_per_replica` > 1 (each replica over
  several cores), which the emulation cannot build; TF's checks of the
  configuration and of `input_partition_dims` come first."""
  if num_cores_per_replica and num_cores_per_replica > 1:
    raise _model_parallelism_refused(
        num_cores_per_replica, 'each emulated core runs the whole model_fn')


class EmulatedSystem:
  """TF 2.15's `_InternalTPUContext` of the emulated system (`tpu_context.py`
  of tensorflow-estimator, 233-880): `num_shards` cores (1 if None), the
  replicas, on `num_hosts` hosts of `num_of_cores_per_host`.

  Args:
    config: the estimator's `RunConfig`: its TPUConfig, master, evaluation
      master and session config (whose cluster names the master job).
    mode: the mode of `with_mode`, or None.
  """

  def __init__(self, config, mode=None):
    self._config = config
    self._mode = mode

  @contextlib.contextmanager
  def with_mode(self, mode):
    """This context in `mode` (TF's way to set it)."""
    moded = copy.copy(self)
    moded._mode = mode  # pylint: disable=protected-access
    yield moded

  @property
  def mode(self):
    if self._mode is None:
      raise RuntimeError(
          '`mode` needs to be set via contextmanager `with_mode`.')
    return self._mode

  @property
  def num_replicas(self):
    return self._config.tpu_config.num_shards or 1

  @property
  def num_of_cores_per_host(self):
    cores = self.num_replicas
    if cores > _CORES_PER_POD_HOST and cores % _CORES_PER_POD_HOST == 0:
      return _CORES_PER_POD_HOST
    return cores

  @property
  def num_hosts(self):
    return self.num_replicas // self.num_of_cores_per_host

  @property
  def num_of_replicas_per_host(self):
    return self.num_of_cores_per_host

  @property
  def num_cores_per_replica(self):
    return self._config.tpu_config.num_cores_per_replica

  @property
  def master_job(self):
    """The job TPU computations are placed on, or None (a local master), as
    TF derives it (lines 598-628): `TPUConfig.tpu_job_name`, else the one the
    mode's master and the session config's cluster give."""
    config = self._config
    if config.tpu_config.tpu_job_name:
      return config.tpu_config.tpu_job_name
    cluster_def = (config.session_config.cluster_def
                   if config.session_config else None)
    try:
      return internals.master_job(self._master, cluster_def)
    except ValueError as e:
      raise ValueError(str(e) + ' Please specify a tpu_job_name as part of '
                       'your TPUConfig.') from e

  @property
  def _master(self):
    """The master of the mode's sessions."""
    return (self._config.evaluation_master if self.mode == ModeKeys.EVAL else
            self._config.master)

  def host_device(self, host_id=0):
    """The CPU device of host `host_id`, where its input_fn runs (TF's
    `tpu_host_placement_function`, lines 630-652)."""
    job = self.master_job
    if job is None:
      return _LOCAL_CPU
    return '/job:{}/task:{}/device:CPU:0'.format(job, host_id)

  def tpu_host_placement_function(self, _sentinel=None, replica_id=None,
                                  host_id=None):
    """TF's (lines 630-652): the CPU device of a host, or of a replica's."""
    assert _sentinel is None
    if replica_id is not None and host_id is not None:
      raise RuntimeError(
          'replica_id and host_id can have only one non-None value.')
    if replica_id is not None:
      host_id = replica_id // self.num_of_cores_per_host
    return self.host_device(host_id)

  def device_for_replica(self, replica_id):
    """(CPU device of the replica's host, the replica's ordinal there), as
    TF's (lines 800-830)."""
    job = self.master_job
    return ('{}/task:{}/device:CPU:0'.format(
        '' if job is None else '/job:' + job,
        replica_id // self.num_of_replicas_per_host),
            replica_id % self.num_of_replicas_per_host)

  @contextlib.contextmanager
  def input_pipeline_of_host(self, host_id, broadcast):
    """Where host `host_id` builds its input pipeline, as TF builds it
    (`tpu_estimator.py` 1488-1590): on the host's CPU, in the name scope
    `input_pipeline_task<host_id>` unless the input is broadcast.  The
    emulated hosts are this process when the master is a local one (TF's
    `master_job` gives it no job): their CPU is this process's.  In a task
    of a between-graph cluster the estimator's device functions place it."""
    with contextlib.ExitStack() as stack:
      if internals.master_job(self._master, None) is None:
        stack.enter_context(tf.compat.v1.device(_LOCAL_CPU))
      elif not self._config.cluster_spec:
        stack.enter_context(tf.compat.v1.device(self.host_device(host_id)))
      if not broadcast:
        stack.enter_context(
            tf.compat.v1.name_scope('input_pipeline_task%d' % host_id))
      yield


class TPUContext:
  """The legacy `TPUContext` of the emulated TPU system.

  Args:
    system: the `EmulatedSystem` in the mode called.
    input_fn_call: for an input_fn's context, its call's
      `input_pipeline.InputFnCall`; None for a model_fn's.
  """

  def __init__(self, system, input_fn_call=None):
    self._system = system
    self._input_fn_call = input_fn_call

  def _require_input_fn(self):
    if self._input_fn_call is None:
      raise RuntimeError('This TPUContext instance must not be called from'
                         ' model_fn.')

  @property
  def device_assignment(self):
    """None, as TF 2.15's without model parallelism (`tpu_context.py`, lines
    193-202 and 418-420): TPUConfig.num_cores_per_replica, which would assign
    each replica's cores, is not emulated."""
    if self._input_fn_call is not None:
      raise RuntimeError('This TPUContext instance must not be called from'
                         ' input_fn.')
    if self._system.num_cores_per_replica:
      raise _model_parallelism_refused(self._system.num_cores_per_replica,
                                       'there is no device assignment of its '
                                       'cores')
    return None

  def current_input_fn_deployment(self):
    """(host device, invocation index, invocation count, replicas fed)."""
    self._require_input_fn()
    call = self._input_fn_call
    return (self._system.host_device(call.host_id), call.invocation_index,
            call.invocation_count, call.replicas_fed)

  @property
  def num_replicas(self):
    return self._system.num_replicas

  @property
  def num_hosts(self):
    return self._system.num_hosts

  @property
  def current_host(self):
    self._require_input_fn()
    return self._input_fn_call.host_id

  @property
  def num_of_replicas_per_host(self):
    return self._system.num_of_replicas_per_host

  def device_for_replica(self, replica_id):
    """(CPU device of the replica's host, its device ordinal there)."""
    return self._system.device_for_replica(replica_id)

  @property
  def tpu_host_placement_function(self):
    """`host_id -> the CPU device of that host`."""
    return lambda host_id: self._system.tpu_host_placement_function(
        host_id=host_id)
