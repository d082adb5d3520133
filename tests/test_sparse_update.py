"""tpu_fc.lookup.sparse_update against tpu_fc.reference (THE definition), on both lanes.

Every optimizer configuration times every optional stage runs 1 and 3 steps in
a `tf.compat.v1` graph and session; table and slots must match the numpy
reference applied as many times, within the float32 error bound of `harness.oracle`
(`test_wrong_rules_fail_the_comparison`: it still rejects wrong rules).
Expected values never come from the code under test.
"""
import contextlib

import numpy as np
import pytest

from harness import oracle
import tpu_fc
from tpu_fc import optimizers
from tpu_fc import reference
from tpu_fc.lookup import sparse_update
import tensorflow as tf  # pylint: disable=g-bad-import-order  (after tpu_fc)

VOCAB, DIM = 7, 3
PARAMS_LR = 123.0  # stored on every parameters object; the update must ignore it
# (unique ids, learning rate) of each step; rows 3 and 5 are never looked up.
STEPS = [([4, 1, 0], 0.1), ([6, 1, 2, 4], 0.05), ([0, 4], 0.2)]
NEVER_LOOKED_UP = [3, 5]

CASES = {
    'sgd': ('StochasticGradientDescentParameters', {}),
    'adagrad': ('AdagradParameters', dict(initial_accumulator=0.5)),
    'proximal_adagrad': ('ProximalAdagradParameters',
                         dict(l1_regularization_strength=0.3,
                              l2_regularization_strength=0.2)),
    'proximal_adagrad_l2': ('ProximalAdagradParameters',
                            dict(l2_regularization_strength=0.5)),
    'adam': ('AdamParameters', dict(sum_inside_sqrt=False, epsilon=0.1)),
    'adam_sum_inside_sqrt': ('AdamParameters', dict(epsilon=0.1)),
    'adam_non_lazy': ('AdamParameters', dict(lazy_adam=False,
                                             sum_inside_sqrt=False,
                                             epsilon=0.1)),
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
                               l1_regularization_strength=0.05,
                               l2_regularization_strength=0.2)),
    'ftrl_linear_by_lr_power': ('FtrlParameters',
                                dict(multiply_linear_by_learning_rate=True,
                                     learning_rate_power=-0.7,
                                     l1_regularization_strength=0.05)),
    # Legal only in the legacy API; the kernel would give 0/0 = NaN here.
    'ftrl_zero_accumulator': ('FtrlParameters',
                              dict(initial_accumulator_value=0.0,
                                   allow_zero_accumulator=True,
                                   l1_regularization_strength=0.1)),
    'ftrl_zero_accumulator_linear_by_lr': (
        'FtrlParameters', dict(initial_accumulator_value=0.0,
                               allow_zero_accumulator=True,
                               multiply_linear_by_learning_rate=True,
                               l1_regularization_strength=0.01)),
    'momentum': ('MomentumParameters', dict(momentum=0.9)),
    'momentum_nesterov': ('MomentumParameters', dict(momentum=0.9,
                                                     use_nesterov=True)),
    'rms_prop': ('RMSPropParameters', dict(rho=0.9, momentum=0.5,
                                           epsilon=1e-3)),
    'adagrad_momentum': ('AdagradMomentumParameters', dict(momentum=0.9)),
    'adagrad_momentum_nesterov_beta2': ('AdagradMomentumParameters',
                                        dict(momentum=0.9, use_nesterov=True,
                                             exponent=3.0, beta2=0.9,
                                             epsilon=0.1)),
    'proximal_yogi': ('ProximalYogiParameters',
                      dict(l1_regularization_strength=0.3,
                           l2_regularization_strength=0.2)),
    'proximal_yogi_l2': ('ProximalYogiParameters',
                         dict(beta1=0.5, beta2=0.75,
                              l2_regularization_strength=0.5)),
    # The rates of STEPS stand for global steps here.
    'frequency_estimator': ('FrequencyEstimatorParameters',
                            dict(tau=0.25, max_delta=0.5,
                                 outlier_threshold=1.5, weight_exponent=1.0)),
}
# Its constructor takes no learning rate, clipping or decay (TF 2.15 fixes
# them): its cases run without STAGES.
FIXED_COMMON = ('FrequencyEstimatorParameters',)
STAGES = {
    'plain': {},
    'gradient_clipping': dict(clip_gradient_min=-0.5, clip_gradient_max=0.4),
    'weight_decay': dict(weight_decay_factor=0.3),
    'weight_decay_times_lr': dict(
        weight_decay_factor=0.3,
        multiply_weight_decay_factor_by_learning_rate=True),
    'weight_clipping': dict(clip_weight_min=-0.3, clip_weight_max=0.5),
    'all': dict(clip_gradient_min=-0.5, clip_gradient_max=0.4,
                weight_decay_factor=0.5,
                multiply_weight_decay_factor_by_learning_rate=True,
                clip_weight_min=-0.3, clip_weight_max=0.6),
}


def takes_stages(case):
  return CASES[case][0] not in FIXED_COMMON


def make(case, stage='plain'):
  name, kwargs = CASES[case]
  if not takes_stages(case):
    assert stage == 'plain', (case, stage)
    return getattr(tpu_fc, name)(**kwargs)
  return getattr(tpu_fc, name)(PARAMS_LR, **kwargs, **STAGES[stage])


def fullest(case):
  """Every stage ('all'), or none for an optimizer that takes none."""
  return 'all' if takes_stages(case) else 'plain'


def case_stages(stages):
  """(case, stage) of every case with each of `stages` it takes."""
  return [(case, stage) for case in sorted(CASES) for stage in stages
          if stage == 'plain' or takes_stages(case)]


def is_non_lazy(params):
  return not getattr(params, 'lazy_adam', True)


def random_state(params, seed=0, dim=DIM):
  """Random table and slots (non-negative where the rule needs it), grads per step.

  Every step's gradient has exact zeros.  FTRL with a zero initial accumulator
  keeps never-updated elements (accumulator and linear 0, all of column 1) next
  to trained ones: a zero gradient there is the case the FTRL kernel gets wrong.
  """
  rng = np.random.default_rng(seed)
  table = rng.normal(size=(VOCAB, dim)).astype(np.float32)
  slots = {}
  for name in params.slot_initial_values():
    if name in ('accumulators', 'velocities', 'ms'):
      value = rng.uniform(0.1, 1.0, size=(VOCAB, dim))
    else:
      value = rng.normal(size=(VOCAB, dim))
    slots[name] = value.astype(np.float32)
  if getattr(params, 'initial_accumulator_value', None) == 0:
    never_updated = rng.uniform(size=(VOCAB, dim)) < 0.5
    never_updated[:, 1] = True
    for name in ('accumulators', 'linears'):
      slots[name][never_updated] = 0.0
  grads = []
  for ids, _ in STEPS:
    g = 1.5 * rng.normal(size=(len(ids), dim))
    g[0, 1] = 0.0
    grads.append(g.astype(np.float32))
  return table, slots, grads


class Harness:
  """A graph with one table, its slots and the update; a session to run it."""

  def __init__(self, params, vocab=VOCAB, dim=DIM, learning_rate=None):
    self.graph = tf.Graph()
    with self.graph.as_default():
      self.table = tf.compat.v1.get_variable(
          'table', shape=[vocab, dim], dtype=tf.float32, use_resource=True,
          initializer=tf.compat.v1.zeros_initializer())
      self.slots = sparse_update.create_slot_variables(params, self.table,
                                                       'table/slots')
      self.ids = tf.compat.v1.placeholder(tf.int64, [None])
      self.grads = tf.compat.v1.placeholder(tf.float32, [None, dim])
      self.lr = (tf.compat.v1.placeholder(tf.float32, [])
                 if learning_rate is None else learning_rate)
      self.update = sparse_update.apply_sparse_update(
          params, self.table, self.slots, self.ids, self.grads, self.lr)
      variables = dict(self.slots, table=self.table)
      self._loads = {}
      for name, var in variables.items():
        value = tf.compat.v1.placeholder(tf.float32, var.shape)
        self._loads[name] = (value, var.assign(value))
      self._reads = {name: var.read_value() for name, var in variables.items()}
      init = tf.compat.v1.global_variables_initializer()
    self.session = tf.compat.v1.Session(graph=self.graph)
    self.session.run(init)

  def __enter__(self):
    return self

  def __exit__(self, *unused):
    self.session.close()

  def load(self, table, slots):
    values = dict(slots, table=table)
    self.session.run([self._loads[name][1] for name in values],
                     {self._loads[name][0]: value
                      for name, value in values.items()})

  def step(self, ids, grads, lr=None):
    feed = {self.ids: ids, self.grads: grads}
    if lr is not None:
      feed[self.lr] = lr
    self.session.run(self.update, feed)

  def state(self):
    values = self.session.run(self._reads)
    return values.pop('table'), values


@pytest.fixture(scope='module')
def harness_of():
  """(case, stage) -> its Harness (the rate fed at each step), built once for
  the tests that load their own state into it."""
  built = {}

  def harness(case, stage):
    if (case, stage) not in built:
      built[case, stage] = Harness(make(case, stage))
    return built[case, stage]
  yield harness
  for harness in built.values():
    harness.session.close()


@pytest.fixture(scope='module')
def stepped(harness_of):
  """(case, stage) -> (params, table, slots, grads, the table and slots after
  each of STEPS) from `random_state`, run once for the tests comparing them."""
  done = {}

  def steps(case, stage):
    if (case, stage) not in done:
      params = make(case, stage)
      table, slots, grads = random_state(params)
      harness = harness_of(case, stage)
      harness.load(table, slots)
      states = []
      for (ids, lr), g in zip(STEPS, grads):
        harness.step(ids, g, lr)
        states.append(harness.state())
      done[case, stage] = params, table, slots, grads, states
    return done[case, stage]
  return steps


def assert_steps_match_reference(params, table, slots, grads, states):
  """States after steps 1 and 3 against the reference's steps."""
  want = oracle.ReferenceSteps(params, table, slots)
  for step, ((ids, lr), g, got) in enumerate(zip(STEPS, grads, states),
                                             start=1):
    want.step(ids, g, lr)
    if step in (1, 3):
      want.assert_matches(*got, err_msg=f'step {step}')


@pytest.mark.parametrize('case, stage', case_stages(sorted(STAGES)))
def test_one_and_three_steps_match_reference(stepped, case, stage):
  params, table, slots, grads, states = stepped(case, stage)
  assert_steps_match_reference(params, table, slots, grads, states)
  got_table, got_slots = states[-1]
  assert np.all(np.isfinite(got_table))
  rest = NEVER_LOOKED_UP
  if is_non_lazy(params):  # every row moves: zero gradient, m and v decay.
    assert np.all(got_table[rest] != table[rest])
  else:  # bit-identical, not merely close.
    np.testing.assert_array_equal(got_table[rest], table[rest])
    for name, value in slots.items():
      np.testing.assert_array_equal(got_slots[name][rest], value[rest])


@pytest.mark.parametrize('case, stage', case_stages(['plain', 'all']))
def test_wrong_rules_fail_the_comparison(stepped, case, stage, monkeypatch):
  """The float32 bound is tight: each plausible bug (oracle.WRONG_RULES)
  planted in the reference fails the comparison above (on its very steps)."""
  params, table, slots, grads, states = stepped(case, stage)
  assert not oracle.surviving_wrong_rules(
      monkeypatch, params, lambda: assert_steps_match_reference(
          params, table, slots, grads, states))


@pytest.mark.parametrize('case', sorted(CASES))
def test_constant_learning_rate(case):
  """A python-number rate: FTRL and ProximalAdagrad pick their path statically."""
  params = make(case, fullest(case))
  table, slots, grads = random_state(params, seed=1)
  (ids, lr), g = STEPS[1], grads[1]
  with Harness(params, learning_rate=lr) as harness:
    harness.load(table, slots)
    harness.step(ids, g)
    oracle.ReferenceSteps(params, table, slots).step(
        ids, g, lr).assert_matches(*harness.state())


# The reference divides by the rate in FTRL without
# multiply_linear_by_learning_rate: undefined at 0, left out.
ZERO_LR_CASES = sorted(
    c for c in CASES
    if CASES[c][0] != 'FtrlParameters' or
    CASES[c][1].get('multiply_linear_by_learning_rate'))


@pytest.mark.parametrize('constant', [False, True])
@pytest.mark.parametrize('case', ZERO_LR_CASES)
def test_zero_learning_rate(harness_of, case, constant):
  """Rate 0 (a warm-up's first step): the FTRL/ProximalAdagrad kernels reject
  it.  Fed, on the graph of the case's fullest stage (its state loaded)."""
  params = make(case, fullest(case))
  table, slots, grads = random_state(params, seed=2)
  (ids, _), g = STEPS[0], grads[0]
  with (Harness(params, learning_rate=0.0) if constant else
        contextlib.nullcontext(harness_of(case, fullest(case)))) as harness:
    harness.load(table, slots)
    harness.step(ids, g, None if constant else 0.0)
    got = harness.state()
  assert np.all(np.isfinite(got[0]))
  oracle.ReferenceSteps(params, table, slots).step(
      ids, g, 0.0).assert_matches(*got)


@pytest.mark.parametrize('case', sorted(CASES))
def test_steps_from_initial_slots_with_int32_ids(case):
  params = make(case, fullest(case))
  table, _, grads = random_state(params, seed=3)
  slots = reference.init_slots(params, table.shape)
  with Harness(params) as harness:
    harness.load(table, {})
    want = oracle.ReferenceSteps(params, table, slots)
    want.assert_matches(*harness.state())  # before any step: exactly
    for (ids, lr), g in zip(STEPS, grads):
      harness.session.run(harness.update, {
          harness.ids: np.array(ids, np.int32), harness.grads: g,
          harness.lr: lr})
      want.step(ids, g, lr)
    want.assert_matches(*harness.state())


@pytest.mark.parametrize('case', sorted(CASES))
def test_slot_variables(case):
  params = make(case)
  graph = tf.Graph()
  with graph.as_default():
    with tf.compat.v1.variable_scope('scope'):
      table = tf.compat.v1.get_variable('t', shape=[VOCAB, DIM],
                                        use_resource=True)
      slots = sparse_update.create_slot_variables(params, table, 't_slots')
    trainable = graph.get_collection(
        tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
    global_variables = graph.get_collection(
        tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    init = tf.compat.v1.global_variables_initializer()
    reads = {name: var.read_value() for name, var in slots.items()}
  expected = params.slot_initial_values()
  assert list(slots) == list(expected)
  assert list(expected) == [mid for _, mid in params.SLOTS]
  assert trainable == [table]
  assert global_variables == [table] + list(slots.values())
  for name, var in slots.items():
    assert var.name == 'scope/t_slots/{}:0'.format(name)
    assert not var.trainable
    assert hasattr(var, 'handle')  # a resource variable
    assert var.dtype.base_dtype == tf.float32
    assert var.shape == table.shape
  with tf.compat.v1.Session(graph=graph) as session:
    session.run(init)
    values = session.run(reads)
  for name, value in expected.items():
    np.testing.assert_array_equal(values[name],
                                  np.full((VOCAB, DIM), value, np.float32))


def _dense_reads(graph, update):
  """ReadVariableOps the update depends on, including inside tf.cond branches."""
  seen, stack, reads = set(), [update], []
  while stack:
    op = stack.pop()
    if op.name in seen:
      continue
    seen.add(op.name)
    if op.type == 'ReadVariableOp':
      reads.append(op.name)
    stack.extend(t.op for t in op.inputs)
    stack.extend(op.control_inputs)
  for function in graph.as_graph_def().library.function:
    reads.extend('{}/{}'.format(function.signature.name, node.name)
                 for node in function.node_def if node.op == 'ReadVariableOp')
  return reads


@pytest.mark.parametrize('case', sorted(CASES))
def test_large_table_is_never_read_densely(case):
  """200000 x 16: lazy updates gather and scatter rows, never read the table."""
  params = make(case, fullest(case))
  graph = tf.Graph()
  with graph.as_default():
    table = tf.compat.v1.get_variable(
        'big', shape=[200000, 16], use_resource=True,
        initializer=tf.compat.v1.zeros_initializer())
    slots = sparse_update.create_slot_variables(params, table, 'big_slots')
    update = sparse_update.apply_sparse_update(
        params, table, slots, tf.compat.v1.placeholder(tf.int64, [None]),
        tf.compat.v1.placeholder(tf.float32, [None, 16]),
        tf.compat.v1.placeholder(tf.float32, []))
  reads = _dense_reads(graph, update)
  if is_non_lazy(params):  # the one full-table pass (and a check of the check)
    assert reads
  else:
    assert not reads


@pytest.mark.parametrize('case', ['adagrad', 'adam_non_lazy', 'ftrl_linear_by_lr',
                                  'proximal_adagrad', 'rms_prop',
                                  'adagrad_momentum_nesterov_beta2',
                                  'proximal_yogi', 'frequency_estimator'])
def test_eager_and_tf_function(case):
  params = make(case, fullest(case))
  table, slots, grads = random_state(params, seed=4)
  table_var = tf.Variable(table)
  slot_vars = sparse_update.create_slot_variables(params, table_var, 'slots')
  for name, value in params.slot_initial_values().items():
    np.testing.assert_array_equal(slot_vars[name].numpy(),
                                  np.full(table.shape, value, np.float32))
    slot_vars[name].assign(slots[name])

  @tf.function
  def step(ids, g, lr):
    sparse_update.apply_sparse_update(params, table_var, slot_vars, ids, g, lr)

  want = oracle.ReferenceSteps(params, table, slots)
  for i, ((ids, lr), g) in enumerate(zip(STEPS, grads)):
    if i % 2:
      step(tf.constant(ids), tf.constant(g), tf.constant(lr))
    else:
      sparse_update.apply_sparse_update(params, table_var, slot_vars,
                                        tf.constant(ids), g, lr)
    want.step(ids, g, lr)
  want.assert_matches(table_var.numpy(),
                      {name: var.numpy() for name, var in slot_vars.items()})


@pytest.mark.legacy_only
def test_tf_215_parameter_classes():
  """TF's own legacy classes, converted as the spec converts them, update as
  the reference does with TF's object (recognised by name)."""
  params = tf.compat.v1.tpu.experimental.FtrlParameters(
      PARAMS_LR, l1_regularization_strength=0.3, beta=0.5,
      clip_weight_min=-0.3)
  table, slots, grads = random_state(params=make('ftrl'))
  with Harness(optimizers.as_tpu_fc_parameters(params)) as harness:
    assert list(harness.slots) == ['accumulators', 'linears']
    harness.load(table, slots)
    (ids, lr), g = STEPS[0], grads[0]
    harness.step(ids, g, lr)
    oracle.ReferenceSteps(params, table, slots).step(
        ids, g, lr).assert_matches(*harness.state())


def test_errors():
  with tf.Graph().as_default():
    table = tf.compat.v1.get_variable('t', shape=[VOCAB, DIM],
                                      use_resource=True)
    with pytest.raises(ValueError, match='accumulators'):
      sparse_update.apply_sparse_update(make('adagrad'), table, {}, [0],
                                        np.zeros((1, DIM), np.float32), 0.1)
    # OnlineYogi: a rule of optimization_parameters.proto TF never exposed.
    with pytest.raises(NotImplementedError, match='OnlineYogi'):
      sparse_update.apply_sparse_update(
          type('OnlineYogiParameters', (), {})(), table, {}, [0],
          np.zeros((1, DIM), np.float32), 0.1)
