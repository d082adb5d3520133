"""The oracles tests compare with: `tpu_fc.reference` stepped with its float32
error bound (`ReferenceSteps`), the wrong rules that bound must reject
(`WRONG_RULES`), the expected tables of the harness's models, and how TF's
own classes react (`outcome`).
"""
import inspect

import numpy as np

from tpu_fc import reference

from harness import estimators
from harness import inputs
from harness import models


def outcome(fn, *args, **kwargs):
  """(exception type, message) of calling fn, or None if it returns.

  Lets a test compare how tpu_fc and TF's own implementation react to the
  same arguments.
  """
  try:
    fn(*args, **kwargs)
  except Exception as e:  # pylint: disable=broad-except
    return type(e), str(e)
  return None


# The float32 error bound of the embedding update rules.
#
# Float32 implementations of one rule (numpy's in tpu_fc.reference, Eigen's in
# a TF kernel, vectorised differently on AVX2 and AVX-512 CPUs, tpu_fc's TF
# ops) round differently, so they are compared per element within
#
#   roundings * EPS32 * magnitude
#
# where `magnitude` is the sum of the magnitudes of the terms that formed the
# element (`_MAGNITUDES`), not the element itself: FTRL's linear
# `l + g - (a'^p - a^p)/η·w` is a small difference of large terms, and its
# rounding errors are those of the terms.
#
# ROUNDINGS: each correctly rounded float32 operation errs by at most EPS32/2
# of its result; pow and rsqrt, which Eigen approximates, are budgeted at 2
# ulps (4 roundings).  Sqrt, pow with an exponent in [0, 1] and division by a
# sum of non-negative terms do not amplify relative errors, so an element errs
# by at most EPS32/2 of its magnitude per rounding on its longest chain.  That
# is FTRL's weight: 12 on its linear (g², a + g², pow (4), -, /η, ·w, + g, + l,
# then sign·λ1 -), 9 on its quadratic (the same a' (2), pow (4), + β, /η,
# + 2λ2), 1 for the division, and 2 more for weight decay: 24.  Two
# implementations may err in opposite directions: 2 · 24 · EPS32/2.  Errors of
# earlier steps reach later ones through the same magnitudes, so to first
# order `roundings` grows by that much per step.
#
# The gradient: implementations that derive it themselves (an engine's chain
# rule, a test's numpy) are off by up to `gradient_roundings` each, and the
# sum of an id's n gradients rounds n - 1 more times (of the sum of their
# sizes), except that two exact addends round alike in any order.  A gradient
# off by c roundings adds GRADIENT_FACTOR · c to a step: FTRL's weight divides
# its linear by its quadratic, each holding g² (2c).  The learning rate must be
# the same float32 number in both.  On several cores each core's application
# (`reference.apply_update_by_core`) is a step.
#
# WRONG_RULES below shows the bound still rejects wrong rules.
EPS32 = float(np.finfo(np.float32).eps)  # 2**-23
ROUNDINGS = 24
GRADIENT_FACTOR = 4
BEYOND_BOUND = 'beyond the float32 error bound'

# HostEmbeddingEngine's gradient of a looked-up id: a sqrt (sqrtn's norm),
# weight / norm, times d(loss)/d(activation), times the gradient multiplier.
# (Weights in the tests are dyadic, so their sums and squares are exact.)
ENGINE_GRADIENT_ROUNDINGS = 4


def _sgd_magnitudes(p, x, m, lr):
  del p, x
  return {'table': m['table'] + lr * m['g']}


def _adagrad_magnitudes(p, x, m, lr):
  del p
  a = x['accumulators'] + x['g'] ** 2
  return {'accumulators': m['accumulators'] + m['g'] ** 2,
          'table': m['table'] + lr * m['g'] / np.sqrt(a)}


def _adam_magnitudes(p, x, m, lr):
  v = p.beta2 * x['velocities'] + (1 - p.beta2) * x['g'] ** 2
  if p.sum_inside_sqrt:
    denominator = np.sqrt(v + p.epsilon ** 2)
  else:
    denominator = np.sqrt(v) + p.epsilon
  momenta = p.beta1 * m['momenta'] + (1 - p.beta1) * m['g']
  return {'momenta': momenta,
          'velocities': p.beta2 * m['velocities'] + (1 - p.beta2) * m['g'] ** 2,
          'table': m['table'] + lr * momenta / denominator}


def _ftrl_magnitudes(p, x, m, lr):
  power = -p.learning_rate_power
  a_new = x['accumulators'] + x['g'] ** 2
  powers = a_new ** power + x['accumulators'] ** power  # of a'^p - a^p
  l1, l2 = p.l1_regularization_strength, p.l2_regularization_strength
  if p.multiply_linear_by_learning_rate:
    linears = m['linears'] + lr * m['g'] + powers * m['table']
    q = a_new ** power + p.beta + 2 * l2 * lr
    threshold = l1 * lr
  else:
    linears = m['linears'] + m['g'] + powers / lr * m['table']
    q = (a_new ** power + p.beta) / lr + 2 * l2
    threshold = l1
  # q = 0 only where a' = β = λ2 = 0: there l' = l = 0, and both give w = 0.
  return {'accumulators': m['accumulators'] + m['g'] ** 2, 'linears': linears,
          'table': (threshold + linears) / np.where(q > 0, q, np.inf)}


def _proximal_adagrad_magnitudes(p, x, m, lr):
  rate = lr / np.sqrt(x['accumulators'] + x['g'] ** 2)
  return {'accumulators': m['accumulators'] + m['g'] ** 2,
          'table': (m['table'] + rate * (m['g'] + p.l1_regularization_strength))
                   / (1 + rate * p.l2_regularization_strength)}


def _momentum_magnitudes(p, x, m, lr):
  del x
  momenta = p.momentum * m['momenta'] + m['g']
  step = m['g'] + p.momentum * momenta if p.use_nesterov else momenta
  return {'momenta': momenta, 'table': m['table'] + lr * step}


def _rms_prop_magnitudes(p, x, m, lr):
  ms = p.rho * x['ms'] + (1 - p.rho) * x['g'] ** 2
  mom = p.momentum * m['mom'] + lr * m['g'] / np.sqrt(ms + p.epsilon)
  return {'ms': p.rho * m['ms'] + (1 - p.rho) * m['g'] ** 2, 'mom': mom,
          'table': m['table'] + mom}


def _adagrad_momentum_magnitudes(p, x, m, lr):
  # (a + ε)^(-1/k) errs relatively as a does, times 1/k (<= 1 in the tests).
  if p.beta2 == 1:
    a = x['accumulators'] + x['g'] ** 2
    accumulators = m['accumulators'] + m['g'] ** 2
  else:
    a = p.beta2 * x['accumulators'] + (1 - p.beta2) * x['g'] ** 2
    accumulators = (abs(p.beta2) * m['accumulators'] +
                    abs(1 - p.beta2) * m['g'] ** 2)
  scaled = m['g'] * (a + p.epsilon) ** (-1 / p.exponent)
  momenta = abs(p.momentum) * m['momenta'] + scaled
  step = abs(p.momentum) * momenta + scaled if p.use_nesterov else momenta
  return {'accumulators': accumulators, 'momenta': momenta,
          'table': m['table'] + lr * step}


def _proximal_yogi_magnitudes(p, x, m, lr):
  g2 = x['g'] ** 2
  v = x['velocities'] + (1 - p.beta2) * np.sign(g2 - x['velocities']) * g2
  rate = lr / (np.sqrt(v) + p.epsilon)
  momenta = p.beta1 * m['momenta'] + (1 - p.beta1) * m['g']
  return {'momenta': momenta,
          'velocities': m['velocities'] + (1 - p.beta2) * m['g'] ** 2,
          'table': (m['table'] + rate * (momenta + p.l1_regularization_strength))
                   / (1 + rate * p.l2_regularization_strength)}


def _frequency_estimator_magnitudes(p, x, m, lr):
  del x
  delta = lr + m['last_hit_step']
  return {'last_hit_step': np.full_like(m['last_hit_step'], lr),
          'table': m['table'] * abs(1 - p.tau) + delta * (1 + abs(p.tau))}


# (params, x = values before the step, m = their magnitudes, lr) -> magnitudes
# after it: each rule of tpu_fc.reference with every term taken by magnitude.
# x and m hold the updated rows of 'table', each slot and the summed 'g'.
_MAGNITUDES = {
    'StochasticGradientDescentParameters': _sgd_magnitudes,
    'AdagradParameters': _adagrad_magnitudes,
    'AdamParameters': _adam_magnitudes,
    'FtrlParameters': _ftrl_magnitudes,
    'ProximalAdagradParameters': _proximal_adagrad_magnitudes,
    'MomentumParameters': _momentum_magnitudes,
    'RMSPropParameters': _rms_prop_magnitudes,
    'AdagradMomentumParameters': _adagrad_momentum_magnitudes,
    'ProximalYogiParameters': _proximal_yogi_magnitudes,
    'FrequencyEstimatorParameters': _frequency_estimator_magnitudes,
}


def _step_magnitudes(params, state, magnitudes, ids, grads, lr, every_row):
  """Magnitudes after one reference step, in its step order (float64)."""
  ids = np.asarray(ids, np.int64).reshape(-1)
  grads = np.asarray(grads, np.float64)
  rows, position = np.unique(ids, return_inverse=True)
  g = np.zeros((rows.shape[0], grads.shape[1]))
  g_magnitude = np.zeros_like(g)  # the duplicates' sum rounds on their sizes
  np.add.at(g, position.reshape(-1), grads)
  np.add.at(g_magnitude, position.reshape(-1), np.abs(grads))
  low, high = params.clip_gradient_min, params.clip_gradient_max
  g = np.clip(g, -np.inf if low is None else low,
              np.inf if high is None else high)
  name = type(params).__name__
  if every_row and name == 'AdamParameters' and not params.lazy_adam:  # g = 0
    dense_g = np.zeros(state['table'].shape)
    dense_magnitude = np.zeros_like(dense_g)
    dense_g[rows], dense_magnitude[rows] = g, g_magnitude
    rows, g, g_magnitude = np.arange(dense_g.shape[0]), dense_g, dense_magnitude
  x = dict({k: np.asarray(v, np.float64)[rows] for k, v in state.items()}, g=g)
  m = dict({k: v[rows] for k, v in magnitudes.items()}, g=g_magnitude)
  updated = _MAGNITUDES[name](params, x, m, float(lr))
  if params.weight_decay_factor:  # clipping adds no error: it is exact
    decay = abs(params.weight_decay_factor)
    if params.multiply_weight_decay_factor_by_learning_rate:
      decay *= lr
    updated['table'] = updated['table'] + decay * m['table']
  result = {k: v.copy() for k, v in magnitudes.items()}
  for k, v in updated.items():
    result[k][rows] = v
  return result


def assert_within(got, want, bound, err_msg=''):
  """Asserts |got - want| <= bound per element (a NaN fails), showing the worst."""
  got, want = np.asarray(got), np.asarray(want)
  assert got.shape == want.shape, (err_msg, got.shape, want.shape)
  error = np.abs(got.astype(np.float64) - want)
  over = ~(error <= bound)
  if over.any():
    worst = np.unravel_index(np.argmax(np.where(over, error - bound, -np.inf)),
                             got.shape)
    raise AssertionError(
        f'{err_msg}: {over.sum()} of {over.size} elements {BEYOND_BOUND}; '
        f'worst {worst}: got {got[worst]!r}, want {want[worst]!r}, bound '
        f'{bound[worst]:.3g}')


def _turns(ids, grads, cores, num_cores):
  """[(ids, grads)] of each turn of `reference.apply_update_by_core`: an id's
  first turn is on the first core that saw it in ring order from its holder
  `id mod num_cores`, its second on the next one, ..."""
  cores = np.asarray(cores, np.int64).reshape(-1)
  distance = (cores - ids % num_cores) % num_cores
  turn = np.zeros_like(ids)
  for row in np.unique(ids):
    mine = ids == row
    turn[mine] = np.unique(distance[mine], return_inverse=True)[1].reshape(-1)
  return [(ids[turn == t], grads[turn == t])
          for t in range(turn.max(initial=0) + 1)]


class ReferenceSteps:
  """Steps of `tpu_fc.reference` from a start state, with the float32 error
  bound of every element (see ROUNDINGS above).

  A step replaces the arrays, never writes into them: `copy.copy` snapshots.
  """

  def __init__(self, params, table, slots, gradient_roundings=0):
    self.params = params
    self.table = np.asarray(table, np.float32)
    self.slots = {k: np.asarray(v, np.float32) for k, v in slots.items()}
    self.gradient_roundings = gradient_roundings
    self._magnitudes = {k: np.abs(v, dtype=np.float64)
                        for k, v in self._state().items()}
    self._roundings = 0

  def _state(self):
    return dict(self.slots, table=self.table)

  def step(self, ids, grads, learning_rate, cores=None, num_cores=1):
    """One step: `apply_sparse_update`, or with `cores` (the core of each id)
    `apply_update_by_core` on `num_cores` cores (one application with
    gradient accumulation).  Returns self."""
    ids = np.asarray(ids, np.int64).reshape(-1)
    grads = np.asarray(grads, np.float32)
    if cores is not None and reference.accumulates(self.params):
      cores = None  # the cores' gradients are one update
    turns = ([(ids, grads)] if cores is None else
             _turns(ids, grads, cores, num_cores))
    state = self._state()
    for turn, (turn_ids, turn_grads) in enumerate(turns):
      self._magnitudes = _step_magnitudes(self.params, state, self._magnitudes,
                                          turn_ids, turn_grads, learning_rate,
                                          every_row=turn == 0)
      duplicates = np.unique(turn_ids, return_counts=True)[1].max(initial=1)
      summing = (duplicates - 1 if self.gradient_roundings or duplicates > 2
                 else 0)
      self._roundings += ROUNDINGS + GRADIENT_FACTOR * (
          self.gradient_roundings + summing)
      table, slots = reference.apply_sparse_update(
          self.params, state.pop('table'), state, turn_ids, turn_grads,
          learning_rate, every_row=turn == 0)
      state = dict(slots, table=table)
    if cores is None:  # its one turn is the step
      self.table, self.slots = state.pop('table'), state
    else:  # the turns above gave the magnitudes their states in between
      self.table, self.slots = reference.apply_update_by_core(
          self.params, self.table, self.slots, ids, grads, cores, num_cores,
          learning_rate)
    return self

  def assert_matches(self, table, slots=None, err_msg=''):
    """Asserts another implementation's table and slots (None: the table
    only) after the same steps are within the bound of the reference's
    (exactly equal before any step)."""
    got = {'table': table}
    if slots is not None:
      assert sorted(slots) == sorted(self.slots), (err_msg, sorted(slots))
      got.update(slots)
    want = self._state()
    for name, value in got.items():
      assert_within(value, want[name],
                    self._roundings * EPS32 * self._magnitudes[name],
                    f'{err_msg} {name}'.strip())


# Plausible bugs, each one edit of the rule's source in tpu_fc.reference:
# (label, text, wrong text).  Every comparison within the bound above must
# reject each one (the `*wrong_rules*` tests): the bound catches wrong rules.
_ANY_RULE = [
    ('gradient_negated', 'g, lr):\n', 'g, lr):\n  g = -g\n'),
    ('rate_0.1%_high', 'g, lr):\n', 'g, lr):\n  lr = lr * _F32(1.001)\n'),
]
# Rules that do not read the gradient (it should be zero), for which the
# gradient's sign is no bug.
_READS_NO_GRADIENT = ('FrequencyEstimatorParameters',)
WRONG_RULES = {
    'StochasticGradientDescentParameters': [],
    'AdagradParameters': [('accumulates_abs_g', 'g * g', 'np.abs(g)')],
    'AdamParameters': [
        ('momenta_without_1_minus_beta1', '(_ONE - b1) * g', 'g'),
        ('velocities_decay_with_beta1', 'b2 * slots', 'b1 * slots')],
    'FtrlParameters': [
        ('accumulates_abs_g', 'g * g', 'np.abs(g)'),
        ('power_of_new_accumulator_only', ' - np.power(a, p)', '')],
    'ProximalAdagradParameters': [
        ('gradient_step_ignores_accumulator', 'w - lr_t * g', 'w - lr * g')],
    'MomentumParameters': [('momenta_sign_flipped', 'mu * slots',
                            '-mu * slots')],
    'RMSPropParameters': [('epsilon_dropped', 'np.sqrt(ms + eps)',
                           'np.sqrt(ms)')],
    'AdagradMomentumParameters': [
        # optimization_parameters.proto's text read literally: the momentum
        # of (a + ε)^(-1/k) alone, times g in the update.
        ('momentum_of_the_preconditioner_alone',
         "scaled = g * np.power(a + eps, -(_ONE / k))\n"
         "  m = mu * slots['momenta'] + scaled\n"
         "  step = mu * m + scaled if params.use_nesterov else m\n"
         "  return w - lr * step,",
         "scaled = np.power(a + eps, -(_ONE / k))\n"
         "  m = mu * slots['momenta'] + scaled\n"
         "  step = mu * m + scaled if params.use_nesterov else m\n"
         "  return w - lr * g * step,"),
        ('preconditioned_by_the_old_accumulator', 'np.power(a + eps',
         "np.power(slots['accumulators'] + eps")],
    'ProximalYogiParameters': [
        ('velocities_as_adams',
         "slots['velocities'] + (_ONE - b2) * np.sign(g2 - slots['velocities'])"
         " * g2", "b2 * slots['velocities'] + (_ONE - b2) * g2"),
        ('gradient_step_by_g_not_m', 'w - lr_t * m', 'w - lr_t * g')],
    'FrequencyEstimatorParameters': [
        ('tau_weights_swapped', 'w * (_ONE - tau) + clipped * tau',
         'w * tau + clipped * (_ONE - tau)'),
        ('delta_not_clipped', 'np.minimum(delta, max_delta)', 'delta'),
        ('outliers_not_reset', 'np.where(outlier,', 'np.where(False,'),
        ('last_hit_step_kept', "np.full_like(w, lr)",
         "slots['last_hit_step']")],
}


def _edited(function, text, wrong_text):
  """`function` of tpu_fc.reference with `text` in its source replaced."""
  source = inspect.getsource(function)
  assert source.count(text) == 1, (function.__name__, text)  # still applies
  namespace = dict(vars(reference))
  exec(source.replace(text, wrong_text), namespace)  # pylint: disable=exec-used
  return namespace[function.__name__]


def _set_rule(monkeypatch, name, slots, rule):
  """Makes `rule` tpu_fc.reference's rule of the optimizer class `name`, with
  `slots(params)` its ordered {slot: initial value}, while `monkeypatch`
  lasts: the one place the oracle's table is changed."""
  monkeypatch.setitem(reference._OPTIMIZERS, name,  # pylint: disable=protected-access
                      reference._Optimizer(slots, rule))  # pylint: disable=protected-access


def register_rule(monkeypatch, name, slots, rule, magnitudes):
  """Teaches the oracle, for one test, the rule of an optimizer class tpu_fc
  does not have (a test's own, named `name`): `slots(params)` gives its
  ordered {mid-level slot: initial value}; `rule` is written as
  tpu_fc.reference's rules, `magnitudes` as `_MAGNITUDES`' (its float32
  bound).  tpu_fc never learns of it."""
  _set_rule(monkeypatch, name, slots, rule)
  monkeypatch.setitem(_MAGNITUDES, name, magnitudes)


def surviving_wrong_rules(monkeypatch, params, compare):
  """Labels of the wrong rules for `params` that `compare()` accepts.

  `compare()` runs a comparison with `tpu_fc.reference`, which here has one
  wrong rule (see WRONG_RULES) at a time.
  """
  name = type(params).__name__
  optimizer = reference._OPTIMIZERS[name]  # pylint: disable=protected-access
  survivors = []
  any_rule = [rule for rule in _ANY_RULE
              if not (rule[0] == 'gradient_negated' and
                      name in _READS_NO_GRADIENT)]
  for label, text, wrong_text in any_rule + WRONG_RULES[name]:
    with monkeypatch.context() as patch:
      _set_rule(patch, name, optimizer.slots,
                _edited(optimizer.rule, text, wrong_text))
      try:
        compare()
      except AssertionError as error:
        if BEYOND_BOUND not in str(error):
          raise
        continue
    survivors.append(label)
  return survivors


# The contract model's expected tables.


def occurrences(num_shards):
  """(ids, cores, d(loss)/d(row)) of every id the contract model looks up."""
  per_core = len(inputs.IDS) // num_shards
  ids, cores, grads = [], [], []
  for example, row_ids in enumerate(inputs.IDS):
    for row in row_ids:
      ids.append(row)
      cores.append(example // per_core)
      grads.append(models.COEF / len(row_ids) / num_shards)
  return np.array(ids), np.array(cores), np.array(grads, np.float32)


def expected_step(path, optimizer_name, steps=1,
                  num_shards=estimators.NUM_SHARDS):
  """`ReferenceSteps` after `steps` steps of the contract model on `path`
  ('mid_level': the migrated model on `num_shards` emulated cores)."""
  if path in ('embedding_core', 'mid_level'):
    params = estimators.EMBEDDING_OPTIMIZERS[optimizer_name]
  else:
    params = estimators.MODEL_OPTIMIZERS[optimizer_name][1]
  num_shards = 1 if path == 'cpu' else num_shards
  ids, cores, grads = occurrences(num_shards)
  want = ReferenceSteps(params, models.START,
                        reference.init_slots(params, (models.VOCAB,
                                                      models.DIM)),
                        gradient_roundings=2)
  for _ in range(steps):
    if path != 'cpu' and path != 'tensor_core':  # as the optimizer's
      # use_gradient_accumulation says: one update, or each core's in turn
      want.step(ids, grads, models.LR, cores=cores, num_cores=num_shards)
    else:  # a model variable: the shards' gradients averaged, one update
      want.step(ids, grads, models.LR)
  return want


# The engine's features looked up by hand (`inputs.Feat`).


def np_activation(feat, table):
  """Activation ([B, dim] or [B, L, dim]) and sequence lengths, by hand."""
  entries = feat.entries()
  if feat.seq_len:
    act = np.zeros((inputs.ENGINE_BATCH, feat.seq_len, feat.dim), np.float64)
    lengths = np.zeros(inputs.ENGINE_BATCH, np.int64)
    for b, j, i, _ in entries:
      lengths[b] = max(lengths[b], min(j + 1, feat.seq_len))
      if j < feat.seq_len:
        act[b, j] = table[i]
    return act, lengths
  act = np.zeros((inputs.ENGINE_BATCH, feat.dim), np.float64)
  for b in range(inputs.ENGINE_BATCH):
    mine = [(i, w) for bb, _, i, w in entries if bb == b]
    if mine:
      act[b] = sum(w * table[i].astype(np.float64) for i, w in mine) * _scale(
          feat.combiner, [w for _, w in mine])
  return act, None


def _scale(combiner, weights):
  if combiner == 'mean':
    return 1.0 / sum(weights)
  if combiner == 'sqrtn':
    return 1.0 / np.sqrt(sum(w * w for w in weights))
  assert combiner == 'sum'
  return 1.0


def np_entry_gradients(feat, dy):
  """(ids, examples, d(loss)/d(row)) of the looked-up entries, by the chain rule."""
  entries = feat.entries()
  ids, examples, grads = [], [], []
  for b, j, i, w in entries:
    if feat.seq_len:
      if j >= feat.seq_len:
        continue  # truncated: not part of the activation
      grads.append(dy[b, j])
    else:
      grads.append(dy[b] * w * _scale(
          feat.combiner, [ww for bb, _, _, ww in entries if bb == b]))
    ids.append(i)
    examples.append(b)
  return ids, examples, grads


# The user model's tables (`models.user_model_fn`), and its variables by hand.

# Legacy TPU checkpoint slot suffix per mid-level slot (LEGACY_SEMANTICS §7).
SLOT_SUFFIX = {
    'StochasticGradientDescentParameters': {},
    'AdagradParameters': {'accumulators': 'Adagrad'},
    'AdamParameters': {'momenta': 'Adam/m', 'velocities': 'Adam/v'},
    'FtrlParameters': {'accumulators': 'Ftrl', 'linears': 'Ftrl_1'},
    'MomentumParameters': {'momenta': 'Momentum'},
    'RMSPropParameters': {'ms': 'RMSProp/ms', 'mom': 'RMSProp/mom'},
    'ProximalAdagradParameters': {'accumulators': 'ProximalAdagrad'},
    # TF 2.15's `_*Handler.get_default_slot_variable_names` (dict configs).
    'AdagradMomentumParameters': {'accumulators': 'AdagradMomentum/Accumulator',
                                  'momenta': 'AdagradMomentum/Momentum'},
    'ProximalYogiParameters': {'velocities': 'ProximalYogi',
                               'momenta': 'ProximalYogi_1'},
    'FrequencyEstimatorParameters': {'last_hit_step': 'FrequencyEstimator'},
}

# Model variables, metrics and activations against numpy by hand: float32 sums
# of a few terms (~1e-7 of values below 10) on tables that differ from the
# reference's within the update bound (all by at most 1e-6 here).
TOL = dict(rtol=1e-5, atol=1e-5)


class Table:
  """The numpy model of one embedding-core table of the user model and its
  slots, trained by the reference (`inputs.Feature.row_grads`)."""

  def __init__(self, name, init, params, feats):
    self.name, self.feats = name, feats
    # row_grads rounds at most as often as the engine: the norm's sqrt,
    # dact·w, / norm, the multiplier.
    self.want = ReferenceSteps(
        params, init, reference.init_slots(params, init.shape),
        gradient_roundings=ENGINE_GRADIENT_ROUNDINGS)

  @property
  def w(self):
    return self.want.table

  def step(self, dacts, lr, multiplier=1.0, tpu=True, num_shards=estimators.NUM_SHARDS):
    """One TPU embedding update: `dacts` = {feature key: d(loss)/d(activation)}.

    The examples split evenly over `num_shards` cores, whose gradients apply
    as the optimizer's `use_gradient_accumulation` says (summed by default).
    """
    ids, cores, grads = [], [], []
    for feat in self.feats:
      i, examples, g = feat.row_grads(dacts[feat.key], tpu)
      ids += i
      cores += [b // (inputs.BATCH // num_shards) for b in examples]
      grads.append(g)
    grads = np.concatenate(grads) * np.float32(multiplier)
    self.want.step(np.array(ids, np.int64), grads, lr, cores=cores,
                   num_cores=num_shards)

  def check(self, estimator, step):
    suffixes = SLOT_SUFFIX[type(self.want.params).__name__]
    self.want.assert_matches(
        estimator.get_variable_value(self.name),
        {slot: estimator.get_variable_value(
            '{}/{}'.format(self.name, suffixes[slot]))
         for slot in self.want.slots},
        err_msg='{} after step {}'.format(self.name, step))


def check_bias(estimator, c, steps, scale):
  """SGD on the bias: d(loss)/d(bias) = sum_b c[b] * scale every step."""
  expected = models.BIAS0 - steps * models.MODEL_LR * scale * c.sum(0)
  np.testing.assert_allclose(estimator.get_variable_value('bias'), expected,
                             **TOL)
