"""`params['context']` under `use_tpu=True`: the emulated TPU system, one host.

Input pipelines read it to shard their data (`current_input_fn_deployment()`,
`current_host`, `num_hosts`) and model_fns to size per-replica work
(`num_replicas`); the values describe the emulated system, and an input_fn
call's deployment is TF 2.15's for the input pipeline (`input_pipeline`).
"""

_HOST_DEVICE = '/job:localhost/replica:0/task:0/device:CPU:0'


class TPUContext:
  """The legacy `TPUContext` of an emulated TPU system with one host.

  Args:
    num_replicas: the emulated cores.
    input_fn_deployment: for an input_fn's context, its call's (invocation
      index, invocation count, replicas it feeds); None for a model_fn's.
  """

  def __init__(self, num_replicas, input_fn_deployment=None):
    self._num_replicas = num_replicas
    self._input_fn_deployment = input_fn_deployment

  def _require_input_fn(self):
    if self._input_fn_deployment is None:
      raise RuntimeError('This TPUContext instance must not be called from'
                         ' model_fn.')

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
