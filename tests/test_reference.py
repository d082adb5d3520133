"""Tests of tpu_fc.reference against TensorFlow's own optimizer kernels.

Expected values never come from the code under test: they come from
`tf.raw_ops` sparse optimizer kernels fed the gradient summed per unique id
(TF's kernels do not accumulate duplicates), or, for Adam with
`sum_inside_sqrt`, AdagradMomentum, ProximalYogi and FrequencyEstimator (no TF
kernel), from a float64 derivation written here; `test_rules_by_hand` has two
steps of each of these three written out in numbers.
Gradient clipping, decoupled weight decay and weight clipping are applied
around the kernels by `expected_update`, following the module docstring.
Results are compared within the float32 error bound of `harness.oracle` (TF's
kernels round differently from numpy, and differently again per CPU);
`test_wrong_rules_fail_the_comparison` shows that bound rejects wrong rules.
"""
import types

import numpy as np
import pytest

from harness import oracle
from tpu_fc import reference
import tensorflow as tf  # pylint: disable=g-bad-import-order  (after tpu_fc)

LR = 0.1
PARAMS_LR = 123.0  # stored on every params object; the reference must ignore it
VOCAB, DIM = 6, 3
IDS = np.array([4, 1, 4, 0])
NOT_LOOKED_UP = [2, 3, 5]

COMMON = dict(use_gradient_accumulation=True, clip_weight_min=None,
              clip_weight_max=None, weight_decay_factor=None,
              multiply_weight_decay_factor_by_learning_rate=None,
              clip_gradient_min=None, clip_gradient_max=None)
# Own constructor arguments with the legacy defaults (Momentum and RMSProp
# have none: theirs are required).
OWN_ARGS = {
    'StochasticGradientDescentParameters': {},
    'AdagradParameters': dict(initial_accumulator=0.1),
    'AdamParameters': dict(beta1=0.9, beta2=0.999, epsilon=1e-8,
                           lazy_adam=True, sum_inside_sqrt=True),
    'FtrlParameters': dict(learning_rate_power=-0.5,
                           initial_accumulator_value=0.1,
                           l1_regularization_strength=0.0,
                           l2_regularization_strength=0.0,
                           multiply_linear_by_learning_rate=False, beta=0,
                           allow_zero_accumulator=False),
    'ProximalAdagradParameters': dict(initial_accumulator=0.1,
                                      l1_regularization_strength=0.0,
                                      l2_regularization_strength=0.0),
    'MomentumParameters': dict(momentum=0.9, use_nesterov=False),
    'RMSPropParameters': dict(rho=0.9, momentum=0.5, epsilon=1e-3),
    'AdagradMomentumParameters': dict(momentum=0.9, use_nesterov=False,
                                      exponent=2, beta2=1, epsilon=1e-10),
    'ProximalYogiParameters': dict(beta1=0.9, beta2=0.999, epsilon=1e-3,
                                   l1_regularization_strength=0.0,
                                   l2_regularization_strength=0.0,
                                   initial_accumulator_value=1e-6),
    'FrequencyEstimatorParameters': dict(tau=0.25, max_delta=0.5,
                                         outlier_threshold=1.5,
                                         weight_exponent=1.0),
}
# Its constructor takes none of COMMON: TF 2.15 fixes them.
FIXED_COMMON = ('FrequencyEstimatorParameters',)
# Legacy slot namedtuple field -> mid-level slot name.
LEGACY_SLOT_FIELDS = {'accumulator': 'accumulators', 'linear': 'linears',
                      'm': 'momenta', 'v': 'velocities', 'momenta': 'momenta',
                      'ms': 'ms', 'mom': 'mom',
                      'last_hit_step': 'last_hit_step'}

CASES = {
    'sgd': ('StochasticGradientDescentParameters', {}),
    'adagrad': ('AdagradParameters', dict(initial_accumulator=0.5)),
    'adam': ('AdamParameters', dict(sum_inside_sqrt=False)),
    'adam_sum_inside_sqrt': ('AdamParameters', dict(epsilon=0.1)),
    'adam_non_lazy': ('AdamParameters',
                      dict(lazy_adam=False, sum_inside_sqrt=False)),
    'adam_non_lazy_sum_inside_sqrt': ('AdamParameters',
                                      dict(lazy_adam=False, epsilon=0.1)),
    'ftrl': ('FtrlParameters', dict(l1_regularization_strength=0.3,
                                    l2_regularization_strength=0.2)),
    'ftrl_beta_power': ('FtrlParameters',
                        dict(beta=0.5, learning_rate_power=-0.3,
                             l1_regularization_strength=0.3,
                             l2_regularization_strength=0.2)),
    'ftrl_linear_by_lr': ('FtrlParameters',
                          dict(multiply_linear_by_learning_rate=True, beta=0.5,
                               l1_regularization_strength=3.0,
                               l2_regularization_strength=0.2)),
    'ftrl_linear_by_lr_power': ('FtrlParameters',
                                dict(multiply_linear_by_learning_rate=True,
                                     learning_rate_power=-0.7,
                                     l1_regularization_strength=3.0)),
    'proximal_adagrad': ('ProximalAdagradParameters',
                         dict(l1_regularization_strength=0.3,
                              l2_regularization_strength=0.2)),
    'proximal_adagrad_no_regularization': ('ProximalAdagradParameters', {}),
    'momentum': ('MomentumParameters', {}),
    'momentum_nesterov': ('MomentumParameters', dict(use_nesterov=True)),
    'rms_prop': ('RMSPropParameters', {}),
    'adagrad_momentum': ('AdagradMomentumParameters', {}),
    'adagrad_momentum_exponent_3': ('AdagradMomentumParameters',
                                    dict(momentum=0.5, exponent=3.0,
                                         epsilon=0.1)),
    # The hyperparameters of TF's TPU test of the mid-level optimizer.
    'adagrad_momentum_nesterov_beta2': ('AdagradMomentumParameters',
                                        dict(use_nesterov=True, exponent=3.0,
                                             beta2=0.9, epsilon=0.1)),
    'proximal_yogi': ('ProximalYogiParameters', {}),
    'proximal_yogi_regularized': ('ProximalYogiParameters',
                                  dict(beta1=0.5, beta2=0.75,
                                       l1_regularization_strength=0.3,
                                       l2_regularization_strength=0.2,
                                       initial_accumulator_value=0.5)),
    'frequency_estimator': ('FrequencyEstimatorParameters', {}),
}
# The cases whose optimizer takes the common arguments (clipping, decay).
STAGED_CASES = sorted(c for c in CASES if CASES[c][0] not in FIXED_COMMON)


def _tf_classes():
  from tensorflow.python.tpu import tpu_embedding  # pylint: disable=g-import-not-at-top
  v1 = tf.compat.v1.tpu.experimental
  return {
      'StochasticGradientDescentParameters':
          v1.StochasticGradientDescentParameters,
      'AdagradParameters': v1.AdagradParameters,
      'AdamParameters': v1.AdamParameters,
      'FtrlParameters': v1.FtrlParameters,
      'ProximalAdagradParameters': tpu_embedding.ProximalAdagradParameters,
      'MomentumParameters': tpu_embedding.MomentumParameters,
      'RMSPropParameters': tpu_embedding.RMSPropParameters,
      'AdagradMomentumParameters': tpu_embedding.AdagradMomentumParameters,
      'ProximalYogiParameters': tpu_embedding.ProximalYogiParameters,
      'FrequencyEstimatorParameters':
          tpu_embedding.FrequencyEstimatorParameters,
  }


def _stub_class(name):
  return type(name, (types.SimpleNamespace,), {})


def make_stub(name, **kwargs):
  attrs = dict(COMMON, learning_rate=PARAMS_LR, **OWN_ARGS[name])
  if name == 'FtrlParameters':
    attrs['initial_linear_value'] = 0.0
  attrs.update(kwargs)
  return _stub_class(name)(**attrs)


def make_tf(name, **kwargs):
  rate = {} if name in FIXED_COMMON else dict(learning_rate=PARAMS_LR)
  return _tf_classes()[name](**rate, **dict(OWN_ARGS[name], **kwargs))


@pytest.fixture(params=[
    'stub',
    pytest.param('tf', marks=pytest.mark.legacy_only),
])
def make(request):
  return make_stub if request.param == 'stub' else make_tf


@pytest.fixture(params=sorted(CASES))
def case(request):
  return CASES[request.param]


# Overrides the `case` fixture with the cases of STAGED_CASES.
staged = pytest.mark.parametrize('case', [CASES[c] for c in STAGED_CASES],
                                 ids=STAGED_CASES)


def random_state(params, seed=0):
  """Random table, slots (non-negative where the rule needs it) and grads."""
  rng = np.random.default_rng(seed)
  table = rng.normal(size=(VOCAB, DIM)).astype(np.float32)
  slots = {}
  for name in reference.slot_initial_values(params):
    if name in ('accumulators', 'velocities', 'ms'):
      slots[name] = rng.uniform(0.1, 1.0, size=(VOCAB, DIM))
    else:
      slots[name] = rng.normal(size=(VOCAB, DIM))
    slots[name] = slots[name].astype(np.float32)
  grads = rng.normal(size=(len(IDS), DIM)).astype(np.float32)
  return table, slots, grads


def sum_duplicates(ids, grads):
  """Sorted unique ids and their summed float32 gradients (written out)."""
  summed = {}
  for i, g in zip(ids.tolist(), grads):
    summed[i] = summed[i] + g if i in summed else g.copy()
  rows = np.array(sorted(summed), dtype=np.int64)
  return rows, np.stack([summed[i] for i in rows]).astype(np.float32)


def _adam_by_hand(params, w, m, v, g, lr):
  """Adam, no bias correction, `sum_inside_sqrt` denominator, in float64.

  From the float32 hyperparameters a kernel gets: `1 - float32(0.999)` is
  1.3e-5 off `1 - 0.999`.
  """
  w, m, v, g = (np.asarray(x, np.float64) for x in (w, m, v, g))
  b1, b2, eps, lr = (np.float64(np.float32(x)) for x in (
      params.beta1, params.beta2, params.epsilon, lr))
  m = b1 * m + (1 - b1) * g
  v = b2 * v + (1 - b2) * g * g
  return w - lr * m / np.sqrt(v + eps ** 2), m, v


def _adagrad_momentum_by_hand(params, w, a, m, g, lr):
  """AdagradMomentum (optimization_parameters.proto, with the momentum over
  the scaled gradient as TF's TPU test checks it), in float64."""
  w, a, m, g = (np.asarray(x, np.float64) for x in (w, a, m, g))
  mu, k, b2, eps, lr = (np.float64(np.float32(x)) for x in (
      params.momentum, params.exponent, params.beta2, params.epsilon, lr))
  a = a + g * g if b2 == 1 else b2 * a + (1 - b2) * g * g
  scaled = g / (a + eps) ** (1 / k)
  m = mu * m + scaled
  return w - lr * (mu * m + scaled if params.use_nesterov else m), a, m


def _proximal_yogi_by_hand(params, w, v, m, g, lr):
  """Yogi's Algorithm 2 without bias correction, then the l1/l2 proximal step
  (TF Addons' Yogi), in float64."""
  w, v, m, g = (np.asarray(x, np.float64) for x in (w, v, m, g))
  b1, b2, eps, l1, l2, lr = (np.float64(np.float32(x)) for x in (
      params.beta1, params.beta2, params.epsilon,
      params.l1_regularization_strength, params.l2_regularization_strength,
      lr))
  m = b1 * m + (1 - b1) * g
  v = v - (1 - b2) * np.sign(v - g * g) * g * g
  rate = lr / (np.sqrt(v) + eps)
  u = w - rate * m
  w = np.where(np.abs(u) > rate * l1, u - rate * l1 * np.sign(u), 0.0)
  return w / (1 + rate * l2), v, m


def _frequency_estimator_by_hand(params, d, last, step):
  """optimization_parameters.proto's sequence of operations, in float64."""
  d, last = np.asarray(d, np.float64), np.asarray(last, np.float64)
  tau, max_delta, threshold, step = (np.float64(np.float32(x)) for x in (
      params.tau, params.max_delta, params.outlier_threshold, step))
  delta = step - last
  clipped = np.minimum(delta, max_delta)
  d = np.where(delta >= threshold * d, clipped,
               d * (1 - tau) + clipped * tau)
  return d, np.full_like(d, step)


def _by_hand(params, table, slots, rows, g, lr):
  """The three rules no TF kernel computes, on the rows `rows`."""
  name = type(params).__name__
  table, slots = table.copy(), {k: v.copy() for k, v in slots.items()}
  if name == 'AdagradMomentumParameters':
    table[rows], slots['accumulators'][rows], slots['momenta'][rows] = (
        _adagrad_momentum_by_hand(params, table[rows],
                                  slots['accumulators'][rows],
                                  slots['momenta'][rows], g, lr))
  elif name == 'ProximalYogiParameters':
    table[rows], slots['velocities'][rows], slots['momenta'][rows] = (
        _proximal_yogi_by_hand(params, table[rows], slots['velocities'][rows],
                               slots['momenta'][rows], g, lr))
  else:
    table[rows], slots['last_hit_step'][rows] = _frequency_estimator_by_hand(
        params, table[rows], slots['last_hit_step'][rows], lr)
  return table, slots


def kernel_update(params, table, slots, rows, g, lr):
  """Optimizer rule only, via TF kernels (or, for the rules no TF kernel
  computes, derived here); returns (table, slots)."""
  name = type(params).__name__
  if name in ('AdagradMomentumParameters', 'ProximalYogiParameters',
              'FrequencyEstimatorParameters'):
    return _by_hand(params, table, slots, rows, g, lr)
  var = tf.Variable(table)
  slot_vars = {k: tf.Variable(v) for k, v in slots.items()}
  h = {k: v.handle for k, v in slot_vars.items()}
  f32 = lambda x: tf.constant(x, tf.float32)
  grad, idx = tf.constant(g), tf.constant(rows)
  if name == 'StochasticGradientDescentParameters':
    tf.raw_ops.ResourceScatterSub(resource=var.handle, indices=idx,
                                  updates=f32(lr) * grad)
  elif name == 'AdagradParameters':
    tf.raw_ops.ResourceSparseApplyAdagrad(
        var=var.handle, accum=h['accumulators'], lr=f32(lr), grad=grad,
        indices=idx)
  elif name == 'ProximalAdagradParameters':
    tf.raw_ops.ResourceSparseApplyProximalAdagrad(
        var=var.handle, accum=h['accumulators'], lr=f32(lr),
        l1=f32(params.l1_regularization_strength),
        l2=f32(params.l2_regularization_strength), grad=grad, indices=idx)
  elif name == 'MomentumParameters':
    tf.raw_ops.ResourceSparseApplyMomentum(
        var=var.handle, accum=h['momenta'], lr=f32(lr), grad=grad,
        indices=idx, momentum=f32(params.momentum),
        use_nesterov=params.use_nesterov)
  elif name == 'RMSPropParameters':
    tf.raw_ops.ResourceSparseApplyRMSProp(
        var=var.handle, ms=h['ms'], mom=h['mom'], lr=f32(lr),
        rho=f32(params.rho), momentum=f32(params.momentum),
        epsilon=f32(params.epsilon), grad=grad, indices=idx)
  elif name == 'FtrlParameters':
    # TPU `beta` == TF's l2 + beta / (2 lr) (optimization_parameters.proto).
    tf.raw_ops.ResourceSparseApplyFtrlV2(
        var=var.handle, accum=h['accumulators'], linear=h['linears'],
        grad=grad, indices=idx, lr=f32(lr),
        l1=f32(params.l1_regularization_strength),
        l2=f32(params.l2_regularization_strength + params.beta / (2 * lr)),
        l2_shrinkage=f32(0.0), lr_power=f32(params.learning_rate_power),
        multiply_linear_by_lr=params.multiply_linear_by_learning_rate)
  elif name == 'AdamParameters':
    table, slots = table.copy(), {k: v.copy() for k, v in slots.items()}
    if params.sum_inside_sqrt:
      table[rows], slots['momenta'][rows], slots['velocities'][rows] = (
          _adam_by_hand(params, table[rows], slots['momenta'][rows],
                        slots['velocities'][rows], g, lr))
      return table, slots
    w, m, v = (tf.Variable(x[rows]) for x in (
        table, slots['momenta'], slots['velocities']))
    # beta1_power = beta2_power = 0 turns TF's bias correction off.
    tf.raw_ops.ResourceApplyAdam(
        var=w.handle, m=m.handle, v=v.handle, beta1_power=f32(0.0),
        beta2_power=f32(0.0), lr=f32(lr), beta1=f32(params.beta1),
        beta2=f32(params.beta2), epsilon=f32(params.epsilon), grad=grad)
    table[rows], slots['momenta'][rows], slots['velocities'][rows] = (
        w.numpy(), m.numpy(), v.numpy())
    return table, slots
  else:
    raise AssertionError(name)
  return var.numpy(), {k: v.numpy() for k, v in slot_vars.items()}


def _bounds(low, high):
  return (-np.inf if low is None else low), (np.inf if high is None else high)


def expected_update(params, table, slots, ids, grads, lr):
  """Sum duplicates, clip, TF kernel, decoupled decay, clip weights."""
  rows, g = sum_duplicates(ids, grads)
  g = np.clip(g, *_bounds(params.clip_gradient_min, params.clip_gradient_max))
  g = g.astype(np.float32)
  if type(params).__name__ == 'AdamParameters' and not params.lazy_adam:
    dense = np.zeros_like(table)
    dense[rows] = g
    rows, g = np.arange(VOCAB), dense
  new_table, new_slots = kernel_update(params, table, slots, rows, g, lr)
  if params.weight_decay_factor:
    decay = np.float32(params.weight_decay_factor)
    if params.multiply_weight_decay_factor_by_learning_rate:
      decay *= np.float32(lr)
    new_table[rows] -= decay * table[rows]
  new_table[rows] = np.clip(
      new_table[rows], *_bounds(params.clip_weight_min, params.clip_weight_max))
  return new_table, new_slots


def assert_update(params, table, slots, ids, grads, lr=LR):
  """Checks the reference against `expected_update`; returns its result."""
  got = oracle.ReferenceSteps(params, table, slots).step(ids, grads, lr)
  assert got.table.dtype == np.float32
  assert list(got.slots) == list(reference.slot_initial_values(params))
  assert all(value.dtype == np.float32 for value in got.slots.values())
  got.assert_matches(*expected_update(params, table, slots, ids, grads, lr))
  return got.table, got.slots


def test_matches_tf_kernels(case, make):
  params = make(case[0], **case[1])
  table, slots, grads = random_state(params)
  assert_update(params, table, slots, IDS, grads)


def test_wrong_rules_fail_the_comparison(case, monkeypatch):
  """The float32 bound is tight: each plausible bug (oracle.WRONG_RULES)
  planted in the reference fails the comparison with TF's kernels."""
  params = make_stub(case[0], **case[1])
  table, slots, grads = random_state(params)
  assert not oracle.surviving_wrong_rules(
      monkeypatch, params,
      lambda: assert_update(params, table, slots, IDS, grads))


def test_two_steps_from_initial_slots(case, make):
  params = make(case[0], **case[1])
  table, _, grads = random_state(params, seed=1)
  slots = reference.init_slots(params, (VOCAB, DIM))
  table, slots = assert_update(params, table, slots, IDS, grads)
  assert_update(params, table, slots, np.array([5, 5, 1, 2]), -grads)


@staged
@pytest.mark.parametrize('low,high', [(-0.5, 0.5), (None, 0.3), (-0.2, None)])
def test_gradient_clipping(case, make, low, high):
  params = make(case[0], clip_gradient_min=low, clip_gradient_max=high,
                **case[1])
  table, slots, grads = random_state(params)
  clipped, _ = assert_update(params, table, slots, IDS, 3 * grads)
  unclipped = make(case[0], **case[1])
  free, _ = reference.apply_sparse_update(unclipped, table, slots, IDS,
                                          3 * grads, LR)
  assert not np.allclose(clipped, free)  # the bounds were active


@staged
@pytest.mark.parametrize('low,high', [(-0.5, 0.5), (None, 0.2), (-0.1, None)])
def test_weight_clipping(case, make, low, high):
  params = make(case[0], clip_weight_min=low, clip_weight_max=high, **case[1])
  table, slots, grads = random_state(params)
  new_table, _ = assert_update(params, table, slots, IDS, grads)
  lo, hi = _bounds(low, high)
  updated = np.arange(VOCAB) if not getattr(params, 'lazy_adam', True) else IDS
  assert np.all((new_table[updated] >= lo) & (new_table[updated] <= hi))


@staged
@pytest.mark.parametrize('multiply', [False, True])
def test_weight_decay(case, make, multiply):
  params = make(case[0], weight_decay_factor=0.25,
                multiply_weight_decay_factor_by_learning_rate=multiply,
                **case[1])
  table, slots, grads = random_state(params)
  decayed, _ = assert_update(params, table, slots, IDS, grads)
  plain, _ = reference.apply_sparse_update(make(case[0], **case[1]), table,
                                           slots, IDS, grads, LR)
  decay = np.float32(0.25) * (np.float32(LR) if multiply else np.float32(1))
  # The reference's own float32 operations, in its order: bit-identical.
  np.testing.assert_array_equal(decayed[IDS], plain[IDS] - decay * table[IDS])


@staged
def test_all_steps_together(case, make):
  params = make(case[0], clip_gradient_min=-0.5, clip_gradient_max=0.4,
                weight_decay_factor=0.5,
                multiply_weight_decay_factor_by_learning_rate=True,
                clip_weight_min=-0.3, clip_weight_max=0.6, **case[1])
  table, slots, grads = random_state(params, seed=2)
  assert_update(params, table, slots, IDS, 2 * grads)


def test_duplicates_are_summed(case, make):
  params = make(case[0], **case[1])
  table, slots, grads = random_state(params)
  with_duplicates = reference.apply_sparse_update(params, table, slots, IDS,
                                                  grads, LR)
  # Same batch with the duplicate id 4 pre-summed, listed in another order.
  unique = reference.apply_sparse_update(
      params, table, slots, np.array([1, 4, 0]),
      np.stack([grads[1], grads[0] + grads[2], grads[3]]), LR)
  np.testing.assert_array_equal(with_duplicates[0], unique[0])
  for name in slots:
    np.testing.assert_array_equal(with_duplicates[1][name], unique[1][name])


def test_rows_not_looked_up(case, make):
  params = make(case[0], **case[1])
  table, slots, grads = random_state(params)
  new_table, new_slots = reference.apply_sparse_update(params, table, slots,
                                                       IDS, grads, LR)
  rest = NOT_LOOKED_UP
  assert not np.allclose(new_table[IDS], table[IDS])
  if getattr(params, 'lazy_adam', True):
    np.testing.assert_array_equal(new_table[rest], table[rest])
    for name, value in slots.items():
      np.testing.assert_array_equal(new_slots[name][rest], value[rest])
  else:  # non-lazy Adam: zero gradient, m and v decay, weights move.
    assert np.all(new_table[rest] != table[rest])
    np.testing.assert_array_equal(
        new_slots['momenta'][rest],
        np.float32(params.beta1) * slots['momenta'][rest])
    np.testing.assert_array_equal(
        new_slots['velocities'][rest],
        np.float32(params.beta2) * slots['velocities'][rest])


@staged
def test_inputs_not_mutated(case, make):
  params = make(case[0], weight_decay_factor=0.1, clip_weight_min=-0.5,
                clip_gradient_max=0.1, **case[1])
  table, slots, grads = random_state(params)
  ids = IDS.copy()
  before = (table.copy(), {k: v.copy() for k, v in slots.items()},
            ids.copy(), grads.copy(), dict(vars(params)))
  new_table, new_slots = reference.apply_sparse_update(params, table, slots,
                                                       ids, grads, LR)
  assert new_table is not table
  assert all(new_slots[k] is not slots[k] for k in slots)
  np.testing.assert_array_equal(table, before[0])
  assert list(slots) == list(before[1])
  for name, value in slots.items():
    np.testing.assert_array_equal(value, before[1][name])
  np.testing.assert_array_equal(ids, before[2])
  np.testing.assert_array_equal(grads, before[3])
  assert vars(params) == before[4]


def test_learning_rate_comes_from_the_argument(case):
  name, kwargs = case
  params = make_stub(name, **kwargs)
  table, slots, grads = random_state(params)
  other = make_stub(name, **dict(kwargs, learning_rate=0.5))
  for a, b in zip(
      reference.apply_sparse_update(params, table, slots, IDS, grads, LR),
      reference.apply_sparse_update(other, table, slots, IDS, grads, LR)):
    np.testing.assert_equal(a, b)


def test_slot_initial_values(case, make):
  name, kwargs = case
  if 'initial_accumulator' in OWN_ARGS[name]:
    kwargs = dict(kwargs, initial_accumulator=0.7)
  params = make(name, **kwargs)
  want = {
      'StochasticGradientDescentParameters': lambda p: {},
      'AdagradParameters': lambda p: {'accumulators': p.initial_accumulator},
      'ProximalAdagradParameters':
          lambda p: {'accumulators': p.initial_accumulator},
      'AdamParameters': lambda p: {'momenta': 0.0, 'velocities': 0.0},
      'FtrlParameters': lambda p: {'accumulators': p.initial_accumulator_value,
                                   'linears': 0.0},
      'MomentumParameters': lambda p: {'momenta': 0.0},
      'RMSPropParameters': lambda p: {'ms': 0.0, 'mom': 0.0},
      'AdagradMomentumParameters': lambda p: {'accumulators': 0.0,
                                              'momenta': 0.0},
      'ProximalYogiParameters': lambda p: {
          'velocities': p.initial_accumulator_value, 'momenta': 0.0},
      'FrequencyEstimatorParameters': lambda p: {'last_hit_step': 0.0},
  }[name](params)
  got = reference.slot_initial_values(params)
  assert list(got.items()) == list(want.items())
  slots = reference.init_slots(params, (VOCAB, DIM))
  assert list(slots) == list(want)
  for slot_name, value in slots.items():
    assert value.dtype == np.float32 and value.shape == (VOCAB, DIM)
    np.testing.assert_array_equal(value, np.float32(want[slot_name]))


@pytest.mark.legacy_only
@pytest.mark.parametrize('name,kwargs', [
    ('StochasticGradientDescentParameters', {}),
    ('AdagradParameters', dict(initial_accumulator=0.7)),
    ('ProximalAdagradParameters', dict(initial_accumulator=0.3)),
    ('AdamParameters', {}),
    ('FtrlParameters', dict(initial_accumulator_value=0.0)),
    ('FtrlParameters', dict(initial_accumulator_value=0.4)),
    ('MomentumParameters', {}),
    ('RMSPropParameters', {}),
    ('AdagradMomentumParameters', {}),
    ('ProximalYogiParameters', dict(initial_accumulator_value=0.3)),
    ('FrequencyEstimatorParameters', {}),
])
def test_init_slots_match_legacy_handlers(name, kwargs):
  """The legacy `_*Handler` slot initializers, run in a TF1 graph."""
  from tensorflow.python.tpu import tpu_embedding  # pylint: disable=g-import-not-at-top
  params = make_tf(name, **kwargs)
  handler = tpu_embedding._get_optimization_handler(params)  # pylint: disable=protected-access
  dim = 1 if name == 'FrequencyEstimatorParameters' else DIM  # TF's check
  with tf.Graph().as_default():
    slot_variables, _, _ = handler.create_variables_and_ops(
        'tbl', handler.get_default_slot_variable_names('tbl'), num_hosts=1,
        table_config=tpu_embedding.TableConfig(VOCAB, dim),
        table_variables=[], config_proto=None)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      legacy = {} if slot_variables is None else {
          LEGACY_SLOT_FIELDS[field]: session.run(partitions[0])
          for field, partitions in slot_variables._asdict().items()}
  ours = reference.init_slots(params, (VOCAB, dim))
  assert list(ours) == list(legacy)
  for slot_name, value in ours.items():
    np.testing.assert_array_equal(value, legacy[slot_name])


def test_unknown_class_raises():
  table, slots, grads = np.zeros((VOCAB, DIM)), {}, np.zeros((len(IDS), DIM))
  # OnlineYogi: a rule of optimization_parameters.proto TF never exposed.
  for params in (_stub_class('OnlineYogiParameters')(**COMMON), object()):
    name = type(params).__name__
    with pytest.raises(NotImplementedError, match=name):
      reference.apply_sparse_update(params, table, slots, IDS, grads, LR)
    with pytest.raises(NotImplementedError, match=name):
      reference.slot_initial_values(params)
    with pytest.raises(NotImplementedError, match=name):
      reference.init_slots(params, (VOCAB, DIM))


def test_wrong_slots_or_shapes_raise():
  params = make_stub('AdagradParameters')
  table, slots, grads = random_state(params)
  with pytest.raises(ValueError, match='accumulators'):
    reference.apply_sparse_update(params, table, {}, IDS, grads, LR)
  with pytest.raises(ValueError, match='grads'):
    reference.apply_sparse_update(params, table, slots, IDS, grads[:2], LR)


# Two steps of each rule without a TF kernel, in numbers worked out by hand
# from the equations of its docstring (one row looked up, the others kept).


def _two_steps(params, table, grads, rates):
  """The table and slots after `reference.apply_sparse_update` on row 1 with
  each of `grads` (one per step) at the rates `rates`."""
  slots = reference.init_slots(params, np.shape(table))
  for g, rate in zip(grads, rates):
    table, slots = reference.apply_sparse_update(
        params, table, slots, [1], np.array([g], np.float32), rate)
  return table, slots


@pytest.mark.parametrize('nesterov', [False, True])
def test_adagrad_momentum_by_hand(nesterov):
  # ε = 7 makes a + ε squares: step 1 g = 3: a = 9, s = 3/√16 = 0.75;
  # step 2 g = 3: a = 18, s = 3/√25 = 0.6; μ = 0.5, η = 0.5, w = 1.
  params = make_stub('AdagradMomentumParameters', momentum=0.5, epsilon=7.0,
                     use_nesterov=nesterov)
  table, slots = _two_steps(params, [[5.0], [1.0]], [[3.0], [3.0]],
                            [0.5, 0.5])
  momenta = 0.5 * 0.75 + 0.6  # 0.975
  if nesterov:  # w -= η (μ m + s): 1 - 0.5·1.125 - 0.5·1.0875
    weight = 1 - 0.5 * (0.5 * 0.75 + 0.75) - 0.5 * (0.5 * momenta + 0.6)
  else:  # w -= η m: 1 - 0.5·0.75 - 0.5·0.975
    weight = 1 - 0.5 * 0.75 - 0.5 * momenta
  np.testing.assert_allclose(table, [[5.0], [weight]], rtol=1e-6)
  np.testing.assert_allclose(slots['accumulators'], [[0.0], [18.0]], rtol=1e-6)
  np.testing.assert_allclose(slots['momenta'], [[0.0], [momenta]], rtol=1e-6)


def test_adagrad_momentum_by_hand_beta2_and_exponent():
  # β2 = 0.5, k = 1, ε = 0.5, μ = 0.25, η = 1, w = 1.  Step 1 g = 3:
  # a = 0.5·9 = 4.5, s = 3/5 = 0.6, m = 0.6, w = 0.4.  Step 2 g = -1:
  # a = 2.25 + 0.5 = 2.75, s = -1/3.25, m = 0.15 - 1/3.25.
  params = make_stub('AdagradMomentumParameters', momentum=0.25, beta2=0.5,
                     exponent=1, epsilon=0.5)
  table, slots = _two_steps(params, [[0.0], [1.0]], [[3.0], [-1.0]],
                            [1.0, 1.0])
  momenta = 0.25 * 0.6 - 1 / 3.25
  np.testing.assert_allclose(table, [[0.0], [0.4 - momenta]], rtol=1e-6)
  np.testing.assert_allclose(slots['accumulators'], [[0.0], [2.75]], rtol=1e-6)
  np.testing.assert_allclose(slots['momenta'], [[0.0], [momenta]], rtol=1e-6)


def test_adagrad_momentum_one_step_as_tfs_tpu_test():
  """`_check_embedding_and_slot_variables_for_adagrad_momentum` of TF's
  `tpu_embedding_base_test.py`: from zero slots, momentum 0.9, Nesterov,
  exponent 3, β2 0.9, ε 0.1: `a = 0.1 g²`, `p = (a + 0.1)^(-1/3)`,
  `momenta = g p`, `w -= η (0.9 g p + g p)`."""
  params = make_stub('AdagradMomentumParameters', **CASES[
      'adagrad_momentum_nesterov_beta2'][1])
  g = np.array([2.0, -0.5, 0.0], np.float32)
  table, slots = _two_steps(params, [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], [g],
                            [0.1])
  a = 0.1 * g.astype(np.float64) ** 2
  scaled = g * (a + 0.1) ** (-1 / 3)
  np.testing.assert_allclose(slots['accumulators'][1], a, rtol=1e-6)
  np.testing.assert_allclose(slots['momenta'][1], scaled, rtol=1e-6)
  np.testing.assert_allclose(table[1], [4.0, 5.0, 6.0] - 0.1 * 1.9 * scaled,
                             rtol=1e-6)


def test_proximal_yogi_by_hand():
  # β1 = 0.5, β2 = 0.75, ε = 1, η = 1, l1 = 0.2, l2 = 1, v₀ = 0, w = (3, 0.05).
  # Step 1 g = 2: m = 1, v = 0 + 0.25·sign(4)·4 = 1, ηₜ = 1/(1 + 1) = 0.5,
  # u = w - 0.5 = (2.5, -0.45), shrunk by ηₜ·l1 = 0.1: (2.4, -0.35),
  # / (1 + 0.5) = (1.6, -0.7/3).  Step 2 g = -1: m = 0.5 - 0.5 = 0,
  # g² = v: sign 0, v stays 1, u = w: (1.6 - 0.1, -0.7/3 + 0.1) / 1.5.
  params = make_stub('ProximalYogiParameters', beta1=0.5, beta2=0.75,
                     epsilon=1.0, l1_regularization_strength=0.2,
                     l2_regularization_strength=1.0,
                     initial_accumulator_value=0.0)
  table, slots = _two_steps(params, [[9.0, 9.0], [3.0, 0.05]],
                            [[2.0, 2.0], [-1.0, -1.0]], [1.0, 1.0])
  np.testing.assert_allclose(
      table, [[9.0, 9.0], [1.5 / 1.5, (-0.7 / 3 + 0.1) / 1.5]], rtol=1e-6)
  np.testing.assert_allclose(slots['velocities'], [[0, 0], [1, 1]], rtol=1e-6)
  np.testing.assert_allclose(slots['momenta'], [[0, 0], [0, 0]], atol=1e-7)


def test_proximal_yogi_l1_zeroes_a_small_weight():
  # One step, g = 1, v₀ = 1 (sign 0), β1 = 0: m = 1, ηₜ = 0.5/(1 + 1) = 0.25;
  # u = w - 0.25 = (0.3, -0.5); l1 = 2: ηₜ·l1 = 0.5 zeroes both; l1 = 1.6:
  # ηₜ·l1 = 0.4: (0.3 → 0, -0.5 → -0.1); l1 = 1: (0.05, -0.25).
  for l1, want in ((2.0, [0.0, 0.0]), (1.6, [0.0, -0.1]),
                   (1.0, [0.05, -0.25])):
    params = make_stub('ProximalYogiParameters', beta1=0.0, epsilon=1.0,
                       l1_regularization_strength=l1,
                       initial_accumulator_value=1.0)
    table, _ = _two_steps(params, [[0.0, 0.0], [0.55, -0.25]], [[1.0, 1.0]],
                          [0.5])
    np.testing.assert_allclose(table[1], want, atol=1e-7)


def test_frequency_estimator_by_hand():
  # τ = 0.25, max_delta = 8, threshold 2; D = 4, last hit 0.  Step 2:
  # delta 2 < 2·4: D = 4·0.75 + 2·0.25 = 3.5.  Step 12: delta 10 >= 2·3.5:
  # an outlier, D = min(10, 8) = 8.  The gradient is not read.
  params = make_stub('FrequencyEstimatorParameters', tau=0.25, max_delta=8.0,
                     outlier_threshold=2.0)
  table, slots = _two_steps(params, [[4.0], [4.0]], [[0.0], [123.0]],
                            [2.0, 12.0])
  np.testing.assert_array_equal(table, [[4.0], [8.0]])
  np.testing.assert_array_equal(slots['last_hit_step'], [[0.0], [12.0]])
  # Step 13: delta 1: D = 8·0.75 + 1·0.25 = 6.25.
  table, slots = reference.apply_sparse_update(
      params, table, slots, [1], np.zeros((1, 1), np.float32), 13.0)
  np.testing.assert_array_equal(table, [[4.0], [6.25]])
