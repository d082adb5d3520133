"""How input_fn feeds the emulated TPU's cores: TF 2.15's `_InputPipeline`.

`TPUConfig.per_host_input_for_training`, and outside training
`eval_training_input_configuration`, decide it as tensorflow-estimator 2.15
does (`tpu_context.py`: `_InternalTPUContext.is_input_sharded_per_core`,
`is_input_per_host_with_iterators`, `is_input_broadcast_with_iterators`,
`batch_size_for_input_fn`, `batch_size_for_model_fn`; `tpu_estimator.py`:
`_InputPipeline._invoke_input_fn_and_record_structure` and the
`generate_*_enqueue_ops_fn*` it calls), for n cores on h hosts
(`tpu_context.EmulatedSystem`):

* `PER_SHARD_V1`, training: input_fn is called once per core, each call with
  the core's batch size and its invocation index, and core c takes call c's
  batches (features and labels, not a Dataset, as TF requires).
* `PER_HOST_V2`: input_fn is called once per host with the core's batch size
  and must return a Dataset; core k of host i takes, at step s, its host's
  batch s * n / h + k.
* `BROADCAST`: input_fn is called once (host 0) with the global batch size;
  every core takes the whole batch (its slice when
  `eval_training_input_configuration` is `SLICED`, in every mode, as TF's
  broadcast enqueue reads that setting).
* `PER_HOST_V1` (the default), `PER_SHARD_V1` outside training: input_fn is
  called once per host with the global batch size / h; the host's cores take
  a slice each.  Evaluation or prediction with
  `eval_training_input_configuration=SLICED`: called once with the global
  batch size, core c takes slice c.

The embedding engine looks up a step's global batch: the cores' batches,
joined in core order (`per_step_input`), which the emulation slices back
into each core's own.
"""
from typing import NamedTuple

import numpy as np

from tpu_fc._tf import tf
from tpu_fc import _tf_internals as internals
from tpu_fc.estimator import input_fn as input_fn_lib
from tpu_fc.estimator.model_fn import ModeKeys
from tpu_fc.estimator.tpu.tpu_config import InputPipelineConfig, TPUConfig


# How the cores take their batches.
PER_CORE_CALLS = 'per_core_calls'  # core c: input_fn call c's batches
SPLIT = 'split'                    # core c: slice c of each batch
PER_HOST_V2 = 'per_host_v2'        # core k of a host of m: its batch s * m + k
WHOLE = 'whole'                    # every core: the whole batch


class InputFnCall(NamedTuple):
  """One input_fn call: the host it runs on, and its
  `TPUContext.current_input_fn_deployment()` but the device."""
  host_id: int
  invocation_index: int
  invocation_count: int
  replicas_fed: int


class Deployment(NamedTuple):
  """The input of one mode on the emulated TPU: how the cores take their
  batches (`kind`), whether input_fn is called once for all hosts
  (`broadcast`), and `params['batch_size']` of input_fn and model_fn (None
  without a configured batch size)."""
  kind: str
  broadcast: bool
  num_cores: int
  num_hosts: int
  input_fn_batch_size: int | None
  model_fn_batch_size: int | None

  @property
  def input_fn_calls(self) -> int:
    if self.kind == PER_CORE_CALLS:
      return self.num_cores
    return 1 if self.broadcast else self.num_hosts

  @property
  def cores_per_host(self) -> int:
    return self.num_cores // self.num_hosts

  @property
  def batches_per_call(self) -> int:
    """Batches each input_fn call's input gives a step."""
    return self.cores_per_host if self.kind == PER_HOST_V2 else 1

  def call(self, invocation: int) -> InputFnCall:
    """The `InputFnCall` of call number `invocation`."""
    if self.kind == PER_CORE_CALLS:
      return InputFnCall(invocation // self.cores_per_host, invocation,
                         self.num_cores, 1)
    if self.broadcast:
      return InputFnCall(0, 0, 1, self.num_cores)
    return InputFnCall(invocation, invocation, self.num_hosts,
                       self.cores_per_host)

  def checked(self, given: input_fn_lib.Input) -> input_fn_lib.Input:
    """`given`, an input_fn call's `input_fn.Input`; TF's TypeError for the
    kind of result the deployment cannot take."""
    if self.kind == PER_CORE_CALLS and given.from_dataset:
      raise TypeError(  # (TF's two spaces and "yet ... yet")
          '`input_fn` returning `Dataset`  is not yet supported in '
          'per-Core input pipeline deployment yet. Please set '
          'TPUConfig.per_host_input_for_training to True or return '
          '`features` and `labels` from `input_fn`')
    if self.kind == PER_HOST_V2 and not given.from_dataset:
      raise TypeError('`input_fn` must return a `Dataset` for the PER_HOST_V2 '
                      'input pipeline configuration.')
    return given


def deployment(tpu_config: TPUConfig, mode: str, num_cores: int,
               num_hosts: int, global_batch_size: int | None) -> Deployment:
  """The `Deployment` of `mode` on `num_cores` emulated cores of `num_hosts`
  hosts."""
  pipeline = tpu_config.per_host_input_for_training
  sliced_config = (tpu_config.eval_training_input_configuration ==
                   InputPipelineConfig.SLICED)
  sliced = mode != ModeKeys.TRAIN and sliced_config
  broadcast = pipeline == InputPipelineConfig.BROADCAST or sliced
  if mode == ModeKeys.TRAIN and pipeline == InputPipelineConfig.PER_SHARD_V1:
    kind = PER_CORE_CALLS
  elif broadcast:
    kind = SPLIT if sliced_config else WHOLE
  elif pipeline == InputPipelineConfig.PER_HOST_V2:
    kind = PER_HOST_V2
  else:
    kind = SPLIT

  def divided(batch_size, parts):
    return None if batch_size is None else batch_size // parts

  if kind in (PER_CORE_CALLS, PER_HOST_V2):
    input_fn_batch_size = divided(global_batch_size, num_cores)
  else:
    input_fn_batch_size = divided(global_batch_size,
                                  1 if broadcast else num_hosts)
  return Deployment(
      kind, broadcast, num_cores, num_hosts,
      input_fn_batch_size=input_fn_batch_size,
      model_fn_batch_size=(global_batch_size if broadcast and not sliced else
                           divided(global_batch_size, num_cores)))


def _joined(batches):
  """Batches of one structure (features, or labels: None), joined along the
  batch dimension."""
  if batches[0] is None:
    return None

  def join(*values):
    if isinstance(values[0], tf.SparseTensor):
      return tf.sparse.concat(0, list(values), expand_nonconcat_dims=True)
    return tf.concat(list(values), axis=0)

  return tf.nest.map_structure(join, *batches)


def _cores_in_order(next_batches):
  """`() -> the step's batch`: each core's `next_batch()` taken in core order
  (control dependencies, as TF's PER_HOST_V2 enqueue orders its get_next
  calls), joined into one batch."""
  def next_batch():
    batches, previous = [], []
    for take in next_batches:
      with tf.control_dependencies(previous):
        batch = take()
      batches.append(batch)
      previous = [tensor for tensor in tf.nest.flatten(
          batch, expand_composites=True) if isinstance(tensor, tf.Tensor)]
    features, labels = zip(*batches)
    return _joined(features), _joined(labels)
  return next_batch


def per_step_input(inputs, batches_per_call):
  """The `input_fn.Input` whose every batch is a step's: the batches of the
  input_fn calls' `inputs`, `batches_per_call` from each, in core order."""
  if len(inputs) == 1 and batches_per_call == 1:
    return inputs[0]
  takes = [given for given in inputs for _ in range(batches_per_call)]
  per_step = (_cores_in_order([given.next_batch_per_step for given in takes])
              if all(given.next_batch_per_step for given in inputs) else None)
  return input_fn_lib.Input(
      next_batch=_cores_in_order([given.next_batch for given in takes]),
      hooks=[hook for given in inputs for hook in given.hooks],
      from_dataset=any(given.from_dataset for given in inputs),
      next_batch_per_step=per_step)


def _key_names(value):
  return sorted(value) if isinstance(value, dict) else []


def _dims_in_structure_of(value, dims, index, name):
  """`dims` at the places of `value`'s tensors; TF's error (its texts name
  the features `features`, the labels `labels:`) where they do not fit."""
  try:
    return internals.flatten_up_to(value, dims)
  except TypeError as e:
    raise ValueError(
        'TPUConfig.input_partition_dims[{index}] mismatched the structure of '
        '{kind}. input_partition_dims[{index}]: {dims}, {name} {value}. '
        '{error}'.format(index=index, kind=name.rstrip(':'), dims=dims,
                         name=name, value=value, error=e)) from e


def check_input_partition_dims(tpu_config, features, labels):
  """TF 2.15's checks of `TPUConfig.input_partition_dims` against a batch, in
  its order and words (`tpu_estimator.py`, `InputsStructureRecorder`,
  1324-1398; `tpu_feed.py`, `_check_input_partition_dims`, 905-943), made
  after input_fn though the partitioning they configure, model parallelism,
  is not emulated."""
  feature_dims, label_dims = (list(tpu_config.input_partition_dims) +
                              [None])[:2]
  if _key_names(feature_dims) != _key_names(features):
    raise ValueError('TPUConfig.input_partition_dims[0] mismatched feature '
                     'keys. Expected {}, got {}'.format(
                         _key_names(features), _key_names(feature_dims)))
  if label_dims is not None and _key_names(label_dims) != _key_names(labels):
    raise ValueError('TPUConfig.input_partition_dims[1] mismatched label '
                     'keys. Expected {}, got {}'.format(
                         _key_names(labels), _key_names(label_dims)))
  label_tensors = tf.nest.flatten(labels) if labels is not None else []
  tensors = tf.nest.flatten(features) + label_tensors
  dims = _dims_in_structure_of(features, feature_dims, 0, 'features')
  if label_dims is None:
    dims += [None] * len(label_tensors)
  elif labels is not None:
    dims += _dims_in_structure_of(labels, label_dims, 1, 'labels:')
  for tensor, tensor_dims in zip(tensors, dims):
    if tensor_dims is None:
      continue
    tensor_dims = np.array(tensor_dims)
    if (tensor_dims < 1).any():
      raise ValueError('All input partition dims must be >= 1.')
    if tensor_dims.prod() == 1:
      continue
    if tensor_dims.prod() != tpu_config.num_cores_per_replica:
      raise ValueError(
          'The product of each input partition dim should equal to '
          'num_cores_per_replica. (dim = {}, num_cores_per_replica = {})'
          .format(tensor_dims, tpu_config.num_cores_per_replica))
    if tensor_dims.shape[0] != tensor.shape.ndims:
      raise ValueError(
          'Input partition dims must have the same number of dimensions as '
          'the `Tensor` to be partitioned. (tensor shape = {}, input '
          'partition dims = {}).'.format(tensor.shape.as_list(), tensor_dims))
