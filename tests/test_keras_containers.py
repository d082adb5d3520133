"""What legacy TPUEstimator scripts tripped on, through the public API."""
import json
import os
import re

import numpy as np
import pytest

import tpu_fc
from tpu_fc.estimator.tpu import replication
from tpu_fc._tf import tf

from harness import estimators
from harness import inputs
from harness import lanes
from harness import models
from harness import scripts

# The linear model's data and batch (every model here takes batches of it).
N, BATCH, X, Y = inputs.N, estimators.LINEAR_BATCH, inputs.X, inputs.Y
pytestmark = pytest.mark.filterwarnings('ignore:`tf.layers.dense` is deprecated')


def _keras_auc(labels, logits):
  """A Keras metric object, as TF's EstimatorSpec takes it."""
  auc = tf.keras.metrics.AUC()
  auc.update_state(labels, tf.sigmoid(logits))
  return {'auc': auc}


def test_a_keras_metric_from_metric_fn_counts_on_the_cpu_and_is_refused_on_a_tpu(
    tmp_path):
  """As TF 2.15: with use_tpu=False its EstimatorSpec takes a Keras metric
  object; its TPU evaluation fails on one (it takes each metric's [0] and
  [1]): the same TypeError, saying what a metric_fn returns, in an
  evaluation loop and in a one-step evaluation alike."""
  metrics, _ = estimators.train_linear(tmp_path / 'cpu', use_tpu=False,
                                       metric_fn=_keras_auc)
  assert 0 < metrics['auc'] <= 1
  if lanes.LEGACY:
    legacy, _ = estimators.train_linear(
        tmp_path / 'legacy', use_tpu=False, metric_fn=_keras_auc,
        driver=tf.compat.v1.estimator.tpu)
    assert legacy['auc'] == metrics['auc']
  for eval_steps in (N // BATCH, 1):
    with pytest.raises(TypeError, match=re.escape(
        "'AUC' object is not subscriptable: metric_fn returned it for metric "
        "'auc'. On a TPU (use_tpu=True, eval_on_tpu=True), a metric_fn returns "
        'a dict of name -> (value, update_op) pairs, e.g. from '
        'tf.compat.v1.metrics.*')):
      estimators.train_linear(tmp_path / 'tpu_{}'.format(eval_steps),
                              use_tpu=True, metric_fn=_keras_auc,
                              eval_steps=eval_steps)


def test_features_as_one_tensor_run_on_the_emulated_tpu(tmp_path):
  """TPUEstimator's input_fn may give a Tensor, not a dict (it crashed with use_tpu=True)."""
  cpu_metrics, cpu_kernel = estimators.train_linear(tmp_path / 'cpu',
                                                    use_tpu=False)
  tpu_metrics, tpu_kernel = estimators.train_linear(tmp_path / 'tpu',
                                                    use_tpu=True)
  np.testing.assert_allclose(tpu_kernel, cpu_kernel, rtol=1e-6)
  # (The eval loss is shard 0's, as on a TPU; metrics see every shard.)
  np.testing.assert_allclose(tpu_metrics['mean_logit'], cpu_metrics['mean_logit'],
                             rtol=1e-6)
  if lanes.LEGACY:  # TF's own driver agrees
    legacy_metrics, legacy_kernel = estimators.train_linear(
        tmp_path / 'legacy', use_tpu=False, driver=tf.compat.v1.estimator.tpu)
    np.testing.assert_allclose(legacy_kernel, cpu_kernel, rtol=1e-6)
    np.testing.assert_allclose(legacy_metrics['loss'], cpu_metrics['loss'], rtol=1e-6)


def test_a_plain_optimizer_on_two_shards_learns_from_core_0s_slice_and_says_so(
    tmp_path, tf_log, monkeypatch):
  """No CrossShardOptimizer: as on a TPU, the dense variables get core 0's
  update only, i.e. learn from the first half of every batch; a warning says
  so once per process, naming CrossShardOptimizer."""
  monkeypatch.setattr(replication, '_warned_core_0_trains_alone', [])

  estimators.linear_estimator(tmp_path / 'cross_shard', use_tpu=True).train(
      inputs.linear, max_steps=1)
  assert not [m for m in tf_log if 'no cross-replica sum' in m]
  plain = estimators.linear_estimator(tmp_path / 'plain', use_tpu=True,
                                      plain_optimizer=True)
  plain.train(inputs.linear, max_steps=2)
  plain.train(inputs.linear, max_steps=4)
  assert [m for m in tf_log if 'no cross-replica sum' in m] == [
      "TPUConfig.num_shards=2, and the train_op updates trainable variables "
      "(dense/bias, dense/kernel) with no cross-replica sum: as on a TPU, only "
      "core 0's update is applied, so they learn from 1/2 of every batch (core "
      "0's slice). Wrap the optimizer in tf.compat.v1.tpu.CrossShardOptimizer "
      "to train them on the whole batch."]
  # Each train() read the first 2 batches; core 0 had their first halves.
  core_0 = np.concatenate([X[:BATCH // 2], X[BATCH:BATCH + BATCH // 2]] * 2)
  core_0_labels = np.concatenate([Y[:BATCH // 2],
                                  Y[BATCH:BATCH + BATCH // 2]] * 2)
  on_core_0_slices = estimators.linear_estimator(tmp_path / 'core_0',
                                                 use_tpu=False)
  on_core_0_slices.train(lambda params: tf.data.Dataset.from_tensor_slices(
      (core_0, core_0_labels)).batch(BATCH // 2), max_steps=4)
  for name in ('dense/kernel', 'dense/bias'):
    np.testing.assert_allclose(plain.get_variable_value(name),
                               on_core_0_slices.get_variable_value(name),
                               rtol=1e-6, err_msg=name)


HOOK_EXPLANATION = ('training_hooks cannot fetch its tensors .*Pass them to '
                    'host_call instead')


@pytest.mark.parametrize('hook, wording', [
    ('logging', 'should have graph attribute that is equal to current graph'),
    ('nan', 'is not an element of this graph')])
def test_hook_on_a_model_fn_tensor_says_to_use_host_call(tmp_path, tf_log, hook,
                                                          wording):
  """The hook works on the CPU; under the TPU loop the error (TF's, worded as
  the hook fetches) says why and what to do."""
  estimators.train_linear(tmp_path / 'cpu', use_tpu=False, hook_on_loss=hook)
  if hook == 'logging':
    assert any(m.startswith('loss = ') for m in tf_log)
  with pytest.raises(ValueError, match='(?s)' + wording + '.*' + HOOK_EXPLANATION):
    estimators.train_linear(tmp_path / 'tpu', use_tpu=True, hook_on_loss=hook)


TF1_HOOK_SCRIPT = """
import tpu_fc
import tensorflow as tf
from harness import estimators
tf.compat.v1.disable_v2_behavior()
try:
  estimators.train_linear({!r}, use_tpu=True, hook_on_loss='nan')
except ValueError as error:
  print(type(error).__name__, error)
"""


@pytest.mark.subprocess
def test_hook_on_a_model_fn_tensor_under_tf1_control_flow_says_to_use_host_call(
    tmp_path):
  """A TF1 loop's body op is not fetchable: TF's error class and wording, then
  the explanation."""
  finished = scripts.run_python(
      ['-c', TF1_HOOK_SCRIPT.format(str(tmp_path))], cwd=str(tmp_path),
      env=scripts.env())
  assert finished.returncode == 0, finished.stderr[-4000:]
  assert re.search('^InaccessibleTensorError .*has been marked as not '
                   'fetchable.*' + HOOK_EXPLANATION,
                   finished.stdout, re.S), finished.stdout


def _summary_steps(directory):
  """The steps of the summaries written to `directory`, in order."""
  return sorted(event.step
                for path in tf.io.gfile.glob(os.path.join(directory, 'events*'))
                for event in tf.compat.v1.train.summary_iterator(path)
                for _ in event.summary.value)


@pytest.mark.parametrize('run', ['loop', 'one_step', 'cpu', pytest.param(
    'tf_cpu', marks=pytest.mark.legacy_only)])
def test_host_call_runs_every_n_steps_of_each_tpu_loop(tmp_path, run):
  """TPUConfig(experimental_host_call_every_n_steps=3), iterations_per_loop=4,
  10 steps: on a TPU, at steps 0 and 3 of each loop (loops of 4, 4 and 2
  steps: steps 0, 3, 4, 7, 8), in a loop or one step per run; with
  use_tpu=False every step, as TF 2.15's own TPUEstimator(use_tpu=False)."""
  driver = tf.compat.v1.estimator.tpu if run == 'tf_cpu' else tpu_fc
  use_tpu = run in ('loop', 'one_step')
  summary_dir = str(tmp_path / 'host_call')
  estimator = driver.TPUEstimator(
      model_fn=models.linear_model_fn, use_tpu=use_tpu, train_batch_size=BATCH,
      params={'hook_on_loss': None, 'spec': driver.TPUEstimatorSpec,
              'summary_dir': summary_dir},
      config=driver.RunConfig(
          model_dir=str(tmp_path / 'model'), tpu_config=driver.TPUConfig(
              iterations_per_loop=4, num_shards=2 if use_tpu else None,
              experimental_host_call_every_n_steps=3)))
  if run == 'one_step':  # the same batch every step: one step per run
    estimator.train(lambda params: (tf.constant(X[:BATCH]),
                                    tf.constant(Y[:BATCH])), max_steps=10)
  else:
    estimator.train(inputs.linear, max_steps=10)
  steps = _summary_steps(summary_dir)
  # (host_call reads the global step in the run that increments it, as in
  # TF: step k logs k or k + 1)
  on_tpu_steps = [0, 3, 4, 7, 8] if use_tpu else list(range(10))
  assert len(steps) == len(on_tpu_steps), steps
  assert all(step in (k, k + 1) for k, step in zip(on_tpu_steps, steps)), steps


HASH_BUCKETS = 7
WORDS = np.array([b'a', b'b', b'c', b'd'] * (N // 4))


def _hashed_column():
  return tpu_fc.embedding_column(
      tf.feature_column.categorical_column_with_hash_bucket('word', HASH_BUCKETS),
      2, initializer=tf.compat.v1.constant_initializer(0.1))


def _word_input_fn(params, mode):
  """TF's advice for hash columns on the TPU: integer ids made in the input_fn."""
  def parse(words, labels):
    features = {'word': tf.sparse.from_dense(words[:, tf.newaxis])}
    if params['transform_in_predict'] or mode != tpu_fc.ModeKeys.PREDICT:
      features['word'] = _hashed_column().categorical_column._transform_feature(  # pylint: disable=protected-access
          features)
    return features, labels
  dataset = tf.data.Dataset.from_tensor_slices((WORDS, Y))
  if mode == tpu_fc.ModeKeys.TRAIN:
    dataset = dataset.repeat()
  return dataset.batch(params['batch_size'], drop_remainder=True).map(parse)


def _word_model_fn(features, labels, mode, params):
  logits = tf.reduce_sum(
      tf.keras.layers.DenseFeatures([_hashed_column()])(features), axis=1,
      keepdims=True)
  if mode == tpu_fc.ModeKeys.PREDICT:
    return tpu_fc.TPUEstimatorSpec(mode, predictions={'logit': logits})
  loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
  optimizer = tf.compat.v1.tpu.CrossShardOptimizer(
      tf.compat.v1.train.GradientDescentOptimizer(0.1))
  return tpu_fc.TPUEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(
      loss, tf.compat.v1.train.get_global_step()))


@pytest.mark.parametrize('transform_in_predict', [False, True])
def test_predict_of_ids_transformed_for_the_tpu(tmp_path, transform_in_predict):
  """Ids transformed in the input_fn for TPU training: raw strings to predict."""
  estimator = tpu_fc.TPUEstimator(
      model_fn=_word_model_fn, use_tpu=True, train_batch_size=BATCH,
      predict_batch_size=BATCH,
      params={'transform_in_predict': transform_in_predict},
      config=tpu_fc.RunConfig(model_dir=str(tmp_path)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=[_hashed_column()],
          optimization_parameters=tpu_fc.StochasticGradientDescentParameters(
              0.1)))
  estimator.train(_word_input_fn, max_steps=2)
  predictions = estimator.predict(_word_input_fn, yield_single_examples=False)
  if transform_in_predict:
    with pytest.raises(ValueError, match='Feature word holds int64 ids, but its '
                       'column word takes strings: with use_tpu=True, predict'):
      next(predictions)
    return
  table = estimator.get_variable_value(
      'dense_features/word_embedding/embedding_weights')
  ids = tf.strings.to_hash_bucket_fast(WORDS[:BATCH], HASH_BUCKETS).numpy()
  np.testing.assert_allclose(next(predictions)['logit'][:, 0],
                             table[ids].sum(axis=1), rtol=1e-6)


# A legacy script as users wrote it (tests/scripts/legacy_user_model.py), run
# unchanged by `python -m tpu_fc run`, and on TF 2.15 by TF's own TPUEstimator.

USER_MODEL = os.path.join(scripts.SCRIPTS, 'legacy_user_model.py')


def _run_user_model(tmp_path, name, runs, v1=True, on_tpu_fc=True):
  """{run name: result} of the script's `runs`, in a process of its own."""
  result = tmp_path / (name + '.json')
  args = (['-m', 'tpu_fc', 'run'] if on_tpu_fc else []) + [
      USER_MODEL, str(result), str(tmp_path / name)] + (['--v1'] if v1 else [])
  for run in runs:
    args += ['--run', run]
  finished = scripts.run_python(args, cwd=str(tmp_path), env=scripts.env(),
                                timeout=600)
  assert finished.returncode == 0, finished.stderr[-6000:]
  return json.loads(result.read_text())


def _assert_same_model(got, want):
  """Same variables, metrics, predictions and served predictions, bit for bit
  (the same kernels on the same values, in the same order)."""
  assert sorted(got['variables']) == sorted(want['variables'])
  for name, value in want['variables'].items():
    np.testing.assert_array_equal(got['variables'][name], value, err_msg=name)
  assert got['metrics'] == want['metrics']
  np.testing.assert_array_equal(got['predictions'], want['predictions'])
  np.testing.assert_array_equal(got['served'], want['served'])
  assert len(got['summaries']) == len(want['summaries'])


@pytest.fixture(scope='module')
def user_model_runs(tmp_path_factory):
  """The script under TF1 behaviour (disable_v2_behavior), emulated TPU with 2
  shards looping 3 steps per run or 1 (also with host_call every 2 steps),
  with 1 shard, on the CPU, and with a dynamic batch; and with TF2 behaviour,
  2 shards looping."""
  tmp_path = tmp_path_factory.mktemp('user_model')
  runs = _run_user_model(tmp_path, 'v1', [
      'loop:tpu:2:3', 'step:tpu:2:1', 'one_shard:tpu:0:3', 'cpu:cpu:0:3',
      'dynamic:tpu:2:3:dynamic_batch', 'every_2:tpu:2:3:host_call_every_2'])
  runs['v2_loop'] = _run_user_model(tmp_path, 'v2', ['loop:tpu:2:3'],
                                    v1=False)['loop']
  if lanes.LEGACY:
    runs['tf_cpu'] = _run_user_model(tmp_path, 'tf', ['cpu:cpu:0:3'],
                                     on_tpu_fc=False)['cpu']
  return runs


@pytest.mark.subprocess
@pytest.mark.parametrize('name', ['loop', 'step', 'one_shard', 'cpu',
                                  'v2_loop'])
def test_user_model_trains_evaluates_predicts_and_exports(user_model_runs, name):
  """Static shapes (`tf.zeros(logits.shape)`), Keras `Input(tensor=...)`,
  multivalent sequence ids and recall_at_k through all four modes: the exported
  model serves what predict gave."""
  run = user_model_runs[name]
  assert 'error' not in run, run.get('error')
  assert run['metrics']['global_step'] == 6
  assert set(run['metrics']) == {'loss', 'recall_at_1', 'accuracy',
                                 'global_step'}
  assert len(run['predictions']) == 32
  np.testing.assert_array_equal(run['served'], run['predictions'][:8])
  assert run['profiles'] >= 1  # the ProfilerHook wrote timelines
  # host_call runs every step, its tags unprefixed by any loop's name scope;
  # it reads the global step in the run that increments it (as in TF): step k
  # logs k or k + 1
  assert [tag for tag, _ in run['summaries']] == ['loss'] * 6
  assert all(step in (k, k + 1)
             for k, (_, step) in enumerate(run['summaries'])), run['summaries']


@pytest.mark.subprocess
def test_tf1_loop_runs_host_call_every_n_steps_of_each_loop(user_model_runs):
  """experimental_host_call_every_n_steps=2 in loops of 3 steps: steps 0 and
  2 of each loop (0, 2, 3, 5), under TF1 control flow (a v1 cond in a v1
  while_loop); the model trains as with host_call every step."""
  run = user_model_runs['every_2']
  assert [tag for tag, _ in run['summaries']] == ['loss'] * 4
  assert all(step in (k, k + 1) for k, (_, step) in zip(
      [0, 2, 3, 5], run['summaries'])), run['summaries']
  _assert_same_model(dict(run, summaries=user_model_runs['loop']['summaries']),
                     user_model_runs['loop'])


@pytest.mark.subprocess
def test_tf1_loop_runs_iterations_per_loop_steps_per_run(user_model_runs):
  """Under disable_v2_behavior, as with TF2 control flow: 3 steps per
  session.run, each the same as one step per run (the history table's
  learning_rate_fn read in the loop: TF1 once failed to build it there)."""
  assert user_model_runs['loop']['training_runs'] == 2
  assert user_model_runs['step']['training_runs'] == 6
  _assert_same_model(user_model_runs['loop'], user_model_runs['step'])
  _assert_same_model(user_model_runs['v2_loop'], user_model_runs['loop'])


@pytest.mark.subprocess
@pytest.mark.legacy_only
def test_cpu_run_is_tf_2_15s(user_model_runs):
  _assert_same_model(user_model_runs['cpu'], user_model_runs['tf_cpu'])


@pytest.mark.subprocess
def test_a_dynamic_batch_gets_tf_2_15s_error_naming_the_feature(
    user_model_runs):
  error = user_model_runs['dynamic']['error']
  assert error.startswith('The features to the model returned by input_fn must '
                          'have static shape. Tensor: ')
  assert "Feature 'price' has shape (?, 1)" in error
  assert 'drop_remainder=True' in error


# A `DenseFeatures` inside a Keras `Sequential`, a subclassed `Model` (named
# `Sub`: a root `sub` op built before the model_fn would make it `Sub_1`) or a
# `tf.name_scope`.  TF2's `DenseFeatures` names its table by the enclosing name
# scopes on the CPU; a TPU's record of it, by variable scope, leaves them out.

EPS32 = np.finfo(np.float32).eps
CONTAINER_IDS = np.array([[1], [4], [2], [5]] * (N // 4))  # no id 0 (dense ids)
CONTAINER_LABELS = np.linspace(-1, 1, N).astype(np.float32).reshape(N, 1)
CONTAINER_TABLE = 'dense_features/ids_embedding/embedding_weights'
# The Dense layer's variable scope in each container; a table's is the same as
# at the top (CONTAINER_TABLE) but under a variable scope.
CONTAINER_DENSE = {'sequential': 'sequential/dense', 'subclassed': 'Sub/dense',
                   'name_scope': 'tower/dense', 'variable_scope': 'tower/dense',
                   'functional': 'dense'}


def _container_input_fn(params):
  return tf.data.Dataset.from_tensor_slices(
      ({'ids': CONTAINER_IDS}, CONTAINER_LABELS)).repeat().batch(
          params['batch_size'], drop_remainder=True)


class _Sub(tf.keras.Model):  # pylint: disable=abstract-method
  """A subclassed model named `Sub`: its layers' variables are `Sub/...`."""

  def __init__(self, embedded, out):
    super().__init__(name='Sub')
    self.embedded = embedded
    self.out = out

  def call(self, inputs):  # pylint: disable=arguments-differ
    return self.out(self.embedded(inputs))


CONTAINER_START = np.arange(12, dtype=np.float32).reshape(6, 2) / 8


def _container_column(driver):
  """The model's one column, `driver`'s (the model_fn's and the spec's: a
  TPU makes the table with the spec's initializer)."""
  return driver.embedding_column(
      tf.feature_column.categorical_column_with_identity('ids', 6), 2,
      initializer=tf.compat.v1.constant_initializer(CONTAINER_START))


def _container_model_fn(features, labels, mode, params):
  """A one-column DenseFeatures and a Dense layer in `params['container']`,
  with the layer class and TPU column of `params['driver']` (tpu_fc or TF)."""
  driver, layer_class = lanes.driver(params['driver']), params['layer']
  column = _container_column(driver)
  dense = lambda: tf.keras.layers.Dense(
      1, kernel_initializer=tf.compat.v1.constant_initializer([[0.5], [-0.25]]))
  if params['container'] == 'sequential':
    logits = tf.keras.Sequential([layer_class([column]), dense()])(features)
  elif params['container'] == 'subclassed':
    logits = _Sub(layer_class([column]), dense())(features)
  elif params['container'] == 'functional':
    inputs = {'ids': tf.keras.Input(tensor=features['ids'])}
    logits = tf.keras.Model(inputs, dense()(layer_class([column])(inputs))).output
  else:
    scope = (tf.name_scope if params['container'] == 'name_scope' else
             tf.compat.v1.variable_scope)
    with scope('tower'):
      logits = dense()(layer_class([column])(features))
  if mode == tpu_fc.ModeKeys.PREDICT:
    return driver.TPUEstimatorSpec(mode, predictions={'logit': logits})
  loss = tf.reduce_mean(tf.square(logits - labels))
  if mode == tpu_fc.ModeKeys.EVAL:
    return driver.TPUEstimatorSpec(mode, loss=loss, eval_metrics=(
        lambda logits: {'mean_logit': tf.compat.v1.metrics.mean(logits)},
        [logits]))
  optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.5)
  if params['use_tpu']:
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
  return driver.TPUEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(
      loss, tf.compat.v1.train.get_global_step()))


def _container_estimator(model_dir, container, use_tpu=True, driver='tpu_fc',
                         layer=tf.keras.layers.DenseFeatures,
                         model_fn=_container_model_fn, **kwargs):
  params = {'container': container, 'driver': driver, 'layer': layer}
  driver = lanes.driver(driver)
  column = _container_column(driver)
  return driver.TPUEstimator(
      model_fn=model_fn, use_tpu=use_tpu, train_batch_size=BATCH,
      eval_batch_size=BATCH, predict_batch_size=BATCH,
      params=params, config=driver.RunConfig(
          model_dir=str(model_dir), tpu_config=driver.TPUConfig(
              iterations_per_loop=1, num_shards=2 if use_tpu else None)),
      embedding_config_spec=driver.EmbeddingConfigSpec(
          feature_columns=[column],
          optimization_parameters=driver.AdagradParameters(0.5)), **kwargs)


def _ids_receiver():
  ids = tf.compat.v1.placeholder(tf.int64, [None, 1], name='ids')
  return tpu_fc.export.ServingInputReceiver({'ids': ids}, {'ids': ids})


def _served(export_dir, ids):
  serve = tf.saved_model.load(export_dir.decode()).signatures['serving_default']
  return serve(ids=tf.constant(ids))['logit'].numpy()


def _logits_by_hand(estimator, table, dense, ids):
  """table[id] · kernel + bias, from the checkpoint; and the bound of its
  float32 rounding (two products, two sums: 4 roundings of the terms)."""
  rows = estimator.get_variable_value(table)[ids[:, 0]]
  kernel = estimator.get_variable_value(dense + '/kernel')
  bias = estimator.get_variable_value(dense + '/bias')
  terms = np.abs(rows * kernel[:, 0]).sum(axis=1, keepdims=True) + np.abs(bias)
  return rows @ kernel + bias, 4 * EPS32 * terms


def _container_table(container):
  return ('tower/' if container == 'variable_scope' else '') + CONTAINER_TABLE


@pytest.mark.parametrize('container,eval_on_tpu', [
    ('sequential', False), ('subclassed', True), ('name_scope', True),
    ('variable_scope', False), ('functional', True)])
def test_a_model_in_a_container_evaluates_predicts_and_exports_what_it_trained(
    tmp_path, container, eval_on_tpu):
  """(A variable scope and a functional model worked before: kept.)"""
  estimator = _container_estimator(tmp_path, container,
                                   eval_on_tpu=eval_on_tpu)
  estimator.train(_container_input_fn, max_steps=1)
  dense, table = CONTAINER_DENSE[container], _container_table(container)
  assert sorted(estimator.get_variable_names()) == sorted([
      table, table + '/Adagrad', dense + '/bias', dense + '/kernel',
      'global_step'])
  trained = estimator.get_variable_value(table)
  # The step moved every looked-up row far beyond the bounds below.
  assert np.abs(trained - CONTAINER_START)[[1, 2, 4, 5]].min() > 1e-3
  logits, bound = _logits_by_hand(estimator, table, dense, CONTAINER_IDS)
  metrics = estimator.evaluate(_container_input_fn, steps=1)
  # (the mean's 4 more roundings, of the logits' sizes)
  assert abs(metrics['mean_logit'] - logits[:BATCH].mean()) <= (
      bound[:BATCH].mean() + 4 * EPS32 * np.abs(logits[:BATCH]).mean())
  predictions = np.stack([p['logit'] for p in estimator.predict(
      lambda params: _container_input_fn(params).take(2))])
  np.testing.assert_array_less(np.abs(predictions - logits[:2 * BATCH]),
                               bound[:2 * BATCH] + 1e-30)
  export_dir = estimator.export_saved_model(str(tmp_path / 'export'),
                                            _ids_receiver)
  # Served outside tpu_fc: the SavedModel's variables hold the trained names.
  assert table in dict(tf.train.list_variables(
      os.path.join(export_dir.decode(), 'variables', 'variables')))
  np.testing.assert_array_equal(_served(export_dir, CONTAINER_IDS[:BATCH]),
                                predictions[:BATCH])


def _tf_tpu_table_names(container, layer):
  """The table and Adagrad slot names TF 2.15's TPU training gives the
  container model's table: its column's record in TPU mode
  (`tpu/feature_column.py`, `_record_variable_scope_and_name`) read by
  tensorflow_estimator's `_tpu_estimator_embedding.get_full_variable_names`."""
  from tensorflow.python.tpu import tpu_function  # pylint: disable=g-import-not-at-top
  from tensorflow_estimator.python.estimator.tpu import _tpu_estimator_embedding  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default() as graph, tpu_function.tpu_shard_context(2):
    _container_model_fn(  # on a TPU, features hold the activations
        {'ids': tf.zeros([BATCH // 2, 2])}, None, tpu_fc.ModeKeys.PREDICT,
        {'container': container, 'driver': 'tf', 'layer': layer})
    tables, slots = _tpu_estimator_embedding.get_full_variable_names(
        graph, {'tbl_ids': None},
        tf.compat.v1.tpu.experimental.AdagradParameters(0.5))
  return tables['tbl_ids'], slots['tbl_ids'].accumulator


@pytest.mark.legacy_only
@pytest.mark.parametrize('container,layer', [
    ('sequential', 'v1'), ('subclassed', 'v1'), ('name_scope', 'v1'),
    ('sequential', 'v2')])
def test_tpu_checkpoints_hold_tf_2_15s_names_and_its_export_reads_them(
    tmp_path, container, layer):
  """A v1 `DenseFeatures` (`tf.compat.v1.keras.layers`) makes its table in its
  own variable scope: TF's TPU run and its CPU graph name it alike, in any
  container, and tpu_fc's checkpoint is what TF's TPU run saves: TF's own
  export (use_tpu=True, export_to_tpu=False) serves it as tpu_fc's does.
  TF2's `DenseFeatures` is recorded by the bare variable scope on a TPU
  (`embedding_weights`) and named by the container on the CPU, so TF 2.15
  could not export it from any TPU checkpoint; tpu_fc's export serves it."""
  layer_class = {'v1': tf.compat.v1.keras.layers.DenseFeatures,
                 'v2': tf.keras.layers.DenseFeatures}[layer]
  estimator = _container_estimator(tmp_path, container, layer=layer_class)
  estimator.train(_container_input_fn, max_steps=1)
  served = _served(estimator.export_saved_model(str(tmp_path / 'tpu_fc'),
                                                _ids_receiver), CONTAINER_IDS)
  tf_estimator = _container_estimator(tmp_path, container, driver='tf',
                                      layer=layer_class, export_to_tpu=False)
  table, slot = _tf_tpu_table_names(container, layer_class)
  if layer == 'v2':
    assert table == 'embedding_weights'
    with pytest.raises(ValueError, match='Could not load all requested '
                       'variables from checkpoint'):
      tf_estimator.export_saved_model(str(tmp_path / 'tf'), _ids_receiver)
    return
  assert (table, slot) == (CONTAINER_TABLE, CONTAINER_TABLE + '/Adagrad')
  assert {table, slot} <= set(estimator.get_variable_names())
  np.testing.assert_array_equal(
      _served(tf_estimator.export_saved_model(str(tmp_path / 'tf'),
                                              _ids_receiver), CONTAINER_IDS),
      served)


def _renamed_checkpoint(source, model_dir, renames):
  """`source`'s latest checkpoint written into `model_dir` with variables
  renamed by `renames` (as another writer of the same model named them)."""
  reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(source)))
  with tf.Graph().as_default():
    variables = [tf.compat.v1.Variable(reader.get_tensor(name),
                                       name=renames.get(name, name))
                 for name in reader.get_variable_to_shape_map()]
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      tf.compat.v1.train.Saver(variables).save(
          session, str(model_dir / 'model.ckpt'), global_step=1)


@pytest.mark.parametrize('container', ['sequential', 'subclassed'])
def test_a_real_tpu_checkpoint_of_a_tf2_dense_features_model_restores(
    tmp_path, container):
  """TF 2.15's TPU names a TF2 `DenseFeatures` table by the bare variable
  scope: `embedding_weights`, its Adagrad slot `embedding_weights/Adagrad`
  (on the legacy lane: TF's own rule says so).  A `use_tpu=True` model
  predicts, exports and trains on from such a checkpoint exactly as from its
  own, which names them `dense_features/ids_embedding/...`."""
  tf_names = ('embedding_weights', 'embedding_weights/Adagrad')
  if lanes.LEGACY:
    assert _tf_tpu_table_names(container, tf.keras.layers.DenseFeatures) == (
        tf_names)
  own = _container_estimator(tmp_path / 'own', container)
  own.train(_container_input_fn, max_steps=1)
  _renamed_checkpoint(tmp_path / 'own', tmp_path / 'tpu', dict(zip(
      (CONTAINER_TABLE, CONTAINER_TABLE + '/Adagrad'), tf_names)))
  from_tpu = _container_estimator(tmp_path / 'tpu', container)
  assert set(tf_names) <= set(from_tpu.get_variable_names())
  two_batches = lambda params: _container_input_fn(params).take(2)
  predictions = [np.stack([p['logit'] for p in estimator.predict(two_batches)])
                 for estimator in (own, from_tpu)]
  np.testing.assert_array_equal(predictions[1], predictions[0])
  np.testing.assert_array_equal(
      _served(from_tpu.export_saved_model(str(tmp_path / 'export'),
                                          _ids_receiver), CONTAINER_IDS[:BATCH]),
      predictions[0][:BATCH])
  for estimator in (own, from_tpu):
    estimator.train(_container_input_fn, max_steps=2)
  assert sorted(from_tpu.get_variable_names()) == sorted(
      own.get_variable_names())
  for name in own.get_variable_names():
    np.testing.assert_array_equal(from_tpu.get_variable_value(name),
                                  own.get_variable_value(name), err_msg=name)


@pytest.mark.legacy_only
def test_use_tpu_false_names_and_values_are_tf_2_15s(tmp_path):
  """A TF2 `DenseFeatures` in a Sequential, use_tpu=False: the container's
  names (`sequential/dense_features/...`), TF's values to the bit."""
  trained = []
  for driver in ('tpu_fc', 'tf'):
    estimator = _container_estimator(tmp_path / driver, 'sequential',
                                     use_tpu=False, driver=driver)
    estimator.train(_container_input_fn, max_steps=2)
    trained.append({name: estimator.get_variable_value(name)
                    for name in estimator.get_variable_names()})
  ours, tfs = trained
  assert 'sequential/' + CONTAINER_TABLE in tfs
  assert sorted(ours) == sorted(tfs)
  for name, value in tfs.items():
    np.testing.assert_array_equal(ours[name], value, err_msg=name)


def _recording_root_names(root_names, use_tpu):
  """The container model, recording the graph's root names at its first call
  (of one per shard) in `root_names[use_tpu, mode or 'export']` (an export's
  call has no batch size)."""
  def model_fn(features, labels, mode, params):
    graph = mode if 'batch_size' in params else 'export'
    if (use_tpu, graph) not in root_names:
      root_names[use_tpu, graph] = {
          op.name.split('/')[0]
          for op in tf.compat.v1.get_default_graph().get_operations()}
    return _container_model_fn(features, labels, mode, params)
  return model_fn


def test_nothing_built_before_the_model_fn_takes_a_root_name(tmp_path):
  """What the emulated TPU builds before a model_fn (lookups, per-shard
  slices, predict's padding; in TRAIN, EVAL, PREDICT and export) is in a name
  scope of its own, as TF's infeed and dataset functions: the root names a
  model_fn finds are TF's CPU graph's (input_fn, global step) and, for an
  embedding table, the TPU's dummy variable and tpu_fc's handle."""
  root_names = {}
  for use_tpu in (False, True):
    estimator = _container_estimator(
        tmp_path / str(use_tpu), 'sequential', use_tpu=use_tpu,
        model_fn=_recording_root_names(root_names, use_tpu))
    estimator.train(_container_input_fn, max_steps=1)
    estimator.evaluate(_container_input_fn, steps=1)
    next(estimator.predict(_container_input_fn))
    estimator.export_saved_model(str(tmp_path / 'export'), _ids_receiver)
  for graph in (tpu_fc.ModeKeys.TRAIN, tpu_fc.ModeKeys.EVAL,
                tpu_fc.ModeKeys.PREDICT, 'export'):
    added = root_names[True, graph] - root_names[False, graph]
    assert {name for name in added if not name.startswith('tpu_fc_infeed')} <= {
        'tpu_embedding_dummy_table_variable_tbl_ids',
        'tpu_embedding_handle_tbl_ids'}, (graph, added)
