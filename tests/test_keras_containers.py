"""A `DenseFeatures` inside a Keras `Sequential`, a subclassed `Model` (named
`Sub`: a root `sub` op built before the model_fn would make it `Sub_1`), a
functional `Model`, a `tf.name_scope` or a variable scope: what such a model
trains, evaluates, predicts and exports, and the names its table has.  TF2's
`DenseFeatures` names its table by the enclosing name scopes on the CPU; a
TPU's record of it, by variable scope, leaves them out."""
import os
import shutil

import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf

from harness import estimators
from harness import inputs
from harness import lanes


# The model's data and batch (the linear model's).
N, BATCH = inputs.N, estimators.LINEAR_BATCH

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


# Evaluated on the TPU or on the CPU, by container.
EVAL_ON_TPU = {'sequential': False, 'subclassed': True, 'name_scope': True,
               'variable_scope': False, 'functional': True}


@pytest.fixture(name='trained_in', scope='module')
def _trained_in(tmp_path_factory):
  """container -> the model_dir of its model trained one step, trained once
  for the tests that read it or train on in a copy of it."""
  model_dirs = {}

  def trained_in(container):
    if container not in model_dirs:
      model_dir = tmp_path_factory.mktemp(container)
      _container_estimator(model_dir, container).train(_container_input_fn,
                                                       max_steps=1)
      model_dirs[container] = model_dir
    return model_dirs[container]

  return trained_in


@pytest.mark.parametrize('container', sorted(EVAL_ON_TPU))
def test_a_model_in_a_container_evaluates_predicts_and_exports_what_it_trained(
    tmp_path, trained_in, container):
  """(A variable scope and a functional model worked before: kept.)"""
  estimator = _container_estimator(trained_in(container), container,
                                   eval_on_tpu=EVAL_ON_TPU[container])
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
    tmp_path, trained_in, container):
  """TF 2.15's TPU names a TF2 `DenseFeatures` table by the bare variable
  scope: `embedding_weights`, its Adagrad slot `embedding_weights/Adagrad`
  (on the legacy lane: TF's own rule says so).  A `use_tpu=True` model
  predicts, exports and trains on from such a checkpoint exactly as from its
  own, which names them `dense_features/ids_embedding/...`."""
  tf_names = ('embedding_weights', 'embedding_weights/Adagrad')
  if lanes.LEGACY:
    assert _tf_tpu_table_names(container, tf.keras.layers.DenseFeatures) == (
        tf_names)
  shutil.copytree(trained_in(container), tmp_path / 'own')  # (trains on)
  own = _container_estimator(tmp_path / 'own', container)
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
  model_fn finds are TF's CPU graph's (global step), the input pipeline's
  scope on a TPU (TF's `input_pipeline_task0`, where the CPU graph has
  input_fn's ops at the root) and, for an embedding table, the TPU's dummy
  variable and tpu_fc's handle."""
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
        'input_pipeline_task0', 'tpu_embedding_dummy_table_variable_tbl_ids',
        'tpu_embedding_handle_tbl_ids'}, (graph, added)
