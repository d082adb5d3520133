"""Tests of tpu_fc.reference against TensorFlow's own optimizer kernels.

Expected values never come from the code under test: they come from
`tf.raw_ops` sparse optimizer kernels fed the gradient summed per unique id
(TF's kernels do not accumulate duplicates), or, for Adam with
`sum_inside_sqrt` (no TF kernel), from a float64 derivation written here.
Gradient clipping, decoupled weight decay and weight clipping are applied
around the kernels by `expected_update`, following the module docstring.
Results are compared within the float32 error bound of `helpers` (TF's
kernels round differently from numpy, and differently again per CPU);
`test_wrong_rules_fail_the_comparison` shows that bound rejects wrong rules.
"""
import types

import numpy as np
import pytest

import helpers
from tpu_fc import reference
import tensorflow as tf  # pylint: disable=g-bad-import-order  (after tpu_fc)

LEGACY_TF = tf.__version__.startswith('2.15')
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
}
# Legacy slot namedtuple field -> mid-level slot name.
LEGACY_SLOT_FIELDS = {'accumulator': 'accumulators', 'linear': 'linears',
                      'm': 'momenta', 'v': 'velocities', 'momenta': 'momenta',
                      'ms': 'ms', 'mom': 'mom'}

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
}


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
  return _tf_classes()[name](learning_rate=PARAMS_LR,
                             **dict(OWN_ARGS[name], **kwargs))


@pytest.fixture(params=[
    'stub',
    pytest.param('tf', marks=pytest.mark.skipif(
        not LEGACY_TF, reason='legacy *Parameters classes need TF 2.15')),
])
def make(request):
  return make_stub if request.param == 'stub' else make_tf


@pytest.fixture(params=sorted(CASES))
def case(request):
  return CASES[request.param]


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


def kernel_update(params, table, slots, rows, g, lr):
  """Optimizer rule only, via TF kernels; returns (table, slots)."""
  name = type(params).__name__
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
  got = helpers.ReferenceSteps(params, table, slots).step(ids, grads, lr)
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
  """The float32 bound is tight: each plausible bug (helpers.WRONG_RULES)
  planted in the reference fails the comparison with TF's kernels."""
  params = make_stub(case[0], **case[1])
  table, slots, grads = random_state(params)
  assert not helpers.surviving_wrong_rules(
      monkeypatch, params,
      lambda: assert_update(params, table, slots, IDS, grads))


def test_two_steps_from_initial_slots(case, make):
  params = make(case[0], **case[1])
  table, _, grads = random_state(params, seed=1)
  slots = reference.init_slots(params, (VOCAB, DIM))
  table, slots = assert_update(params, table, slots, IDS, grads)
  assert_update(params, table, slots, np.array([5, 5, 1, 2]), -grads)


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


@pytest.mark.parametrize('low,high', [(-0.5, 0.5), (None, 0.2), (-0.1, None)])
def test_weight_clipping(case, make, low, high):
  params = make(case[0], clip_weight_min=low, clip_weight_max=high, **case[1])
  table, slots, grads = random_state(params)
  new_table, _ = assert_update(params, table, slots, IDS, grads)
  lo, hi = _bounds(low, high)
  updated = np.arange(VOCAB) if not getattr(params, 'lazy_adam', True) else IDS
  assert np.all((new_table[updated] >= lo) & (new_table[updated] <= hi))


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
  }[name](params)
  got = reference.slot_initial_values(params)
  assert list(got.items()) == list(want.items())
  slots = reference.init_slots(params, (VOCAB, DIM))
  assert list(slots) == list(want)
  for slot_name, value in slots.items():
    assert value.dtype == np.float32 and value.shape == (VOCAB, DIM)
    np.testing.assert_array_equal(value, np.float32(want[slot_name]))


@pytest.mark.skipif(not LEGACY_TF, reason='legacy handlers need TF 2.15')
@pytest.mark.parametrize('name,kwargs', [
    ('StochasticGradientDescentParameters', {}),
    ('AdagradParameters', dict(initial_accumulator=0.7)),
    ('ProximalAdagradParameters', dict(initial_accumulator=0.3)),
    ('AdamParameters', {}),
    ('FtrlParameters', dict(initial_accumulator_value=0.0)),
    ('FtrlParameters', dict(initial_accumulator_value=0.4)),
    ('MomentumParameters', {}),
    ('RMSPropParameters', {}),
])
def test_init_slots_match_legacy_handlers(name, kwargs):
  """The legacy `_*Handler` slot initializers, run in a TF1 graph."""
  from tensorflow.python.tpu import tpu_embedding  # pylint: disable=g-import-not-at-top
  params = make_tf(name, **kwargs)
  handler = tpu_embedding._get_optimization_handler(params)  # pylint: disable=protected-access
  with tf.Graph().as_default():
    slot_variables, _, _ = handler.create_variables_and_ops(
        'tbl', handler.get_default_slot_variable_names('tbl'), num_hosts=1,
        table_config=tpu_embedding.TableConfig(VOCAB, DIM),
        table_variables=[], config_proto=None)
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      legacy = {} if slot_variables is None else {
          LEGACY_SLOT_FIELDS[field]: session.run(partitions[0])
          for field, partitions in slot_variables._asdict().items()}
  ours = reference.init_slots(params, (VOCAB, DIM))
  assert list(ours) == list(legacy)
  for slot_name, value in ours.items():
    np.testing.assert_array_equal(value, legacy[slot_name])


def test_unknown_class_raises():
  table, slots, grads = np.zeros((VOCAB, DIM)), {}, np.zeros((len(IDS), DIM))
  for params in (_stub_class('AdagradMomentumParameters')(**COMMON),
                 object()):
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
