"""The tables and slots an emulated TPU trains (use_tpu=True without a TPU),
through the public API only, against hand-derived numbers.

A user's view: `tpu_fc.embedding_column` / `shared_embedding_columns` with
constant initializers, an `EmbeddingConfigSpec` (or dict configs), a legacy
model_fn (`models.user_model_fn`: DenseFeatures, input_layer or
SequenceFeatures, `CrossShardOptimizer` when `params['use_tpu']`), checkpoints
read back with `get_variable_value` under the legacy names.

Every expected value is derived independently of the code under test:

* the model's loss is linear in the activations, `loss = sum(out * c)` with
  `out = activation + bias` and `c` a fixed per-example feature (or the mean
  over examples), so d(loss)/d(activation) is `c` scaled by `1/num_shards`
  (each shard's loss is divided by num_shards by `CrossShardOptimizer`) or
  `1/batch` (mean loss);
* activations by hand (`inputs.Feature`, LEGACY_SEMANTICS §5: combiners over
  weights, empty rows 0, dense ids drop id 0 on the TPU path, sequences
  zero-padded / truncated at `max_sequence_length`), the gradient of every
  looked-up id by the chain rule;
* table updates by `tpu_fc.reference` (THE definition of the TPU update rules,
  on several cores: `apply_update_by_core`), compared within the float32 error
  bound of `oracle.ReferenceSteps` (`oracle.Table`), CPU model-optimizer
  updates (use_tpu=False, tensor-core columns) by the TF1 optimizer formulas
  written out here;
* checkpoint names from LEGACY_SEMANTICS §7 (`oracle.SLOT_SUFFIX`).
"""
import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf

from harness import estimators
from harness import inputs
from harness import lanes
from harness import models
from harness import oracle

pytestmark = pytest.mark.filterwarnings('ignore::UserWarning')
fc = tf.feature_column
V, D, B, L = inputs.VOCAB, inputs.DIM, inputs.BATCH, inputs.MAX_LENGTH
NS = estimators.NUM_SHARDS


# Tables and slots after 1 and 3 steps: optimizers, combiners, input kinds. --


OPTIMIZERS = {
    'sgd': lambda: tpu_fc.StochasticGradientDescentParameters(0.1),
    'adagrad': lambda: tpu_fc.AdagradParameters(0.1, initial_accumulator=0.2),
    'adam': lambda: tpu_fc.AdamParameters(0.05, beta1=0.8, beta2=0.9,
                                          epsilon=1e-3),
    'ftrl': lambda: tpu_fc.FtrlParameters(
        0.2, learning_rate_power=-0.5, initial_accumulator_value=0.1,
        l1_regularization_strength=0.01, l2_regularization_strength=0.02),
    'momentum': lambda: tpu_fc.MomentumParameters(0.1, momentum=0.9),
    'rmsprop': lambda: tpu_fc.RMSPropParameters(0.1, rho=0.9, momentum=0.5,
                                                epsilon=0.01),
    'proximal_adagrad': lambda: tpu_fc.ProximalAdagradParameters(
        0.1, initial_accumulator=0.1, l1_regularization_strength=0.01,
        l2_regularization_strength=0.02),
}


def run_single_table_case(tmp_path, feat, params, layer='dense_features',
                          evaluate=False):
  """Trains one column 3 steps; checks table, slots (after steps 2 and 3),
  bias (and eval)."""
  init = models.init_table(1)
  sequence = bool(feat.seq_len)
  c = None if sequence else inputs.coefficients(0, D)
  cs = inputs.coefficients(1, L, D) if sequence else None

  def column_fn():
    column = feat.column(init)
    return ([], [column]) if sequence else ([column], [])

  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=sum(column_fn(), []),
                                    optimization_parameters=params)
  prefix = 'sequence_features' if sequence else layer
  table = oracle.Table(
      '{}/{}/embedding_weights'.format(prefix, feat.column_name), init, params,
      [feat])
  # Sum loss, CrossShardOptimizer: each shard's loss is divided by NS.
  dact = (cs if sequence else c) / NS
  two, estimator = estimators.train_2_and_3(
      tmp_path, models.user_model_fn(column_fn, layer), spec,
      inputs.input_fn([feat], c, cs))
  for _ in range(2):
    table.step({feat.key: dact}, params.learning_rate)
  table.check(two, 2)
  table.step({feat.key: dact}, params.learning_rate)
  table.check(estimator, 3)
  assert estimator.get_variable_value('global_step') == 3
  if not sequence:
    oracle.check_bias(estimator, c, 3, 1.0 / NS)
  if evaluate:
    # The activations the model sees: eval loss from the trained tables.
    result = estimator.evaluate(inputs.input_fn([feat], c, cs, repeat=1),
                                steps=1)
    if sequence:
      per_example = (feat.activation(table.w) * cs).sum((1, 2))
    else:
      per_example = ((feat.activation(table.w) + models.BIAS0 -
                      3 * models.MODEL_LR / NS * c.sum(0)) * c).sum(1)
    np.testing.assert_allclose(result['mean_per_example'], per_example.mean(),
                               **oracle.TOL)
    # TF 2.15's TPU evaluation reports shard 0's loss (outputs_from_all_shards=False).
    np.testing.assert_allclose(result['loss'],
                               per_example[:len(per_example) // NS].sum(),
                               **oracle.TOL)
  return estimator


@pytest.mark.parametrize('optimizer', sorted(OPTIMIZERS))
def test_optimizer_tables_and_slots_after_2_and_3_steps(tmp_path, optimizer):
  feat = inputs.Feature('a', inputs.A_SP, combiner='sum')
  estimator = run_single_table_case(tmp_path, feat, OPTIMIZERS[optimizer]())
  names = set(estimator.get_variable_names())
  table = 'dense_features/a_embedding/embedding_weights'
  suffixes = oracle.SLOT_SUFFIX[type(OPTIMIZERS[optimizer]()).__name__]
  expected_slots = {'{}/{}'.format(table, s) for s in suffixes.values()}
  assert {n for n in names if n.startswith(table + '/')} == expected_slots
  assert not [n for n in names if 'tpu_embedding_dummy_table_variable' in n]


KINDS = {
    'sparse_mean': (inputs.Feature('a', inputs.A_SP, combiner='mean'),
                    'dense_features'),
    'sparse_sqrtn': (inputs.Feature('a', inputs.A_SP, combiner='sqrtn'),
                     'dense_features'),
    'dense_ids_mean': (inputs.Feature('a', inputs.D_DENSE, dense=True,
                                      combiner='mean'), 'dense_features'),
    'dense_ids_sum_input_layer': (
        inputs.Feature('a', inputs.D_DENSE, dense=True, combiner='sum'),
        'input_layer'),
    'weighted_mean': (inputs.Feature('a', inputs.A_SP, weights=inputs.A_W,
                                     combiner='mean'), 'dense_features'),
    'weighted_sqrtn_input_layer': (
        inputs.Feature('a', inputs.A_SP, weights=inputs.A_W, combiner='sqrtn'),
        'input_layer'),
    'sequence': (inputs.Feature('s', inputs.S_SP, seq_len=L), 'dense_features'),
}


@pytest.mark.parametrize('kind', sorted(KINDS))
def test_input_kinds_tables_after_2_and_3_steps_and_eval(tmp_path, kind):
  feat, layer = KINDS[kind]
  run_single_table_case(tmp_path, feat, tpu_fc.AdagradParameters(0.1), layer,
                        evaluate=True)


def test_shared_table_after_2_and_3_steps(tmp_path):
  """Two features on one shared table: their gradients add up."""
  init = models.init_table(2)
  fa = inputs.Feature('a', inputs.A_SP, combiner='mean')
  fb = inputs.Feature('b', inputs.B_SP, combiner='mean')
  params = tpu_fc.AdamParameters(0.05, beta1=0.5, beta2=0.8, epsilon=1e-3)

  def column_fn():
    return tpu_fc.shared_embedding_columns(
        [fa.categorical(), fb.categorical()], D, combiner='mean',
        initializer=models.const_init(init)), []

  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=column_fn()[0],
                                    optimization_parameters=params)
  c = inputs.coefficients(2, 2 * D)  # DenseFeatures: a_shared_embedding, b_shared_...
  two, estimator = estimators.train_2_and_3(
      tmp_path, models.user_model_fn(column_fn), spec,
      inputs.input_fn([fa, fb], c))
  dacts = {'a': c[:, :D] / NS, 'b': c[:, D:] / NS}
  table = oracle.Table('a_b_shared_embedding', init, params, [fa, fb])
  table.step(dacts, 0.05)
  table.step(dacts, 0.05)
  table.check(two, 2)
  table.step(dacts, 0.05)
  table.check(estimator, 3)
  oracle.check_bias(estimator, c, 3, 1.0 / NS)
  names = estimator.get_variable_names()
  assert not [n for n in names if 'embedding_weights' in n]


def test_truncated_sequence_ids_are_not_updated(tmp_path):
  """Id 1 occurs only at position 2 >= L: its row and slots stay untouched.

  FTRL recomputes w from its slots, so a zero-gradient "update" of a row that was
  never looked up would zero it (found and fixed in 253a3b7).
  """
  feat = inputs.Feature('s', inputs.S_SP, seq_len=L)
  init = models.init_table(20)
  params = tpu_fc.FtrlParameters(0.2)

  def column_fn():
    return [], [feat.column(init)]

  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=column_fn()[1],
                                    optimization_parameters=params)
  cs = inputs.coefficients(20, L, D)
  estimator = estimators.user_estimator(
      tmp_path, models.user_model_fn(column_fn), spec)
  estimator.train(inputs.input_fn([feat], cs=cs), steps=1)
  name = 'sequence_features/s_embedding/embedding_weights'
  np.testing.assert_array_equal(estimator.get_variable_value(name)[1], init[1])
  np.testing.assert_array_equal(
      estimator.get_variable_value(name + '/Ftrl_1')[1], np.zeros(D))
  expected = oracle.Table(name, init, params, [feat])
  expected.step({'s': cs / NS}, 0.2)
  expected.check(estimator, 1)


# The learning rate of a column. -------------------------------------------


def test_learning_rate_fn_gets_the_pre_increment_global_step(tmp_path):
  """Step k uses fn(k - 1); a column without a fn uses the optimizer's rate."""
  fa = inputs.Feature('a', inputs.A_SP, combiner='sum')
  fb = inputs.Feature('b', inputs.B_SP, combiner='sum')
  init_a, init_b = models.init_table(3), models.init_table(4)

  def rate(step):
    return 0.1 + 0.05 * tf.cast(step, tf.float32)

  def rate_np(step):  # in float32, as rate
    return np.float32(0.1) + np.float32(0.05) * np.float32(step)

  def column_fn():
    return [fa.column(init_a, learning_rate_fn=rate), fb.column(init_b)], []

  params = tpu_fc.StochasticGradientDescentParameters(0.3)
  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=column_fn()[0],
                                    optimization_parameters=params)
  c = inputs.coefficients(3, 2 * D)
  two, estimator = estimators.train_2_and_3(
      tmp_path, models.user_model_fn(column_fn), spec,
      inputs.input_fn([fa, fb], c))
  table_a = oracle.Table('dense_features/a_embedding/embedding_weights', init_a,
                         params, [fa])
  table_b = oracle.Table('dense_features/b_embedding/embedding_weights', init_b,
                         params, [fb])
  dacts = {'a': c[:, :D] / NS, 'b': c[:, D:] / NS}
  for step, estimator_after in ((0, None), (1, two), (2, estimator)):
    table_a.step(dacts, rate_np(step))
    table_b.step(dacts, 0.3)
    if estimator_after is not None:
      table_a.check(estimator_after, step + 1)
      table_b.check(estimator_after, step + 1)


# Dict configs: the optimizers TF 2.15's engine takes and its column spec
# refuses (with TF 2.15's own classes on the legacy lane), per table or for the
# spec.  The model reads the activation `features['a']` directly.


CLASSES = ['tpu_fc', pytest.param('tf_2_15', marks=pytest.mark.legacy_only)]


def dict_spec(classes, params, where, dim=D, learning_rate_fn=None):
  """Feature 'a' of table 't' (models.init_table(11)), trained by `params` given
  `where` ('table' or 'spec'), with `classes`' configs."""
  configs = tpu_fc if classes == 'tpu_fc' else lanes.tf_tpu_embedding
  table = configs.TableConfig(
      V, dim, combiner='sum',
      initializer=models.const_init(models.init_table(11)[:, :dim]),
      learning_rate_fn=learning_rate_fn,
      optimization_parameters=params if where == 'table' else None)
  return tpu_fc.EmbeddingConfigSpec(
      feature_to_config_dict={'a': configs.FeatureConfig('t')},
      table_to_config_dict={'t': table},
      optimization_parameters=(
          params if where == 'spec' else
          configs.StochasticGradientDescentParameters(1.0)))


def dict_model_fn(stop_gradient=False):
  """`sum((features['a'] + bias) * c)`; `stop_gradient`: no embedding
  gradient (a FrequencyEstimator table's)."""

  def model_fn(features, labels, mode, params):
    del labels, params
    net = features['a']
    if stop_gradient:
      net = tf.stop_gradient(net)
    bias = tf.compat.v1.get_variable(
        'bias', [net.shape[-1]], initializer=models.const_init(models.BIAS0))
    loss = tf.reduce_sum((net + bias) * features['c'])
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(models.MODEL_LR))
    return tpu_fc.TPUEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(
        loss, global_step=tf.compat.v1.train.get_global_step()))

  return model_fn


DICT_ONLY = {
    # The hyperparameters of TF's TPU test of the mid-level AdagradMomentum.
    'AdagradMomentumParameters': dict(learning_rate=0.1, momentum=0.9,
                                      use_nesterov=True, exponent=3.0,
                                      beta2=0.9, epsilon=0.1),
    'ProximalYogiParameters': dict(learning_rate=0.1, beta1=0.5,
                                   l1_regularization_strength=0.01,
                                   l2_regularization_strength=0.02,
                                   initial_accumulator_value=0.1),
}


@pytest.mark.parametrize('where', ['table', 'spec'])
@pytest.mark.parametrize('classes', CLASSES)
@pytest.mark.parametrize('name', sorted(DICT_ONLY))
def test_dict_configs_train_with_adagrad_momentum_and_proximal_yogi(
    tmp_path, name, classes, where):
  feat = inputs.Feature('a', inputs.A_SP, combiner='sum')
  params = getattr(tpu_fc if classes == 'tpu_fc' else lanes.tf_tpu_embedding,
                   name)(**DICT_ONLY[name])
  c = inputs.coefficients(11, D)
  two, estimator = estimators.train_2_and_3(
      tmp_path, dict_model_fn(), dict_spec(classes, params, where),
      inputs.input_fn([feat], c))
  table = oracle.Table('t', models.init_table(11),
                       getattr(tpu_fc, name)(**DICT_ONLY[name]), [feat])
  for _ in range(2):
    table.step({'a': c / NS}, 0.1)
  table.check(two, 2)
  table.step({'a': c / NS}, 0.1)
  table.check(estimator, 3)
  oracle.check_bias(estimator, c, 3, 1.0 / NS)


@pytest.mark.parametrize('where', ['table', 'spec'])
@pytest.mark.parametrize('classes', CLASSES)
def test_dict_configs_estimate_lookup_frequencies(tmp_path, classes, where):
  """A FrequencyEstimator table (dimension 1, its rate the global step) after
  its second and third steps (global steps 1 and 2 their rates): every
  looked-up id's estimate and last hit step."""
  feat = inputs.Feature('a', inputs.A_SP, combiner='sum')
  kwargs = dict(tau=0.25, max_delta=1.5, outlier_threshold=0.5,
                weight_exponent=1.0)
  params = (tpu_fc if classes == 'tpu_fc' else
            lanes.tf_tpu_embedding).FrequencyEstimatorParameters(**kwargs)
  spec = dict_spec(classes, params, where, dim=1,
                   learning_rate_fn=lambda step: tf.cast(step, tf.float32))
  two, estimator = estimators.train_2_and_3(
      tmp_path, dict_model_fn(stop_gradient=True), spec,
      inputs.input_fn([feat], inputs.coefficients(12, 1)))
  want = oracle.ReferenceSteps(
      tpu_fc.FrequencyEstimatorParameters(**kwargs),
      models.init_table(11)[:, :1],
      {'last_hit_step': np.zeros((V, 1), np.float32)})
  ids = np.array([i for _, _, i, _ in feat.entries()])
  for step, estimator_after in ((0, None), (1, two), (2, estimator)):
    want.step(ids, np.zeros((len(ids), 1), np.float32), step)
    if estimator_after is not None:
      want.assert_matches(
          estimator_after.get_variable_value('t'),
          {'last_hit_step': estimator_after.get_variable_value(
              't/FrequencyEstimator')}, err_msg='after step {}'.format(step))
  # By hand: every id but 2 is looked up at every step, last at step 2.
  assert sorted(set(ids.tolist())) == [0, 1, 3, 4, 5]
  np.testing.assert_array_equal(
      estimator.get_variable_value('t/FrequencyEstimator')[:, 0],
      [2, 2, 0, 2, 2, 2])


# Which optimizer trains the tables. ---------------------------------------


def test_model_optimizer_does_not_train_embedding_core_tables(tmp_path):
  """use_tpu=True: the spec's SGD trains the table, the model's Momentum does not."""
  feat = inputs.Feature('a', inputs.A_SP, combiner='sum')
  init = models.init_table(12)
  params = tpu_fc.StochasticGradientDescentParameters(0.1)

  column_fn, spec = estimators.one_column(feat, init, params)
  estimator = estimators.user_estimator(
      tmp_path, models.user_model_fn(
          column_fn, model_optimizer=lambda: tf.compat.v1.train.MomentumOptimizer(
              models.MODEL_LR, 0.9)), spec)
  c = inputs.coefficients(12, D)
  estimator.train(inputs.input_fn([feat], c), steps=2)
  table = oracle.Table('dense_features/a_embedding/embedding_weights', init,
                       params, [feat])
  table.step({'a': c / NS}, 0.1)
  table.step({'a': c / NS}, 0.1)
  table.check(estimator, 2)
  names = set(estimator.get_variable_names())
  assert names == {'global_step', 'bias', 'bias/Momentum',
                   'dense_features/a_embedding/embedding_weights'}
  # Momentum on the bias: m = 0.9 m + g; b -= lr m, with g = sum(c) / NS.
  g = c.sum(0) / NS
  np.testing.assert_allclose(estimator.get_variable_value('bias/Momentum'),
                             1.9 * g, **oracle.TOL)
  np.testing.assert_allclose(estimator.get_variable_value('bias'),
                             models.BIAS0 - models.MODEL_LR * (g + 1.9 * g),
                             **oracle.TOL)


def test_cpu_model_optimizer_trains_tables_and_the_spec_is_ignored(tmp_path):
  """use_tpu=False: TF 2.15's CPU TPUEstimator; Momentum trains the table."""
  feat = inputs.Feature('a', inputs.D_DENSE, dense=True, combiner='mean')
  init = models.init_table(13)

  column_fn, spec = estimators.one_column(feat, init,
                                          tpu_fc.AdagradParameters(0.1))
  estimator = estimators.user_estimator(
      tmp_path, models.user_model_fn(
          column_fn, model_optimizer=lambda: tf.compat.v1.train.MomentumOptimizer(
              models.MODEL_LR, 0.9)), spec, use_tpu=False)
  c = inputs.coefficients(13, D)
  estimator.train(inputs.input_fn([feat], c), steps=2)
  name = 'dense_features/a_embedding/embedding_weights'
  assert set(estimator.get_variable_names()) == {
      'global_step', 'bias', 'bias/Momentum', name, name + '/Momentum'}
  # CPU lookup: dense id 0 is a real id; full gradient c per example (no shards).
  ids, _, grads = feat.row_grads(c, tpu=False)
  assert 0 in ids
  g = np.zeros((V, D), np.float32)
  np.add.at(g, ids, grads)
  momentum = g + 0.9 * g
  np.testing.assert_allclose(estimator.get_variable_value(name + '/Momentum'),
                             momentum, **oracle.TOL)
  np.testing.assert_allclose(estimator.get_variable_value(name),
                             init - models.MODEL_LR * (g + momentum),
                             **oracle.TOL)


# Tensor-core columns: densified, trained by the model optimizer. ----------


@pytest.mark.parametrize('combiner', ['sum', 'mean'])
def test_tensor_core_column_is_trained_by_the_model_optimizer(tmp_path,
                                                              combiner):
  width = 2
  # Entries at position >= width are truncated; id 0 is real; (2, 1, 3) keeps
  # a position-1 id in a row with no position 0.
  ft = inputs.Feature('t', [(0, 0, 1), (0, 1, 4), (0, 2, 4), (1, 0, 0),
                            (2, 1, 3), (2, 2, 5), (3, 0, 2), (3, 1, 2)],
                      combiner=combiner)
  fa = inputs.Feature('a', inputs.A_SP, combiner='sum')
  init_a, init_t = models.init_table(17), models.init_table(18)
  params = tpu_fc.AdagradParameters(0.1)

  def column_fn():
    tensor_core = tpu_fc.embedding_column(
        ft.categorical(), D, combiner=combiner,
        initializer=models.const_init(init_t),
        embedding_lookup_device='tpu_tensor_core',
        tensor_core_shape=[None, width])
    return [fa.column(init_a), tensor_core], []

  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=column_fn()[0],
                                    optimization_parameters=params)
  assert [col.name for col in spec.tensor_core_feature_columns] == [
      't_embedding']
  estimator = estimators.user_estimator(
      tmp_path, models.user_model_fn(column_fn), spec)
  c = inputs.coefficients(17, 2 * D)   # a_embedding, t_embedding
  input_fn = inputs.input_fn([fa, ft], c)
  estimator.train(input_fn, steps=1)
  name_t = 'dense_features/t_embedding/embedding_weights'
  name_a = 'dense_features/a_embedding/embedding_weights'
  assert set(estimator.get_variable_names()) == {
      'global_step', 'bias', name_a, name_a + '/Adagrad', name_t}

  kept = [e for e in ft.raw if e[1] < width]
  counts = np.bincount([b for b, _, _ in kept], minlength=B)
  norms = (np.maximum(counts, 1) if combiner == 'mean' else
           np.ones(B)).astype(np.float32)
  # The model's SGD, summed over shards: each shard's loss divided by NS.
  g = np.zeros((V, D), np.float32)
  for b, _, i in kept:
    g[i] += c[b, D:] / NS / norms[b]
  expected_t = init_t - models.MODEL_LR * g
  np.testing.assert_allclose(estimator.get_variable_value(name_t), expected_t,
                             **oracle.TOL)
  table_a = oracle.Table(name_a, init_a, params, [fa])
  table_a.step({'a': c[:, :D] / NS}, 0.1)
  table_a.check(estimator, 1)

  # Evaluate sees the truncated, combined lookup of the trained variable.
  result = estimator.evaluate(inputs.input_fn([fa, ft], c, repeat=1), steps=1)
  act_t = np.zeros((B, D), np.float32)
  for b, _, i in kept:
    act_t[b] += expected_t[i] / norms[b]
  out = np.concatenate([fa.activation(table_a.w), act_t], 1) + (
      models.BIAS0 - models.MODEL_LR / NS * c.sum(0))
  np.testing.assert_allclose(result['mean_per_example'],
                             (out * c).sum(1).mean(), **oracle.TOL)


def test_shared_tensor_core_columns_on_several_shards(tmp_path):
  """`test_tensor_core_embedding_shared_*`: a shared table on the tensor core
  is created once per graph; every emulated shard uses it, and a mean loss
  trains as on the CPU."""
  table0 = np.arange(20, dtype=np.float32).reshape(10, 2) / 20
  columns = tpu_fc.shared_embedding_columns(
      [fc.categorical_column_with_identity('x', 10),
       fc.categorical_column_with_identity('y', 10)], 2,
      initializer=tf.compat.v1.constant_initializer(table0),
      embedding_lookup_device='tpu_tensor_core', tensor_core_shape=[None, 2])

  def model_fn(features, labels, mode, params):
    net = tf.compat.v1.keras.layers.DenseFeatures(columns)(features)
    logits = tf.compat.v1.layers.dense(
        net, 1, kernel_initializer=tf.compat.v1.ones_initializer())
    loss = tf.compat.v1.losses.mean_squared_error(labels, logits)
    optimizer = tf.compat.v1.train.AdagradOptimizer(0.5)
    if params['use_tpu']:
      optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
    return tpu_fc.TPUEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(
        loss, tf.compat.v1.train.get_global_step()))

  def input_fn(params):
    batch = params['batch_size']
    ids = lambda offset: tf.SparseTensor(
        [[i, j] for i in range(batch) for j in (0, 1)],
        tf.constant([(i + j + offset) % 10 for i in range(batch)
                     for j in (0, 1)], tf.int64), [batch, 2])
    labels = tf.reshape(tf.range(batch, dtype=tf.float32), [batch, 1])
    return tf.data.Dataset.from_tensors(
        ({'x': ids(0), 'y': ids(3)}, labels)).repeat()

  values = {}
  for num_shards, use_tpu in ((2, True), (None, False)):
    estimator = tpu_fc.TPUEstimator(
        model_fn=model_fn, use_tpu=use_tpu, train_batch_size=8,
        config=tpu_fc.RunConfig(
            model_dir=str(tmp_path / str(num_shards)),
            tpu_config=tpu_fc.TPUConfig(num_shards=num_shards)),
        embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
            feature_columns=columns,
            optimization_parameters=tpu_fc.AdagradParameters(0.1)))
    estimator.train(input_fn, steps=2)
    values[use_tpu] = {name: estimator.get_variable_value(name)
                       for name in estimator.get_variable_names()}
  assert sorted(values[True]) == sorted(values[False])
  for name, value in values[False].items():  # per-shard sums reassociate:
    np.testing.assert_allclose(values[True][name], value, rtol=1e-5,  # ~8 ulps
                               atol=1e-6, err_msg=name)
  assert not np.allclose(values[True]['x_y_shared_embedding'], table0)
