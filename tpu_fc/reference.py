"""Numpy reference for the TPU embedding update rules: THE definition used by tpu_fc.

One call of `apply_sparse_update` is one optimizer step of one embedding table,
as the TPU embedding engine applies it for a global batch.  Everything is
float32, computed in float32 (no float64 detour), like the device.

Step order (each choice and its source):

1. **Duplicate ids are summed** into one gradient per unique row (gradient
   accumulation, `optimization_parameters.proto`: "accumulate them into a
   temporary array and another to apply them").  Without accumulation this
   holds within one core's application (see "Several cores" below).
2. **Gradient clipping** clamps the summed gradient to
   `[clip_gradient_min, clip_gradient_max]` (None = unbounded); the proto:
   "Limits to which to clip the backward pass gradient before using it for
   updates".  The legacy classes only allow it with accumulation.
3. **The optimizer rule** (table `_OPTIMIZERS`, equations in each rule's
   docstring, LEGACY_SEMANTICS §4.4) updates the weights and slots of the
   looked-up unique rows only; every other row and its slots stay unchanged
   (lazy).  Exception: Adam with `lazy_adam=False` (proto `use_non_lazy_adam`:
   "updates all parameters in the embedding table") updates every row, with a
   zero gradient for the rows not looked up, so their `m`, `v` decay and
   their weights still move.  No Adam bias correction (proto: emulate it with
   a dynamic rate `η·√(1-β2^t)/(1-β1^t)`).
4. **Weight decay** is decoupled (proto: "see weight_decay_optimizers.py",
   i.e. `DecoupledWeightDecayExtension`) and uses the pre-update weights of
   the updated rows: `w_new = rule(w) - wd·w`, with
   `wd = weight_decay_factor` (None/0 = off), times the learning rate when
   `multiply_weight_decay_factor_by_learning_rate`.  For FTRL, ProximalAdagrad
   and ProximalYogi, whose rule is not `w` minus a step, this differs from
   "decay first, then apply the rule"; the device order is unverified.
5. **Weight clipping** clamps the updated rows to
   `[clip_weight_min, clip_weight_max]` (proto: "Limits to which to clip the
   weight values after the backward pass"), so it comes last.

**Several cores** (`apply_update_by_core`), as TF's own TPU tests pin them, one
rule for each setting of the optimizer's `use_gradient_accumulation`:

* **on** (the default of every legacy `*Parameters` and mid-level optimizer):
  every core's gradients of a row are accumulated and applied **once**, as one
  step 1-5 above with the gradient summed over the global batch: the numbers of
  one core (TF's mid-level correctness tests,
  `tensorflow/python/tpu/tests/tpu_embedding_v2_correctness_*_test.py`, 2
  replicas, default optimizers: Adagrad accumulator `init + (Σ g)²`).
* **off**: a table's rows live on its cores modulo (`id mod num_cores`).  Within
  a core the gradients of one id are summed; across cores the per-core sums are
  applied one core after another, each a full step 1-5 above: the core holding
  the id first, then the others in ring order (holder + 1, holder + 2, ...
  modulo num_cores), skipping cores that did not see the id.  TF 2.15's TPU
  test of this (tensorflow_estimator's `tpu_estimator_gradients_test.py`,
  `test_adagrad_opt_embedding_variables_on_tpu`, built with
  `use_gradient_accumulation=False`) pins the order for 2 cores; the ring order
  beyond 2 is tpu_fc's assumption.  (Gradient clipping and non-lazy Adam need
  accumulation, so neither meets this rule.)

`learning_rate` is an argument, never read from the parameters object: the
caller resolves `TableConfig.learning_rate` / `learning_rate_fn` first.
Optimizers are recognised by class name and read only the legacy attribute
names, so TF 2.15's `tf.compat.v1.tpu.experimental.*Parameters` and tpu_fc's
own classes both work.  Slot names are the mid-level ones
(`tf.tpu.experimental.embedding`; tpu_fc's for optimizers without a mid-level
twin, `tpu_fc.optimizers` SLOTS), initial values those of the legacy
`_*Handler.create_variables_and_ops` initializers.
"""
import collections

import numpy as np

_F32 = np.float32
_ZERO, _ONE, _TWO = _F32(0), _F32(1), _F32(2)


def _hyper(params, *names):
  """The named hyperparameters as float32 scalars."""
  return [_F32(getattr(params, name)) for name in names]


def _sgd(params, w, slots, g, lr):
  """SGD: `w -= η g`."""
  del params, slots
  return w - lr * g, {}


def _adagrad(params, w, slots, g, lr):
  """Adagrad (no ε): `a += g²; w -= η g / √a`."""
  del params
  a = slots['accumulators'] + g * g
  return w - lr * g / np.sqrt(a), {'accumulators': a}


def _adam(params, w, slots, g, lr):
  """Adam without bias correction.

  `m = β1 m + (1-β1) g; v = β2 v + (1-β2) g²;`
  `w -= η m / √(v + ε²)` if `sum_inside_sqrt`, else `w -= η m / (√v + ε)`.
  """
  b1, b2, eps = _hyper(params, 'beta1', 'beta2', 'epsilon')
  m = b1 * slots['momenta'] + (_ONE - b1) * g
  v = b2 * slots['velocities'] + (_ONE - b2) * g * g
  if params.sum_inside_sqrt:
    denominator = np.sqrt(v + eps * eps)
  else:
    denominator = np.sqrt(v) + eps
  return w - lr * m / denominator, {'momenta': m, 'velocities': v}


def _ftrl(params, w, slots, g, lr):
  """FTRL-proximal with `p = -learning_rate_power`, `β = beta`.

  `a' = a + g²; l += g - (a'^p - a^p)/η · w; q = (a'^p + β)/η + 2λ2;`
  `w = |l| > λ1 ? (sign(l) λ1 - l)/q : 0; a = a'`.
  With `multiply_linear_by_learning_rate` the `linears` slot stores `η·l`:
  `l += η g - (a'^p - a^p) w; q = a'^p + β + 2 λ2 η`, threshold `λ1 η`.
  """
  p, l1, l2, beta = _hyper(params, 'learning_rate_power',
                           'l1_regularization_strength',
                           'l2_regularization_strength', 'beta')
  p = -p
  a, a_new = slots['accumulators'], slots['accumulators'] + g * g
  power_delta = np.power(a_new, p) - np.power(a, p)
  if params.multiply_linear_by_learning_rate:
    linear = slots['linears'] + lr * g - power_delta * w
    q = np.power(a_new, p) + beta + _TWO * l2 * lr
    threshold = l1 * lr
  else:
    linear = slots['linears'] + g - power_delta / lr * w
    q = (np.power(a_new, p) + beta) / lr + _TWO * l2
    threshold = l1
  w_new = np.zeros_like(w)
  np.divide(np.sign(linear) * threshold - linear, q, out=w_new,
            where=np.abs(linear) > threshold)
  return w_new, {'accumulators': a_new, 'linears': linear}


def _proximal_adagrad(params, w, slots, g, lr):
  """ProximalAdagrad: `a += g²; ηₜ = η/√a; u = w - ηₜ g;`
  `w = sign(u) · max(|u| - ηₜ λ1, 0) / (1 + ηₜ λ2)`."""
  l1, l2 = _hyper(params, 'l1_regularization_strength',
                  'l2_regularization_strength')
  a = slots['accumulators'] + g * g
  lr_t = lr / np.sqrt(a)
  u = w - lr_t * g
  shrunk = np.sign(u) * np.maximum(np.abs(u) - lr_t * l1, _ZERO)
  return shrunk / (_ONE + lr_t * l2), {'accumulators': a}


def _momentum(params, w, slots, g, lr):
  """Momentum: `m = μ m + g; w -= η m`; Nesterov: `w -= η (g + μ m)`."""
  (mu,) = _hyper(params, 'momentum')
  m = mu * slots['momenta'] + g
  step = g + mu * m if params.use_nesterov else m
  return w - lr * step, {'momenta': m}


def _rms_prop(params, w, slots, g, lr):
  """RMSProp: `ms = ρ ms + (1-ρ) g²; mom = μ mom + η g/√(ms + ε); w -= mom`."""
  rho, mu, eps = _hyper(params, 'rho', 'momentum', 'epsilon')
  ms = rho * slots['ms'] + (_ONE - rho) * g * g
  mom = mu * slots['mom'] + lr * g / np.sqrt(ms + eps)
  return w - mom, {'ms': ms, 'mom': mom}


def _adagrad_momentum(params, w, slots, g, lr):
  """AdagradMomentum: momentum over the Adagrad-scaled gradient.

  `a = β2 == 1 ? a + g² : β2 a + (1-β2) g²;  s = g · (a + ε)^(-1/k);`
  `m = μ m + s;  w -= η (use_nesterov ? μ m + s : m)`, with `k = exponent`,
  `μ = momentum`; both slots start at 0.

  Sources: TF's TPU test of the mid-level optimizer
  (`tensorflow/python/tpu/tests/tpu_embedding_base_test.py`,
  `_check_embedding_and_slot_variables_for_adagrad_momentum`: one step from
  zero slots with momentum 0.9, Nesterov, exponent 3, β2 0.9, ε 0.1, checking
  the table, `accumulators` and `momenta = g·s`) and TF's SparseCore kernel of
  the same optimizer (`tensorflow/core/tpu/kernels/sparse_core_xla_ops.cc`,
  `XlaSparseDenseMatmulGradWithAdagradMomentumAndCsrInputOp`), which is this
  rule at every step.  `optimization_parameters.proto` (and LEGACY_SEMANTICS
  §4.4, copied from it) writes the momentum over `(a + ε)^(-1/k)` alone and
  multiplies by g in the weight update; its momenta would hold no g, which the
  TPU test's momenta refute, so the proto's text is not taken.  Beyond one step
  the TPU is pinned by the kernel, not by a TPU test.
  """
  mu, k, b2, eps = _hyper(params, 'momentum', 'exponent', 'beta2', 'epsilon')
  if b2 == _ONE:
    a = slots['accumulators'] + g * g
  else:
    a = b2 * slots['accumulators'] + (_ONE - b2) * g * g
  scaled = g * np.power(a + eps, -(_ONE / k))
  m = mu * slots['momenta'] + scaled
  step = mu * m + scaled if params.use_nesterov else m
  return w - lr * step, {'accumulators': a, 'momenta': m}


def _proximal_yogi(params, w, slots, g, lr):
  """ProximalYogi, lazy, without bias correction.

  `m = β1 m + (1-β1) g;  v += (1-β2) · sign(g² - v) · g²;  ηₜ = η / (√v + ε);`
  `u = w - ηₜ m;  w = sign(u) · max(|u| - ηₜ λ1, 0) / (1 + ηₜ λ2)`,
  `v` (slot `velocities`) from `initial_accumulator_value`, `m` (`momenta`)
  from 0.

  Sources: `optimization_parameters.proto` (`ProximalYogiParameters`: the
  Yogi paper's Algorithm 2, https://papers.nips.cc/paper/8186, "plus some
  extensions based on FTRL", lazy, no hyper-parameter update: the bias
  correction `η √(1-β2^t)/(1-β1^t)` is the user's dynamic learning rate; its
  reserved `sign`/`tanh` fields: the sign activation); TF Addons' `Yogi`
  (`tensorflow_addons/optimizers/yogi.py`, the open-source form with TF 2.15's
  defaults and l1/l2: its `v` update, per-coordinate rate and proximal step
  `_solve`, whose value equals the formula above).  The proto gives no
  formula: the device's order of operations (and whether its l1/l2 step is
  this proximal one) is not pinned by a source.
  """
  b1, b2, eps, l1, l2 = _hyper(params, 'beta1', 'beta2', 'epsilon',
                               'l1_regularization_strength',
                               'l2_regularization_strength')
  m = b1 * slots['momenta'] + (_ONE - b1) * g
  g2 = g * g
  v = slots['velocities'] + (_ONE - b2) * np.sign(g2 - slots['velocities']) * g2
  lr_t = lr / (np.sqrt(v) + eps)
  u = w - lr_t * m
  shrunk = np.sign(u) * np.maximum(np.abs(u) - lr_t * l1, _ZERO)
  return shrunk / (_ONE + lr_t * l2), {'velocities': v, 'momenta': m}


def _frequency_estimator(params, w, slots, g, lr):
  """FrequencyEstimator: the table row D is the mean of the global steps
  between two lookups of its id; `lr` is the global step.

  `delta = step - last_hit_step;  c = min(delta, max_delta);`
  `D = delta >= outlier_threshold · D ? c : D (1-τ) + c τ;`
  `last_hit_step = step`; the gradient is not read (it should be zero).

  Source: `optimization_parameters.proto`, `FrequencyEstimatorParameters`
  ("The exact sequence of operations used in the optimizer"); TF 2.15's
  class docstring: the learning rate is to be the float32 global step (a
  table `learning_rate_fn`).  The proto also says D starts at `max_delta`:
  that is the table's initializer, the user's.  `weight_exponent` ("(delta /
  max_delta) ^ weight_exponent") takes no part in the update; what the device
  does with it is not pinned by a source, and lookups return D.
  """
  del g
  tau, max_delta, threshold = _hyper(params, 'tau', 'max_delta',
                                     'outlier_threshold')
  delta = lr - slots['last_hit_step']
  clipped = np.minimum(delta, max_delta)
  outlier = delta >= threshold * w
  estimate = np.where(outlier, clipped, w * (_ONE - tau) + clipped * tau)
  return estimate, {'last_hit_step': np.full_like(w, lr)}


# slots(params) -> ordered {mid-level slot name: initial value}; rule as above.
_Optimizer = collections.namedtuple('_Optimizer', ['slots', 'rule'])
_OPTIMIZERS = {
    'StochasticGradientDescentParameters': _Optimizer(lambda p: {}, _sgd),
    'AdagradParameters': _Optimizer(
        lambda p: {'accumulators': p.initial_accumulator}, _adagrad),
    'AdamParameters': _Optimizer(
        lambda p: {'momenta': 0.0, 'velocities': 0.0}, _adam),
    'FtrlParameters': _Optimizer(
        lambda p: {'accumulators': p.initial_accumulator_value,
                   'linears': getattr(p, 'initial_linear_value', 0.0)},
        _ftrl),
    'ProximalAdagradParameters': _Optimizer(
        lambda p: {'accumulators': p.initial_accumulator}, _proximal_adagrad),
    'MomentumParameters': _Optimizer(lambda p: {'momenta': 0.0}, _momentum),
    'RMSPropParameters': _Optimizer(
        lambda p: {'ms': 0.0, 'mom': 0.0}, _rms_prop),
    'AdagradMomentumParameters': _Optimizer(
        lambda p: {'accumulators': 0.0, 'momenta': 0.0}, _adagrad_momentum),
    'ProximalYogiParameters': _Optimizer(
        lambda p: {'velocities': p.initial_accumulator_value, 'momenta': 0.0},
        _proximal_yogi),
    'FrequencyEstimatorParameters': _Optimizer(
        lambda p: {'last_hit_step': 0.0}, _frequency_estimator),
}


def _optimizer(params):
  name = type(params).__name__
  if name not in _OPTIMIZERS:
    raise NotImplementedError(
        f'No reference update rule for optimizer parameters {name}.')
  return _OPTIMIZERS[name]


def slot_initial_values(params):
  """Ordered `{mid-level slot name: initial value}` for `params`."""
  return {name: float(value)
          for name, value in _optimizer(params).slots(params).items()}


def init_slots(params, shape):
  """Float32 slot arrays of `shape`, filled with `slot_initial_values`."""
  return {name: np.full(shape, value, dtype=_F32)
          for name, value in slot_initial_values(params).items()}


def _clip(x, low, high):
  """Clamps to [low, high]; a None bound is unbounded."""
  if low is not None:
    x = np.maximum(x, _F32(low))
  if high is not None:
    x = np.minimum(x, _F32(high))
  return x


def apply_sparse_update(params, table, slots, ids, grads, learning_rate,
                        every_row=True):
  """One embedding update step; returns `(new_table, new_slots)`.

  Args:
    params: legacy-style optimizer parameters (see the module docstring).
    table: `[vocabulary_size, dim]` weights.
    slots: `{slot name: [vocabulary_size, dim] array}` with exactly the names
      of `slot_initial_values(params)`.
    ids: 1-D int row ids, duplicates allowed.
    grads: `[len(ids), dim]` gradient of each id.
    learning_rate: the resolved learning rate (python float).
    every_row: False for the later applications of a multi-core step, where
      non-lazy Adam updates the rows `ids` only.

  Inputs are never modified; the results are new float32 arrays.
  """
  optimizer = _optimizer(params)
  table = np.array(table, dtype=_F32)
  if table.ndim != 2:
    raise ValueError(f'table must be [vocabulary_size, dim], got {table.shape}.')
  expected_slots = list(optimizer.slots(params))
  if sorted(slots) != sorted(expected_slots):
    raise ValueError(f'{type(params).__name__} needs slots {expected_slots}, '
                     f'got {sorted(slots)}.')
  slots = {name: np.array(slots[name], dtype=_F32) for name in expected_slots}
  ids = np.asarray(ids)
  grads = np.asarray(grads, dtype=_F32)
  if ids.ndim != 1 or grads.shape != (ids.shape[0], table.shape[1]):
    raise ValueError(f'ids must be 1-D and grads [len(ids), {table.shape[1]}]; '
                     f'got ids {ids.shape}, grads {grads.shape}.')
  lr = _F32(learning_rate)

  # 1. accumulate duplicates, 2. clip the accumulated gradient.
  rows, position = np.unique(ids.astype(np.int64), return_inverse=True)
  g = np.zeros((rows.shape[0], table.shape[1]), dtype=_F32)
  np.add.at(g, position.reshape(-1), grads)
  g = _clip(g, params.clip_gradient_min, params.clip_gradient_max)
  if (every_row and type(params).__name__ == 'AdamParameters' and
      not params.lazy_adam):
    dense_g = np.zeros_like(table)
    dense_g[rows] = g
    rows, g = np.arange(table.shape[0]), dense_g

  # 3. rule, 4. decoupled weight decay, 5. weight clipping.
  w_old = table[rows]
  w_new, new_slot_rows = optimizer.rule(
      params, w_old, {name: slot[rows] for name, slot in slots.items()}, g, lr)
  if params.weight_decay_factor:
    decay = _F32(params.weight_decay_factor)
    if params.multiply_weight_decay_factor_by_learning_rate:
      decay = decay * lr
    w_new = w_new - decay * w_old
  table[rows] = _clip(w_new, params.clip_weight_min, params.clip_weight_max)
  for name, value in new_slot_rows.items():
    slots[name][rows] = value
  return table, slots


def accumulates(params):
  """Whether a step applies the cores' gradients of a row as one update
  (`use_gradient_accumulation`; module docstring, "Several cores")."""
  return bool(params.use_gradient_accumulation)


def apply_update_by_core(params, table, slots, ids, grads, cores, num_cores,
                         learning_rate):
  """One step of a table on `num_cores` cores; `cores[i]` is the core of `ids[i]`.

  Returns `(new_table, new_slots)`: with gradient accumulation one
  `apply_sparse_update` of every core's gradients, else the per-core sums
  applied in the TPU's core order (module docstring), one `apply_sparse_update`
  per application.
  """
  ids = np.asarray(ids).astype(np.int64).reshape(-1)
  cores = np.asarray(cores).astype(np.int64).reshape(-1)
  grads = np.asarray(grads, dtype=_F32)
  if cores.shape != ids.shape or np.any((cores < 0) | (cores >= num_cores)):
    raise ValueError(f'cores must give a core in [0, {num_cores}) per id; got '
                     f'{cores} for ids {ids}.')
  if accumulates(params):
    return apply_sparse_update(params, table, slots, ids, grads, learning_rate)
  per_core = collections.defaultdict(dict)  # id -> {core: summed gradient}
  for row, core, g in zip(ids.tolist(), cores.tolist(), grads):
    sums = per_core[row]
    sums[core] = sums[core] + g if core in sums else g.copy()
  applications = {  # id -> its per-core sums, in application order
      row: [sums[core] for core in sorted(
          sums, key=lambda c, r=row: (c - r % num_cores) % num_cores)]
      for row, sums in per_core.items()}
  if not applications:  # non-lazy Adam still takes its one step
    return apply_sparse_update(params, table, slots, ids, grads, learning_rate)
  for turn in range(max(len(sums) for sums in applications.values())):
    rows = [row for row, sums in applications.items() if len(sums) > turn]
    table, slots = apply_sparse_update(
        params, table, slots, np.array(rows, dtype=np.int64),
        np.stack([applications[row][turn] for row in rows]), learning_rate,
        every_row=turn == 0)
  return table, slots
