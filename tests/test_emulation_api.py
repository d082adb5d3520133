"""use_tpu=True without a TPU, through the public API only, against hand-derived numpy.

A user's view of the emulated TPU: `tpu_fc.embedding_column` /
`shared_embedding_columns` with constant initializers, an `EmbeddingConfigSpec`,
`TPUEstimator` with `TPUConfig(num_shards=...)`, a legacy model_fn (DenseFeatures,
input_layer or SequenceFeatures, `CrossShardOptimizer` when `params['use_tpu']`),
checkpoints read back with `get_variable_value` under the legacy names.

Every expected value is derived here, independently of the code under test:

* the model's loss is linear in the activations, `loss = sum(out * c)` with
  `out = activation + bias` and `c` a fixed per-example feature (or the mean over
  examples), so d(loss)/d(activation) is `c` scaled by `1/num_shards` (each shard's
  loss is divided by num_shards by `CrossShardOptimizer`) or `1/batch` (mean loss);
* activations by hand (LEGACY_SEMANTICS §5: combiners over weights, empty rows 0,
  dense ids drop id 0 on the TPU path, sequences zero-padded / truncated at
  `max_sequence_length`), the gradient of every looked-up id by the chain rule;
* table updates by `tpu_fc.reference` (THE definition of the TPU update rules,
  on several cores: `apply_update_by_core`), compared within the float32 error bound of
  `oracle.ReferenceSteps`, CPU model-optimizer updates (use_tpu=False,
  tensor-core columns) by the TF1 optimizer formulas written out here;
* checkpoint names from LEGACY_SEMANTICS §7.
"""
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from typing import Any, Optional

import numpy as np
import pytest

from harness import lanes
from harness import oracle
import tpu_fc
from tpu_fc import reference
import tensorflow as tf  # pylint: disable=g-bad-import-order  (after tpu_fc)

fc = tf.feature_column
V, D, B, NS = 6, 2, 4, 2        # vocabulary, dimension, global batch, shards
L = 2                           # max_sequence_length
MODEL_LR = 0.5                  # the model_fn's own optimizer (bias, tensor core)
BIAS0 = 0.25
# Model variables, metrics and activations against numpy by hand: float32 sums
# of a few terms (~1e-7 of values below 10) on tables that differ from the
# reference's within the update bound (all by at most 1e-6 here).
TOL = dict(rtol=1e-5, atol=1e-5)
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

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


def init_table(seed):
  """A distinct constant table per seed, [V, D] float32."""
  return (np.linspace(-1.0, 1.0, V * D).reshape(V, D) * (1 + 0.1 * seed) +
          0.05 * seed).astype(np.float32)


def const_init(array):
  return tf.compat.v1.constant_initializer(array)


# Features: the tensors a user feeds and what each lookup sees. --------------


@dataclasses.dataclass
class Feat:
  """One id feature.

  `raw`: [(example, position, id)] for sparse input, or a [B, k] id list for
  dense input. `weights` (sparse only) makes it a weighted column.
  """
  key: str
  raw: Any
  dense: bool = False
  weights: Optional[list] = None
  combiner: str = 'mean'
  seq_len: int = 0
  width: int = 3

  @property
  def weight_key(self):
    return self.key + '_w' if self.weights else None

  @property
  def column_name(self):
    if self.weights:
      return '{0}_weighted_by_{0}_w_embedding'.format(self.key)
    return self.key + '_embedding'

  def categorical(self):
    if self.seq_len:
      return fc.sequence_categorical_column_with_identity(self.key, V)
    column = fc.categorical_column_with_identity(self.key, V)
    if self.weights:
      column = fc.weighted_categorical_column(column, self.weight_key)
    return column

  def column(self, init, **kwargs):
    return tpu_fc.embedding_column(
        self.categorical(), D, combiner=self.combiner,
        initializer=const_init(init), max_sequence_length=self.seq_len,
        **kwargs)

  def entries(self, tpu=True):
    """[(example, position, id, weight)] that are looked up."""
    if self.dense:
      # TPU: dense ids are enqueued through tf.where(x) -> id 0 is dropped;
      # CPU: the identity column drops -1 only.
      return [(b, j, i, 1.0) for b, row in enumerate(self.raw)
              for j, i in enumerate(row) if (i != 0 if tpu else i >= 0)]
    weights = self.weights or [1.0] * len(self.raw)
    return [(b, j, i, w) for (b, j, i), w in zip(self.raw, weights)]

  def tensors(self):
    if self.dense:
      return {self.key: tf.constant(np.array(self.raw, np.int64))}
    indices = [[b, j] for b, j, _ in self.raw]
    out = {self.key: tf.SparseTensor(
        indices, tf.constant([i for _, _, i in self.raw], tf.int64),
        [B, self.width])}
    if self.weights:
      out[self.weight_key] = tf.SparseTensor(
          indices, tf.constant(self.weights, tf.float32), [B, self.width])
    return out

  def _norms(self, entries):
    norms = np.ones(B, np.float32)
    for b in range(B):
      w = np.array([e[3] for e in entries if e[0] == b], np.float32)
      if self.combiner == 'mean' and w.size:
        norms[b] = w.sum()
      elif self.combiner == 'sqrtn' and w.size:
        norms[b] = np.sqrt((w * w).sum())
    return norms

  def activation(self, table, tpu=True):
    """[B, D] (or [B, L, D] for a sequence feature) by hand."""
    entries = self.entries(tpu)
    if self.seq_len:
      out = np.zeros((B, self.seq_len, D), np.float32)
      for b, j, i, _ in entries:
        if j < self.seq_len:
          out[b, j] = table[i]
      return out
    out = np.zeros((B, D), np.float32)
    norms = self._norms(entries)
    for b, _, i, w in entries:
      out[b] += w * table[i] / norms[b]
    return out

  def row_grads(self, dact, tpu=True):
    """(ids, examples, grads) of every looked-up entry; grads by the chain rule."""
    entries = self.entries(tpu)
    ids, examples, grads = [], [], []
    if self.seq_len:
      for b, j, i, _ in entries:
        if j < self.seq_len:
          ids.append(i)
          examples.append(b)
          grads.append(dact[b, j])
    else:
      norms = self._norms(entries)
      for b, _, i, w in entries:
        ids.append(i)
        examples.append(b)
        grads.append(dact[b] * w / norms[b])
    return ids, examples, np.array(grads, np.float32).reshape(-1, D)


class Table:
  """The numpy model of one embedding-core table and its slots."""

  def __init__(self, name, init, params, feats):
    self.name, self.feats = name, feats
    # row_grads rounds at most as often as the engine: the norm's sqrt,
    # dact·w, / norm, the multiplier.
    self.want = oracle.ReferenceSteps(
        params, init, reference.init_slots(params, init.shape),
        gradient_roundings=oracle.ENGINE_GRADIENT_ROUNDINGS)

  @property
  def w(self):
    return self.want.table

  def step(self, dacts, lr, multiplier=1.0, tpu=True, num_shards=NS):
    """One TPU embedding update: `dacts` = {feature key: d(loss)/d(activation)}.

    The examples split evenly over `num_shards` cores, whose gradients apply
    as the optimizer's `use_gradient_accumulation` says (summed by default).
    """
    ids, cores, grads = [], [], []
    for feat in self.feats:
      i, examples, g = feat.row_grads(dacts[feat.key], tpu)
      ids += i
      cores += [b // (B // num_shards) for b in examples]
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


# Fixed data: duplicates inside and across examples, an empty example (2), id 0
# (a real id when sparse, dropped when dense on the TPU), gaps in positions.
A_SP = [(0, 0, 1), (0, 1, 3), (0, 2, 1), (1, 0, 5), (1, 2, 0), (3, 0, 3),
        (3, 1, 4)]
A_W = [0.5, 2.0, 1.5, 1.0, 3.0, 0.25, 2.0]
B_SP = [(0, 0, 2), (1, 0, 3), (1, 1, 3), (2, 0, 1), (3, 0, 5)]
D_DENSE = [[2, 0, 2], [0, 0, 0], [5, 1, 0], [3, 4, 0]]
# Sequence ids: id 1 only at position 2 >= L (truncated, never looked up).
S_SP = [(0, 0, 2), (0, 1, 5), (0, 2, 1), (1, 0, 4), (3, 0, 0), (3, 1, 3)]


def coefficients(seed, *shape):
  """The fixed d(loss)/d(out) per example: distinct, signed, non-trivial."""
  rng = np.random.RandomState(seed)
  return rng.uniform(-2.0, 2.0, (B,) + shape).round(2).astype(np.float32)


# The model_fn, input_fn and estimator a user writes. -------------------------


def make_model_fn(column_fn, layer='dense_features', reduction='sum',
                  model_optimizer=None, seen_batch_sizes=None):
  """A legacy TPUEstimator model_fn whose loss is linear in the activations.

  `column_fn() -> (dense columns, sequence columns)`.  Per example
  `sum((net + bias) * c) + sum(seq[:, :L] * cs)`; loss is their sum or mean.
  """

  def model_fn(features, labels, mode, params):
    del labels
    if seen_batch_sizes is not None:
      seen_batch_sizes.append(params['batch_size'])
    dense_columns, sequence_columns = column_fn()
    per_example, predictions = [], {}
    if dense_columns:
      if layer == 'dense_features':
        net = tf.keras.layers.DenseFeatures(dense_columns)(features)
      else:
        net = tf.compat.v1.feature_column.input_layer(features, dense_columns)
      bias = tf.compat.v1.get_variable(
          'bias', [net.shape[-1]], initializer=const_init(BIAS0))
      predictions['out'] = net + bias
      per_example.append(tf.reduce_sum(predictions['out'] * features['c'], 1))
    if sequence_columns:
      sequence, length = tf.keras.experimental.SequenceFeatures(
          sequence_columns)(features)
      predictions['seq'] = sequence[:, :L]
      predictions['seq_length'] = length
      per_example.append(
          tf.reduce_sum(predictions['seq'] * features['cs'], [1, 2]))
    per_example = tf.add_n(per_example)
    if mode == tpu_fc.ModeKeys.PREDICT:
      return tpu_fc.TPUEstimatorSpec(mode, predictions=predictions)
    loss = (tf.reduce_sum(per_example) if reduction == 'sum' else
            tf.reduce_mean(per_example))

    def metric_fn(per_example):
      return {'mean_per_example': tf.compat.v1.metrics.mean(per_example)}

    train_op = None
    if mode == tpu_fc.ModeKeys.TRAIN:
      optimizer = (model_optimizer() if model_optimizer else
                   tf.compat.v1.train.GradientDescentOptimizer(MODEL_LR))
      if params['use_tpu']:
        optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
      train_op = optimizer.minimize(
          loss, global_step=tf.compat.v1.train.get_global_step())
    return tpu_fc.TPUEstimatorSpec(mode, loss=loss, train_op=train_op,
                                   eval_metrics=(metric_fn, [per_example]))

  return model_fn


def make_input_fn(feats, c=None, cs=None, repeat=None):
  """The same fixed global batch, `repeat` times (None: forever)."""

  def input_fn(params):
    del params
    features = {}
    for feat in feats:
      features.update(feat.tensors())
    if c is not None:
      features['c'] = tf.constant(c)
    if cs is not None:
      features['cs'] = tf.constant(cs)
    dataset = tf.data.Dataset.from_tensors((features, tf.zeros([B, 1])))
    return dataset.repeat(repeat)

  return input_fn


def make_estimator(model_dir, model_fn, spec, use_tpu=True, num_shards=NS):
  return tpu_fc.TPUEstimator(
      model_fn=model_fn, model_dir=str(model_dir), use_tpu=use_tpu,
      config=tpu_fc.RunConfig(
          tf_random_seed=1, tpu_config=tpu_fc.TPUConfig(num_shards=num_shards)),
      train_batch_size=B, eval_batch_size=B, predict_batch_size=B,
      embedding_config_spec=spec)


def train_1_and_3(tmp_path, model_fn, spec, input_fn):
  """Estimators trained 1 and 3 steps, each in a fresh model_dir (one train call).

  (Resuming training from a use_tpu=True checkpoint is tested on its own:
  test_training_resumes_from_its_own_checkpoint.)
  """
  estimators = []
  for steps in (1, 3):
    estimator = make_estimator(tmp_path / 'steps{}'.format(steps), model_fn,
                               spec)
    estimator.train(input_fn, steps=steps)
    estimators.append(estimator)
  return estimators


def check_bias(estimator, c, steps, scale):
  """SGD on the bias: d(loss)/d(bias) = sum_b c[b] * scale every step."""
  expected = BIAS0 - steps * MODEL_LR * scale * c.sum(0)
  np.testing.assert_allclose(estimator.get_variable_value('bias'), expected,
                             **TOL)


# 1. Tables and slots after 1 and 3 steps: optimizers, combiners, input kinds. -

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
  """Trains one column 1 and 3 steps; checks table, slots, bias (and eval)."""
  init = init_table(1)
  sequence = bool(feat.seq_len)
  c = None if sequence else coefficients(0, D)
  cs = coefficients(1, L, D) if sequence else None

  def column_fn():
    column = feat.column(init)
    return ([], [column]) if sequence else ([column], [])

  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=sum(column_fn(), []),
                                    optimization_parameters=params)
  prefix = 'sequence_features' if sequence else layer
  table = Table('{}/{}/embedding_weights'.format(prefix, feat.column_name),
                init, params, [feat])
  # Sum loss, CrossShardOptimizer: each shard's loss is divided by NS.
  dact = (cs if sequence else c) / NS
  one, estimator = train_1_and_3(tmp_path, make_model_fn(column_fn, layer),
                                 spec, make_input_fn([feat], c, cs))
  table.step({feat.key: dact}, params.learning_rate)
  table.check(one, 1)
  for _ in range(2):
    table.step({feat.key: dact}, params.learning_rate)
  table.check(estimator, 3)
  assert estimator.get_variable_value('global_step') == 3
  if not sequence:
    check_bias(estimator, c, 3, 1.0 / NS)
  if evaluate:
    # The activations the model sees: eval loss from the trained tables.
    result = estimator.evaluate(make_input_fn([feat], c, cs, repeat=1),
                                steps=1)
    if sequence:
      per_example = (feat.activation(table.w) * cs).sum((1, 2))
    else:
      per_example = ((feat.activation(table.w) + BIAS0 -
                      3 * MODEL_LR / NS * c.sum(0)) * c).sum(1)
    np.testing.assert_allclose(result['mean_per_example'], per_example.mean(),
                               **TOL)
    # TF 2.15's TPU evaluation reports shard 0's loss (outputs_from_all_shards=False).
    np.testing.assert_allclose(result['loss'],
                               per_example[:len(per_example) // NS].sum(), **TOL)
  return estimator


@pytest.mark.parametrize('optimizer', sorted(OPTIMIZERS))
def test_optimizer_tables_and_slots_after_1_and_3_steps(tmp_path, optimizer):
  feat = Feat('a', A_SP, combiner='sum')
  estimator = run_single_table_case(tmp_path, feat, OPTIMIZERS[optimizer]())
  names = set(estimator.get_variable_names())
  table = 'dense_features/a_embedding/embedding_weights'
  expected_slots = {'{}/{}'.format(table, s) for s in
                    SLOT_SUFFIX[type(OPTIMIZERS[optimizer]()).__name__].values()}
  assert {n for n in names if n.startswith(table + '/')} == expected_slots
  assert not [n for n in names if 'tpu_embedding_dummy_table_variable' in n]


KINDS = {
    'sparse_mean': (Feat('a', A_SP, combiner='mean'), 'dense_features'),
    'sparse_sqrtn': (Feat('a', A_SP, combiner='sqrtn'), 'dense_features'),
    'dense_ids_mean': (Feat('a', D_DENSE, dense=True, combiner='mean'),
                       'dense_features'),
    'dense_ids_sum_input_layer': (Feat('a', D_DENSE, dense=True,
                                       combiner='sum'), 'input_layer'),
    'weighted_mean': (Feat('a', A_SP, weights=A_W, combiner='mean'),
                      'dense_features'),
    'weighted_sqrtn_input_layer': (Feat('a', A_SP, weights=A_W,
                                        combiner='sqrtn'), 'input_layer'),
    'sequence': (Feat('s', S_SP, seq_len=L), 'dense_features'),
}


@pytest.mark.parametrize('kind', sorted(KINDS))
def test_input_kinds_tables_after_1_and_3_steps_and_eval(tmp_path, kind):
  feat, layer = KINDS[kind]
  run_single_table_case(tmp_path, feat, tpu_fc.AdagradParameters(0.1), layer,
                        evaluate=True)


def test_shared_table_after_1_and_3_steps(tmp_path):
  """Two features on one shared table: their gradients add up."""
  init = init_table(2)
  fa = Feat('a', A_SP, combiner='mean')
  fb = Feat('b', B_SP, combiner='mean')
  params = tpu_fc.AdamParameters(0.05, beta1=0.5, beta2=0.8, epsilon=1e-3)

  def column_fn():
    return tpu_fc.shared_embedding_columns(
        [fa.categorical(), fb.categorical()], D, combiner='mean',
        initializer=const_init(init)), []

  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=column_fn()[0],
                                    optimization_parameters=params)
  c = coefficients(2, 2 * D)  # DenseFeatures: a_shared_embedding, b_shared_...
  one, estimator = train_1_and_3(tmp_path, make_model_fn(column_fn), spec,
                                 make_input_fn([fa, fb], c))
  dacts = {'a': c[:, :D] / NS, 'b': c[:, D:] / NS}
  table = Table('a_b_shared_embedding', init, params, [fa, fb])
  table.step(dacts, 0.05)
  table.check(one, 1)
  table.step(dacts, 0.05)
  table.step(dacts, 0.05)
  table.check(estimator, 3)
  check_bias(estimator, c, 3, 1.0 / NS)
  names = estimator.get_variable_names()
  assert not [n for n in names if 'embedding_weights' in n]


def test_truncated_sequence_ids_are_not_updated(tmp_path):
  """Id 1 occurs only at position 2 >= L: its row and slots stay untouched.

  FTRL recomputes w from its slots, so a zero-gradient "update" of a row that was
  never looked up would zero it (found and fixed in 253a3b7).
  """
  feat = Feat('s', S_SP, seq_len=L)
  init = init_table(20)
  params = tpu_fc.FtrlParameters(0.2)

  def column_fn():
    return [], [feat.column(init)]

  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=column_fn()[1],
                                    optimization_parameters=params)
  cs = coefficients(20, L, D)
  estimator = make_estimator(tmp_path, make_model_fn(column_fn), spec)
  estimator.train(make_input_fn([feat], cs=cs), steps=1)
  name = 'sequence_features/s_embedding/embedding_weights'
  np.testing.assert_array_equal(estimator.get_variable_value(name)[1], init[1])
  np.testing.assert_array_equal(
      estimator.get_variable_value(name + '/Ftrl_1')[1], np.zeros(D))
  expected = Table(name, init, params, [feat])
  expected.step({'s': cs / NS}, 0.2)
  expected.check(estimator, 1)


# 2. learning_rate_fn and experimental_gradient_multiplier_fn. ----------------


def test_learning_rate_fn_gets_the_pre_increment_global_step(tmp_path):
  """Step k uses fn(k - 1); a column without a fn uses the optimizer's rate."""
  fa = Feat('a', A_SP, combiner='sum')
  fb = Feat('b', B_SP, combiner='sum')
  init_a, init_b = init_table(3), init_table(4)

  def rate(step):
    return 0.1 + 0.05 * tf.cast(step, tf.float32)

  def rate_np(step):  # in float32, as rate
    return np.float32(0.1) + np.float32(0.05) * np.float32(step)

  def column_fn():
    return [fa.column(init_a, learning_rate_fn=rate), fb.column(init_b)], []

  params = tpu_fc.StochasticGradientDescentParameters(0.3)
  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=column_fn()[0],
                                    optimization_parameters=params)
  c = coefficients(3, 2 * D)
  one, estimator = train_1_and_3(tmp_path, make_model_fn(column_fn), spec,
                                 make_input_fn([fa, fb], c))
  table_a = Table('dense_features/a_embedding/embedding_weights', init_a,
                  params, [fa])
  table_b = Table('dense_features/b_embedding/embedding_weights', init_b,
                  params, [fb])
  dacts = {'a': c[:, :D] / NS, 'b': c[:, D:] / NS}
  table_a.step(dacts, rate_np(0))
  table_b.step(dacts, 0.3)
  table_a.check(one, 1)
  table_b.check(one, 1)
  for step in (1, 2):
    table_a.step(dacts, rate_np(step))
    table_b.step(dacts, 0.3)
  table_a.check(estimator, 3)
  table_b.check(estimator, 3)


def test_gradient_multiplier_fn_scales_every_embedding_gradient(tmp_path):
  feat = Feat('a', A_SP, combiner='mean')
  init = init_table(5)
  params = tpu_fc.AdagradParameters(0.1, initial_accumulator=0.1)

  def column_fn():
    return [feat.column(init)], []

  spec = tpu_fc.EmbeddingConfigSpec(
      feature_columns=column_fn()[0], optimization_parameters=params,
      experimental_gradient_multiplier_fn=(
          lambda step: 2.0 + tf.cast(step, tf.float32)))
  c = coefficients(5, D)
  one, estimator = train_1_and_3(tmp_path, make_model_fn(column_fn), spec,
                                 make_input_fn([feat], c))
  table = Table('dense_features/a_embedding/embedding_weights', init, params,
                [feat])
  table.step({'a': c / NS}, 0.1, multiplier=2.0)
  table.check(one, 1)
  table.step({'a': c / NS}, 0.1, multiplier=3.0)
  table.step({'a': c / NS}, 0.1, multiplier=4.0)
  table.check(estimator, 3)
  check_bias(estimator, c, 3, 1.0 / NS)  # the model's gradients are unscaled


# Dict configs: the optimizers TF 2.15's engine takes and its column spec
# refuses (with TF 2.15's own classes on the legacy lane), per table or for the
# spec.  The model reads the activation `features['a']` directly.

CLASSES = ['tpu_fc', pytest.param('tf_2_15', marks=pytest.mark.legacy_only)]


def dict_spec(classes, params, where, dim=D, learning_rate_fn=None):
  """Feature 'a' of table 't' (init_table(11)), trained by `params` given
  `where` ('table' or 'spec'), with `classes`' configs."""
  configs = tpu_fc if classes == 'tpu_fc' else lanes.tf_tpu_embedding
  table = configs.TableConfig(
      V, dim, combiner='sum', initializer=const_init(init_table(11)[:, :dim]),
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
    bias = tf.compat.v1.get_variable('bias', [net.shape[-1]],
                                     initializer=const_init(BIAS0))
    loss = tf.reduce_sum((net + bias) * features['c'])
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(MODEL_LR))
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
  feat = Feat('a', A_SP, combiner='sum')
  params = getattr(tpu_fc if classes == 'tpu_fc' else lanes.tf_tpu_embedding, name)(
      **DICT_ONLY[name])
  c = coefficients(11, D)
  one, estimator = train_1_and_3(
      tmp_path, dict_model_fn(), dict_spec(classes, params, where),
      make_input_fn([feat], c))
  table = Table('t', init_table(11), getattr(tpu_fc, name)(**DICT_ONLY[name]),
                [feat])
  table.step({'a': c / NS}, 0.1)
  table.check(one, 1)
  for _ in range(2):
    table.step({'a': c / NS}, 0.1)
  table.check(estimator, 3)
  check_bias(estimator, c, 3, 1.0 / NS)


@pytest.mark.parametrize('where', ['table', 'spec'])
@pytest.mark.parametrize('classes', CLASSES)
def test_dict_configs_estimate_lookup_frequencies(tmp_path, classes, where):
  """A FrequencyEstimator table (dimension 1, its rate the global step) after
  steps 0, 1 and 2: every looked-up id's estimate and last hit step."""
  feat = Feat('a', A_SP, combiner='sum')
  kwargs = dict(tau=0.25, max_delta=1.5, outlier_threshold=0.5,
                weight_exponent=1.0)
  params = (tpu_fc if classes == 'tpu_fc' else
            lanes.tf_tpu_embedding).FrequencyEstimatorParameters(**kwargs)
  spec = dict_spec(classes, params, where, dim=1,
                   learning_rate_fn=lambda step: tf.cast(step, tf.float32))
  one, estimator = train_1_and_3(tmp_path, dict_model_fn(stop_gradient=True),
                                 spec, make_input_fn([feat], coefficients(12, 1)))
  want = oracle.ReferenceSteps(
      tpu_fc.FrequencyEstimatorParameters(**kwargs), init_table(11)[:, :1],
      {'last_hit_step': np.zeros((V, 1), np.float32)})
  ids = np.array([i for _, _, i, _ in feat.entries()])
  for step, estimator_after in ((0, one), (1, None), (2, estimator)):
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


# 3. Shard counts. -----------------------------------------------------------


def test_num_shards_1_with_a_spec_is_refused(tmp_path):
  feat = Feat('a', A_SP)

  def column_fn():
    return [feat.column(init_table(0))], []

  spec = tpu_fc.EmbeddingConfigSpec(
      feature_columns=column_fn()[0],
      optimization_parameters=tpu_fc.AdagradParameters(0.1))
  with pytest.raises(ValueError) as error:
    make_estimator(tmp_path, make_model_fn(column_fn), spec, num_shards=1)
  assert str(error.value) == ('Setting TPUConfig.num_shards==1 is unsupported '
                              'when embedding_config_spec is not None.')


def test_mean_loss_on_any_number_of_shards(tmp_path):
  """CrossShardOptimizer + mean loss: d(loss)/d(act) = c / global batch on any
  number of shards; with gradient accumulation the tables are alike too."""
  fa = Feat('a', A_SP, combiner='mean')
  fw = Feat('w', B_SP, weights=[1.0, 0.5, 2.0, 1.5, 0.75], combiner='sqrtn')
  fs = Feat('s', S_SP, seq_len=L)
  inits = {'a': init_table(6), 'w': init_table(7), 's': init_table(8)}
  params = tpu_fc.FtrlParameters(0.2, l2_regularization_strength=0.1)

  def column_fn():
    return ([fa.column(inits['a']), fw.column(inits['w'])],
            [fs.column(inits['s'])])

  c = coefficients(6, 2 * D)   # a_embedding, w_weighted_by_w_w_embedding
  cs = coefficients(7, L, D)
  input_fn = make_input_fn([fa, fw, fs], c, cs)
  dacts = {'a': c[:, :D] / B, 'w': c[:, D:] / B, 's': cs / B}
  dense = {}
  for num_shards in (None, 2, 4):
    seen = []
    spec = tpu_fc.EmbeddingConfigSpec(feature_columns=sum(column_fn(), []),
                                      optimization_parameters=params)
    estimator = make_estimator(
        tmp_path / str(num_shards),
        make_model_fn(column_fn, reduction='mean', seen_batch_sizes=seen),
        spec, num_shards=num_shards)
    estimator.train(input_fn, steps=2)
    assert set(seen) == {B // (num_shards or 1)}, num_shards
    tables = [
        Table('dense_features/a_embedding/embedding_weights', inits['a'],
              params, [fa]),
        Table('dense_features/w_weighted_by_w_w_embedding/embedding_weights',
              inits['w'], params, [fw]),
        Table('sequence_features/s_embedding/embedding_weights', inits['s'],
              params, [fs]),
    ]
    for table in tables:
      for _ in range(2):
        table.step(dacts, 0.2, num_shards=num_shards or 1)
      table.check(estimator, 2)
    dense[num_shards] = {
        n: estimator.get_variable_value(n)
        for n in estimator.get_variable_names()
        if not any(n.startswith(table.name) for table in tables)}
    check_bias(estimator, c, 2, 1.0 / B)
  for num_shards in (2, 4):
    assert sorted(dense[num_shards]) == sorted(dense[None])
    for name, value in dense[None].items():
      np.testing.assert_allclose(dense[num_shards][name], value, rtol=1e-6,
                                 atol=1e-6, err_msg=name)


# 4. Evaluate and predict after training. -------------------------------------


def test_evaluate_is_inference_and_predict_uses_the_trained_tables(tmp_path):
  fa = Feat('a', A_SP, combiner='sqrtn', weights=A_W)
  fb = Feat('b', B_SP, combiner='sum')
  init_a, init_b = init_table(9), init_table(10)
  params = tpu_fc.AdagradParameters(0.3)

  def column_fn():
    return [fa.column(init_a), fb.column(init_b)], []

  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=column_fn()[0],
                                    optimization_parameters=params)
  estimator = make_estimator(tmp_path, make_model_fn(column_fn), spec)
  c = coefficients(9, 2 * D)
  estimator.train(make_input_fn([fa, fb], c), steps=2)
  names = ['dense_features/a_weighted_by_a_w_embedding/embedding_weights',
           'dense_features/b_embedding/embedding_weights', 'bias']
  before = {n: estimator.get_variable_value(n)
            for n in estimator.get_variable_names()}
  checkpoint = estimator.latest_checkpoint()
  table_a, table_b, bias = (before[n] for n in names)
  out = np.concatenate([fa.activation(table_a), fb.activation(table_b)],
                       1) + bias
  per_example = (out * c).sum(1)

  # Two batches: an update between them would change the second one's values.
  result = estimator.evaluate(make_input_fn([fa, fb], c, repeat=2), steps=2)
  assert result['global_step'] == 2
  np.testing.assert_allclose(result['mean_per_example'], per_example.mean(),
                             **TOL)
  # Loss: shard 0's sum loss, as TF 2.15's TPU evaluation reports it.
  np.testing.assert_allclose(result['loss'],
                             per_example[:len(per_example) // NS].sum(), **TOL)
  assert estimator.latest_checkpoint() == checkpoint
  after = {n: estimator.get_variable_value(n)
           for n in estimator.get_variable_names()}
  assert sorted(after) == sorted(before)
  for name, value in before.items():
    np.testing.assert_array_equal(after[name], value, err_msg=name)

  predictions = list(estimator.predict(make_input_fn([fa, fb], c, repeat=1)))
  assert len(predictions) == B
  np.testing.assert_allclose(np.stack([p['out'] for p in predictions]), out,
                             **TOL)


def test_predict_sequence_features_on_the_cpu(tmp_path):
  """Predict looks up on the CPU, ids from the trained table, the sequence cut
  at max_sequence_length first, as the TPU enqueues it: lengths capped."""
  fs = Feat('s', S_SP, seq_len=L)
  init = init_table(11)

  def column_fn():
    return [], [fs.column(init)]

  spec = tpu_fc.EmbeddingConfigSpec(
      feature_columns=column_fn()[1],
      optimization_parameters=tpu_fc.StochasticGradientDescentParameters(0.5))
  estimator = make_estimator(tmp_path, make_model_fn(column_fn), spec)
  cs = coefficients(11, L, D)
  input_fn = make_input_fn([fs], cs=cs)
  estimator.train(input_fn, steps=1)
  table = estimator.get_variable_value(
      'sequence_features/s_embedding/embedding_weights')
  predictions = list(estimator.predict(make_input_fn([fs], cs=cs, repeat=1)))
  assert len(predictions) == B
  np.testing.assert_allclose(np.stack([p['seq'] for p in predictions]),
                             fs.activation(table), **TOL)
  # Last index + 1 (3, 1, 0, 2), capped at L = 2.
  assert L == 2
  assert [int(p['seq_length']) for p in predictions] == [2, 1, 0, 2]


# 5. Which optimizer trains the tables. ---------------------------------------


def test_model_optimizer_does_not_train_embedding_core_tables(tmp_path):
  """use_tpu=True: the spec's SGD trains the table, the model's Momentum does not."""
  feat = Feat('a', A_SP, combiner='sum')
  init = init_table(12)
  params = tpu_fc.StochasticGradientDescentParameters(0.1)

  def column_fn():
    return [feat.column(init)], []

  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=column_fn()[0],
                                    optimization_parameters=params)
  estimator = make_estimator(
      tmp_path, make_model_fn(
          column_fn, model_optimizer=lambda: tf.compat.v1.train.MomentumOptimizer(
              MODEL_LR, 0.9)), spec)
  c = coefficients(12, D)
  estimator.train(make_input_fn([feat], c), steps=2)
  table = Table('dense_features/a_embedding/embedding_weights', init, params,
                [feat])
  table.step({'a': c / NS}, 0.1)
  table.step({'a': c / NS}, 0.1)
  table.check(estimator, 2)
  names = set(estimator.get_variable_names())
  assert names == {'global_step', 'bias', 'bias/Momentum',
                   'dense_features/a_embedding/embedding_weights'}
  # Momentum on the bias: m = 0.9 m + g; b -= lr m, with g = sum(c) / NS.
  g = c.sum(0) / NS
  np.testing.assert_allclose(estimator.get_variable_value('bias/Momentum'),
                             1.9 * g, **TOL)
  np.testing.assert_allclose(estimator.get_variable_value('bias'),
                             BIAS0 - MODEL_LR * (g + 1.9 * g), **TOL)


def test_cpu_model_optimizer_trains_tables_and_the_spec_is_ignored(tmp_path):
  """use_tpu=False: TF 2.15's CPU TPUEstimator; Momentum trains the table."""
  feat = Feat('a', D_DENSE, dense=True, combiner='mean')
  init = init_table(13)

  def column_fn():
    return [feat.column(init)], []

  spec = tpu_fc.EmbeddingConfigSpec(
      feature_columns=column_fn()[0],
      optimization_parameters=tpu_fc.AdagradParameters(0.1))
  estimator = make_estimator(
      tmp_path, make_model_fn(
          column_fn, model_optimizer=lambda: tf.compat.v1.train.MomentumOptimizer(
              MODEL_LR, 0.9)), spec, use_tpu=False)
  c = coefficients(13, D)
  estimator.train(make_input_fn([feat], c), steps=2)
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
                             momentum, **TOL)
  np.testing.assert_allclose(estimator.get_variable_value(name),
                             init - MODEL_LR * (g + momentum), **TOL)


# 6. Checkpoint names and cross-restore. --------------------------------------


def test_checkpoint_names_match_between_tpu_and_cpu(tmp_path):
  """DenseFeatures, shared, input_layer and sequence: same names both ways."""
  fa = Feat('a', A_SP)
  fb, fc_ = Feat('p', B_SP), Feat('q', A_SP)
  fd = Feat('d', B_SP, weights=[1.0, 0.5, 2.0, 1.5, 0.75])
  fs = Feat('s', S_SP, seq_len=L)

  def column_fn():
    shared = tpu_fc.shared_embedding_columns(
        [fb.categorical(), fc_.categorical()], D,
        initializer=const_init(init_table(1)))
    return ([fa.column(init_table(0))] + shared, [fd.column(init_table(2))],
            [fs.column(init_table(3))])

  def model_fn(features, labels, mode, params):
    del labels
    dense_columns, v1_columns, sequence_columns = column_fn()
    net = tf.concat([
        tf.keras.layers.DenseFeatures(dense_columns)(features),
        tf.compat.v1.feature_column.input_layer(features, v1_columns)], 1)
    sequence, _ = tf.keras.experimental.SequenceFeatures(sequence_columns)(
        features)
    bias = tf.compat.v1.get_variable('bias', [4 * D],
                                     initializer=const_init(BIAS0))
    loss = (tf.reduce_sum((net + bias) * features['c']) +
            tf.reduce_sum(sequence[:, :L] * features['cs']))
    optimizer = tf.compat.v1.train.AdagradOptimizer(0.1)
    if params['use_tpu']:
      optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
    return tpu_fc.TPUEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(
        loss, global_step=tf.compat.v1.train.get_global_step()))

  spec = tpu_fc.EmbeddingConfigSpec(
      feature_columns=sum(column_fn(), []),
      optimization_parameters=tpu_fc.AdagradParameters(0.1))
  input_fn = make_input_fn([fa, fb, fc_, fd, fs], coefficients(14, 4 * D),
                           coefficients(15, L, D))
  names = {}
  for use_tpu in (True, False):
    estimator = make_estimator(tmp_path / str(use_tpu), model_fn, spec,
                               use_tpu=use_tpu)
    estimator.train(input_fn, steps=1)
    names[use_tpu] = set(estimator.get_variable_names())
  tables = {'dense_features/a_embedding/embedding_weights',
            'p_q_shared_embedding',
            'input_layer/d_weighted_by_d_w_embedding/embedding_weights',
            'sequence_features/s_embedding/embedding_weights'}
  assert names[True] == names[False]
  assert names[True] == (tables | {t + '/Adagrad' for t in tables} |
                         {'bias', 'bias/Adagrad', 'global_step'})


def test_training_resumes_from_its_own_checkpoint(tmp_path):
  """train(steps=1) twice in one model_dir == 2 steps.

  Failed at 253a3b7 ("Variables not initialized:
  tpu_embedding_dummy_table_variable_tbl_a": the dummy variables were left out
  of the Saver, so nothing initialized them when the session restored).
  """
  feat = Feat('a', A_SP, combiner='sum')
  init = init_table(19)
  params = tpu_fc.AdagradParameters(0.1)

  def column_fn():
    return [feat.column(init)], []

  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=column_fn()[0],
                                    optimization_parameters=params)
  c = coefficients(19, D)
  input_fn = make_input_fn([feat], c)
  estimator = make_estimator(tmp_path, make_model_fn(column_fn), spec)
  estimator.train(input_fn, steps=1)
  estimator.train(input_fn, steps=1)
  table = Table('dense_features/a_embedding/embedding_weights', init, params,
                [feat])
  table.step({'a': c / NS}, 0.1)
  table.step({'a': c / NS}, 0.1)
  table.check(estimator, 2)
  check_bias(estimator, c, 2, 1.0 / NS)


@pytest.mark.parametrize('order', ['cpu_then_tpu', 'tpu_then_cpu'])
def test_cross_restore_between_cpu_and_tpu_adagrad(tmp_path, order):
  """A model_dir trained one way continues the other way from its tables and slots.

  Mean loss, so d(loss)/d(act) = c / B on both; model Adagrad (CPU) and spec
  AdagradParameters (TPU) apply the same rule, so 2 steps = 2 reference steps
  (one update each, the TPU's gradients accumulated over its cores).
  """
  feat = Feat('a', A_SP, combiner='mean')
  init = init_table(16)
  params = tpu_fc.AdagradParameters(0.2, initial_accumulator=0.1)

  def column_fn():
    return [feat.column(init)], []

  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=column_fn()[0],
                                    optimization_parameters=params)
  model_fn = make_model_fn(
      column_fn, reduction='mean',
      model_optimizer=lambda: tf.compat.v1.train.AdagradOptimizer(
          0.2, initial_accumulator_value=0.1))
  c = coefficients(16, D)
  input_fn = make_input_fn([feat], c)
  table = Table('dense_features/a_embedding/embedding_weights', init, params,
                [feat])
  accumulator = np.full(D, 0.1, np.float32)
  bias = np.full(D, BIAS0, np.float32)
  modes = [False, True] if order == 'cpu_then_tpu' else [True, False]
  for step, use_tpu in enumerate(modes, 1):
    estimator = make_estimator(tmp_path, model_fn, spec, use_tpu=use_tpu)
    estimator.train(input_fn, steps=1)
    table.step({'a': c / B}, 0.2, num_shards=NS if use_tpu else 1)
    table.check(estimator, step)
    g = c.sum(0) / B
    accumulator = accumulator + g * g
    bias = bias - 0.2 * g / np.sqrt(accumulator)
    np.testing.assert_allclose(estimator.get_variable_value('bias'), bias,
                               **TOL)
    assert estimator.get_variable_value('global_step') == step


# 7. Tensor-core columns: densified, trained by the model optimizer. ----------


@pytest.mark.parametrize('combiner', ['sum', 'mean'])
def test_tensor_core_column_is_trained_by_the_model_optimizer(tmp_path,
                                                              combiner):
  width = 2
  # Entries at position >= width are truncated; id 0 is real; (2, 1, 3) keeps
  # a position-1 id in a row with no position 0.
  ft = Feat('t', [(0, 0, 1), (0, 1, 4), (0, 2, 4), (1, 0, 0), (2, 1, 3),
                  (2, 2, 5), (3, 0, 2), (3, 1, 2)], combiner=combiner)
  fa = Feat('a', A_SP, combiner='sum')
  init_a, init_t = init_table(17), init_table(18)
  params = tpu_fc.AdagradParameters(0.1)

  def column_fn():
    tensor_core = tpu_fc.embedding_column(
        ft.categorical(), D, combiner=combiner, initializer=const_init(init_t),
        embedding_lookup_device='tpu_tensor_core',
        tensor_core_shape=[None, width])
    return [fa.column(init_a), tensor_core], []

  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=column_fn()[0],
                                    optimization_parameters=params)
  assert [col.name for col in spec.tensor_core_feature_columns] == [
      't_embedding']
  estimator = make_estimator(tmp_path, make_model_fn(column_fn), spec)
  c = coefficients(17, 2 * D)   # a_embedding, t_embedding
  input_fn = make_input_fn([fa, ft], c)
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
  expected_t = init_t - MODEL_LR * g
  np.testing.assert_allclose(estimator.get_variable_value(name_t), expected_t,
                             **TOL)
  table_a = Table(name_a, init_a, params, [fa])
  table_a.step({'a': c[:, :D] / NS}, 0.1)
  table_a.check(estimator, 1)

  # Evaluate sees the truncated, combined lookup of the trained variable.
  result = estimator.evaluate(make_input_fn([fa, ft], c, repeat=1), steps=1)
  act_t = np.zeros((B, D), np.float32)
  for b, _, i in kept:
    act_t[b] += expected_t[i] / norms[b]
  out = np.concatenate([fa.activation(table_a.w), act_t], 1) + (
      BIAS0 - MODEL_LR / NS * c.sum(0))
  np.testing.assert_allclose(result['mean_per_example'],
                             (out * c).sum(1).mean(), **TOL)


# 8. A legacy script, unchanged, through `python -m tpu_fc run`. --------------

LEGACY_SCRIPT = '''
"""A TPUEstimator script written for TF 2.15: legacy names only."""
import json
import sys

import numpy as np
import tensorflow.compat.v1 as tf

VOCAB, DIM, BATCH = 10, 4, 8
rng = np.random.RandomState(0)
IDS = rng.randint(0, VOCAB, size=(32, 2)).astype(np.int64)
X = rng.normal(size=(32, 1)).astype(np.float32)
Y = (IDS[:, :1] % 2).astype(np.float32)


def columns():
  ids = tf.feature_column.categorical_column_with_identity('ids', VOCAB)
  return [tf.tpu.experimental.embedding_column(ids, DIM, combiner='mean')]


def make_input_fn(repeat, n=32):
  def input_fn(params):
    data = tf.data.Dataset.from_tensor_slices(({'ids': IDS[:n], 'x': X[:n]},
                                               Y[:n]))
    if repeat:
      data = data.repeat()
    data = data.batch(params['batch_size'], drop_remainder=True)
    def to_sparse(features, labels):
      features = dict(features)
      features['ids'] = tf.RaggedTensor.from_tensor(features['ids']).to_sparse()
      return features, labels
    return data.map(to_sparse)
  return input_fn


def model_fn(features, labels, mode, params):
  net = tf.feature_column.input_layer(features, columns())
  net = tf.concat([net, features['x']], 1)
  logits = tf.layers.dense(net, 1)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.tpu.TPUEstimatorSpec(
        mode, predictions={'probability': tf.sigmoid(logits)})
  loss = tf.losses.sigmoid_cross_entropy(labels, logits)
  optimizer = tf.train.AdagradOptimizer(0.1)
  if params['use_tpu']:
    optimizer = tf.tpu.CrossShardOptimizer(optimizer)
  train_op = optimizer.minimize(loss, global_step=tf.train.get_global_step())

  def metric_fn(labels, logits):
    return {'accuracy': tf.metrics.accuracy(
        labels, tf.cast(logits > 0, tf.float32))}
  return tf.estimator.tpu.TPUEstimatorSpec(
      mode, loss=loss, train_op=train_op,
      eval_metrics=(metric_fn, [labels, logits]))


spec = tf.estimator.tpu.experimental.EmbeddingConfigSpec(
    feature_columns=columns(),
    optimization_parameters=tf.tpu.experimental.AdagradParameters(0.1))
config = tf.estimator.tpu.RunConfig(
    model_dir=sys.argv[2],
    tpu_config=tf.estimator.tpu.TPUConfig(num_shards=2))
estimator = tf.estimator.tpu.TPUEstimator(
    model_fn=model_fn, config=config, use_tpu=True, train_batch_size=BATCH,
    eval_batch_size=BATCH, predict_batch_size=BATCH,
    embedding_config_spec=spec)
estimator.train(make_input_fn(True), max_steps=5)
metrics = estimator.evaluate(make_input_fn(False), steps=2)
predictions = list(estimator.predict(make_input_fn(False, n=16)))
with open(sys.argv[1], 'w') as f:
  json.dump({
      'loss': float(metrics['loss']),
      'accuracy': float(metrics['accuracy']),
      'global_step': int(metrics['global_step']),
      'num_predictions': len(predictions),
      'probabilities': [float(p['probability'][0]) for p in predictions],
      'estimator': type(estimator).__module__,
      'variables': estimator.get_variable_names(),
  }, f)
'''


def test_legacy_script_runs_unchanged(tmp_path):
  script = tmp_path / 'legacy_train.py'
  script.write_text(textwrap.dedent(LEGACY_SCRIPT))
  out = tmp_path / 'result.json'
  env = dict(os.environ)
  env['PYTHONPATH'] = REPO + os.pathsep + env.get('PYTHONPATH', '')
  proc = subprocess.run(
      [sys.executable, '-m', 'tpu_fc', 'run', str(script), str(out),
       str(tmp_path / 'model')],
      env=env, cwd=str(tmp_path), capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-4000:]
  result = json.loads(out.read_text())
  assert np.isfinite(result['loss'])
  assert 0.0 <= result['accuracy'] <= 1.0
  assert result['global_step'] == 5
  assert result['num_predictions'] == 16
  assert all(0.0 < p < 1.0 for p in result['probabilities'])
  assert result['estimator'].startswith('tpu_fc.')
  assert 'input_layer/ids_embedding/embedding_weights' in result['variables']
  assert 'input_layer/ids_embedding/embedding_weights/Adagrad' in (
      result['variables'])
