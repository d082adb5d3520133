"""`params['context']` under `use_tpu=True`: the emulated TPU system, one host.

Input pipelines read it to shard their data (`current_input_fn_deployment()`,
`current_host`, `num_hosts`) and model_fns to size per-replica work
(`num_replicas`); the values describe the emulated system.
"""


class TPUContext:
  """The legacy `TPUContext` of an emulated TPU system with one host."""

  def __init__(self, num_replicas, call_from_input_fn):
    self._num_replicas = num_replicas
    self._call_from_input_fn = call_from_input_fn

  def _require_input_fn(self):
    if not self._call_from_input_fn:
      raise RuntimeError('This TPUContext instance must not be called from'
                         ' model_fn.')

  def current_input_fn_deployment(self):
    """(host device, invocation index, invocation count, replicas fed)."""
    self._require_input_fn()
    return ('/job:localhost/replica:0/task:0/device:CPU:0', 0, 1,
            self._num_replicas)

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
