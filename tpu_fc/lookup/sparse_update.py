"""One TPU-embedding optimizer step of one table, as TF ops: `tpu_fc.reference` in a graph.

`tpu_fc.reference` is the definition; this module builds the same step order for
the host engine (TF1 graphs through `tf.compat.v1`, also eager and tf.function):

1. gradient clipping of the (already de-duplicated and summed) gradients,
2. the optimizer rule on the looked-up rows only (non-lazy Adam: every row),
3. decoupled weight decay from the pre-update rows, `w = rule(w) - wd·w_old`,
4. weight clipping of the updated rows.

Each stage is built only when configured.  The rule is the optimizer class's
`RULE` (`tpu_fc.optimizers.Rule`, declared with the class); this module knows no
optimizer.  Rules run on TF's sparse training kernels wherever their
arithmetic is the reference's (fast, in place, exact up to float32 rounding);
the rest (Adam, AdagradMomentum, ProximalYogi and
FrequencyEstimator, which no TF kernel computes) gather the rows, apply the
reference formulas and scatter the rows back.  Nothing reads a whole table (or
slot) except non-lazy Adam, which by definition updates every row: once a
resource variable has had a sparse access every dense read copies the whole
buffer (PERFORMANCE_NOTES).

XLA (`jit_compile=True`) compiles no sparse training kernel: there the gathered
formulas run, which every mid-level optimizer has.

Where a kernel departs from the reference it is not used (the `Rule` says where):
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
import numpy as np

from tpu_fc import _tf_internals as internals
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


def _on_devices_of(parts):
  """Device function: ops of `.../part_N` on the device of `parts[N]`."""
  devices = [part.device for part in parts]

  def device(op):
    match = internals.PART_NAME.search(op.name)
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
  initial_values = parameters.slot_initial_values()
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
    parameters: tpu_fc's legacy optimizer parameters (TF 2.15's converted
      by `optimizers.as_tpu_fc_parameters`); its class's `RULE` applies.
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
  rule = getattr(parameters, 'RULE', None)
  if rule is None:
    raise NotImplementedError(
        'tpu_fc has no sparse update for optimizer parameters {}; supported: '
        'the *Parameters of tpu_fc.optimizers and their subclasses with a '
        'RULE.'.format(type(parameters).__name__))
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

    if every_row and parameters.updates_every_row():
      # The rows not looked up get a zero gradient, after clipping.
      shape = tf.raw_ops.VariableShape(input=table_variable.handle,
                                       out_type=ids.dtype)
      dense_g = tf.scatter_nd(tf.expand_dims(ids, -1), g, shape)
      return _rows_step(rule.rows, *args, _AllRows(), dense_g, lr)

    def with_rows():
      return _rows_step(rule.rows, *args, _SparseRows(ids), g, lr)

    def with_kernel():
      return _kernel_step(rule.kernel, *args, ids, g, lr)

    if internals.compiling_with_xla():
      if rule.rows is None:  # (no mid-level optimizer's: they all have rows)
        raise NotImplementedError(
            '{} has no update XLA can compile (TF\'s sparse training kernels '
            'have no XLA kernel); train its tables without jit_compile.'
            .format(type(parameters).__name__))
      return with_rows()
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
