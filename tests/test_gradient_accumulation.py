"""How a step applies the cores' gradients of a row, per `use_gradient_accumulation`.

On (the default): every core's gradients are summed and applied once, the
numbers of one core (TF's mid-level correctness tests,
`tpu_embedding_v2_correctness_*_test.py`, 2 replicas, default optimizers).
Off: ids summed within a core, the cores' sums applied one after another, the
core holding the id first (TF 2.15's `tpu_estimator_gradients_test.py`,
`test_adagrad_opt_embedding_variables_on_tpu`, which sets it False).

Expected values are derived by hand here (Adagrad and Momentum, written out
step by step), and for every optimizer from
`tpu_fc.reference.apply_update_by_core`, which applies the one-core rule
(checked against TF's kernels by tests/test_reference.py) once or core by core,
within the float32 error bound of `oracle.ReferenceSteps`; that bound rejects
the other setting's numbers.
"""
import numpy as np
import pytest

from harness import covering
from harness import models
from harness import oracle
import tpu_fc
from tpu_fc import reference
from tpu_fc._tf import tf

pytestmark = pytest.mark.filterwarnings('ignore::UserWarning')

VOCAB, DIM = 8, 2
TABLE = 'dense_features/x_embedding/embedding_weights'
START = (np.arange(VOCAB * DIM, dtype=np.float32).reshape(VOCAB, DIM) - 5) / 10
# num_shards -> (ids of each example, d(loss)/d(activation) of each example);
# examples split evenly over the cores, in order.
SCENARIOS = {
    # TF's test: id 1 lives on core 1 (applied first), id 2 on core 0.
    2: ([[0, 1], [1, 2], [1, 2], [2, 3]], [1.5, 1.0, 0.5, 0.0]),
    # id 5 (holder 1) seen on cores 0, 2, 3: applied 2, 3, 0; id 6 (holder 2)
    # on cores 1, 3: applied 3, 1; id 1 (holder 1) on cores 0, 1: 1, 0.
    4: ([[5, 0], [1], [6], [1], [5], [2], [5, 6], [3]],
        [0.9, 0.3, -0.4, 0.2, 0.7, -0.6, 0.25, 0.5]),
    # One example a core.  id 3 (holder 3) seen on cores 0, 1, 2, 4, 7:
    # applied 4, 7, 0, 1, 2; id 5 (holder 5) on cores 1, 5: applied 5, 1.
    8: ([[3], [5, 3], [3], [7], [0, 3], [5], [6], [3, 1]],
        [0.4, -0.3, 0.2, 0.6, -0.5, 0.1, 0.8, 0.7]),
}
LR = 0.12
# Accumulation on: every optimizer, also what only it allows (gradient
# clipping, non-lazy Adam).
SUMMED = {
    'sgd': tpu_fc.StochasticGradientDescentParameters(LR),
    'adagrad': tpu_fc.AdagradParameters(LR, initial_accumulator=0.1),
    'adam': tpu_fc.AdamParameters(LR, beta1=0.8, beta2=0.9, epsilon=0.1),
    'adam_non_lazy': tpu_fc.AdamParameters(LR, lazy_adam=False,
                                           sum_inside_sqrt=False),
    'ftrl': tpu_fc.FtrlParameters(LR, l1_regularization_strength=0.01,
                                  l2_regularization_strength=0.02, beta=0.3),
    'proximal_adagrad': tpu_fc.ProximalAdagradParameters(
        LR, l1_regularization_strength=0.01, l2_regularization_strength=0.1),
    'momentum': tpu_fc.MomentumParameters(LR, momentum=0.9),
    'rms_prop': tpu_fc.RMSPropParameters(LR, rho=0.9, momentum=0.5,
                                         epsilon=0.1),
    'adagrad_clipped_decayed': tpu_fc.AdagradParameters(
        LR, clip_gradient_min=-0.6, clip_gradient_max=0.6,
        weight_decay_factor=0.1, clip_weight_min=-0.45, clip_weight_max=0.9),
}
# Accumulation off: the same optimizers where the legacy classes allow it.
PER_CORE = {
    name: params.replace(use_gradient_accumulation=False)
    for name, params in SUMMED.items()
    if name not in ('adam_non_lazy', 'adagrad_clipped_decayed')}
PER_CORE['adagrad_decayed'] = tpu_fc.AdagradParameters(
    LR, use_gradient_accumulation=False, weight_decay_factor=0.1,
    clip_weight_min=-0.45, clip_weight_max=0.9)
# Only dict-configured tables take AdagradMomentum in a legacy spec (TF's
# column spec refuses it): its several-core rule is tested on the mid-level.
MID_LEVEL_ONLY = 'adagrad_momentum'
SUMMED[MID_LEVEL_ONLY] = tpu_fc.AdagradMomentumParameters(
    LR, momentum=0.9, use_nesterov=True, exponent=3, beta2=0.9, epsilon=0.1)
PER_CORE[MID_LEVEL_ONLY] = SUMMED[MID_LEVEL_ONLY].replace(
    use_gradient_accumulation=False)
OPTIMIZERS = {'summed': SUMMED, 'per_core': PER_CORE}


def occurrences(num_shards):
  """Every looked-up id with its core and gradient (sum combiner)."""
  examples, example_gradients = SCENARIOS[num_shards]
  per_core = len(examples) // num_shards
  ids, cores, gradients = [], [], []
  for example, (row_ids, g) in enumerate(zip(examples, example_gradients)):
    for row in row_ids:
      ids.append(row)
      cores.append(example // per_core)
      gradients.append([g] * DIM)
  return np.array(ids), np.array(cores), np.array(gradients, np.float32)


def train_one_step(model_dir, optimizer, num_shards):
  """One emulated TPU step; the loss is sum(activation * g) on each shard."""
  examples, example_gradients = SCENARIOS[num_shards]
  indices = [[e, i] for e, row_ids in enumerate(examples)
             for i in range(len(row_ids))]
  values = [r for row in examples for r in row]
  column = tpu_fc.embedding_column(
      tf.feature_column.categorical_column_with_identity('x', VOCAB), DIM,
      combiner='sum', initializer=tf.compat.v1.constant_initializer(START))

  def input_fn(params):
    del params
    features = {'x': tf.SparseTensor(indices, tf.constant(values, tf.int64),
                                     [len(examples), 2]),
                'g': tf.constant(example_gradients, shape=[len(examples), 1])}
    return tf.data.Dataset.from_tensors((features, features['g'])).repeat()

  estimator = tpu_fc.TPUEstimator(
      model_fn=models.embedding_model_fn(
          [column], lambda activation, features, labels: tf.reduce_sum(
              activation * features['g']), rate=0.0, cross_shard=False),
      train_batch_size=len(examples),
      config=tpu_fc.RunConfig(
          model_dir=str(model_dir),
          tpu_config=tpu_fc.TPUConfig(num_shards=num_shards)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=[column], optimization_parameters=optimizer))
  estimator.train(input_fn, steps=1)
  return estimator


def _adagrad_by_hand(in_order):
  """(table, accumulators) after Adagrad applies each row's gradients in
  `in_order` ({row: [g, ...]}) one after another, in float64."""
  table, accumulators = START.copy(), np.full((VOCAB, DIM), 0.1)
  for row, gradients in in_order.items():
    for g in gradients:
      accumulators[row] += g * g
      table[row] -= LR * g / np.sqrt(accumulators[row])
  return table, accumulators


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """(setting, name, num_shards) -> (table, estimator) after that one step,
  run once for the tests reading it (by hand, and against the reference)."""
  done = {}

  def train(setting, name, num_shards):
    case = (setting, name, num_shards)
    if case not in done:
      estimator = train_one_step(
          tmp_path_factory.mktemp('-'.join(map(str, case))),
          OPTIMIZERS[setting][name], num_shards)
      done[case] = estimator.get_variable_value(TABLE), estimator
    return done[case]
  return train


def test_adagrad_by_hand_two_cores_summed(trained):
  """The default: every core's gradients of a row summed, one update."""
  table, estimator = trained('summed', 'adagrad', 2)
  accumulators = estimator.get_variable_value(TABLE + '/Adagrad')
  # id 0: 1.5; id 1: 1.5 + 1.0 + 0.5; id 2: 1.0 + 0.5 + 0.0; id 3: 0.
  want_table, want_accumulators = _adagrad_by_hand(
      {0: [1.5], 1: [3.0], 2: [1.5], 3: [0.0]})
  np.testing.assert_allclose(accumulators[:4, 0], [2.35, 9.1, 2.35, 0.1],
                             rtol=1e-6)
  # By hand in float64: the engine's float32 rounds a few times (~1e-7).
  np.testing.assert_allclose(accumulators, want_accumulators, rtol=1e-6)
  np.testing.assert_allclose(table, want_table, rtol=1e-6, atol=1e-7)


def test_adagrad_by_hand_two_cores_per_core(trained):
  """TF's test (accumulation off): accumulators init + g0² + g1², rows moved
  by two Adagrad steps."""
  table, estimator = trained('per_core', 'adagrad', 2)
  accumulators = estimator.get_variable_value(TABLE + '/Adagrad')
  # id 0: core 0 only, g = 1.5.  id 3: core 1 only, g = 0.
  # id 1: core 0 sums 1.5 + 1.0, core 1 has 0.5; its holder is core 1.
  # id 2: core 0 has 1.0, core 1 sums 0.5 + 0.0; its holder is core 0.
  want_table, want_accumulators = _adagrad_by_hand(
      {0: [1.5], 3: [0.0], 1: [0.5, 2.5], 2: [1.0, 0.5]})
  np.testing.assert_allclose(accumulators[:4, 0], [2.35, 6.6, 1.35, 0.1],
                             rtol=1e-6)
  np.testing.assert_allclose(accumulators, want_accumulators, rtol=1e-6)
  np.testing.assert_allclose(table, want_table, rtol=1e-6, atol=1e-7)


def _momentum_by_hand(in_order):
  """The table after Momentum (μ = 0.9, from zero momenta) applies each row's
  gradients in `in_order` one after another, in float64."""
  want = START.copy()
  for row, gradients in in_order.items():
    momentum = 0.0
    for g in gradients:
      momentum = 0.9 * momentum + g
      want[row] -= LR * momentum
  return want


def test_momentum_by_hand_four_cores_in_ring_order(trained):
  table, _ = trained('per_core', 'momentum', 4)
  want = _momentum_by_hand({0: [0.9], 5: [0.7, 0.25, 0.9], 6: [0.25, -0.4],
                            1: [0.2, 0.3], 2: [-0.6], 3: [0.5]})
  # By hand in float64: the engine's float32 rounds a few times (~1e-7).
  np.testing.assert_allclose(table, want, rtol=1e-6, atol=1e-7)
  # Another order of id 5's cores (holder first, 1 2 3 0 would skip to 2 too;
  # 0 first does not) moves the row elsewhere.
  wrong = START[5] - LR * (0.9 + (0.81 + 0.7) + (0.9 * 1.51 + 0.25))
  assert np.all(np.abs(table[5] - wrong) > 1e-3)


@pytest.mark.parametrize('setting', sorted(OPTIMIZERS))
def test_momentum_by_hand_eight_cores(trained, setting):
  table, _ = trained(setting, 'momentum', 8)
  if setting == 'summed':  # one step of each id's total
    in_order = {3: [0.4 - 0.3 + 0.2 - 0.5 + 0.7], 5: [-0.3 + 0.1], 7: [0.6],
                0: [-0.5], 6: [0.8], 1: [0.7]}
  else:  # id 3: cores 4, 7, 0, 1, 2 (holder 3 saw none); id 5: cores 5, 1
    in_order = {3: [-0.5, 0.7, 0.4, -0.3, 0.2], 5: [0.1, -0.3], 7: [0.6],
                0: [-0.5], 6: [0.8], 1: [0.7]}
  np.testing.assert_allclose(table, _momentum_by_hand(in_order), rtol=1e-6,
                             atol=1e-7)


def _reference_step(optimizer, num_shards):
  ids, cores, gradients = occurrences(num_shards)
  # The sum combiner passes d(loss)/d(activation) = g on exactly.
  want = oracle.ReferenceSteps(
      optimizer, START, reference.init_slots(optimizer, (VOCAB, DIM)))
  return want.step(ids, gradients, LR, cores=cores, num_cores=num_shards)


# The cases trained for the tests by hand, which read the same trainings.
BY_HAND = [(setting, 'adagrad', 2) for setting in sorted(OPTIMIZERS)] + [
    (setting, 'momentum', 8) for setting in sorted(OPTIMIZERS)]
# Pairwise over setting x optimizer x cores: every optimizer in each setting
# that allows it, each on 2 and on 8 cores, each setting on both.  The
# setting decides which gradients of a row make one update (all cores' summed,
# or each core's sum in turn) and the cores which ids each core holds; the
# optimizer's rule applies to whatever sums it is handed, so a bug of the
# three together is one of two of them.
CASES = covering.pairwise(
    [(setting, name, num_shards) for setting in sorted(OPTIMIZERS)
     for name in sorted(OPTIMIZERS[setting]) if name != MID_LEVEL_ONLY
     for num_shards in (2, 8)], keep=BY_HAND)


@pytest.mark.parametrize('setting, name, num_shards', CASES,
                         ids=['-'.join(map(str, case)) for case in CASES])
def test_every_optimizer_on_several_cores(trained, setting, name, num_shards):
  """The emulated estimator applies the setting's rule."""
  optimizer = OPTIMIZERS[setting][name]
  table, estimator = trained(setting, name, num_shards)
  _assert_the_setting_applied(
      setting, name, num_shards, table,
      {slot: estimator.get_variable_value('{}/{}'.format(TABLE, suffix))
       for suffix, slot in optimizer.SLOTS})


def _assert_the_setting_applied(setting, name, num_cores, table, slots):
  """The step is the reference's for the setting; unless the rule is linear
  in g (SGD), the other setting's numbers are out of bound."""
  _reference_step(OPTIMIZERS[setting][name], num_cores).assert_matches(
      table, slots)
  other = OPTIMIZERS['per_core' if setting == 'summed' else 'summed'].get(name)
  if name == 'sgd' or other is None:  # linear, or no other setting
    return
  with pytest.raises(AssertionError, match=oracle.BEYOND_BOUND):
    _reference_step(other, num_cores).assert_matches(table, slots)


MID_LEVEL_CASES = [(setting, name, cores)
                   for setting in sorted(OPTIMIZERS)
                   for name in ('sgd', 'adagrad', 'adam', 'adam_non_lazy',
                                'ftrl', MID_LEVEL_ONLY)
                   if name in OPTIMIZERS[setting]
                   for cores in (2, 8)]


@pytest.mark.parametrize('setting, name, cores', MID_LEVEL_CASES,
                         ids=['-'.join(map(str, c)) for c in MID_LEVEL_CASES])
def test_mid_level_on_several_cores(setting, name, cores):
  """`mid_level.TPUEmbedding(num_cores=...)` applies the setting's rule, on
  the estimator's scenario (each id of an example gets its example's
  gradient)."""
  optimizer = OPTIMIZERS[setting][name]
  examples, example_gradients = SCENARIOS[cores]
  embedding_api = tf.tpu.experimental.embedding
  table = embedding_api.TableConfig(
      vocabulary_size=VOCAB, dim=DIM, combiner='sum', name='x',
      initializer=tf.constant_initializer(START))
  embedding = tpu_fc.mid_level.TPUEmbedding(
      {'x': embedding_api.FeatureConfig(table=table)},
      optimizer.to_mid_level(), num_cores=cores)
  embedding.enqueue({'x': tf.ragged.constant(examples, tf.int64).to_sparse()})
  embedding.dequeue()
  embedding.apply_gradients({'x': tf.constant(
      [[g] * DIM for g in example_gradients], tf.float32)})
  variables = embedding._variables['x']  # pylint: disable=protected-access
  _assert_the_setting_applied(
      setting, name, cores, variables['parameters'].numpy(),
      {slot: variable.numpy() for slot, variable in variables.items()
       if slot != 'parameters'})
