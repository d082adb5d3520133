"""The TPU's per-core update order: ids summed within a core, cores applied in turn.

Expected values are derived by hand here (Adagrad and Momentum, written out
step by step in the order the TPU applies the cores), and for every optimizer
from `tpu_fc.reference.apply_update_by_core`, which applies the one-core rule
(checked against TF's kernels by tests/test_reference.py) core by core in that
order, within the float32 error bound of `helpers.ReferenceSteps`.
The scenario for 2 cores is the one of TF 2.15's TPU test
(`tpu_estimator_gradients_test.py`, `test_adagrad_opt_embedding_variables_on_tpu`).
"""
import numpy as np
import pytest

import helpers
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
}
LR = 0.12
OPTIMIZERS = {
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

  def model_fn(features, labels, mode, params):
    del labels, params
    activation = tf.compat.v1.keras.layers.DenseFeatures([column])(features)
    loss = tf.reduce_sum(activation * features['g'])
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.0).minimize(
        loss, tf.compat.v1.train.get_global_step())
    return tpu_fc.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)

  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn, train_batch_size=len(examples),
      config=tpu_fc.RunConfig(
          model_dir=str(model_dir),
          tpu_config=tpu_fc.TPUConfig(num_shards=num_shards)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=[column], optimization_parameters=optimizer))
  estimator.train(input_fn, steps=1)
  return estimator


def test_adagrad_by_hand_two_cores(tmp_path):
  """TF's test: accumulators init + g0² + g1², rows moved by two Adagrad steps."""
  estimator = train_one_step(tmp_path, OPTIMIZERS['adagrad'], 2)
  table = estimator.get_variable_value(TABLE)
  accumulators = estimator.get_variable_value(TABLE + '/Adagrad')
  want_table, want_accumulators = START.copy(), np.full((VOCAB, DIM), 0.1)
  # id 0: core 0 only, g = 1.5.  id 3: core 1 only, g = 0.
  # id 1: core 0 sums 1.5 + 1.0, core 1 has 0.5; its holder is core 1.
  # id 2: core 0 has 1.0, core 1 sums 0.5 + 0.0; its holder is core 0.
  for row, in_order in ((0, [1.5]), (3, [0.0]), (1, [0.5, 2.5]),
                        (2, [1.0, 0.5])):
    for g in in_order:
      want_accumulators[row] += g * g
      want_table[row] -= LR * g / np.sqrt(want_accumulators[row])
  # By hand in float64: the engine's float32 rounds a few times (~1e-7).
  np.testing.assert_allclose(accumulators[:4, 0], [2.35, 6.6, 1.35, 0.1],
                             rtol=1e-6)
  np.testing.assert_allclose(accumulators, want_accumulators, rtol=1e-6)
  np.testing.assert_allclose(table, want_table, rtol=1e-6, atol=1e-7)
  # Summing the cores first (one update) gives id 2 the accumulator 2.35.
  assert abs(accumulators[2, 0] - (0.1 + 1.5 ** 2)) > 0.5


def test_momentum_by_hand_four_cores_in_ring_order(tmp_path):
  estimator = train_one_step(tmp_path, OPTIMIZERS['momentum'], 4)
  table = estimator.get_variable_value(TABLE)
  want = START.copy()
  ring = {0: [0.9], 5: [0.7, 0.25, 0.9], 6: [0.25, -0.4],
          1: [0.2, 0.3], 2: [-0.6], 3: [0.5]}
  for row, in_order in ring.items():
    momentum = 0.0
    for g in in_order:
      momentum = 0.9 * momentum + g
      want[row] -= LR * momentum
  # By hand in float64: the engine's float32 rounds a few times (~1e-7).
  np.testing.assert_allclose(table, want, rtol=1e-6, atol=1e-7)
  # Another order of id 5's cores (holder first, 1 2 3 0 would skip to 2 too;
  # 0 first does not) moves the row elsewhere.
  wrong = START[5] - LR * (0.9 + (0.81 + 0.7) + (0.9 * 1.51 + 0.25))
  assert np.all(np.abs(table[5] - wrong) > 1e-3)


@pytest.mark.parametrize('num_shards', sorted(SCENARIOS))
@pytest.mark.parametrize('name', sorted(OPTIMIZERS))
def test_every_optimizer_applies_cores_in_turn(tmp_path, name, num_shards):
  optimizer = OPTIMIZERS[name]
  estimator = train_one_step(tmp_path, optimizer, num_shards)
  ids, cores, gradients = occurrences(num_shards)
  # The sum combiner passes d(loss)/d(activation) = g on exactly.
  want = helpers.ReferenceSteps(
      optimizer, START, reference.init_slots(optimizer, (VOCAB, DIM)))
  want.step(ids, gradients, LR, cores=cores, num_cores=num_shards)
  want.assert_matches(
      estimator.get_variable_value(TABLE),
      {slot: estimator.get_variable_value('{}/{}'.format(TABLE, suffix))
       for suffix, slot in optimizer.SLOTS})
