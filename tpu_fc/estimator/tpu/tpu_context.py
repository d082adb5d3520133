"""`params['context']` under `use_tpu=True`: the emulated TPU system, one host.

Input pipelines read it to shard their data (`current_input_fn_deployment()`,
`current_host`, `num_hosts`) and model_fns to size per-replica work
(`num_replicas`, `device_assignment`); the values describe the emulated system,
and an input_fn call's deployment is TF 2.15's for the input pipeline
(`input_pipeline`).
"""

_HOST_DEVICE = '/job:localhost/replica:0/task:0/device:CPU:0'


class TPUContext:
  """The legacy `TPUContext` of an emulated TPU system with one host.

  Args:
    num_replicas: the emulated cores.
    input_fn_deployment: for an input_fn's context, its call's (invocation
      index, invocation count, replicas it feeds); None for a model_fn's.
    num_cores_per_replica: TPUConfig's (model parallelism, not emulated).
  """

  def __init__(self, num_replicas, input_fn_deployment=None,
               num_cores_per_replica=None):
    self._num_replicas = num_replicas
    self._input_fn_deployment = input_fn_deployment
    self._num_cores_per_replica = num_cores_per_replica

  def _require_input_fn(self):
    if self._input_fn_deployment is None:
      raise RuntimeError('This TPUContext instance must not be called from'
                         ' model_fn.')

  @property
  def device_assignment(self):
    """None, as TF 2.15's without model parallelism (`tpu_context.py`, lines
    193-202 and 418-420): TPUConfig.num_cores_per_replica, which would assign
    each replica's cores, is not emulated."""
    if self._input_fn_deployment is not None:
      raise RuntimeError('This TPUContext instance must not be called from'
                         ' input_fn.')
    if self._num_cores_per_replica:
      raise NotImplementedError(
          'TPUConfig(num_cores_per_replica={}) asks for model parallelism, '
          'which tpu_fc does not emulate: there is no device assignment of '
          'its cores. Leave num_cores_per_replica=None.'.format(
              self._num_cores_per_replica))
    return None

  def current_input_fn_deployment(self):
    """(host device, invocation index, invocation count, replicas fed)."""
    self._require_input_fn()
    return (_HOST_DEVICE,) + tuple(self._input_fn_deployment)

  @property
  def num_replicas(self):
    return self._num_replicas

  @property
  def num_hosts(self):
    return 1

  @property
  def current_host(self):
    self._require_input_fn()
    return 0

  @property
  def num_of_replicas_per_host(self):
    return self._num_replicas
