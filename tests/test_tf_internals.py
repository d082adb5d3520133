"""TF's internals, used in one place: `tpu_fc/_tf_internals.py`, on this lane's TF.

A TF upgrade that moves or renames one of them fails here, naming it, rather
than somewhere in a training run.
"""
import ast
import os

import pytest

import tpu_fc
from tpu_fc import _tf_internals as internals
from tpu_fc._tf import tf

PACKAGE = os.path.dirname(tpu_fc.__file__)


def _tf_imports(path):
  """The `tensorflow.<internal>` modules a source file imports."""
  with open(path) as f:
    tree = ast.parse(f.read())
  names = []
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module:
      names.append(node.module)
    elif isinstance(node, ast.Import):
      names.extend(alias.name for alias in node.names)
  return [name for name in names if name.startswith('tensorflow.')]


def test_only_the_internals_module_imports_tensorflow_internals():
  importers = {}
  for folder, _, files in os.walk(PACKAGE):
    for name in files:
      path = os.path.join(folder, name)
      if name.endswith('.py') and _tf_imports(path):
        importers[os.path.relpath(path, PACKAGE)] = _tf_imports(path)
  assert list(importers) == ['_tf_internals.py'], importers


PUBLIC = sorted(name for name in vars(internals)
                if not name.startswith('_') and name not in ('tf', 'contextlib'))


@pytest.mark.parametrize('name', PUBLIC)
def test_every_internal_name_resolves(name):
  assert getattr(internals, name) is not None


# Private methods tpu_fc's subclasses override or call on TF's classes.
OVERRIDDEN = [
    (tf.compat.v1.train.StepCounterHook, '_log_and_record'),
    (tf.compat.v1.train.StepCounterHook, '_set_steps_per_run'),
    (internals.TPUEmbeddingColumnV2, '_get_dense_tensor'),
    (internals.TPUSharedEmbeddingColumnV2, '_get_dense_tensor_internal'),
    (tf.compat.v1.saved_model.Builder, '_add_train_op'),
]


@pytest.mark.parametrize('cls, method', OVERRIDDEN,
                         ids=['{}.{}'.format(c.__name__, m) for c, m in OVERRIDDEN])
def test_overridden_private_methods_exist(cls, method):
  assert callable(getattr(cls, method))


def test_the_names_read_where_tf_reads_them_are_tfs():
  """train_and_evaluate and Estimator's training read them from their modules
  when they run, as TF's training and Estimator do."""
  assert internals.server_lib.Server is tf.distribute.Server
  assert (internals.basic_session_run_hooks.SecondOrStepTimer is
          tf.compat.v1.train.SecondOrStepTimer)
  assert (internals.training.MonitoredTrainingSession is
          tf.compat.v1.train.MonitoredTrainingSession)


# The TF attributes tpu_fc replaces while building a graph (`replaced`).
REPLACED = [
    (internals.tpu_ops_module, 'cross_replica_sum'),
    (tf.compat.v1.tpu, 'cross_replica_sum'),
    (tf.compat.v1.tpu, 'CrossShardOptimizer'),
    (internals.Optimizer, 'apply_gradients'),
]


@pytest.mark.parametrize('owner, name', REPLACED,
                         ids=['{}.{}'.format(o.__name__, n) for o, n in REPLACED])
def test_replaced_attributes_exist_and_come_back(owner, name):
  original = getattr(owner, name)
  assert callable(original)
  with internals.replaced(owner, name, len):
    assert getattr(owner, name) is len
  assert getattr(owner, name) is original


def test_graph_and_op_helpers_on_real_objects():
  graph = tf.Graph()
  with graph.as_default():
    table = tf.compat.v1.get_variable('table', [2, 2], use_resource=True)
    bare = tf.raw_ops.VarHandleOp(dtype=tf.float32, shape=[2, 2],
                                  shared_name='not_yet')
    internals.set_shared_name(bare, table.handle.op.get_attr('shared_name'))
    assert bare.op.get_attr('shared_name') == table.handle.op.get_attr(
        'shared_name')
    first, second = tf.constant(1), tf.random.uniform([])
    assert internals.creation_order(first.op) < internals.creation_order(
        second.op)
    assert not internals.is_stateful(first.op)
    assert internals.is_stateful(second.op)
    created = []
    with internals.variable_creator_scope_of(
        graph, lambda next_creator, **kwargs: created.append(
            kwargs['name']) or next_creator(**kwargs)):
      tf.Variable(1.0, name='seen')
    assert created == ['seen']
    assert internals.graph_key(graph) == internals.graph_key(graph)
    with internals.with_variable_store(internals.new_variable_store()):
      tf.compat.v1.get_variable('table', [2, 2])  # a fresh store: no clash
    assert internals.default_variable_store() is not None


def test_a_loop_body_placeholder_names_what_it_captures():
  graph = tf.Graph()
  with graph.as_default():
    variable = tf.Variable(1.0)
    captured = []

    def body(i):
      handle = tf.compat.v1.get_default_graph().capture(variable.handle)
      captured.append(internals.captured_by(handle))
      return i + 1

    tf.while_loop(lambda i: i < 2, body, [0])
    assert captured == [variable.handle]
    assert internals.captured_by(variable.handle) is None


def test_shared_columns_forget_their_table():
  columns = tpu_fc.shared_embedding_columns(
      [tf.feature_column.categorical_column_with_identity(key, 3)
       for key in ('a', 'b')], 2)
  creator = columns[0].shared_embedding_column_creator
  graph = tf.Graph()
  with graph.as_default():
    features = {key: tf.sparse.from_dense(tf.constant([[1]], tf.int64))
                for key in ('a', 'b')}
    tf.keras.layers.DenseFeatures(columns)(features)
    assert creator._embedding_weights  # pylint: disable=protected-access
    internals.forget_shared_table(creator, graph)
    assert internals.graph_key(graph) not in creator._embedding_weights  # pylint: disable=protected-access


def test_hook_helpers_on_real_hooks(tmp_path):
  listener = tf.compat.v1.train.CheckpointSaverListener()
  saver_hook = tf.compat.v1.train.CheckpointSaverHook(
      str(tmp_path), save_steps=1, listeners=[listener])
  assert internals.saver_listeners(saver_hook) == [listener]
  counter = tf.compat.v1.train.StepCounterHook(every_n_steps=1)
  internals.set_steps_per_run(counter, 5)
  assert counter._steps_per_run == 5  # pylint: disable=protected-access


def test_mid_level_configs_and_variables_of_tfs_own_class():
  table = tf.tpu.experimental.embedding.TableConfig(4, 2, name='t')
  features = {'f': tf.tpu.experimental.embedding.FeatureConfig(table)}
  embedding = tf.tpu.experimental.embedding.TPUEmbeddingForServing(
      features, tf.tpu.experimental.embedding.Adagrad(0.1))
  embedding.build()
  assert tf.nest.flatten(internals.mid_level_feature_config(embedding)) == [
      features['f']]
  variables = internals.mid_level_variables(embedding)
  assert sorted(variables['t']) == ['accumulators', 'parameters']
  assert variables['t']['parameters'] is embedding.embedding_tables[table]


def test_a_saved_model_export_is_known_while_its_functions_trace(tmp_path):
  seen = []
  module = tf.Module()
  module.f = tf.function(
      lambda: seen.append(internals.in_saved_model_export()) or tf.constant(1),
      input_signature=[])
  assert not internals.in_saved_model_export()
  tf.saved_model.save(module, str(tmp_path))
  assert seen == [True]


def test_head_helpers_on_real_objects():
  features = {'w': tf.constant([[2.], [4.]]), 'i': tf.constant([1, 3])}
  for column in (tf.feature_column.numeric_column('w'),
                 tf.compat.v1.feature_column.numeric_column('i')):
    assert isinstance(column, internals.NUMERIC_COLUMN_TYPES)
  weights = internals.numeric_column_dense_tensor(
      tf.feature_column.numeric_column('w'), features)
  assert weights.numpy().tolist() == [[2.], [4.]]
  assert internals.numeric_column_dense_tensor(
      tf.feature_column.numeric_column('i'), features).shape == [2, 1]
  losses = tf.constant([[1.], [3.]])
  assert internals.compute_weighted_loss(
      losses, weights, 'sum_over_batch_size').numpy() == 7.
  assert internals.broadcast_weights(
      1., tf.zeros([2, 3])).numpy().tolist() == [[1.] * 3] * 2
