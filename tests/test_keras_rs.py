"""tpu_fc.keras_rs: keras-rs's DistributedEmbedding trained on a CPU by its tables'
optimizers with the TPU rules, and `spec.to_keras_rs()` (latest lane: keras-rs
needs Keras 3 and Python >= 3.11; skipped on the legacy lane).

The numbers are derived by hand here, in float32 numpy, from the TPU rules as
TF documents them (a step's gradients of a row summed first, Adagrad without
epsilon, Adam without bias correction, TF's FTRL, decoupled weight decay of the
looked-up rows); keras-rs's own layer on a CPU (Keras' rules) is the wrong
answer they must reject.
"""
import functools
import inspect

import numpy as np
import pytest

keras_rs = pytest.importorskip('keras_rs')

import keras  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

import tpu_fc  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from tpu_fc import keras_rs as tpu_fc_keras_rs  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from tpu_fc import checkpoint_conversion as conversion  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from tpu_fc._tf import tf  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

from harness import checkpoints  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from harness import covering  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from harness import mid_level  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
from harness import models  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

fc = tf.feature_column
F32 = np.float32

# One table of 5 rows; row 4 is never looked up.  Batch of 4: id 1 three times
# (twice in example 0), so a rule applying each occurrence alone differs.
W0 = np.array([[0.5, -0.25], [1.0, 0.75], [-0.5, 0.25], [0.125, -1.0],
               [2.0, 2.0]], F32)
IDS = [[1, 1, 2], [1], [3], [0]]
# The loss is sum(C * activation) averaged over the batch (Keras' default
# reduction), so d(loss)/d(activation) = C / 4 in every step.
C = np.array([[0.75, -1.5], [3.0, 0.5], [-0.75, 1.5], [1.0, -2.0]], F32)
LR = 0.5
# A row's gradient: the sum of its occurrences' (combiner 'sum'); and the sum
# of their squares, which a rule applying each occurrence alone accumulates.
G = np.zeros_like(W0)
G2 = np.zeros_like(W0)
for example, ids in enumerate(IDS):
  for i in ids:
    G[i] += C[example] / F32(4)
    G2[i] += np.square(C[example] / F32(4))
LOOKED_UP = np.array([True, True, True, True, False])
# float32 implementations of one rule round apart by a few ulps of the terms.
TOL = dict(rtol=2e-6, atol=2e-7)
# Steps through a whole model, trained on each side by a different framework
# (its dense gradients summed in another order), differ by more: Adam's m / √v
# carries a gradient's relative rounding (many ulps where a row's gradients
# cancel) into a step of the learning rate's scale, not the gradient's. Seven
# steps of lr 0.1, each off by up to ~24 float32 ulps of that step: 2e-6.
TRAINED_TOL = dict(rtol=1e-5, atol=2e-6)


def _tpu_steps(rule, g=G, steps=2, **options):
  """(table, slots) after `steps` of `rule(w, slots, g, **options) -> (w,
  slots)` from W0, the row never looked up kept."""
  w, slots = W0.copy(), None
  for step in range(1, steps + 1):
    new_w, slots = rule(w, slots, g, step=step, **options)
    w = np.where(LOOKED_UP[:, None], new_w, w)
  return w, slots


def _sgd(w, slots, g, step):
  del slots, step
  return w - LR * g, {}


def _adagrad(w, slots, g, step, squares=None, epsilon=F32(0), start=F32(0.1)):
  """The TPU's: no epsilon, the accumulator gets (sum of g)^2; Keras':
  `squares` per occurrence and `epsilon` in the root."""
  del step
  a = (start if slots is None else slots['accumulators']) + (
      g * g if squares is None else squares)
  return w - LR * g / np.sqrt(a + epsilon), {'accumulators': a}


B1, B2, EPS = F32(0.9), F32(0.999), F32(1e-3)


def _adam(w, slots, g, step, bias_correction=False):
  """The TPU's: no bias correction, sqrt(v + eps^2); Keras': corrected."""
  m = 0 if slots is None else slots['momenta']
  v = 0 if slots is None else slots['velocities']
  m = B1 * m + (1 - B1) * g
  v = B2 * v + (1 - B2) * g * g
  rate = F32(LR)
  if bias_correction:
    rate *= np.sqrt(1 - B2**step) / (1 - B1**step)
  return w - rate * m / np.sqrt(v + EPS * EPS), {'momenta': m, 'velocities': v}


L1, L2 = F32(0.01), F32(0.02)


def _ftrl(w, slots, g, step, squares=None):
  """TF's ApplyFtrl (learning_rate_power -0.5, beta 0); Keras': `squares`
  per occurrence."""
  del step
  a = F32(0.1) if slots is None else slots['accumulators']
  linear = 0 if slots is None else slots['linears']
  a_new = a + (g * g if squares is None else squares)
  linear = linear + g - (np.sqrt(a_new) - np.sqrt(a)) / LR * w
  quadratic = np.sqrt(a_new) / LR + 2 * L2
  w = np.where(np.abs(linear) > L1,
               (np.sign(linear) * L1 - linear) / quadratic, F32(0))
  return w, {'accumulators': a_new, 'linears': linear}


# Name: (the table's Keras optimizer, the TPU rule, the options making it Keras'
# rule -- none for SGD, whose sum of occurrences is the rule's -- which the
# tolerance must reject).
RULES = {
    'sgd': (lambda: keras.optimizers.SGD(LR), _sgd, None),
    'adagrad': (lambda: keras.optimizers.Adagrad(
        LR, initial_accumulator_value=0.1), _adagrad,
                dict(squares=G2, epsilon=F32(1e-7))),
    'adam': (lambda: keras.optimizers.Adam(LR, beta_1=B1, beta_2=B2,
                                           epsilon=EPS), _adam,
             dict(bias_correction=True)),
    'ftrl': (lambda: keras.optimizers.Ftrl(
        LR, initial_accumulator_value=0.1, l1_regularization_strength=L1,
        l2_regularization_strength=L2), _ftrl, dict(squares=G2)),
}


def _beyond_tolerance(actual, wrong, tol=TOL):
  return np.any(np.abs(actual - wrong) >
                10 * (tol['atol'] + tol['rtol'] * np.abs(wrong)))


def _feature_configs(optimizer, placement='auto', batch=4,
                     initializer=tf.constant_initializer(W0)):
  table = keras_rs.layers.TableConfig(
      name='table', vocabulary_size=5, embedding_dim=2,
      initializer=initializer, optimizer=optimizer,
      combiner='sum', placement=placement)
  return {'a': keras_rs.layers.FeatureConfig(
      name='a', table=table, input_shape=(batch, None),
      output_shape=(batch, 2))}


def _ids():
  return tf.ragged.constant(IDS, dtype=tf.int64)


def _loss(labels, activations):
  return tf.reduce_sum(labels * activations, axis=-1)


def _fit(layer, model_optimizer, steps=2, padded=False, **compile_options):
  """`steps` of `model.fit` on IDS (`padded`: dense, padded with -1, which a
  SparseCore combines per example as it does the ragged ones: Keras
  distributes no RaggedTensor over replicas); the model's output is the
  activation."""
  inputs = {'a': keras.Input(shape=(None,), ragged=not padded, dtype='int64',
                             name='a')}
  model = keras.Model(inputs, layer(inputs)['a'])
  model.compile(optimizer=model_optimizer, loss=_loss, **compile_options)
  ids = _ids().to_tensor(-1) if padded else _ids()
  dataset = tf.data.Dataset.from_tensors(({'a': ids}, C)).repeat(steps)
  model.fit(dataset, verbose=0)
  return model


def _loop(layer, steps=2, function=True, labels=C):
  """A custom loop as keras-rs documents it: the gradient of the layer's
  trainable variables (its dummy) computed, nothing applied."""

  def step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(_loss(labels, layer({'a': _ids()})['a']))
    return tape.gradient(loss, layer.trainable_variables)

  step = tf.function(step) if function else step
  for _ in range(steps):
    gradients = step()
  return gradients


def _table_and_slots(layer):
  """(the one table, {slot: value}) of an emulated layer."""
  table, slots = None, {}
  for key, variable in layer._emulated_variables().items():  # pylint: disable=protected-access
    if '.S' in key:
      slots[key.split('.S')[1]] = variable.numpy()
    else:
      table = variable.numpy()
  return table, slots


def _assert_tpu_rule(layer, name, g=G, **options):
  """The layer's table and slots are the TPU rule's after two steps of
  gradient `g`, beyond the tolerance of Keras' rule."""
  _, rule, keras_rule = RULES[name]
  table, slots = _table_and_slots(layer)
  expected_table, expected_slots = _tpu_steps(rule, g, **options)
  np.testing.assert_allclose(table, expected_table, **TOL)
  assert sorted(slots) == sorted(expected_slots)
  for slot, value in expected_slots.items():
    # (the row never looked up keeps its initial slots: a zero gradient
    # leaves these rules' slots as they are)
    np.testing.assert_allclose(slots[slot], value, **TOL, err_msg=slot)
  np.testing.assert_array_equal(table[~LOOKED_UP], W0[~LOOKED_UP])
  if keras_rule is not None:
    assert _beyond_tolerance(table, _tpu_steps(rule, g, **options,
                                               **keras_rule)[0])


# Optimizer x (model.fit or a custom loop) x (one replica or two): a pairwise
# covering design, every optimizer with both ways of training and both replica
# counts, every way of training on both, in 8 runs instead of the product's 16.
# The layer applies its tables' rules in one update whichever loop computed
# the gradient on however many replicas, so a rule wrong under one factor
# level fails the cases that have that level.
@pytest.mark.parametrize('name, train_by, replicas',
                         covering.LAYER_TRAININGS)
def test_tables_train_by_their_optimizers_tpu_rules(name, train_by, replicas,
                                                    tmp_path):
  """Two steps: the tables and slots of the TPU rule, not Keras'.  The
  model's optimizer decays every weight it trains and keeps slots: it sees
  the gradient-trap dummy only, never a table; a custom loop's gradient is
  the dummy's.  On two replicas (MirroredStrategy over two devices, each
  replica a TPU core with two of the four examples; the model's optimizer
  another kind: Adam of rate 0, whose every step would move a Keras table
  nowhere) the same, as one replica on the same batches: one copy of the
  table, whose save restores into a one-replica layer."""
  if replicas == 1:
    layer = tpu_fc_keras_rs.DistributedEmbedding(
        _feature_configs(RULES[name][0]()))
    if train_by == 'fit':
      model = _fit(layer, keras.optimizers.Adam(1.0, weight_decay=0.5))
      assert [v.name for v in model.trainable_variables] == [
          '_gradient_trap_dummy']
      assert all(v.shape in ((), (1,)) for v in model.optimizer.variables)
    else:
      np.testing.assert_array_equal(_loop(layer)[0], [0.])  # the dummy's
    _assert_tpu_rule(layer, name)
    return
  strategy = mid_level.mirrored()
  with strategy.scope():
    layer = tpu_fc_keras_rs.DistributedEmbedding(_feature_configs(
        RULES[name][0]()))
    if train_by == 'fit':
      _fit(layer, keras.optimizers.Adam(0.0), padded=True)
    else:
      _replicated_loop(strategy, layer)
  _assert_tpu_rule(layer, name)
  for variable in layer._emulated_variables().values():  # pylint: disable=protected-access
    assert len(strategy.experimental_local_results(variable)) == 1
  saved = tpu_fc_keras_rs.save(layer, str(tmp_path), global_step=2)
  single = tpu_fc_keras_rs.DistributedEmbedding(_feature_configs(
      RULES[name][0]()))
  assert tpu_fc_keras_rs.restore(single, saved) == 2
  for key, value in single._emulated_variables().items():  # pylint: disable=protected-access
    np.testing.assert_array_equal(
        value, layer._emulated_variables()[key], err_msg=key)  # pylint: disable=protected-access


def _replicated_loop(strategy, layer, steps=2):
  """keras-rs's custom loop on several replicas: each replica's loss on its
  share of the batch, scaled to the global batch; the gradient of the
  layer's trainable variables (its dummy) computed, nothing applied."""
  dataset = tf.data.Dataset.from_tensors(({'a': _ids()}, C)).repeat(steps)
  batches = iter(strategy.experimental_distribute_dataset(dataset))

  def replica_step(features, labels):
    with tf.GradientTape() as tape:
      loss = tf.nn.compute_average_loss(_loss(labels, layer(features)['a']),
                                        global_batch_size=len(IDS))
    return tape.gradient(loss, layer.trainable_variables)

  step = tf.function(lambda batch: strategy.run(replica_step, args=batch))
  for _ in range(steps):
    step(next(batches))


def test_an_eager_custom_loop_trains_as_a_traced_one():
  layer = tpu_fc_keras_rs.DistributedEmbedding(
      _feature_configs(RULES['adagrad'][0]()))
  _loop(layer, function=False)
  _assert_tpu_rule(layer, 'adagrad')


def test_sparsecore_placement_and_tf_configs_are_emulated_too():
  """keras-rs refuses both off a TPU; the emulated SparseCore takes them."""
  configs = _feature_configs(RULES['adagrad'][0](), placement='sparsecore')
  layer = tpu_fc_keras_rs.DistributedEmbedding(configs)
  _loop(layer)
  _assert_tpu_rule(layer, 'adagrad')
  embedding = tf.tpu.experimental.embedding
  table = embedding.TableConfig(5, 2, initializer=tf.constant_initializer(W0),
                                optimizer=embedding.Adagrad(
                                    LR, initial_accumulator_value=0.1),
                                combiner='sum', name='table')
  layer = tpu_fc_keras_rs.DistributedEmbedding(
      {'a': embedding.FeatureConfig(table, name='a')})
  _loop(layer)
  _assert_tpu_rule(layer, 'adagrad')


def test_default_device_tables_stay_keras_rss_beside_emulated_ones():
  """In one layer: an 'auto' table trained by its Adagrad's TPU rule, a
  'default_device' one by the model's SGD (a Keras variable)."""
  emulated = _feature_configs(RULES['adagrad'][0]())['a']
  keras_table = _feature_configs(RULES['adagrad'][0](),
                                 placement='default_device')['a'].table
  keras_table.name = 'keras_table'
  configs = {'a': emulated, 'b': keras_rs.layers.FeatureConfig(
      name='b', table=keras_table, input_shape=(4, None), output_shape=(4, 2))}
  layer = tpu_fc_keras_rs.DistributedEmbedding(configs)
  inputs = {name: keras.Input(shape=(None,), ragged=True, dtype='int64',
                              name=name) for name in configs}
  outputs = layer(inputs)
  model = keras.Model(inputs, keras.layers.Add()([outputs['a'], outputs['b']]))
  model.compile(optimizer=keras.optimizers.SGD(LR), loss=_loss)
  model.fit(tf.data.Dataset.from_tensors(
      ({'a': _ids(), 'b': _ids()}, C)).repeat(2), verbose=0)
  _assert_tpu_rule(layer, 'adagrad')
  np.testing.assert_allclose(layer.get_embedding_tables()['keras_table'],
                             _tpu_steps(_sgd)[0], **TOL)
  assert len(model.trainable_variables) == 2  # the dummy, the Keras table


def test_each_call_of_a_step_gets_its_own_gradients():
  """A layer called twice a step (two towers sharing it): keras-rs tags each
  call on a TPU; here each call's gradients update its own lookup."""
  layer = tpu_fc_keras_rs.DistributedEmbedding(
      _feature_configs(keras.optimizers.SGD(LR)))
  other_ids = tf.ragged.constant([[4], [4, 2], [], [0]], dtype=tf.int64)

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      first = layer({'a': _ids()})['a']
      second = layer({'a': other_ids})['a']
      loss = tf.reduce_mean(_loss(C, first)) + tf.reduce_mean(
          _loss(2 * C, second))
    return tape.gradient(loss, layer.trainable_variables)

  step()
  second_gradient = np.zeros_like(W0)
  for example, ids in enumerate([[4], [4, 2], [], [0]]):
    for i in ids:
      second_gradient[i] += 2 * C[example] / F32(4)
  np.testing.assert_allclose(layer.get_embedding_tables()['table'],
                             W0 - LR * (G + second_gradient), **TOL)


def test_adagrad_has_no_epsilon():
  """Gradients of 1e-5 against accumulators of 1e-10: Keras' epsilon (1e-7,
  which keras-rs requires and drops) would dominate them."""
  scale = F32(1e-5)
  layer = tpu_fc_keras_rs.DistributedEmbedding(_feature_configs(
      keras.optimizers.Adagrad(LR, initial_accumulator_value=1e-10)))
  _loop(layer, labels=C * scale)
  table, _ = _table_and_slots(layer)
  options = dict(g=G * scale, start=F32(1e-10))
  np.testing.assert_allclose(table, _tpu_steps(_adagrad, **options)[0], **TOL)
  assert _beyond_tolerance(
      table, _tpu_steps(_adagrad, epsilon=F32(1e-7), **options)[0])


def test_keras_rs_on_a_cpu_trains_by_keras_rules_which_the_tolerance_rejects():
  """keras-rs's own layer on a CPU: the table is a Keras variable the model's
  Adagrad trains, by Keras' rule (each occurrence of id 1 alone, epsilon)."""
  make_optimizer, rule, keras_rule = RULES['adagrad']
  layer = keras_rs.layers.DistributedEmbedding(_feature_configs(make_optimizer()))
  _fit(layer, make_optimizer())
  table = layer.get_embedding_tables()['table']
  np.testing.assert_allclose(table, _tpu_steps(rule, **keras_rule)[0], **TOL)
  assert _beyond_tolerance(table, _tpu_steps(rule)[0])


def _spec(parameters, **column_options):
  column = tpu_fc.embedding_column(
      fc.categorical_column_with_identity('a', 5), 2, combiner='sum',
      initializer=tf.constant_initializer(W0), **column_options)
  return tpu_fc.EmbeddingConfigSpec(feature_columns=[column],
                                    optimization_parameters=parameters)


def _spec_layer(spec, **options):
  configs = spec.to_keras_rs(**options)
  return tpu_fc_keras_rs.DistributedEmbedding({'a': configs['a']})


def test_a_learning_rate_fn_reads_the_step_before_each_update():
  """The model optimizer's `iterations` as the global step: 0, then 1."""
  model_optimizer = keras.optimizers.SGD(0.)
  layer = _spec_layer(
      _spec(tpu_fc.StochasticGradientDescentParameters(1.0),
            learning_rate_fn=lambda step: LR / (1 + tf.cast(step, tf.float32))),
      global_step=model_optimizer.iterations)
  _fit(layer, model_optimizer)
  table, _ = _table_and_slots(layer)
  np.testing.assert_allclose(table[LOOKED_UP],
                             (W0 - LR * G - LR / 2 * G)[LOOKED_UP], **TOL)
  assert _beyond_tolerance(table, _tpu_steps(_sgd)[0])  # (a fixed rate)


def test_gradient_clipping_and_weight_decay_apply_to_looked_up_rows():
  """Decoupled weight decay (factor, not times the rate) of the rows looked
  up, on the weights before the step; each row's summed gradient clipped."""
  clip, decay = F32(0.25), F32(0.125)
  layer = _spec_layer(_spec(tpu_fc.StochasticGradientDescentParameters(
      LR, weight_decay_factor=decay, clip_gradient_min=-clip,
      clip_gradient_max=clip)))
  _loop(layer)

  table, _ = _table_and_slots(layer)
  w = W0
  for _ in range(2):
    w = np.where(LOOKED_UP[:, None], w - LR * np.clip(G, -clip, clip) - decay * w,
                 w)
  np.testing.assert_allclose(table, w, **TOL)
  assert _beyond_tolerance(table, _tpu_steps(_sgd, np.clip(G, -clip, clip))[0])
  assert np.abs(G).max() > clip  # (clipping did change a gradient)


# Inputs -------------------------------------------------------------------------

SPARSE_IDS = [(0, 0, 1), (0, 1, 4), (0, 2, 1), (2, 0, 3), (3, 0, 0)]
SPARSE_WEIGHTS = [0.5, 2.0, 1.5, 1.0, 3.0]


def _weighted_activation(combiner):
  """The activation of SPARSE_IDS / SPARSE_WEIGHTS by numpy (empty example 1:
  zeros)."""
  out = np.zeros((4, 2), F32)
  weights = np.zeros(4, F32)
  squares = np.zeros(4, F32)
  for (example, _, i), weight in zip(SPARSE_IDS, SPARSE_WEIGHTS):
    out[example] += F32(weight) * W0[i]
    weights[example] += weight
    squares[example] += weight * weight
  norm = {'sum': np.ones(4, F32), 'mean': weights,
          'sqrtn': np.sqrt(squares)}[combiner]
  return np.divide(out, norm[:, None], out=np.zeros_like(out),
                   where=norm[:, None] > 0)


def _sparse(values, dtype):
  return tf.sparse.reorder(tf.SparseTensor(
      [ids[:2] for ids in SPARSE_IDS], tf.constant(values, dtype), [4, 3]))


@pytest.mark.parametrize('combiner', ['sum', 'mean', 'sqrtn'])
@pytest.mark.parametrize('kind', ['sparse', 'ragged'])
def test_weighted_inputs_and_their_gradients(kind, combiner):
  configs = _feature_configs(keras.optimizers.SGD(LR))
  configs['a'].table.combiner = combiner
  layer = tpu_fc_keras_rs.DistributedEmbedding(configs)
  ids = _sparse([i for _, _, i in SPARSE_IDS], tf.int64)
  weights = _sparse(SPARSE_WEIGHTS, tf.float32)
  if kind == 'ragged':
    ids, weights = (tf.RaggedTensor.from_sparse(ids),
                    tf.RaggedTensor.from_sparse(weights))
  with tf.GradientTape() as tape:
    activation = layer({'a': ids}, {'a': weights})['a']
    loss = tf.reduce_sum(C * activation)
  tape.gradient(loss, layer.trainable_variables)
  expected = _weighted_activation(combiner)
  np.testing.assert_allclose(activation, expected, **TOL)
  # One SGD step: each id's gradient is its share of its example's activation.
  shares = np.zeros_like(W0)
  for (example, _, i), weight in zip(SPARSE_IDS, SPARSE_WEIGHTS):
    shares[i] += _weighted_activation_share(combiner, example, weight) * C[
        example]
  np.testing.assert_allclose(layer.get_embedding_tables()['table'],
                             W0 - LR * shares, **TOL)


def _weighted_activation_share(combiner, example, weight):
  weights = [w for (e, _, _), w in zip(SPARSE_IDS, SPARSE_WEIGHTS)
             if e == example]
  return F32(weight) / {'sum': F32(1), 'mean': F32(sum(weights)),
                        'sqrtn': np.sqrt(F32(sum(w * w for w in weights)))}[
                            combiner]


DENSE_IDS = [[3, 1], [0, 0], [1, 2], [1, 4]]
DENSE_WEIGHTS = [[1.0, 0.5], [2.0, 1.0], [0.5, 0.25], [4.0, 2.0]]


@pytest.mark.parametrize('combiner', ['sum', 'mean', 'sqrtn'])
@pytest.mark.parametrize('width', [1, 2])
def test_dense_ids_and_their_weights_as_a_sparsecore_takes_them(combiner,
                                                                width):
  """keras-rs's `call(inputs, weights)` with dense ids `[batch, n]` (its
  FeatureConfig's output one activation per example): a SparseCore combines
  the n ids of an example by the table's combiner, weighted; one SGD step
  moves each id's row by its share of its example's gradient."""
  configs = _feature_configs(keras.optimizers.SGD(LR))
  configs['a'].table.combiner = combiner
  layer = tpu_fc_keras_rs.DistributedEmbedding(configs)
  ids = np.array(DENSE_IDS)[:, :width]
  weights = np.array(DENSE_WEIGHTS, F32)[:, :width]
  norm = {'sum': np.ones(4, F32), 'mean': weights.sum(axis=1),
          'sqrtn': np.sqrt((weights * weights).sum(axis=1))}[combiner]
  share = weights / norm[:, None]  # d(activation)/d(row) of each id
  with tf.GradientTape() as tape:
    activation = layer({'a': tf.constant(ids)}, {'a': tf.constant(weights)})['a']
    loss = tf.reduce_sum(C * activation)
  tape.gradient(loss, layer.trainable_variables)
  np.testing.assert_allclose(
      activation, (W0[ids] * share[:, :, None]).sum(axis=1), **TOL)
  moved = np.zeros_like(W0)
  np.add.at(moved, ids.reshape(-1), (share[:, :, None] * C[:, None]).reshape(
      -1, 2))
  np.testing.assert_allclose(layer.get_embedding_tables()['table'],
                             W0 - LR * moved, **TOL)


def test_a_single_feature_config_is_named_in_errors():
  """A single un-nested `FeatureConfig` has no path: its name names it."""
  table = tf.tpu.experimental.embedding.TableConfig(vocabulary_size=5, dim=2,
                                                    name='table')
  embedding = tpu_fc.mid_level.TPUEmbedding(
      tf.tpu.experimental.embedding.FeatureConfig(table=table, name='clicks'),
      tf.tpu.experimental.embedding.SGD(LR))
  with pytest.raises(ValueError, match='dense input clicks, which is not'):
    embedding.enqueue(tf.constant([1, 2]), weights=tf.constant([1.0, 2.0]))


# One id an example, [batch, 1]; a row's gradient is its examples' C / 4.
XLA_DENSE_IDS = [[3], [1], [1], [0]]
XLA_DENSE_G = np.zeros_like(W0)
np.add.at(XLA_DENSE_G, [i for (i,) in XLA_DENSE_IDS], C / F32(4))


@pytest.mark.parametrize('name', ['sgd', 'adagrad', 'adam'])
@pytest.mark.parametrize('kind', ['dense', 'ragged'])
def test_xla_compiles_a_step_of_the_tpu_rules(name, kind):
  """`tf.function(jit_compile=True)` around the emulated SparseCore (which
  fails unless XLA compiles all of it): its checks made while tracing, the
  TPU rules on gathered rows; two steps give the TPU rule's table by hand
  (these rules leave a row of zero gradient, row 2 of the dense ids, as it
  is)."""
  if kind == 'dense':
    ids, g = tf.constant(XLA_DENSE_IDS), XLA_DENSE_G
  else:
    ids, g = _ids(), G
  layer = tpu_fc_keras_rs.DistributedEmbedding(
      _feature_configs(RULES[name][0]()))

  @tf.function(jit_compile=True)
  def step():
    with tf.GradientTape() as tape:
      loss = tf.reduce_mean(_loss(C, layer({'a': ids})['a']))
    return tape.gradient(loss, layer.trainable_variables)

  for _ in range(2):
    step()
  np.testing.assert_allclose(layer.get_embedding_tables()['table'],
                             _tpu_steps(RULES[name][1], g)[0], **TOL)


def test_keras_jit_compile_trains_the_tables():
  """`model.compile(jit_compile=True)`: Keras compiles the step with the
  emulated layer in it."""
  layer = tpu_fc_keras_rs.DistributedEmbedding(
      _feature_configs(keras.optimizers.Adagrad(
          LR, initial_accumulator_value=0.1)))
  _fit(layer, keras.optimizers.SGD(0.0), jit_compile=True)
  _assert_tpu_rule(layer, 'adagrad')


def test_shared_tables_and_sequence_features_from_a_spec():
  item, query = tpu_fc.shared_embedding_columns(
      [fc.categorical_column_with_identity('item', 5),
       fc.categorical_column_with_identity('query', 5)], 2, combiner='sum',
      initializer=tf.constant_initializer(W0))
  history = tpu_fc.embedding_column(
      fc.sequence_categorical_column_with_identity('history', 5), 2,
      max_sequence_length=2, initializer=tf.constant_initializer(W0))
  spec = tpu_fc.EmbeddingConfigSpec(
      feature_columns=[item, query, history],
      optimization_parameters=tpu_fc.AdagradParameters(0.1))
  configs = spec.to_keras_rs(batch_size=4)
  assert configs['item'].table is configs['query'].table
  assert configs['history'].input_shape == (4, 2)
  assert configs['history'].output_shape == (4, 2, 2)
  layer = tpu_fc_keras_rs.DistributedEmbedding(configs)
  ids = _ids()
  out = layer({'item': ids, 'query': ids, 'history': ids})
  assert sorted(layer.get_embedding_tables()) == [
      'tbl_history', 'tbl_item_query_shared_embedding']
  np.testing.assert_array_equal(out['item'], out['query'])
  np.testing.assert_array_equal(out['item'][0], W0[1] + W0[1] + W0[2])
  # Each example's first 2 ids, zeros past its end (the legacy sequence).
  np.testing.assert_array_equal(
      out['history'], [W0[[1, 1]], [W0[1], [0, 0]], [W0[3], [0, 0]],
                       [W0[0], [0, 0]]])


# Configs ------------------------------------------------------------------------


def test_configs_are_the_specs_tables_as_to_mid_level_names_them():
  spec = tpu_fc.EmbeddingConfigSpec(
      feature_columns=models.spec_columns(tensor_core=False),
      optimization_parameters=tpu_fc.AdamParameters(
          0.25, beta1=0.5, beta2=0.75, epsilon=0.125, weight_decay_factor=0.5,
          clip_gradient_min=-2.0, clip_gradient_max=2.0))
  step = tf.Variable(3, dtype=tf.int64)
  configs = spec.to_keras_rs(batch_size=8, global_step=step)
  mid_level = spec.to_mid_level(global_step=step)
  assert sorted(configs) == sorted(mid_level.feature_config)
  for name, config in configs.items():
    twin = mid_level.feature_config[name].table
    table = config.table
    assert (table.name, table.vocabulary_size, table.embedding_dim,
            table.combiner, table.placement) == (
                twin.name, twin.vocabulary_size, twin.dim, twin.combiner,
                'auto')
    positions = mid_level.feature_config[name].max_sequence_length
    assert config.input_shape == (8, positions or None)
    assert config.output_shape == (8,) + ((positions,) if positions else ()) + (
        twin.dim,)
    # The TPU optimizer keras-rs makes of it is the mid-level twin.
    ours = _keras_rs_tpu_optimizer(table.optimizer)
    assert type(ours) is type(twin.optimizer)
    for field in ('beta_1', 'beta_2', 'epsilon', 'lazy_adam',
                  'sum_inside_sqrt', 'weight_decay_factor',
                  'multiply_weight_decay_factor_by_learning_rate',
                  'clip_gradient_min', 'clip_gradient_max',
                  'use_gradient_accumulation', 'clip_weight_min',
                  'clip_weight_max'):
      assert getattr(ours, field) == pytest.approx(
          getattr(twin.optimizer, field)), (name, field)
    rates = [ours.learning_rate, twin.optimizer.learning_rate]
    rates = [float(rate()) if callable(rate) else rate for rate in rates]
    assert rates[0] == pytest.approx(rates[1])
  assert float(configs['a'].table.optimizer.learning_rate) == pytest.approx(
      0.125)  # 0.5 / (1 + 3)
  assert configs['b'].table is configs['c'].table  # (one shared table)


def _keras_rs_tpu_optimizer(optimizer):
  return tpu_fc_keras_rs.config_conversion.to_tf_tpu_optimizer(optimizer)


@pytest.mark.parametrize('parameters, field', [
    (tpu_fc.AdagradParameters(0.1, use_gradient_accumulation=False),
     'use_gradient_accumulation'),
    (tpu_fc.AdagradParameters(0.1, clip_weight_min=-1.), 'clip_weight_min'),
    (tpu_fc.StochasticGradientDescentParameters(0.1, clip_weight_max=1.),
     'clip_weight_max'),
    (tpu_fc.AdagradParameters(
        0.1, weight_decay_factor=0.5,
        multiply_weight_decay_factor_by_learning_rate=True),
     'multiply_weight_decay_factor_by_learning_rate'),
    (tpu_fc.AdagradParameters(0.1, clip_gradient_min=-1., clip_gradient_max=2.),
     'clip_gradient_min, clip_gradient_max'),
    (tpu_fc.AdagradParameters(0.1, clip_gradient_max=2.),
     'clip_gradient_min, clip_gradient_max'),
    (tpu_fc.AdamParameters(0.1, lazy_adam=False), 'lazy_adam'),
    (tpu_fc.AdamParameters(0.1, sum_inside_sqrt=False), 'sum_inside_sqrt'),
    (tpu_fc.FtrlParameters(0.1, multiply_linear_by_learning_rate=True),
     'multiply_linear_by_learning_rate'),
    (tpu_fc.FtrlParameters(0.1, allow_zero_accumulator=True),
     'allow_zero_accumulator'),
    (tpu_fc.FtrlParameters(0.1, initial_accumulator_value=0.),
     'initial_accumulator_value'),
    (tpu_fc.ProximalAdagradParameters(0.1), 'optimization_parameters'),
    (tpu_fc.MomentumParameters(0.1, 0.9), 'optimization_parameters'),
    (tpu_fc.RMSPropParameters(0.1, 0.9, 0., 1e-6), 'optimization_parameters'),
], ids=lambda value: value if isinstance(value, str) else None)
def test_what_keras_rs_cannot_carry_is_refused_naming_table_and_field(
    parameters, field):
  with pytest.raises(ValueError) as refused:
    _spec(parameters).to_keras_rs()
  assert str(refused.value).startswith('Table tbl_a: {}='.format(field))


def test_spec_settings_keras_rs_cannot_carry_are_refused():
  column = tpu_fc.embedding_column(
      fc.categorical_column_with_identity('a', 5), 2)
  sequence = tpu_fc.embedding_column(
      fc.sequence_categorical_column_with_identity('s', 5), 2,
      max_sequence_length=3)
  tensor_core = tpu_fc.embedding_column(
      fc.categorical_column_with_identity('t', 5), 2,
      embedding_lookup_device='tpu_tensor_core', tensor_core_shape=[None, 2])
  adagrad = tpu_fc.AdagradParameters(0.1)
  cases = {
      'experimental_gradient_multiplier_fn': tpu_fc.EmbeddingConfigSpec(
          feature_columns=[column], optimization_parameters=adagrad,
          experimental_gradient_multiplier_fn=lambda step: 2.),
      'pipeline_execution_with_tensor_core': tpu_fc.EmbeddingConfigSpec(
          feature_columns=[column], optimization_parameters=adagrad,
          pipeline_execution_with_tensor_core=True),
      "embedding_lookup_device='tpu_tensor_core'": tpu_fc.EmbeddingConfigSpec(
          feature_columns=[column, tensor_core],
          optimization_parameters=adagrad),
      'max_sequence_length=3': tpu_fc.EmbeddingConfigSpec(
          feature_columns=[sequence], optimization_parameters=adagrad),
  }
  for field, spec in cases.items():
    with pytest.raises(ValueError, match='^(Every table|Feature [ts]): ' +
                       field.replace('(', r'\(')):
      spec.to_keras_rs()
  with pytest.raises(ValueError, match='^Table tbl_a: its learning_rate_fn '
                     r'reads the global step.*to_keras_rs\(global_step='):
    _spec(tpu_fc.AdagradParameters(0.1),
          learning_rate_fn=models.rate_fn).to_keras_rs()
  table = tf.tpu.experimental.embedding.TableConfig(
      5, 2, name='q', quantization_config=(
          tf.tpu.experimental.embedding.QuantizationConfig(4, -1., 1.)))
  with pytest.raises(ValueError, match='^Table q: quantization_config='):
    tpu_fc.EmbeddingConfigSpec(
        feature_to_config_dict={
            'q': tf.tpu.experimental.embedding.FeatureConfig(table)},
        table_to_config_dict={'q': table},
        optimization_parameters=adagrad).to_keras_rs()


def test_settings_that_change_no_number_are_left_behind():
  column = tpu_fc.embedding_column(
      fc.categorical_column_with_identity('a', 5), 2)
  spec = tpu_fc.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=tpu_fc.AdagradParameters(0.1),
      clipping_limit=3., partition_strategy='mod')
  assert list(spec.to_keras_rs()) == ['a']


# Checkpoints and saving ---------------------------------------------------------


def _adagrad_layer():
  # (an initializer Keras can serialize, for model.save)
  return tpu_fc_keras_rs.DistributedEmbedding(_feature_configs(
      RULES['adagrad'][0](), initializer=keras.initializers.Constant(0.25)))


def _trained_layer():
  layer = _adagrad_layer()
  _loop(layer)
  return layer


def test_a_checkpoint_of_the_model_holds_the_tables_and_slots(tmp_path):
  layer = _trained_layer()
  inputs = {'a': keras.Input(shape=(None,), ragged=True, dtype='int64')}
  model = keras.Model(inputs, layer(inputs)['a'])
  prefix = tf.train.Checkpoint(model=model).save(str(tmp_path / 'ckpt'))
  held = {name for name, _ in tf.train.list_variables(prefix)
          if '/embedding/' in name}
  assert held == {'model/_operations/1/embedding/table/.ATTRIBUTES/VARIABLE_VALUE',
                  'model/_operations/1/embedding/table.Saccumulators/.ATTRIBUTES/'
                  'VARIABLE_VALUE'}
  restored = _adagrad_layer()
  model = keras.Model(inputs, restored(inputs)['a'])
  tf.train.Checkpoint(model=model).restore(prefix).assert_consumed()
  for (name, value), restored_value in zip(
      _table_and_slots(layer)[1].items(), _table_and_slots(restored)[1].values()):
    np.testing.assert_array_equal(restored_value, value, err_msg=name)
  np.testing.assert_array_equal(_table_and_slots(restored)[0],
                                _table_and_slots(layer)[0])


def test_save_weights_and_model_save_hold_the_tables_by_name(tmp_path):
  layer = _trained_layer()
  inputs = {'a': keras.Input(shape=(None,), ragged=True, dtype='int64')}
  model = keras.Model(inputs, layer(inputs)['a'])
  model.save_weights(str(tmp_path / 'model.weights.h5'))
  model.save(str(tmp_path / 'model.keras'))
  loaded = keras.models.load_model(str(tmp_path / 'model.keras'),
                                   custom_objects={'_loss': _loss})
  fresh = _adagrad_layer()
  weights_model = keras.Model(inputs, fresh(inputs)['a'])
  weights_model.load_weights(str(tmp_path / 'model.weights.h5'))
  for other in (loaded.layers[1], fresh):
    assert isinstance(other, tpu_fc_keras_rs.DistributedEmbedding)
    for got, want in zip(_table_and_slots(other), _table_and_slots(layer)):
      np.testing.assert_equal(got, want)
  import h5py  # pylint: disable=g-import-not-at-top  (Keras' dependency)
  with h5py.File(str(tmp_path / 'model.weights.h5')) as saved:
    # (Keras names a layer's entry after its class)
    assert sorted(saved['layers/distributed_embedding/vars']) == [
        'table', 'table.Saccumulators']


def test_weights_of_other_tables_are_refused_naming_them(tmp_path):
  plain = keras_rs.layers.DistributedEmbedding(
      _feature_configs(keras.optimizers.SGD(LR)))
  inputs = {'a': keras.Input(shape=(None,), ragged=True, dtype='int64')}
  keras.Model(inputs, plain(inputs)['a']).save_weights(
      str(tmp_path / 'plain.weights.h5'))
  layer = tpu_fc_keras_rs.DistributedEmbedding(
      _feature_configs(keras.optimizers.SGD(LR)))
  model = keras.Model(inputs, layer(inputs)['a'])
  with pytest.raises(ValueError, match=r"hold \[\], but its emulated "
                     r"SparseCore tables and slots are \['table'\]"):
    model.load_weights(str(tmp_path / 'plain.weights.h5'))


def test_keras_rs_internals_the_layer_uses_are_there():
  conversion = tpu_fc_keras_rs.config_conversion
  for name in ('keras_to_tf_tpu_configuration',
               'clone_tf_tpu_feature_configs', 'to_tf_tpu_optimizer'):
    assert callable(getattr(conversion, name)), name
  assert tpu_fc_keras_rs.distributed_embedding.GRADIENT_TRAP_DUMMY_NAME == (
      '_gradient_trap_dummy')
  for name in ('_sparsecore_init', '_sparsecore_build', '_sparsecore_call',
               '_sparsecore_get_embedding_tables', '_has_sparsecore',
               '_is_tpu_strategy'):
    assert callable(getattr(keras_rs.layers.DistributedEmbedding, name)), name


# Legacy checkpoints -> keras-rs -> legacy ---------------------------------------

# DenseFeatures concatenates its columns sorted by name: a, b, c, w.
HARNESS_FEATURES = ('a', 'b', 'c', 'w')


class HarnessModel(keras.Model):
  """`harness.checkpoints.model_fn` in Keras: the spec's embeddings, then
  Dense(1)."""

  def __init__(self, spec):
    super().__init__()
    self.embedding = tpu_fc_keras_rs.DistributedEmbedding(spec.to_keras_rs())
    self.dense = keras.layers.Dense(1)

  def call(self, features):
    activations = self.embedding(
        {name: features[name] for name in HARNESS_FEATURES},
        {name: features['w_weight'] if name == 'w' else None
         for name in HARNESS_FEATURES})
    return self.dense(keras.ops.concatenate(
        [activations[name] for name in HARNESS_FEATURES], axis=1))


def _legacy_embedding_values(values):
  """The tables, their slots and the global step of a legacy checkpoint."""
  return {name: value for name, value in values.items()
          if not name.startswith('dense/')}


@pytest.mark.parametrize('name', sorted(checkpoints.OPTIMIZERS))
def test_legacy_to_keras_rs_and_back_then_five_steps_as_the_estimator(
    name, tmp_path):
  spec = checkpoints.make_spec(checkpoints.OPTIMIZERS[name])
  sgd = {'model_optimizer': tf.compat.v1.train.GradientDescentOptimizer}
  legacy_dir = tmp_path / 'legacy'
  checkpoints.train(legacy_dir, spec, **sgd)
  legacy = checkpoints.checkpoint_values(legacy_dir)
  dataset = checkpoints.input_fn({'batch_size': checkpoints.BATCH})
  model = HarnessModel(spec)
  model(next(iter(dataset))[0])  # (builds it)
  assert tpu_fc_keras_rs.restore(model.embedding, str(legacy_dir)) == 2
  model.dense.set_weights([legacy['dense/kernel'], legacy['dense/bias']])

  back = conversion.to_legacy_checkpoint(
      spec, tpu_fc_keras_rs.save(model.embedding, str(tmp_path / 'kept'), 2),
      str(tmp_path / 'back'))
  restored = _legacy_embedding_values(legacy)
  assert_same_values(checkpoints.checkpoint_values(back), restored)  # bit for bit

  model.compile(optimizer=keras.optimizers.SGD(0.1), loss='mse')
  model.fit(dataset, steps_per_epoch=5, verbose=0)
  checkpoints.train(legacy_dir, spec, steps=5, **sgd)  # the estimator: 5 more
  legacy = checkpoints.checkpoint_values(legacy_dir)
  trained = checkpoints.checkpoint_values(conversion.to_legacy_checkpoint(
      spec, tpu_fc_keras_rs.save(model.embedding, str(tmp_path / 'trained'),
                                 7), str(tmp_path / 'trained_back')))
  want = _legacy_embedding_values(legacy)
  assert sorted(trained) == sorted(want)
  for variable, value in want.items():
    np.testing.assert_allclose(trained[variable], value, **TRAINED_TOL,
                               err_msg=variable)
  np.testing.assert_allclose(model.dense.kernel, legacy['dense/kernel'],
                             **TRAINED_TOL)
  assert all(  # (trained)
      _beyond_tolerance(trained[table], restored[table], TRAINED_TOL)
             for table in (checkpoints.A_TABLE, checkpoints.SHARED_TABLE))


def assert_same_values(got, want):
  assert sorted(got) == sorted(want)
  for name, value in want.items():
    np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_restore_and_save_carry_sparsecore_tables_only(tmp_path):
  keras_layer = keras_rs.layers.DistributedEmbedding(_feature_configs(
      keras.optimizers.SGD(LR), placement='default_device'))
  for carry in (functools.partial(tpu_fc_keras_rs.restore, checkpoint='x'),
                functools.partial(tpu_fc_keras_rs.save, path=str(tmp_path))):
    with pytest.raises(ValueError, match="^Layer .*: every table has "
                       "placement 'default_device'"):
      carry(keras_layer)
    with pytest.raises(TypeError, match='is no keras_rs.layers.Distributed'):
      carry(keras.layers.Dense(1))


def test_evaluate_and_predict_leave_the_tables_as_they_are():
  layer = tpu_fc_keras_rs.DistributedEmbedding(
      _feature_configs(RULES['adagrad'][0]()))
  model = _fit(layer, keras.optimizers.SGD(LR), steps=4)
  trained, _ = _table_and_slots(layer)
  dataset = tf.data.Dataset.from_tensors(({'a': _ids()}, C))
  model.evaluate(dataset, verbose=0)
  predictions = model.predict(dataset, verbose=0)
  np.testing.assert_array_equal(_table_and_slots(layer)[0], trained)
  np.testing.assert_allclose(
      predictions, [trained[ids].sum(axis=0) for ids in IDS], **TOL)
  # Keras' loop of two steps per call, compiled by XLA, traces the same step.
  twice = tpu_fc_keras_rs.DistributedEmbedding(
      _feature_configs(RULES['adagrad'][0]()))
  _fit(twice, keras.optimizers.SGD(LR), steps=4, steps_per_execution=2,
       jit_compile=True)
  np.testing.assert_allclose(_table_and_slots(twice)[0], trained, **TOL)


def test_signatures_are_the_designs():
  """DESIGN.md's: restore(layer, checkpoint, spec=None), save(layer, path,
  global_step=None), DistributedEmbedding(feature_configs, ...) as keras-rs's."""
  def parameters(function):
    return [(p.name, p.default) for p in
            inspect.signature(function).parameters.values()]

  empty = inspect.Parameter.empty
  assert parameters(tpu_fc_keras_rs.restore) == [
      ('layer', empty), ('checkpoint', empty), ('spec', None)]
  assert parameters(tpu_fc_keras_rs.save) == [
      ('layer', empty), ('path', empty), ('global_step', None)]
  assert parameters(tpu_fc_keras_rs.DistributedEmbedding) == parameters(
      keras_rs.layers.DistributedEmbedding)
  assert list(parameters(tpu_fc_keras_rs.DistributedEmbedding))[0] == (
      'feature_configs', empty)
