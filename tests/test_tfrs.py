"""tensorflow-recommenders' `TPUEmbedding` layer after `install()`: trained on
the CPU by its embedding optimizer's TPU rule, whatever the model compiles with.

The expected values are numpy, derived here by hand from the TPU's rules as
TF documents them (`tf.tpu.experimental.embedding.SGD`, `Adagrad`, `Adam`,
`FTRL`), not from tpu_fc; each comparison also rejects the model optimizer's
rule on the rows, which TFRS's own layer applies on the CPU (shown too).
TFRS runs on the latest lane only.
"""
import functools
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import tpu_fc
from tpu_fc import checkpoint_conversion as conversion
from tpu_fc import local_network
from tpu_fc._tf import tf

from harness import covering
from harness import mid_level
from harness import scripts
from harness.checkpoints import OPTIMIZERS, checkpoint_values, make_spec, train

tfrs = pytest.importorskip('tensorflow_recommenders')
from tpu_fc import tfrs as tpu_fc_tfrs  # pylint: disable=g-import-not-at-top,g-bad-import-order
from harness.tfrs import (ADAGRAD_START, ADAM, DIM, FTRL, IDS, KERAS_EPSILON,  # pylint: disable=g-import-not-at-top,g-bad-import-order
                          KERNEL, LABELS, MODEL_LR, OPTIMIZER_ARGS, DENSE_X,
                          START, VOCAB, embedding, guide_data, guide_model,
                          sparse_ids)

TOL = dict(rtol=1e-5, atol=1e-6)  # float32 of a few terms, two steps

# The embedding optimizers' TPU rules by hand: one row's (w, slots, summed
# gradient g) -> (w, slots); slots start as given.


def tpu_sgd(w, slots, g):
  return w - 0.1 * g, slots


def tpu_adagrad(w, slots, g, lr=0.1):
  a = slots['accumulators'] + g * g
  return w - lr * g / np.sqrt(a), {'accumulators': a}


def tpu_adam(w, slots, g):
  """Lazy Adam without bias correction, epsilon inside the root."""
  m = ADAM['beta_1'] * slots['momenta'] + (1 - ADAM['beta_1']) * g
  v = ADAM['beta_2'] * slots['velocities'] + (1 - ADAM['beta_2']) * g * g
  return (w - ADAM['learning_rate'] * m / np.sqrt(v + ADAM['epsilon'] ** 2),
          {'momenta': m, 'velocities': v})


def tpu_ftrl(w, slots, g):
  lr, l1, l2 = (FTRL['learning_rate'], FTRL['l1_regularization_strength'],
                FTRL['l2_regularization_strength'])
  a, a_new = slots['accumulators'], slots['accumulators'] + g * g
  linear = slots['linears'] + g - (np.sqrt(a_new) - np.sqrt(a)) / lr * w
  quadratic = (np.sqrt(a_new) + FTRL['beta']) / lr + 2 * l2
  w = np.where(np.abs(linear) > l1, (np.sign(linear) * l1 - linear) / quadratic,
               0.0)
  return w, {'accumulators': a_new, 'linears': linear}


def keras_adagrad(w, slots, g, lr=MODEL_LR):
  """The model's optimizer, `tf.keras.optimizers.legacy.Adagrad`."""
  a = slots['accumulators'] + g * g
  return w - lr * g / (np.sqrt(a) + KERAS_EPSILON), {'accumulators': a}


TPU_RULES = {
    'sgd': (tpu_sgd, {}),
    'adagrad': (tpu_adagrad, {'accumulators': 0.2}),
    'adam': (tpu_adam, {'momenta': 0.0, 'velocities': 0.0}),
    'ftrl': (tpu_ftrl, {'accumulators': 0.1, 'linears': 0.0}),
}
MODEL_RULE = (keras_adagrad, {'accumulators': ADAGRAD_START})


class NumpyTable:
  """A table and its slots trained by `rule` on the rows it gets gradients of."""

  def __init__(self, rule, slot_starts, start=START):
    self.rule = rule
    self.w = np.array(start, np.float64)
    self.slots = {name: np.full_like(self.w, value)
                  for name, value in slot_starts.items()}

  def step(self, row_gradients):
    for row, g in row_gradients.items():
      self.w[row], slots = self.rule(
          self.w[row], {k: v[row] for k, v in self.slots.items()}, g)
      for name, value in slots.items():
        self.slots[name][row] = value


def gradients(dense_x, features, kernel, bias):
  """The guide's model by hand: MSE of `Dense(1)` over the dense features
  (may be None) then each feature's mean of its rows.  Returns ({feature:
  {row: d(loss)/d(row)}}, d(loss)/d(kernel), d(loss)/d(bias)); `features`
  is {feature: (ids per example, table)}."""
  parts = [] if dense_x is None else [dense_x]
  parts += [np.stack([table.w[ids].mean(0) for ids in examples])
            for examples, table in features.values()]
  x = np.concatenate(parts, 1)
  dy = 2 * (x @ kernel + bias - LABELS) / len(LABELS)
  row_gradients, column = {}, x.shape[1] - DIM * len(features)
  for name, (examples, _) in features.items():
    rows = row_gradients.setdefault(name, {})
    for b, ids in enumerate(examples):
      for row in ids:
        rows[row] = rows.get(row, 0) + dy[b, 0] * kernel[
            column:column + DIM, 0] / len(ids)
    column += DIM
  return row_gradients, x.T @ dy, dy.sum(0)


def expected_guide(rule, steps=2):
  """(table, dense kernel, bias) of the guide's model after `steps` steps:
  the table by `rule`, the dense layer by the model's Adagrad."""
  table = NumpyTable(*rule)
  kernel, bias = KERNEL, np.zeros(1)
  kernel_slots = {'accumulators': np.full_like(kernel, ADAGRAD_START)}
  bias_slots = {'accumulators': np.full_like(bias, ADAGRAD_START)}
  for _ in range(steps):
    rows, d_kernel, d_bias = gradients(
        DENSE_X, {'sparse_input': (IDS, table)}, kernel, bias)
    table.step(rows['sparse_input'])
    kernel, kernel_slots = keras_adagrad(kernel, kernel_slots, d_kernel)
    bias, bias_slots = keras_adagrad(bias, bias_slots, d_bias)
  return table, kernel, bias


def fit(model, steps=2):
  features, labels = guide_data()
  model.fit(tf.data.Dataset.from_tensors((features, labels)).repeat(steps),
            epochs=1, steps_per_epoch=steps, verbose=0)


def custom_loop(model, steps=2):
  """A `GradientTape` loop: every trainable weight's gradient, applied by
  the model's optimizer."""
  features, labels = guide_data()
  mse = tf.keras.losses.MeanSquaredError()

  @tf.function
  def step():
    with tf.GradientTape() as tape:
      loss = mse(labels, model(features))
    grads = tape.gradient(loss, model.trainable_variables)
    model.optimizer.apply_gradients(zip(grads, model.trainable_variables))

  for _ in range(steps):
    step()


def layer_state(layer):
  """{'table' or slot name: value} of the layer's one table."""
  variables = layer._tpu_embedding._variables  # pylint: disable=protected-access
  (table,) = variables
  return {('table' if name == 'parameters' else name): variable.numpy()
          for name, variable in variables[table].items()}


def assert_trained_by(state, want, wrong):
  """`state` is `want` (a NumpyTable) within TOL, and the table is beyond TOL
  of `wrong`'s (the bound catches a wrong rule)."""
  np.testing.assert_allclose(state.pop('table'), want.w, **TOL)
  assert sorted(state) == sorted(want.slots)
  for name, value in state.items():
    np.testing.assert_allclose(value, want.slots[name], err_msg=name, **TOL)
  assert not np.allclose(want.w, wrong.w, **TOL)


@pytest.fixture(name='installed')
def _installed():
  tpu_fc.install()
  yield
  tpu_fc.uninstall()


# Optimizer x (model.fit or a custom loop) x (one replica or two): a pairwise
# covering design, every optimizer with both ways of training and both replica
# counts, every way of training on both, in 8 runs instead of the product's 16.
# The layer applies its optimizer's rule in one update whichever loop computed
# the gradient on however many replicas, so a rule wrong under one factor
# level fails the cases that have that level.
@pytest.mark.parametrize('name, train_by, replicas',
                         covering.LAYER_TRAININGS)
def test_the_guides_program_trains_by_the_embedding_optimizers_tpu_rule(
    installed, name, train_by, replicas, tmp_path):
  """Two steps of the guide's model, its embedding optimizer not the model's:
  the table and slots by that optimizer's TPU rule, the dense layer by the
  model's Adagrad; not the model's rule on the rows.  On two replicas
  (MirroredStrategy over two devices, each replica a TPU core with one example
  of each global batch) the same, as one replica on the same batches: one
  copy of the table, whose checkpoint restores into a one-replica model."""
  del installed
  cls, args = OPTIMIZER_ARGS[name]
  if replicas == 1:
    model, layer = guide_model(cls(**args))
    {'fit': fit, 'loop': custom_loop}[train_by](model)
  else:
    strategy = mid_level.mirrored()
    with strategy.scope():
      model, layer = guide_model(cls(**args), batch_size=None)
    if train_by == 'fit':
      fit(model)
    else:
      replicated_loop(strategy, model)
  assert isinstance(layer, tpu_fc_tfrs.TPUEmbedding)
  want, kernel, bias = expected_guide(TPU_RULES[name])
  wrong, _, _ = expected_guide(MODEL_RULE)
  state = layer_state(layer)
  assert_trained_by(dict(state), want, wrong)
  dense = model.layers[-1]
  np.testing.assert_allclose(dense.kernel.numpy(), kernel, **TOL)
  np.testing.assert_allclose(dense.bias.numpy(), bias, **TOL)
  if replicas == 1:
    return
  for variable in layer._tpu_embedding._variables['table'].values():  # pylint: disable=protected-access
    assert len(strategy.experimental_local_results(variable)) == 1
  saved = tpu_fc_tfrs.save(layer, str(tmp_path), global_step=2)
  _, single = guide_model(cls(**args))
  assert tpu_fc_tfrs.restore(single, saved) == 2
  for key, value in layer_state(single).items():
    np.testing.assert_array_equal(value, state[key], err_msg=key)


def test_the_guides_program_as_written(installed, tmp_path):
  """One Keras Adagrad for the model and the layer, as the guide has it: TFRS
  translates it for the layer (its learning rate and initial accumulator)
  and the Keras optimizer holds the table's accumulators; the table trains by
  the TPU's Adagrad, and its slots save and restore with it."""
  del installed
  optimizer = tf.keras.optimizers.legacy.Adagrad(learning_rate=MODEL_LR)
  model, layer = guide_model(optimizer, model_optimizer=optimizer)
  fit(model)
  want, kernel, _ = expected_guide((functools.partial(tpu_adagrad, lr=MODEL_LR),
                                    {'accumulators': ADAGRAD_START}))
  state = layer_state(layer)
  np.testing.assert_allclose(state['table'], want.w, **TOL)
  np.testing.assert_allclose(state['accumulators'],
                             want.slots['accumulators'], **TOL)
  np.testing.assert_allclose(model.layers[-1].kernel.numpy(), kernel, **TOL)
  slot = layer._tpu_embedding._variables['table']['accumulators']  # pylint: disable=protected-access
  assert any(variable is slot for variable in optimizer.variables())
  saved = tpu_fc_tfrs.save(layer, str(tmp_path), global_step=2)
  _, fresh = guide_model(tf.keras.optimizers.legacy.Adagrad(MODEL_LR))
  assert tpu_fc_tfrs.restore(fresh, saved) == 2
  for name, value in layer_state(fresh).items():
    np.testing.assert_array_equal(value, state[name], err_msg=name)


def test_the_guides_program_compiled_by_xla_trains_by_the_tpu_rule(installed):
  """`model.compile(jit_compile=True)`: XLA compiles the step with the
  emulated lookup and update in it (a TPU compiles everything), and the table
  trains by the embedding optimizer's TPU rule as without it."""
  del installed
  model, layer = guide_model(embedding.Adagrad(**OPTIMIZER_ARGS['adagrad'][1]))
  model.compile(model.optimizer, 'mse', jit_compile=True)
  fit(model)
  want, kernel, _ = expected_guide(TPU_RULES['adagrad'])
  assert_trained_by(layer_state(layer), want, expected_guide(MODEL_RULE)[0])
  np.testing.assert_allclose(model.layers[-1].kernel.numpy(), kernel, **TOL)


def test_tfrs_ranking_model_crosses_activations_of_static_shape(installed):
  """TFRS's `Ranking` squeezes the activations and crosses their
  concatenation, which needs their static shape: the batch the dataset
  gives (drop_remainder), as a TPU's dequeue gives it."""
  del installed
  tables = {str(i): embedding.FeatureConfig(table=embedding.TableConfig(
      vocabulary_size=5, dim=4, name='t{}'.format(i))) for i in range(2)}
  model = tfrs.experimental.models.Ranking(
      embedding_layer=tfrs.experimental.layers.embedding.PartialTPUEmbedding(
          feature_config=tables, optimizer=embedding.SGD(0.1),
          size_threshold=0),
      feature_interaction=tf.keras.Sequential([
          tf.keras.layers.Concatenate(), tfrs.layers.feature_interaction.Cross()
      ]))
  model.compile(optimizer=tf.keras.optimizers.legacy.Adam())
  ids = {key: tf.constant([1, 2, 3, 4]) for key in tables}
  data = tf.data.Dataset.from_tensors(({'dense_features': tf.ones([4, 3]),
                                        'sparse_features': ids},
                                       tf.constant([0, 1, 1, 0]))).repeat(2)
  before = {key: table.numpy() for key, table in tables_by_name(model).items()}
  model.fit(data, verbose=0)
  for key, table in tables_by_name(model).items():
    assert not np.allclose(table.numpy()[1:], before[key][1:]), key


def tables_by_name(model):
  layer = model._embedding_layer  # pylint: disable=protected-access
  return {config.name: table
          for config, table in layer.tpu_embedding.embedding_tables.items()}


def replicated_loop(strategy, model, steps=2):
  """TF's custom loop on several replicas: `strategy.run` of each replica's
  step on its share of the global batches, its loss scaled by
  `compute_average_loss` to the global batch."""
  dataset = tf.data.Dataset.from_tensors(guide_data()).repeat(steps)
  batches = iter(strategy.experimental_distribute_dataset(dataset))

  def replica_step(features, labels):
    with tf.GradientTape() as tape:
      loss = tf.nn.compute_average_loss(
          tf.keras.losses.mean_squared_error(labels, model(features)),
          global_batch_size=len(IDS))
    grads = tape.gradient(loss, model.trainable_variables)
    model.optimizer.apply_gradients(zip(grads, model.trainable_variables))

  step = tf.function(lambda batch: strategy.run(replica_step, args=batch))
  for _ in range(steps):
    step(next(batches))


@pytest.mark.subprocess
def test_the_guides_program_on_two_machines_trains_as_on_one():
  """MultiWorkerMirroredStrategy, two worker processes (TF's collectives on
  a loopback of their own; killed if they outlive 4 minutes), one example of
  each global batch each: both end with the same table and slots, those of
  one replica on the same batches (the TPU's SGD by hand), one copy each."""
  holder = local_network.holder()
  if holder.pid is None:
    pytest.skip('no network namespace on this machine: ' + holder.reason)
  cluster = {'worker': ['127.0.0.1:{}'.format(port) for port in (23456,
                                                                  23457)]}
  workers = [scripts.popen_python(
      local_network.task_command(
          [sys.executable, os.path.join(scripts.SCRIPTS,
                                        'multi_worker_tfrs.py'), 'sgd', '3'],
          holder.pid)[1:],
      env=scripts.env(TF_CONFIG=json.dumps(
          {'cluster': cluster, 'task': {'type': 'worker', 'index': index}})),
      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for index in range(2)]
  try:
    outputs = [worker.communicate(timeout=240) for worker in workers]
  finally:
    for worker in workers:
      worker.kill()
    holder.stop()
  for worker, (_, stderr) in zip(workers, outputs):
    assert worker.returncode == 0, stderr[-3000:]
  first, second = [json.loads(stdout.splitlines()[-1])
                   for stdout, _ in outputs]
  assert first == second
  want, kernel, _ = expected_guide(TPU_RULES['sgd'], steps=3)
  assert first.pop('copies') == [1]
  np.testing.assert_allclose(first['table'], want.w, **TOL)
  np.testing.assert_allclose(first['kernel'], kernel, **TOL)


def test_tfrs_own_layer_trains_its_table_by_the_models_optimizer():
  """Without tpu_fc (the bug): TFRS's layer on the CPU hands its table to the
  model's Adagrad, its SGD ignored: what the test above rejects."""
  model, layer = guide_model(embedding.SGD(learning_rate=0.1),
                             tfrs.layers.embedding.TPUEmbedding)
  assert not isinstance(layer, tpu_fc_tfrs.TPUEmbedding)
  fit(model)
  (table,) = layer.embedding_tables.values()
  wrong, _, _ = expected_guide(MODEL_RULE)
  np.testing.assert_allclose(table.numpy(), wrong.w, **TOL)
  want, _, _ = expected_guide(TPU_RULES['sgd'])
  assert not np.allclose(table.numpy(), want.w, **TOL)


class TwoTables(tf.keras.Model):
  """A subclassed model whose `call` takes no `training`: features a and b
  on tables of their own, a frozen Dense(1) on their activations."""

  def __init__(self, feature_config, optimizer):
    super().__init__()
    self.feature_config = feature_config  # (serving_config takes it)
    self.embedding = tpu_fc_tfrs.TPUEmbedding(feature_config, optimizer)
    self.dense = tf.keras.layers.Dense(
        1, kernel_initializer=tf.constant_initializer(KERNEL[:4]),
        trainable=False)

  def call(self, inputs):
    activations = self.embedding(inputs)
    return self.dense(tf.concat([activations['a'], activations['b']], 1))


TWO_IDS = {'a': IDS, 'b': ([2], [0, 3])}


def two_tables_model():
  """Table ta by the layer's Adam, tb by its own FTRL; the model compiled
  with AdamW, whose weight decay would pull a table it trained to 0."""
  table_a = embedding.TableConfig(VOCAB, DIM, name='ta',
                                  initializer=tf.constant_initializer(START))
  table_b = embedding.TableConfig(VOCAB, DIM, name='tb', optimizer=embedding.FTRL(
      **FTRL), initializer=tf.constant_initializer(-START))
  model = TwoTables({'a': embedding.FeatureConfig(table_a),
                     'b': embedding.FeatureConfig(table_b)},
                    embedding.Adam(**ADAM))
  model.compile(tf.keras.optimizers.AdamW(learning_rate=0.5, weight_decay=0.9),
                'mse')
  return model


def two_tables_data():
  return {name: sparse_ids(ids) for name, ids in TWO_IDS.items()}


def tables_of(model):
  return {t.name: v.numpy() for t, v in model.embedding.embedding_tables.items()}


def expected_two_tables(rule_b, steps=2):
  """Tables ta (by the TPU's Adam) and tb (by `rule_b`) after `steps` steps."""
  tables = {'a': NumpyTable(*TPU_RULES['adam']),
            'b': NumpyTable(*rule_b, start=-START)}
  for _ in range(steps):
    rows, _, _ = gradients(None, {name: (TWO_IDS[name], table)
                                  for name, table in tables.items()},
                           KERNEL[:4], np.zeros(1))
    for name, table in tables.items():
      table.step(rows[name])
  return tables['a'].w, tables['b'].w


@pytest.fixture(name='two_tables', scope='module')
def _two_tables():
  """(model, features, {table: value}) of `two_tables_model` after two steps
  of `model.fit`; shared by the tests that read or serve it (neither changes
  its tables: the first asserts so)."""
  model = two_tables_model()
  features = two_tables_data()
  model.fit(tf.data.Dataset.from_tensors(
      (features, tf.constant(LABELS, tf.float32))).repeat(2), epochs=1,
            steps_per_epoch=2, verbose=0)
  return model, features, tables_of(model)


def test_per_table_optimizers_no_training_argument_and_no_update_in_inference(
    two_tables):
  """Each table by its optimizer's TPU rule (not the layer's for tb), none
  decayed by the model's AdamW, whose only weight is the layer's helper;
  `evaluate`, `predict` and a call leave them as they are."""
  model, features, tables = two_tables
  want_a, want_b = expected_two_tables(TPU_RULES['ftrl'])
  np.testing.assert_allclose(tables['ta'], want_a, **TOL)
  np.testing.assert_allclose(tables['tb'], want_b, **TOL)
  assert not np.allclose(want_b, expected_two_tables(TPU_RULES['adam'])[1],
                         **TOL)
  assert [v.name.split('/')[-1] for v in model.trainable_variables] == [
      'tpu_embedding_helper_dummy:0']
  model.evaluate(features, tf.constant(LABELS, tf.float32), verbose=0)
  model.predict(features, verbose=0)
  model(features)
  for name, value in tables_of(model).items():
    np.testing.assert_array_equal(value, tables[name], err_msg=name)


def test_each_call_applies_its_own_gradients():
  """A layer called twice in a step (shared towers): each call's gradient
  reaches the rows it looked up (SGD: their sum)."""
  table = embedding.TableConfig(VOCAB, DIM, name='t',
                                initializer=tf.constant_initializer(START))
  layer = tpu_fc_tfrs.TPUEmbedding(embedding.FeatureConfig(table),
                                   embedding.SGD(learning_rate=0.1))
  first, second = sparse_ids(IDS), sparse_ids(([0], [2, 3]))
  kernel = tf.constant(KERNEL[2:], tf.float32)
  layer(first)  # builds
  with tf.GradientTape() as tape:
    outputs = tf.matmul(layer(first), kernel) - 2 * tf.matmul(layer(second),
                                                              kernel)
    loss = tf.reduce_sum(outputs)
  tape.gradient(loss, layer.trainable_variables)
  want = np.array(START)
  for examples, sign in ((IDS, 1), (([0], [2, 3]), -2)):
    for ids in examples:
      for row in ids:
        want[row] -= 0.1 * sign * KERNEL[2:, 0] / len(ids)
  (got,) = layer.embedding_tables.values()
  np.testing.assert_allclose(got.numpy(), want, **TOL)


def test_serving_config_and_saved_model_export_look_up_on_the_cpu(two_tables,
                                                                  tmp_path):
  """TFRS's serving paths unchanged: `serving_config` and a SavedModel
  (whose functions would otherwise carry the training lookup's gradient,
  which `tf.saved_model.save` refuses to trace) look the tables up on the
  CPU, as the trained model does."""
  model, features, _ = two_tables
  expected = model(features).numpy()
  served = model.embedding(features, serving_config=model.feature_config)
  np.testing.assert_allclose(model.dense(tf.concat([served['a'], served['b']],
                                                   1)).numpy(), expected, **TOL)
  exported = tf.Module()
  exported.model = model
  exported.serve = tf.function(model.__call__, input_signature=[
      {name: tf.SparseTensorSpec([None, None], tf.int32) for name in 'ab'}])
  tf.saved_model.save(exported, str(tmp_path / 'export'))
  loaded = tf.saved_model.load(str(tmp_path / 'export'))
  np.testing.assert_allclose(loaded.serve(features).numpy(), expected, **TOL)


def test_restore_and_save_carry_tables_and_slots_by_table_name(tmp_path):
  """A legacy checkpoint's tables and Adam slots into the layer (tpu_fc's),
  a converted one into TFRS's own, all or nothing; saved back,
  `convert-checkpoint --to legacy` gives them bit for bit."""
  spec = make_spec(OPTIMIZERS['adam'])
  train(tmp_path / 'legacy', spec)
  legacy = checkpoint_values(tmp_path / 'legacy')
  config = spec.to_mid_level()
  original = tfrs.layers.embedding.TPUEmbedding(config.feature_config,
                                                config.optimizer)
  layer = tpu_fc_tfrs.TPUEmbedding(config.feature_config, config.optimizer)
  changed = make_spec(OPTIMIZERS['adam'], a_vocabulary=12).to_mid_level()
  mismatched = tpu_fc_tfrs.TPUEmbedding(changed.feature_config,
                                        changed.optimizer)
  before = {t.name: v.numpy() for t, v in mismatched.embedding_tables.items()}
  with pytest.raises(conversion.CheckpointConversionError, match=re.escape(
      'Table tbl_a: checkpoint variable dense_features/a_embedding/'
      'embedding_weights has shape [10, 4], but the table is')):
    tpu_fc_tfrs.restore(mismatched, str(tmp_path / 'legacy'))
  for table, variable in mismatched.embedding_tables.items():
    np.testing.assert_array_equal(variable.numpy(), before[table.name])
  converted = conversion.to_mid_level_checkpoint(  # (`--to mid-level`)
      spec, str(tmp_path / 'legacy'), str(tmp_path / 'converted'))
  for restored, checkpoint in ((layer, str(tmp_path / 'legacy')),
                               (original, converted)):
    assert tpu_fc_tfrs.restore(restored, checkpoint) == 2
    tables = {t.name: v.numpy() for t, v in restored.embedding_tables.items()}
    np.testing.assert_array_equal(
        tables['tbl_a'], legacy['dense_features/a_embedding/embedding_weights'])
  saved = tpu_fc_tfrs.save(layer, str(tmp_path / 'mid'), global_step=2)
  back = checkpoint_values(conversion.to_legacy_checkpoint(
      spec, saved, str(tmp_path / 'back')))
  assert sorted(back) == sorted(name for name in legacy
                                if 'embedding' in name or name == 'global_step')
  for name, value in back.items():
    np.testing.assert_array_equal(value, legacy[name], err_msg=name)


INSTALL_SCRIPT = """
import sys
import tpu_fc
tpu_fc.install()
from tpu_fc import tfrs as ours
assert 'tensorflow_recommenders' not in sys.modules
import tensorflow_recommenders as tfrs
from tensorflow_recommenders.experimental.layers.embedding import (
    partial_tpu_embedding)
assert tfrs.layers.embedding.TPUEmbedding is ours.TPUEmbedding
assert partial_tpu_embedding.TPUEmbedding is ours.TPUEmbedding
tpu_fc.uninstall()
(original,) = ours.TPUEmbedding.__bases__
assert tfrs.layers.embedding.TPUEmbedding is original
assert partial_tpu_embedding.TPUEmbedding is original
assert not any(type(f).__name__ == '_AfterImport' for f in sys.meta_path)
tpu_fc.install()
assert tfrs.layers.embedding.TPUEmbedding is ours.TPUEmbedding
print('bound on import')
"""


@pytest.mark.subprocess
def test_install_binds_the_layer_when_tfrs_is_imported():
  """`install()` and `import tpu_fc.tfrs` leave TFRS unimported; its import
  then binds TFRS's names of the layer to tpu_fc's; `uninstall()` gives them
  back."""
  finished = scripts.run_python(['-c', INSTALL_SCRIPT], env=scripts.env())
  assert finished.returncode == 0, finished.stderr[-3000:]
  assert 'bound on import' in finished.stdout
