"""The emulated embedding core (`tpu_fc.lookup.backends.EmbeddingCoreBackend` and its
`host_engine`) against hand-derived numpy, on both lanes.

Every expected value is derived here, independently of the code under test:
activations by hand (LEGACY_SEMANTICS §5: combiners, empty rows -> 0, dense ids
drop id 0 as the TPU's `tf.where` does, negative ids are padding (dropped
with their weights, the engine's rule), sequence features zero-padded and
truncated at `max_sequence_length` with lengths `min(last index + 1, L)`), the
gradient of every looked-up entry by the chain rule for the loss
`sum(activation * C)` (so d(loss)/d(activation) = C), and the table update by
`tpu_fc.reference.apply_update_by_core` (THE definition of the TPU update
rules, §4.4, on `num_shards` cores), which sums duplicate ids itself.  Each test
case builds one graph and runs its steps in one session; after every step the
activations the model saw, the tables and all slots are compared, the tables
and slots within the float32 error bound of `oracle.ReferenceSteps`.
"""
import copy

import numpy as np
import pytest

from harness import covering
from harness import inputs
from harness import oracle
import tpu_fc
from tpu_fc import naming
from tpu_fc import reference
from tpu_fc.lookup import backends
from tpu_fc.lookup.backends import EmbeddingCoreBackend
import tensorflow as tf  # pylint: disable=g-bad-import-order  (after tpu_fc)

fc = tf.feature_column
VOCAB, DIM, BATCH = inputs.ENGINE_VOCAB, inputs.ENGINE_DIM, inputs.ENGINE_BATCH
# Activations against oracle.np_activation's float64 ones: the engine's combiner
# rounds a few times in float32 (~1e-7 of values below 10), and from step 2 on
# it reads its own tables, which differ from the reference's within the update
# bound (by at most 3e-6 here; activations by at most 4e-7).
RTOL, ATOL = 1e-5, 1e-5
COMBINERS = ('sum', 'mean', 'sqrtn')


def simulate(feats, table_of, params_of, num_steps, learning_rate, multiplier,
             loss_features, num_shards):
  """Per step: activations seen, then tables and slots after the update.

  The examples split evenly over `num_shards` cores, in order; each table
  update is the reference's for that many cores (`apply_update_by_core`).  Tables and slots are snapshots of
  `oracle.ReferenceSteps`, with their error bound.
  """
  tables = {}
  for feat in feats:
    name = table_of[feat.name]
    if name not in tables:
      params, init = params_of[name], feat.init()
      # oracle.np_entry_gradients rounds at most as often as the engine: dy·w, the
      # scale, their product, the multiplier.
      tables[name] = oracle.ReferenceSteps(
          params, init, reference.init_slots(params, init.shape),
          gradient_roundings=oracle.ENGINE_GRADIENT_ROUNDINGS)
  history = []
  for step in range(num_steps):
    activations, ids, cores, grads = {}, {}, {}, {}
    for feat in feats:
      table = table_of[feat.name]
      act, lengths = oracle.np_activation(feat, tables[table].table)
      activations[feat.name] = act
      if lengths is not None:
        activations[feat.name + '_seq_length_'] = lengths
      dy = feat.dy() if feat.name in loss_features else np.zeros_like(act)
      feat_ids, examples, feat_grads = oracle.np_entry_gradients(feat, dy)
      ids.setdefault(table, []).extend(feat_ids)
      cores.setdefault(table, []).extend(
          b // (BATCH // num_shards) for b in examples)
      grads.setdefault(table, []).extend(feat_grads)
    for table, want in tables.items():
      g = np.array(grads[table], np.float32).reshape(-1, want.table.shape[1])
      want.step(np.array(ids[table]), g * np.float32(multiplier(step)),
                learning_rate(table, step), cores=cores[table],
                num_cores=num_shards)
    history.append(dict(activations=activations,
                        tables={k: copy.copy(v) for k, v in tables.items()}))
  return history


# The engine, as a TPUEstimator-style step would drive it. ----------------------


def run_engine(columns, feats, params, num_steps, num_shards,
               loss_features=None, gradient_multiplier_fn=None, spec=None,
               model_variable=True):
  """Builds one graph; returns (history per step, table name of each feature).

  The loss of shard s is `sum_f sum(activation_f[s] * C_f[s])`; each shard's
  loss is minimized by its own GradientDescentOptimizer (the model optimizer),
  shard 0 increments the global step.  The model has one variable of its own,
  `b`, whose gradient reads the activations (`b * stop_gradient(sum(act))`: it
  leaves d(loss)/d(activation) = C), as any real model's variables do.  With
  `model_variable=False` the dummies are the only trainable variables.
  """
  loss_features = [f.name for f in feats] if loss_features is None else loss_features
  with tf.Graph().as_default() as graph:
    global_step = tf.compat.v1.train.get_or_create_global_step()
    if spec is None:
      spec = tpu_fc.EmbeddingConfigSpec(feature_columns=columns,
                                        optimization_parameters=params)
    layout = spec.embedding_layout()
    table_of = {f.name: f.table for f in layout.features}
    engine = EmbeddingCoreBackend(
        spec._replace(experimental_gradient_multiplier_fn=gradient_multiplier_fn),
        layout, named_by_columns=False)
    engine.create_variables(training=True)
    step, shards = engine.lookup(features_of(feats), num_shards=num_shards)
    assert len(shards) == num_shards
    per_shard = BATCH // num_shards
    train_ops = []
    for s, shard in enumerate(shards):
      terms = []
      for feat in feats:
        assert shard[feat.name].shape[1:].as_list() == list(
            feat.dy().shape[1:]), feat.name
        if feat.name in loss_features:
          dy = feat.dy()[s * per_shard:(s + 1) * per_shard]
          terms.append(tf.reduce_sum(shard[feat.name] * dy))
      loss = tf.add_n(terms)
      if model_variable:
        bias = tf.compat.v1.get_variable(f'model_b{s}', initializer=0.5)
        loss += bias * tf.stop_gradient(loss)
      train_ops.append(tf.compat.v1.train.GradientDescentOptimizer(1.0).minimize(
          loss, global_step=global_step if s == 0 else None))
    update = engine.apply_gradients(step)
    fetch = {name: tf.concat([shard[name] for shard in shards], axis=0)
             for name in shards[0]}
    history = []
    with tf.compat.v1.Session(graph=graph) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for _ in range(num_steps):
        activations, _ = sess.run([fetch, (train_ops, update)])
        tables, slots = sess.run([engine.tables, engine.slots])
        history.append(dict(activations=activations, tables=tables, slots=slots))
      assert sess.run(global_step) == num_steps
  return history, table_of


def check(columns, feats, params, num_steps=3, num_shards=1,
          loss_features=None, gradient_multiplier_fn=None, multiplier=None,
          learning_rate=None, params_of=None, spec=None):
  """Runs the engine and the numpy model; compares every step."""
  got, table_of = run_engine(columns, feats, params, num_steps,
                             num_shards, loss_features, gradient_multiplier_fn,
                             spec)
  tables = set(table_of.values())
  params_of = params_of or {t: params for t in tables}
  if learning_rate is None:
    learning_rate = lambda table, step: params_of[table].learning_rate
  want = simulate(feats, table_of, params_of, num_steps, learning_rate,
                  multiplier or (lambda step: 1.0),
                  [f.name for f in feats] if loss_features is None
                  else loss_features, num_shards)
  for step, (g, w) in enumerate(zip(got, want), start=1):
    assert sorted(g['activations']) == sorted(w['activations'])
    for name, value in w['activations'].items():
      if name.endswith('_seq_length_'):
        np.testing.assert_array_equal(g['activations'][name], value,
                                      err_msg=f'{name} step {step}')
      else:
        np.testing.assert_allclose(g['activations'][name], value, rtol=RTOL,
                                   atol=ATOL, err_msg=f'{name} step {step}')
    assert sorted(g['tables']) == sorted(tables)
    for table in tables:
      w['tables'][table].assert_matches(g['tables'][table], g['slots'][table],
                                        err_msg=f'{table} step {step}')
  return got, want, table_of


def features_of(feats):
  values = {}
  for feat in feats:
    values.update(feat.inputs())
  return values


# Optimizers x combiners x input kinds. ----------------------------------------

OPTIMIZERS = {
    'sgd': lambda: tpu_fc.StochasticGradientDescentParameters(0.3),
    'adagrad': lambda: tpu_fc.AdagradParameters(0.2, initial_accumulator=0.5),
    'adam_lazy': lambda: tpu_fc.AdamParameters(0.1, beta1=0.8, beta2=0.9,
                                               epsilon=1e-3),
    'adam_non_lazy': lambda: tpu_fc.AdamParameters(
        0.1, beta1=0.8, beta2=0.9, epsilon=1e-3, lazy_adam=False,
        sum_inside_sqrt=False),
    'ftrl': lambda: tpu_fc.FtrlParameters(
        0.2, beta=0.3, l1_regularization_strength=0.01,
        l2_regularization_strength=0.05),
    'proximal_adagrad': lambda: tpu_fc.ProximalAdagradParameters(
        0.2, initial_accumulator=0.3, l1_regularization_strength=0.01,
        l2_regularization_strength=0.05),
    'momentum': lambda: tpu_fc.MomentumParameters(0.1, 0.9),
    'momentum_nesterov': lambda: tpu_fc.MomentumParameters(
        0.1, 0.8, use_nesterov=True),
    'rms_prop': lambda: tpu_fc.RMSPropParameters(0.05, rho=0.9, momentum=0.5,
                                                 epsilon=1e-2),
}


# Pairwise over optimizer x input kind x combiner x shards (each optimizer on
# 1 or 2 shards, in turn): every optimizer updates a table of every input kind
# and of every combiner, every input kind meets every combiner, and each shard
# count sees every kind and combiner (4 tables an optimizer, not 12).  The
# input kind and the combiner make the rows' gradients, which the optimizer's
# rule sees only summed by row and core: no bug needs all four together.
MATRIX = covering.pairwise(
    (optimizer, 1 + i % 2, kind, combiner)
    for i, optimizer in enumerate(sorted(OPTIMIZERS))
    for kind in sorted(inputs.INPUTS) for combiner in COMBINERS)


def _feat(kind, combiner, ids, weighted=False, seed=0):
  """The feature `<kind>_<combiner>` of `ids` (seeded apart by both)."""
  return inputs.Feat(f'{kind}_{combiner}', ids, combiner, weighted=weighted,
                     seed=seed + len(inputs.INPUTS) * COMBINERS.index(combiner)
                     + sorted(inputs.INPUTS).index(kind))


@pytest.mark.parametrize('optimizer', sorted(OPTIMIZERS))
def test_optimizer_combiner_input_matrix(optimizer):
  """Every optimizer on every combiner and input kind: its MATRIX tables,
  in one graph."""
  (num_shards,) = {shards for name, shards, _, _ in MATRIX if name == optimizer}
  feats = [_feat(kind, combiner, inputs.unweighted(inputs.INPUTS[kind]))
           for name, _, kind, combiner in MATRIX if name == optimizer]
  check([f.column() for f in feats], feats,
        OPTIMIZERS[optimizer](), num_shards=num_shards)


# Pairwise over shards x weighted input kind x combiner: each shard count
# weighs both kinds and every combiner, each kind under every combiner.
WEIGHTED = covering.pairwise(
    (num_shards, kind, combiner) for num_shards in (1, 2)
    for kind in ('ragged', 'sparse') for combiner in COMBINERS)


@pytest.mark.parametrize('num_shards', [1, 2])
def test_weighted_sparse_and_ragged_weights(num_shards):
  feats = [_feat(kind, combiner, inputs.INPUTS[kind], weighted=True, seed=10)
           for shards, kind, combiner in WEIGHTED if shards == num_shards]
  check([f.column() for f in feats], feats,
        tpu_fc.AdagradParameters(0.3, initial_accumulator=0.2),
        num_shards=num_shards)


def test_weighted_activation_by_hand():
  """One weighted example spelled out: mean = (0.5 e3 + 2 e0) / 2.5."""
  feat = inputs.Feat('w', inputs.SPARSE, 'mean', weighted=True)
  got, _, _ = check([feat.column()], [feat],
                    tpu_fc.StochasticGradientDescentParameters(0.1),
                    num_steps=1)
  table = feat.init()
  np.testing.assert_allclose(got[0]['activations']['w'][0],
                             (0.5 * table[3] + 2.0 * table[0]) / 2.5,
                             rtol=RTOL, atol=ATOL)
  np.testing.assert_array_equal(got[0]['activations']['w'][2], np.zeros(DIM))


# Sequence features. ------------------------------------------------------------



@pytest.mark.parametrize('num_shards', [1, 2])
def test_sequence_features(num_shards):
  feats = [inputs.Feat('seq_sparse', inputs.SEQUENCE_SPARSE, seq_len=2, seed=20),
           inputs.Feat('seq_ragged', inputs.SEQUENCE_RAGGED, seq_len=2, dim=2, seed=21),
           inputs.Feat('plain', inputs.unweighted(inputs.SPARSE), 'sum', seed=22)]
  # Adagrad leaves rows with a zero gradient unchanged, so this test does not
  # depend on whether truncated ids are updated (see the test below).
  got, _, _ = check([f.column() for f in feats], feats,
                    tpu_fc.AdagradParameters(0.5), num_shards=num_shards)
  activations = got[0]['activations']
  assert activations['seq_sparse'].shape == (BATCH, 2, DIM)
  assert activations['seq_ragged'].shape == (BATCH, 2, 2)
  np.testing.assert_array_equal(activations['seq_sparse_seq_length_'],
                                [2, 2, 0, 1])
  np.testing.assert_array_equal(activations['seq_ragged_seq_length_'],
                                [1, 2, 0, 2])
  assert 'plain_seq_length_' not in activations
  table = feats[0].init()
  np.testing.assert_allclose(activations['seq_sparse'][0], table[[3, 1]],
                             rtol=RTOL, atol=ATOL)
  np.testing.assert_array_equal(activations['seq_sparse'][1, 0], np.zeros(DIM))
  np.testing.assert_array_equal(activations['seq_sparse'][2], np.zeros((2, DIM)))


def test_truncated_sequence_ids_are_not_updated():
  feat = inputs.Feat('seq', inputs.SEQUENCE_SPARSE, seq_len=2, seed=23)
  got, _, _ = run_engine_one(feat, tpu_fc.FtrlParameters(0.1))
  # Ids 5 and 6 appear only at positions >= max_sequence_length.
  np.testing.assert_allclose(got['tables']['tbl_seq'][[5, 6]],
                             feat.init()[[5, 6]], rtol=RTOL, atol=ATOL)


def run_engine_one(feat, params):
  history, table_of = run_engine([feat.column()], [feat], params,
                                 num_steps=1, num_shards=1)
  assert table_of == {feat.name: 'tbl_' + feat.name}
  return history[0], history, table_of


# Shared tables, two tables. ---------------------------------------------------


@pytest.mark.parametrize('optimizer', ['adagrad', 'ftrl'])
def test_shared_columns_sum_gradients_into_one_update(optimizer):
  """Two features on one table (row 3 and row 1 looked up by both) + a second table."""
  init = np.random.RandomState(7).uniform(-1, 1, (VOCAB, DIM)).astype(np.float32)
  shared = tpu_fc.shared_embedding_columns(
      [fc.categorical_column_with_identity('b', VOCAB),
       fc.categorical_column_with_identity('c', VOCAB)], DIM, combiner='sqrtn',
      initializer=tf.compat.v1.constant_initializer(init))
  feats = [inputs.Feat('b', inputs.unweighted(inputs.SPARSE), 'sqrtn', seed=30),
           inputs.Feat('c', inputs.DENSE, 'sqrtn', seed=31),
           inputs.Feat('a', inputs.RAGGED, 'mean', weighted=True, seed=32)]
  for feat in feats[:2]:
    feat.init = lambda: init
  _, _, table_of = check(shared + [feats[2].column()], feats,
                         OPTIMIZERS[optimizer](), num_shards=2)
  assert table_of['b'] == table_of['c'] != table_of['a']
  assert len(set(table_of.values())) == 2


def test_shared_columns_with_sequence_feature():
  init = np.random.RandomState(8).uniform(-1, 1, (VOCAB, 2)).astype(np.float32)
  shared = tpu_fc.shared_embedding_columns(
      [fc.categorical_column_with_identity('p', VOCAB),
       fc.sequence_categorical_column_with_identity('q', VOCAB)], 2,
      combiner='sum', max_sequence_lengths=[0, 2],
      initializer=tf.compat.v1.constant_initializer(init))
  feats = [inputs.Feat('p', inputs.unweighted(inputs.RAGGED), 'sum', dim=2, seed=33),
           inputs.Feat('q', inputs.SEQUENCE_SPARSE, seq_len=2, dim=2, seed=34)]
  for feat in feats:
    feat.init = lambda: init
  check(shared, feats,
        tpu_fc.MomentumParameters(0.1, 0.5), num_shards=2)


# Schedules: learning_rate_fn and gradient_multiplier_fn. -------------------------


def _rate_fn(step):
  return 0.1 / (1. + tf.cast(step, tf.float32))


@pytest.mark.parametrize('optimizer', ['sgd', 'adagrad'])
def test_learning_rate_fn_reads_global_step_before_increment(optimizer):
  params = OPTIMIZERS[optimizer]()
  feats = [inputs.Feat('scheduled', inputs.unweighted(inputs.SPARSE), 'sum', seed=40,
                learning_rate_fn=_rate_fn),
           inputs.Feat('constant', inputs.RAGGED, 'mean', weighted=True, seed=41)]
  def rate(table, step):
    if table == 'tbl_scheduled':  # fn(0), fn(1), fn(2): the pre-increment step
      return np.float32(0.1) / np.float32(1. + step)  # in float32, as _rate_fn
    return params.learning_rate
  _, _, table_of = check([f.column() for f in feats], feats, params,
                         num_steps=3, num_shards=2, learning_rate=rate)
  assert table_of['scheduled'] == 'tbl_scheduled'


def test_learning_rate_fn_differs_from_post_increment_rates():
  """The check above can tell fn(step) from fn(step + 1) (sanity of the test)."""
  params = tpu_fc.StochasticGradientDescentParameters(1.0)
  feat = inputs.Feat('scheduled', inputs.unweighted(inputs.SPARSE), 'sum', seed=40,
              learning_rate_fn=_rate_fn)
  with pytest.raises(AssertionError):
    check([feat.column()], [feat], params, num_steps=1,
          learning_rate=lambda table, step: 0.1 / (2. + step))


def _ancestors(op):
  """Every op `op` waits for (data inputs and control inputs, transitively)."""
  seen, stack = set(), [op]
  while stack:
    current = stack.pop()
    for parent in [t.op for t in current.inputs] + list(current.control_inputs):
      if parent not in seen:
        seen.add(parent)
        stack.append(parent)
  return seen


def test_global_step_read_before_increment_without_model_variables():
  """As the model_fn in the brief: the dummies are the only trainable variables."""
  num_steps = 300
  with tf.Graph().as_default():
    global_step = tf.compat.v1.train.get_or_create_global_step()
    params = tpu_fc.StochasticGradientDescentParameters(1.0)
    column = tpu_fc.embedding_column(
        fc.categorical_column_with_identity('a', 2), 1, combiner='sum',
        initializer=tf.compat.v1.zeros_initializer(),
        learning_rate_fn=lambda step: tf.cast(step, tf.float32))
    spec = tpu_fc.EmbeddingConfigSpec(feature_columns=[column],
                                      optimization_parameters=params)
    engine = EmbeddingCoreBackend(spec, spec.embedding_layout(),
                                named_by_columns=False)
    engine.create_variables(training=True)
    step, shards = engine.lookup({'a': tf.SparseTensor(
        [[0, 0]], tf.constant([1], tf.int64), [1, 1])})
    activation = shards[0]['a']
    # d(loss)/d(row 1) = -1: SGD adds the rate, i.e. the step it read, to row 1.
    train = tf.compat.v1.train.GradientDescentOptimizer(1.0).minimize(
        -tf.reduce_sum(activation), global_step=global_step)
    update = engine.apply_gradients(step)

    # Deterministic part: every read of the global step that the embedding
    # update uses must be ordered before (be an ancestor of) the increment.
    handle = global_step.handle.op
    increments = [op for op in _ancestors(train) | {train}
                  if op.type == 'AssignAddVariableOp' and op.inputs[0].op is handle]
    assert len(increments) == 1
    reads = [op for op in _ancestors(update)
             if op.type == 'ReadVariableOp' and op.inputs[0].op is handle]
    assert reads
    before_increment = _ancestors(increments[0])
    for read in reads:
      assert read in before_increment, read.name

    # Behaviour (racy before a fix, so only reached after the check above).
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      rates = []
      for _ in range(num_steps):
        before = sess.run(engine.tables['tbl_a'])[1, 0]
        sess.run([train, update])
        rates.append(sess.run(engine.tables['tbl_a'])[1, 0] - before)
  np.testing.assert_allclose(rates, np.arange(num_steps), atol=1e-3)


def test_gradient_multiplier_fn():
  feats = [inputs.Feat('x', inputs.unweighted(inputs.SPARSE), 'mean', seed=42),
           inputs.Feat('y', inputs.DENSE, 'sqrtn', seed=43)]
  check([f.column() for f in feats], feats,
        tpu_fc.AdagradParameters(0.1), num_steps=3, num_shards=2,
        gradient_multiplier_fn=lambda step: 2. + tf.cast(step, tf.float32),
        multiplier=lambda step: 2. + step)


# Clipping and weight decay. -----------------------------------------------------

REGULARIZED = {
    'clip_gradient': lambda: tpu_fc.AdagradParameters(
        0.2, clip_gradient_min=-0.3, clip_gradient_max=0.2),
    'clip_weight': lambda: tpu_fc.StochasticGradientDescentParameters(
        0.5, clip_weight_min=-0.5, clip_weight_max=0.4),
    'weight_decay': lambda: tpu_fc.MomentumParameters(
        0.1, 0.9, weight_decay_factor=0.2),
    'weight_decay_times_lr': lambda: tpu_fc.AdamParameters(
        0.1, epsilon=1e-3, weight_decay_factor=0.5,
        multiply_weight_decay_factor_by_learning_rate=True),
    'all_ftrl': lambda: tpu_fc.FtrlParameters(
        0.2, l1_regularization_strength=0.01, clip_gradient_min=-0.5,
        clip_gradient_max=0.4, clip_weight_min=-0.3, clip_weight_max=0.3,
        weight_decay_factor=0.1),
    'all_proximal_adagrad': lambda: tpu_fc.ProximalAdagradParameters(
        0.2, clip_gradient_min=-0.2, clip_weight_max=0.3,
        weight_decay_factor=0.1),
    'all_rms_prop': lambda: tpu_fc.RMSPropParameters(
        0.05, 0.9, 0.5, 1e-2, clip_gradient_max=0.1, clip_weight_min=-0.2,
        weight_decay_factor=0.05, multiply_weight_decay_factor_by_learning_rate=True),
}


@pytest.mark.parametrize('name', sorted(REGULARIZED))
def test_clipping_and_weight_decay(name):
  feats = [inputs.Feat('x', inputs.SPARSE, 'sum', weighted=True, seed=50),
           inputs.Feat('y', inputs.RAGGED, 'mean', seed=51)]
  check([f.column() for f in feats], feats,
        REGULARIZED[name](), num_shards=2)


def test_clipping_binds():
  """The clip bounds above really clip (so the test can tell clipped from not)."""
  feats = [inputs.Feat('x', inputs.SPARSE, 'sum', weighted=True, seed=50),
           inputs.Feat('y', inputs.RAGGED, 'mean', seed=51)]
  summed = []
  for feat in feats:
    ids, _, grads = oracle.np_entry_gradients(feat, feat.dy())
    summed.append(np.zeros((VOCAB, DIM)))
    np.add.at(summed[-1], ids, grads)
  summed = np.concatenate(summed)
  assert (summed > 0.4).any() and (summed < -0.5).any()
  assert ((summed > -0.2) & (summed < 0.1)).any()  # and some do not


# Sharding. ------------------------------------------------------------------------


@pytest.mark.parametrize('optimizer', ['sgd', 'adagrad', 'adam_lazy'])
def test_two_shards_against_one_shard(optimizer):
  """Loss = sum over examples: with gradient accumulation (the default) two
  shards move every row as one shard does; without it a row seen by one core
  does, a row seen by both cores too under SGD only (two Adagrad or Adam steps
  from per-core sums are not one step from their total).  One one-shard run
  for both settings."""
  feats = [inputs.Feat('x', inputs.unweighted(inputs.SPARSE), 'mean', seed=60),  # id 3: both cores
           inputs.Feat('y', inputs.RAGGED, 'sqrtn', weighted=True, seed=61)]
  one, _, _ = check([f.column() for f in feats], feats,
                    OPTIMIZERS[optimizer](), num_steps=1, num_shards=1)
  for accumulation in (True, False):
    two, _, table_of = check(
        [f.column() for f in feats], feats,
        OPTIMIZERS[optimizer]().replace(use_gradient_accumulation=accumulation),
        num_steps=1, num_shards=2)
    _assert_two_shards_move_rows_as_one(feats, one[0], two[0], table_of,
                                        accumulation or optimizer == 'sgd')


def _assert_two_shards_move_rows_as_one(feats, one, two, table_of, both_alike):
  """Rows one core saw alike; rows both cores saw alike iff `both_alike`."""
  seen_by_both = 0
  for feat in feats:
    cores_of = {}
    for b, _, i, _ in feat.entries():
      cores_of.setdefault(i, set()).add(b // (BATCH // 2))
    both = sorted(i for i, cores in cores_of.items() if len(cores) == 2)
    single = sorted(set(range(VOCAB)) - set(both))
    seen_by_both += len(both)
    table = table_of[feat.name]
    got, want = two['tables'][table], one['tables'][table]
    # Engine against engine on values below 2: alike where one core saw the
    # row, a few roundings (~1e-7) apart where two cores' sums are applied.
    np.testing.assert_allclose(got[single], want[single], rtol=1e-6, atol=1e-6)
    if both_alike:
      np.testing.assert_allclose(got[both], want[both], rtol=1e-6, atol=1e-6)
    else:
      assert np.all(np.abs(got[both] - want[both]).max(axis=1) > 1e-4)
  assert seen_by_both


def test_shard_outputs_are_batch_slices():
  feat = inputs.Feat('x', inputs.unweighted(inputs.SPARSE), 'sum', seed=62)
  seq = inputs.Feat('s', inputs.SEQUENCE_SPARSE, seq_len=2, seed=63)
  with tf.Graph().as_default():
    params = tpu_fc.AdagradParameters(0.1)
    spec = tpu_fc.EmbeddingConfigSpec(feature_columns=[feat.column(), seq.column()],
                                      optimization_parameters=params)
    engine = EmbeddingCoreBackend(spec, spec.embedding_layout(),
                                named_by_columns=False)
    engine.create_variables(training=False)
    _, shards = engine.lookup(features_of([feat, seq]), num_shards=2)
    assert [sorted(s) for s in shards] == [['s', 's_seq_length_', 'x']] * 2
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      got = sess.run(shards)
  want, _ = oracle.np_activation(feat, feat.init())
  want_seq, lengths = oracle.np_activation(seq, seq.init())
  for s in range(2):
    rows = slice(2 * s, 2 * s + 2)
    np.testing.assert_allclose(got[s]['x'], want[rows], rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose(got[s]['s'], want_seq[rows], rtol=RTOL, atol=ATOL)
    np.testing.assert_array_equal(got[s]['s_seq_length_'], lengths[rows])


# A loss that ignores a feature. ------------------------------------------------


@pytest.mark.parametrize('num_shards', [1, 2])
def test_loss_ignoring_a_feature_gives_its_rows_zero_gradient(num_shards):
  """FTRL moves a row even for a zero gradient: the rows are updated with g = 0."""
  feats = [inputs.Feat('used', inputs.unweighted(inputs.SPARSE), 'sum', seed=70),
           inputs.Feat('ignored', inputs.RAGGED, 'mean', seed=71)]
  got, _, _ = check([f.column() for f in feats], feats,
                    tpu_fc.FtrlParameters(0.1, l1_regularization_strength=0.01),
                    num_steps=2, num_shards=num_shards, loss_features=['used'])
  looked_up = sorted({i for _, _, i, _ in feats[1].entries()})
  untouched = sorted(set(range(VOCAB)) - set(looked_up))
  table = got[-1]['tables']['tbl_ignored']
  np.testing.assert_array_equal(table[untouched], feats[1].init()[untouched])
  np.testing.assert_array_equal(
      got[-1]['slots']['tbl_ignored']['linears'], np.zeros((VOCAB, DIM)))


def test_shared_table_with_one_feature_ignored():
  init = np.random.RandomState(9).uniform(-1, 1, (VOCAB, DIM)).astype(np.float32)
  shared = tpu_fc.shared_embedding_columns(
      [fc.categorical_column_with_identity('b', VOCAB),
       fc.categorical_column_with_identity('c', VOCAB)], DIM, combiner='mean',
      initializer=tf.compat.v1.constant_initializer(init))
  feats = [inputs.Feat('b', inputs.unweighted(inputs.SPARSE), 'mean', seed=72),
           inputs.Feat('c', inputs.RAGGED, 'mean', seed=73)]
  for feat in feats:
    feat.init = lambda: init
  check(shared, feats, tpu_fc.AdagradParameters(0.3),
        num_steps=2, num_shards=2, loss_features=['c'])


# Evaluation-style use. ------------------------------------------------------------


@pytest.mark.parametrize('num_shards', [1, 2])
def test_eval_lookup_without_training(num_shards):
  feats = [inputs.Feat('x', inputs.SPARSE, 'sqrtn', weighted=True, seed=80),
           inputs.Feat('y', inputs.DENSE, 'mean', seed=81),
           inputs.Feat('s', inputs.SEQUENCE_RAGGED, seq_len=2, seed=82)]
  with tf.Graph().as_default() as graph:
    params = tpu_fc.AdamParameters(0.1)
    spec = tpu_fc.EmbeddingConfigSpec(feature_columns=[f.column() for f in feats],
                                      optimization_parameters=params)
    engine = EmbeddingCoreBackend(spec, spec.embedding_layout(),
                                named_by_columns=False)
    engine.create_variables(training=False)
    table_of = {f.name: f.table for f in spec.embedding_layout().features}
    _, shards = engine.lookup(features_of(feats), num_shards=num_shards)
    assert not graph.get_collection(backends.DUMMY_VARIABLE_COLLECTION)
    assert not tf.compat.v1.trainable_variables()
    assert engine.slots == {}
    # Tables (and the global step the engine reads) are the only variables.
    assert {v.name for v in tf.compat.v1.global_variables()} == {
        'global_step:0'} | {v.name for v in engine.tables.values()}
    fetch = {name: tf.concat([s[name] for s in shards], 0) for name in shards[0]}
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for _ in range(2):
        got = sess.run(fetch)
      tables = sess.run(engine.tables)
  for feat in feats:
    act, lengths = oracle.np_activation(feat, feat.init())
    np.testing.assert_allclose(got[feat.name], act, rtol=RTOL, atol=ATOL)
    if lengths is not None:
      np.testing.assert_array_equal(got[feat.name + '_seq_length_'], lengths)
    np.testing.assert_array_equal(tables[table_of[feat.name]], feat.init())


# Dict path (FeatureConfig / TableConfig). ------------------------------------------


def test_dict_path_training_with_per_table_optimizer():
  """feature_to_config_dict/table_to_config_dict; one table has its own optimizer
  and learning rate, one feature is weighted, two features share table 'u'."""
  init_u = np.random.RandomState(90).uniform(-1, 1, (VOCAB, DIM)).astype(np.float32)
  init_v = np.random.RandomState(91).uniform(-1, 1, (VOCAB, 2)).astype(np.float32)
  own = tpu_fc.FtrlParameters(0.5, l1_regularization_strength=0.01)
  spec = tpu_fc.EmbeddingConfigSpec(
      feature_to_config_dict={
          'f1': tpu_fc.FeatureConfig('u'),
          'f2': tpu_fc.FeatureConfig('u', weight_key='f2_w'),
          'g': tpu_fc.FeatureConfig('v')},
      table_to_config_dict={
          'u': tpu_fc.TableConfig(VOCAB, DIM, combiner='sqrtn',
                                  initializer=tf.compat.v1.constant_initializer(init_u)),
          'v': tpu_fc.TableConfig(VOCAB, 2, combiner='sum', learning_rate=0.25,
                                  optimization_parameters=own,
                                  initializer=tf.compat.v1.constant_initializer(init_v))},
      optimization_parameters=tpu_fc.AdagradParameters(0.1))
  feats = [inputs.Feat('f1', inputs.DENSE, 'sqrtn', seed=92),
           inputs.Feat('f2', inputs.SPARSE, 'sqrtn', weighted=True, seed=93),
           inputs.Feat('g', inputs.unweighted(inputs.RAGGED), 'sum', dim=2, seed=94)]
  feats[0].init = feats[1].init = lambda: init_u
  feats[2].init = lambda: init_v
  params_of = {'u': spec.optimization_parameters, 'v': own}
  check(None, feats, spec.optimization_parameters,
        num_shards=2, spec=spec, params_of=params_of,
        learning_rate=lambda table, step: {'u': 0.1, 'v': 0.25}[table])


def test_dict_path_combiner_none_keeps_id_zero():
  init = np.random.RandomState(95).uniform(-1, 1, (VOCAB, DIM)).astype(np.float32)
  with tf.Graph().as_default():
    params = tpu_fc.AdagradParameters(0.1)
    spec = tpu_fc.EmbeddingConfigSpec(
        feature_to_config_dict={'f': tpu_fc.FeatureConfig('t')},
        table_to_config_dict={'t': tpu_fc.TableConfig(
            VOCAB, DIM, combiner=None,
            initializer=tf.compat.v1.constant_initializer(init))},
        optimization_parameters=params)
    engine = EmbeddingCoreBackend(spec, spec.embedding_layout(),
                                named_by_columns=False)
    engine.create_variables(training=False)
    _, shards = engine.lookup({'f': tf.constant([2, 0, 5, 0], tf.int64)})
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      got = sess.run(shards[0]['f'])
  np.testing.assert_allclose(got, init[[2, 0, 5, 0]], rtol=RTOL, atol=ATOL)


LEGACY_SLOT_NAMES = {
    'sgd': {},
    'adagrad': {'Adagrad': 'accumulators'},
    'adam_lazy': {'Adam/m': 'momenta', 'Adam/v': 'velocities'},
    'ftrl': {'Ftrl': 'accumulators', 'Ftrl_1': 'linears'},
    'proximal_adagrad': {'ProximalAdagrad': 'accumulators'},
    'momentum': {'Momentum': 'momenta'},
    'rms_prop': {'RMSProp/ms': 'ms', 'RMSProp/mom': 'mom'},
}


def _dict_spec(table_optimizer=None, global_optimizer=None):
  return tpu_fc.EmbeddingConfigSpec(
      feature_to_config_dict={'f': tpu_fc.FeatureConfig('t'),
                              'g': tpu_fc.FeatureConfig('other')},
      table_to_config_dict={
          't': tpu_fc.TableConfig(VOCAB, DIM,
                                  optimization_parameters=table_optimizer),
          'other': tpu_fc.TableConfig(VOCAB, 2)},
      optimization_parameters=global_optimizer or
      tpu_fc.StochasticGradientDescentParameters(0.1))


@pytest.mark.parametrize('optimizer', sorted(LEGACY_SLOT_NAMES))
def test_checkpoint_variables_dict_path(optimizer):
  with tf.Graph().as_default() as graph:
    params = OPTIMIZERS[optimizer]()
    spec = _dict_spec(global_optimizer=params)
    engine = EmbeddingCoreBackend(spec, spec.embedding_layout(),
                                named_by_columns=False)
    engine.create_variables(training=True)
    names = engine.checkpoint_variables(graph)
  want = {}
  for table in ('t', 'other'):
    want[table] = engine.tables[table]
    for suffix, slot in LEGACY_SLOT_NAMES[optimizer].items():
      want[f'{table}/{suffix}'] = engine.slots[table][slot]
  assert sorted(names) == sorted(want)
  for name, variable in want.items():
    assert names[name] is variable, name
  assert not any(naming.DUMMY_VARIABLE_PREFIX in n for n in names)


def test_checkpoint_variables_per_table_optimizer_and_eval():
  with tf.Graph().as_default() as graph:
    spec = _dict_spec(table_optimizer=tpu_fc.AdamParameters(0.1),
                      global_optimizer=tpu_fc.AdagradParameters(0.1))
    engine = EmbeddingCoreBackend(spec, spec.embedding_layout(),
                                named_by_columns=False)
    engine.create_variables(training=True)
    names = engine.checkpoint_variables(graph)
  assert sorted(names) == ['other', 'other/Adagrad', 't', 't/Adam/m', 't/Adam/v']
  assert names['t/Adam/v'] is engine.slots['t']['velocities']
  assert names['other/Adagrad'] is engine.slots['other']['accumulators']
  with tf.Graph().as_default() as graph:
    engine = EmbeddingCoreBackend(spec, spec.embedding_layout(),
                                named_by_columns=False)
    engine.create_variables(training=False)
    names = engine.checkpoint_variables(graph)
  assert sorted(names) == ['other', 't']


def test_checkpoint_variables_columns_path_needs_recorded_scopes():
  feat = inputs.Feat('x', inputs.SPARSE, 'sum')
  with tf.Graph().as_default() as graph:
    params = tpu_fc.AdagradParameters(0.1)
    spec = tpu_fc.EmbeddingConfigSpec(feature_columns=[feat.column()],
                                      optimization_parameters=params)
    engine = EmbeddingCoreBackend(spec, spec.embedding_layout(),
                                named_by_columns=False)
    engine.create_variables(training=True)
    with pytest.raises(RuntimeError,
                       match='Embedding feature column did not capture any thing'):
      engine.checkpoint_variables(graph)


# Errors. --------------------------------------------------------------------------


def _engine_for(feats, training=False):
  params = tpu_fc.AdagradParameters(0.1)
  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=[f.column() for f in feats],
                                    optimization_parameters=params)
  engine = EmbeddingCoreBackend(spec, spec.embedding_layout(),
                                named_by_columns=False)
  engine.create_variables(training=training)
  return engine


def _runtime_ids(kind, bad_id):
  """`user_id` input of `kind` holding `bad_id`, with values known only at run time."""
  values = tf.compat.v1.placeholder_with_default(
      tf.constant([2, bad_id, 1], tf.int64), [None])
  if kind == 'sparse':
    return tf.SparseTensor([[0, 0], [1, 0], [3, 1]], values, [BATCH, 2])
  if kind == 'ragged':
    return tf.RaggedTensor.from_row_lengths(values, [1, 1, 0, 1])
  return tf.reshape(tf.concat([values, [4]], 0), [BATCH, 1])


@pytest.mark.parametrize('kind', sorted(inputs.INPUTS))
@pytest.mark.parametrize('training', [False, True])
def test_id_out_of_vocabulary_fails_at_run_time_naming_the_feature(kind, training):
  feat = inputs.Feat('user_id', inputs.SPARSE, 'sum')
  with tf.Graph().as_default():
    engine = _engine_for([feat], training=training)
    step, shards = engine.lookup({'user_id': _runtime_ids(kind, VOCAB + 2)})
    fetches = [shards[0]['user_id']]
    if training:
      fetches.append(tf.compat.v1.train.GradientDescentOptimizer(1.0).minimize(
          tf.reduce_sum(shards[0]['user_id'])))
      fetches.append(engine.apply_gradients(step))
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      with pytest.raises(tf.errors.InvalidArgumentError) as error:
        sess.run(fetches)
      tables = sess.run(engine.tables)
  assert 'user_id' in str(error.value)
  assert str(VOCAB + 2) in str(error.value)
  np.testing.assert_array_equal(tables['tbl_user_id'], feat.init())


def test_id_out_of_vocabulary_known_statically_fails_naming_the_feature():
  feat = inputs.Feat('user_id', inputs.SPARSE, 'sum')
  with tf.Graph().as_default():
    engine = _engine_for([feat])
    with pytest.raises(tf.errors.InvalidArgumentError, match='user_id'):
      _, shards = engine.lookup({'user_id': tf.SparseTensor(
          [[0, 0]], tf.constant([VOCAB], tf.int64), [BATCH, 1])})
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(shards)


def test_negative_ids_are_padding():
  """Negative ids are dropped with their weights (the engine's rule, as TF's safe
  lookups): the activation and the update are those without them.  Every
  input kind under every combiner, in one graph."""
  with_negative_ids = {
      'sparse': inputs.Ids('sparse', [(0, 0, 3), (0, 1, -1), (1, 0, -4),
                                      (2, 0, 6), (2, 1, 6), (3, 2, 1)],
                           weights=[0.5, 3.0, 2.0, 1.0, 2.0, -1.5]),
      'ragged': inputs.Ids('ragged', [[-1], [2, -2, 5], [], [5]]),
      'dense': inputs.Ids('dense', [[-1, 4], [0, 3], [-3, -3], [1, 1]])}
  feats = [_feat(kind, combiner, ids, weighted=kind == 'sparse', seed=110)
           for kind, ids in with_negative_ids.items() for combiner in COMBINERS]
  check([f.column() for f in feats], feats,
        tpu_fc.FtrlParameters(0.2, l1_regularization_strength=0.01),
        num_steps=2, num_shards=2)


LEGACY_STRING_IDS_ERROR = (
    'SparseTensor with string as values are not supported. If you are using '
    'categorical_column_with_vocabulary_file or '
    'categorical_column_with_vocabulary_list, please call '
    'your_column.categorical_column._transform_feature({your_column.key: '
    'features[your_column.key]}) in your input_fn() to convert string to int. '
    'feature_key = user_id.')


@pytest.mark.parametrize('kind', ['sparse', 'dense', 'ragged'])
def test_string_ids_raise_legacy_error(kind):
  feat = inputs.Feat('user_id', inputs.SPARSE, 'sum')
  with tf.Graph().as_default():
    engine = _engine_for([feat])
    if kind == 'sparse':
      ids = tf.SparseTensor([[0, 0]], tf.constant(['a']), [BATCH, 1])
    elif kind == 'dense':
      ids = tf.constant([['a'], ['b'], ['c'], ['d']])
    else:
      ids = tf.ragged.constant([['a'], [], ['b'], []])
    with pytest.raises(ValueError) as error:
      engine.lookup({'user_id': ids})
  assert str(error.value) == LEGACY_STRING_IDS_ERROR


def test_missing_feature_raises_key_error_naming_it():
  feats = [inputs.Feat('user_id', inputs.SPARSE, 'sum'), inputs.Feat('item_id', inputs.RAGGED, 'sum')]
  with tf.Graph().as_default():
    engine = _engine_for(feats)
    with pytest.raises(KeyError, match='item_id'):
      engine.lookup({'user_id': inputs.SPARSE.ids_tensor()})


def test_missing_weights_raise_legacy_error():
  feat = inputs.Feat('user_id', inputs.SPARSE, 'sum', weighted=True)
  with tf.Graph().as_default():
    engine = _engine_for([feat])
    # Legacy TF raises ValueError; the engine raises KeyError: both carry the text.
    with pytest.raises((KeyError, ValueError)) as error:
      engine.lookup({'user_id': inputs.SPARSE.ids_tensor()})
  assert ('Cannot find weights user_id_w for weighted_categorical_column. '
          'Please check if the weights are present in feature dict. Also note '
          'weight-sharing among weighted_categorical_column is not supported '
          'on TPU.') in str(error.value)


def test_dense_weights_raise_legacy_error():
  feat = inputs.Feat('user_id', inputs.SPARSE, 'sum', weighted=True)
  with tf.Graph().as_default():
    engine = _engine_for([feat])
    with pytest.raises(ValueError) as error:
      engine.lookup({'user_id': inputs.SPARSE.ids_tensor(),
                     'user_id_w': tf.ones([BATCH, 4])})
  assert str(error.value) == (
      'weighted_categorical_column with weight key name user_id_w has dense '
      'weights. Dense weights are not supported on TPU. Please use sparse '
      'weights instead.')
