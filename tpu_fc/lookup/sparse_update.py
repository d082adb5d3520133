"""One TPU-embedding optimizer step of one table, as TF ops: `tpu_fc.reference` in a graph.

`tpu_fc.reference` is the definition; this module builds the same step order for
the host engine (TF1 graphs through `tf.compat.v1`, also eager and tf.function):

1. gradient clipping of the (already de-duplicated and summed) gradients,
2. the optimizer rule on the looked-up rows only (non-lazy Adam: every row),
3. decoupled weight decay from the pre-update rows, `w = rule(w) - wd·w_old`,
4. weight clipping of the updated rows.

Each stage is built only when configured.  Rules run on TF's sparse training
kernels wherever their arithmetic is the reference's (fast, in place, exact up
to float32 rounding); the rest (Adam, AdagradMomentum, ProximalYogi and
FrequencyEstimator, which no TF kernel computes) gather the rows, apply the
reference formulas and scatter the rows back.  Nothing reads a whole table (or
slot) except non-lazy Adam, which by definition updates every row: once a
resource variable has had a sparse access every dense read copies the whole
buffer (PERFORMANCE_NOTES).

Where a kernel departs from the reference it is not used:
* `ResourceSparseApplyProximalAdagrad` rejects `lr <= 0` (InvalidArgument),
  `ResourceSparseApplyFtrlV2` too (`lr < 0` with multiply_linear_by_lr, whose
  `lr = 0` would turn the mapped `β/(2η)` into NaN), while the reference is
  defined there (a warm-up schedule gives `fn(0) = 0` on the first step): the
  gathered formulas run for `lr <= 0` instead, chosen at build time for a
  constant rate, by `tf.cond` otherwise.
* The FTRL kernel divides without the `|l| > λ1` guard, so `0/0 = NaN` where the
  reference gives 0 for an element with zero accumulator and zero gradient; that
  needs `initial_accumulator_value=0`, `l2 = beta = 0` and `learning_rate_power
  < 0`, and such configurations always use the gathered formulas.
"""
import collections
import re

import numpy as np

from tpu_fc import _tf_internals as internals
from tpu_fc import optimizers
from tpu_fc._tf import tf

_F32 = np.float32


def table_parts(table_variable):
  """The row-wise parts of a partitioned table (div layout), else [the table]."""
  if isinstance(table_variable, internals.PartitionedVariable):
    return list(table_variable)
  return [table_variable]


def bind_variable_handle(handle, variable):
  """Makes the resource `handle` (a bare VarHandleOp's output) `variable`'s.

  Resource handles name their resource by `shared_name`; the lookups of an
  emulated step are built before the model_fn names the table, so their
  handle gets the table variable's name once it exists.
  """
  internals.set_shared_name(handle, variable.handle.op.get_attr('shared_name'))


# The op names of part N of a partitioned variable and its ops.
PART_NAME = re.compile(r'/part_(\d+)(?:/|$)')


def _on_devices_of(parts):
  """Device function: ops of `.../part_N` on the device of `parts[N]`."""
  devices = [part.device for part in parts]

  def device(op):
    match = PART_NAME.search(op.name)
    return devices[int(match.group(1))] if match else op.device

  return device


def _filled_with(value):
  """An initializer filling with `value`, computed when the initializer runs.

  With a constant value TF folds the fill into a constant that keeps a
  table-sized buffer for the session's lifetime; the slot shares it, so its first
  sparse update copies it: twice the slot's memory (measured: +2.4 GiB for a
  10M x 64 table).  A fill from a feedable scalar is not folded.
  """
  def initializer(shape, dtype=tf.float32, partition_info=None):
    del partition_info
    return tf.fill(shape, tf.compat.v1.placeholder_with_default(
        tf.constant(value, dtype), []))
  return initializer


def create_slot_variables(parameters, table_variable, name_prefix,
                          names=None):
  """`{mid-level slot name: variable}` for `parameters`, shaped like the table.

  Non-trainable resource variables in GLOBAL_VARIABLES only, so that an
  optimizer over TRAINABLE_VARIABLES never sees them; named
  `name_prefix/slot_name` (or `names[slot_name]`) under the current variable
  scope and placed on the
  table's device, since every update reads them alongside the table.  The slots
  of a partitioned table are partitioned alike, each part beside its table part.
  """
  initial_values = optimizers.as_tpu_fc_parameters(
      parameters).slot_initial_values()
  parts = table_parts(table_variable)
  partitioner = None
  if isinstance(table_variable, internals.PartitionedVariable):
    device = _on_devices_of(parts)
    partitioner = tf.compat.v1.fixed_size_partitioner(len(parts))
  else:
    device = table_variable.device
  slots = {}
  with tf.compat.v1.device(device):
    for slot_name, value in initial_values.items():
      slots[slot_name] = tf.compat.v1.get_variable(
          (names or {}).get(slot_name, '{}/{}'.format(name_prefix, slot_name)),
          shape=table_variable.shape, dtype=tf.float32,
          initializer=_filled_with(value),
          trainable=False, use_resource=True, partitioner=partitioner,
          collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES])
  return slots


def _hyper(parameters, *names):
  """Named hyperparameters as float32 constants: float32 arithmetic, as the reference."""
  return [tf.constant(_F32(getattr(parameters, name))) for name in names]


# Kernel rules: (parameters, table handle, {slot: handle}, ids, g, lr) -> op,
# updating the rows `ids` in place.


def _sgd_kernel(parameters, table, slots, ids, g, lr):
  """`w -= η g`: a scatter-sub of `η g` is exactly that."""
  del parameters, slots
  return tf.raw_ops.ResourceScatterSub(resource=table, indices=ids,
                                       updates=lr * g)


def _adagrad_kernel(parameters, table, slots, ids, g, lr):
  """V2 with ε = 0 computes `η g / √a`, the reference's order (V1 uses rsqrt)."""
  del parameters
  return tf.raw_ops.ResourceSparseApplyAdagradV2(
      var=table, accum=slots['accumulators'], lr=lr, epsilon=_F32(0.0),
      grad=g, indices=ids)


def _proximal_adagrad_kernel(parameters, table, slots, ids, g, lr):
  l1, l2 = _hyper(parameters, 'l1_regularization_strength',
                  'l2_regularization_strength')
  return tf.raw_ops.ResourceSparseApplyProximalAdagrad(
      var=table, accum=slots['accumulators'], lr=lr, l1=l1, l2=l2, grad=g,
      indices=ids)


def _ftrl_kernel(parameters, table, slots, ids, g, lr):
  """TPU `beta` is TF's `l2 + β/(2η)`, with and without multiply_linear_by_lr.

  The kernel's quadratic is `a'^p/η + 2 l2` (resp. `a'^p + 2 l2 η`), which is
  the reference's `(a'^p + β)/η + 2λ2` (resp. `a'^p + β + 2λ2η`) for that l2.
  """
  l1, l2, beta, power = _hyper(parameters, 'l1_regularization_strength',
                               'l2_regularization_strength', 'beta',
                               'learning_rate_power')
  if parameters.beta:
    l2 = l2 + beta / (tf.constant(_F32(2.0)) * lr)
  return tf.raw_ops.ResourceSparseApplyFtrlV2(
      var=table, accum=slots['accumulators'], linear=slots['linears'], grad=g,
      indices=ids, lr=lr, l1=l1, l2=l2, l2_shrinkage=_F32(0.0),
      lr_power=power,
      multiply_linear_by_lr=bool(parameters.multiply_linear_by_learning_rate))


def _momentum_kernel(parameters, table, slots, ids, g, lr):
  (momentum,) = _hyper(parameters, 'momentum')
  return tf.raw_ops.ResourceSparseApplyMomentum(
      var=table, accum=slots['momenta'], lr=lr, grad=g, indices=ids,
      momentum=momentum, use_nesterov=bool(parameters.use_nesterov))


def _rms_prop_kernel(parameters, table, slots, ids, g, lr):
  rho, momentum, epsilon = _hyper(parameters, 'rho', 'momentum', 'epsilon')
  return tf.raw_ops.ResourceSparseApplyRMSProp(
      var=table, ms=slots['ms'], mom=slots['mom'], lr=lr, rho=rho,
      momentum=momentum, epsilon=epsilon, grad=g, indices=ids)


# Row rules: the reference's formulas on tensors of rows,
# (parameters, w, {slot: rows}, g, lr) -> (new w, {slot: new rows}).


def _adam_rows(parameters, w, slots, g, lr):
  """Adam without bias correction (no TF kernel has both denominators)."""
  b1, b2, eps = _hyper(parameters, 'beta1', 'beta2', 'epsilon')
  one = tf.constant(_F32(1.0))
  m = b1 * slots['momenta'] + (one - b1) * g
  v = b2 * slots['velocities'] + (one - b2) * g * g
  if parameters.sum_inside_sqrt:
    denominator = tf.sqrt(v + eps * eps)
  else:
    denominator = tf.sqrt(v) + eps
  return w - lr * m / denominator, {'momenta': m, 'velocities': v}


def _ftrl_rows(parameters, w, slots, g, lr):
  """FTRL as the reference writes it, with the `|l| > λ1` guard before dividing."""
  power, l1, l2, beta = _hyper(parameters, 'learning_rate_power',
                               'l1_regularization_strength',
                               'l2_regularization_strength', 'beta')
  p, two = -power, tf.constant(_F32(2.0))
  a, a_new = slots['accumulators'], slots['accumulators'] + g * g
  power_delta = tf.pow(a_new, p) - tf.pow(a, p)
  if parameters.multiply_linear_by_learning_rate:
    linear = slots['linears'] + lr * g - power_delta * w
    q = tf.pow(a_new, p) + beta + two * l2 * lr
    threshold = l1 * lr
  else:
    linear = slots['linears'] + g - power_delta / lr * w
    q = (tf.pow(a_new, p) + beta) / lr + two * l2
    threshold = l1
  w_new = tf.where(tf.abs(linear) > threshold,
                   (tf.sign(linear) * threshold - linear) / q,
                   tf.zeros_like(w))
  return w_new, {'accumulators': a_new, 'linears': linear}


def _proximal_adagrad_rows(parameters, w, slots, g, lr):
  """ProximalAdagrad for rates the kernel rejects (`lr <= 0`)."""
  l1, l2 = _hyper(parameters, 'l1_regularization_strength',
                  'l2_regularization_strength')
  one = tf.constant(_F32(1.0))
  a = slots['accumulators'] + g * g
  lr_t = lr / tf.sqrt(a)
  u = w - lr_t * g
  shrunk = tf.sign(u) * tf.maximum(tf.abs(u) - lr_t * l1,
                                   tf.constant(_F32(0.0)))
  return shrunk / (one + lr_t * l2), {'accumulators': a}


def _adagrad_momentum_rows(parameters, w, slots, g, lr):
  """AdagradMomentum as the reference writes it (no TF kernel has its rule)."""
  momentum, exponent, beta2, epsilon = _hyper(parameters, 'momentum',
                                              'exponent', 'beta2', 'epsilon')
  one = tf.constant(_F32(1.0))
  if parameters.beta2 == 1:
    a = slots['accumulators'] + g * g
  else:
    a = beta2 * slots['accumulators'] + (one - beta2) * g * g
  scaled = g * tf.pow(a + epsilon, -(one / exponent))
  m = momentum * slots['momenta'] + scaled
  step = momentum * m + scaled if parameters.use_nesterov else m
  return w - lr * step, {'accumulators': a, 'momenta': m}


def _proximal_yogi_rows(parameters, w, slots, g, lr):
  """ProximalYogi as the reference writes it (TF has no Yogi kernel)."""
  beta1, beta2, epsilon, l1, l2 = _hyper(
      parameters, 'beta1', 'beta2', 'epsilon', 'l1_regularization_strength',
      'l2_regularization_strength')
  one = tf.constant(_F32(1.0))
  m = beta1 * slots['momenta'] + (one - beta1) * g
  g2 = g * g
  v = slots['velocities'] + (one - beta2) * tf.sign(
      g2 - slots['velocities']) * g2
  lr_t = lr / (tf.sqrt(v) + epsilon)
  u = w - lr_t * m
  shrunk = tf.sign(u) * tf.maximum(tf.abs(u) - lr_t * l1,
                                   tf.constant(_F32(0.0)))
  return shrunk / (one + lr_t * l2), {'velocities': v, 'momenta': m}


def _frequency_estimator_rows(parameters, w, slots, g, lr):
  """FrequencyEstimator as the reference writes it; `lr` is the global step."""
  del g
  tau, max_delta, threshold = _hyper(parameters, 'tau', 'max_delta',
                                     'outlier_threshold')
  delta = lr - slots['last_hit_step']
  clipped = tf.minimum(delta, max_delta)
  estimate = tf.where(delta >= threshold * w, clipped,
                      w * (tf.constant(_F32(1.0)) - tau) + clipped * tau)
  return estimate, {'last_hit_step': tf.fill(tf.shape(w), lr)}


def _ftrl_kernel_is_exact(parameters):
  """False where the kernel's unguarded division can give NaN (or l2 < 0)."""
  zero_accumulator = (parameters.initial_accumulator_value == 0 and
                      parameters.l2_regularization_strength == 0 and
                      parameters.beta == 0 and
                      parameters.learning_rate_power != 0)
  return parameters.beta >= 0 and not zero_accumulator


# kernel: in-place sparse kernel or None; rows: row rule or None;
# kernel_is_exact(parameters): whether the kernel may be used at all;
# kernel_needs_positive_lr: the kernel raises for lr <= 0.
_Rule = collections.namedtuple(
    '_Rule', ['kernel', 'rows', 'kernel_is_exact', 'kernel_needs_positive_lr'])


def _always(parameters):
  del parameters
  return True


_RULES = {
    optimizers.StochasticGradientDescentParameters: _Rule(
        _sgd_kernel, None, _always, False),
    optimizers.AdagradParameters: _Rule(_adagrad_kernel, None, _always, False),
    optimizers.AdamParameters: _Rule(None, _adam_rows, _always, False),
    optimizers.FtrlParameters: _Rule(_ftrl_kernel, _ftrl_rows,
                                     _ftrl_kernel_is_exact, True),
    optimizers.ProximalAdagradParameters: _Rule(
        _proximal_adagrad_kernel, _proximal_adagrad_rows, _always, True),
    optimizers.MomentumParameters: _Rule(_momentum_kernel, None, _always,
                                         False),
    optimizers.RMSPropParameters: _Rule(_rms_prop_kernel, None, _always,
                                        False),
    optimizers.AdagradMomentumParameters: _Rule(None, _adagrad_momentum_rows,
                                                _always, False),
    optimizers.ProximalYogiParameters: _Rule(None, _proximal_yogi_rows,
                                             _always, False),
    optimizers.FrequencyEstimatorParameters: _Rule(
        None, _frequency_estimator_rows, _always, False),
}


class _SparseRows:
  """Reads and writes the rows `ids` of a variable: the lazy access."""

  def __init__(self, ids):
    self._ids = ids

  def read(self, variable):
    return tf.raw_ops.ResourceGather(resource=variable.handle,
                                     indices=self._ids, dtype=tf.float32)

  def write(self, variable, value):
    return tf.raw_ops.ResourceScatterUpdate(resource=variable.handle,
                                            indices=self._ids, updates=value)


class _AllRows:
  """Reads and writes every row: non-lazy Adam's one full-table pass."""

  def read(self, variable):
    return tf.raw_ops.ReadVariableOp(resource=variable.handle,
                                     dtype=tf.float32)

  def write(self, variable, value):
    return tf.raw_ops.AssignVariableOp(resource=variable.handle, value=value)


def _clip(x, low, high):
  """Clamps to [low, high]; a None bound is unbounded (not built)."""
  if low is not None:
    x = tf.maximum(x, tf.constant(_F32(low)))
  if high is not None:
    x = tf.minimum(x, tf.constant(_F32(high)))
  return x


def _weight_decay(parameters, lr):
  """The decay factor tensor, or None when weight decay is off."""
  if not parameters.weight_decay_factor:
    return None
  decay = tf.constant(_F32(parameters.weight_decay_factor))
  if parameters.multiply_weight_decay_factor_by_learning_rate:
    decay = decay * lr
  return decay


def _rows_step(row_rule, parameters, table, slots, rows, g, lr):
  """Gather, rule, decay, clip, scatter: one read and one write per variable.

  Every write waits for every read: a new value need not depend on the old one
  (FrequencyEstimator's `last_hit_step` is the step), and a graph would
  otherwise be free to write it first.
  """
  w = rows.read(table)
  old_slots = {name: rows.read(var) for name, var in slots.items()}
  w_new, new_slots = row_rule(parameters, w, old_slots, g, lr)
  decay = _weight_decay(parameters, lr)
  if decay is not None:
    w_new = w_new - decay * w
  w_new = _clip(w_new, parameters.clip_weight_min, parameters.clip_weight_max)
  with tf.control_dependencies([w] + list(old_slots.values())):
    return tf.group([rows.write(table, w_new)] +
                    [rows.write(slots[name], value)
                     for name, value in new_slots.items()])


def _kernel_step(kernel, parameters, table, slots, ids, g, lr):
  """In-place kernel, then decay and clipping as in-place sparse ops on `ids`.

  The pre-update rows are gathered (a copy) before the kernel runs; each later
  stage is a scatter ordered after the previous one, so clipping sees the
  decayed rows.  Scatter-max/min with a scalar bound clip without a read.
  """
  decay = _weight_decay(parameters, lr)
  w_old = _SparseRows(ids).read(table) if decay is not None else None
  with tf.control_dependencies([] if w_old is None else [w_old]):
    op = kernel(parameters, table.handle,
                {name: var.handle for name, var in slots.items()}, ids, g, lr)
  stages = []
  if decay is not None:
    stages.append((tf.raw_ops.ResourceScatterSub, decay * w_old))
  if parameters.clip_weight_min is not None:
    stages.append((tf.raw_ops.ResourceScatterMax,
                   tf.constant(_F32(parameters.clip_weight_min))))
  if parameters.clip_weight_max is not None:
    stages.append((tf.raw_ops.ResourceScatterMin,
                   tf.constant(_F32(parameters.clip_weight_max))))
  for scatter, updates in stages:
    with tf.control_dependencies([op] if op is not None else []):
      op = scatter(resource=table.handle, indices=ids, updates=updates)
  return op


def _as_branch(build):
  """A `tf.cond` branch running `build()`; branches must return a tensor."""

  def branch():
    op = build()
    with tf.control_dependencies([op] if op is not None else []):
      return tf.constant(True)

  return branch


def apply_sparse_update(parameters, table_variable, slot_variables, unique_ids,
                        gradients, learning_rate, every_row=True):
  """Builds one optimizer step of `tpu_fc.reference.apply_sparse_update`.

  Args:
    parameters: legacy optimizer parameters (tpu_fc's or TF 2.15's classes;
      recognised by class name, like the reference).
    table_variable: `[vocabulary_size, dim]` float32 resource variable.
    slot_variables: `{slot name: variable}`, from `create_slot_variables`.
    unique_ids: 1-D int ids of the rows to update, without duplicates.
    gradients: `[len(unique_ids), dim]` float32, summed per id and already
      multiplied by any gradient multiplier.
    learning_rate: float32 scalar (tensor or number), already resolved.
    every_row: False for the later applications of a multi-core step, where
      non-lazy Adam updates the rows `unique_ids` only.

  Returns:
    An op that applies the step (None in eager mode, where it has run).
  """
  parameters = optimizers.as_tpu_fc_parameters(parameters)
  rule = optimizers.by_class(_RULES, parameters, 'sparse update')
  expected = list(parameters.slot_initial_values())
  if sorted(slot_variables) != sorted(expected):
    raise ValueError('{} needs slot variables {}, got {}.'.format(
        type(parameters).__name__, expected, sorted(slot_variables)))
  with tf.name_scope('sparse_update'):
    lr = tf.cast(learning_rate, tf.float32)
    ids = tf.convert_to_tensor(unique_ids)
    g = _clip(tf.convert_to_tensor(gradients, tf.float32),
              parameters.clip_gradient_min, parameters.clip_gradient_max)
    args = (parameters, table_variable, slot_variables)

    if (every_row and isinstance(parameters, optimizers.AdamParameters) and
        not parameters.lazy_adam):
      # The rows not looked up get a zero gradient, after clipping.
      shape = tf.raw_ops.VariableShape(input=table_variable.handle,
                                       out_type=ids.dtype)
      dense_g = tf.scatter_nd(tf.expand_dims(ids, -1), g, shape)
      return _rows_step(rule.rows, *args, _AllRows(), dense_g, lr)

    def with_rows():
      return _rows_step(rule.rows, *args, _SparseRows(ids), g, lr)

    def with_kernel():
      return _kernel_step(rule.kernel, *args, ids, g, lr)

    if rule.kernel is None or not rule.kernel_is_exact(parameters):
      return with_rows()
    if not rule.kernel_needs_positive_lr:
      return with_kernel()
    static_lr = tf.get_static_value(lr)
    if static_lr is not None:
      return with_kernel() if static_lr > 0 else with_rows()
    return tf.group(tf.cond(lr > 0, _as_branch(with_kernel),
                            _as_branch(with_rows)))


def apply_in_core_order(parameters, table_variable, slot_variables, ids,
                        gradients, learning_rate, turns, num_cores):
  """Builds `tpu_fc.reference.apply_update_by_core` without gradient
  accumulation, from per-core sums.

  `ids` holds one entry per (id, core that saw it), `gradients` the per-core
  sums, and `turns` (int32) each entry's place in its id's order: 0 for the
  id's first application, else the ring distance of its core from the core
  holding the id (`id mod num_cores`), so the entries of one id have distinct
  turns, increasing in the TPU's order.  Turn `k` of every id is one
  `apply_sparse_update` after turn `k - 1`: at most `num_cores` of them per
  step, no sort.  `turns=None`: `ids` are unique, one application.
  """
  if turns is None or num_cores == 1:
    return apply_sparse_update(parameters, table_variable, slot_variables, ids,
                               gradients, learning_rate)
  with tf.name_scope('core_order'):
    # One partition into turns: a boolean mask per turn made 8 shards 2.4x
    # slower (benchmark workload, 26 tables).
    turn_ids = tf.dynamic_partition(ids, turns, num_cores)
    turn_gradients = tf.dynamic_partition(gradients, turns, num_cores)
  op = None
  for turn in range(num_cores):
    with tf.control_dependencies([] if op is None else [op]):
      op = apply_sparse_update(
          parameters, table_variable, slot_variables, turn_ids[turn],
          turn_gradients[turn], learning_rate, every_row=turn == 0)
  return op
