"""Checkpoints of the emulated TPU: the names TF 2.15's TPU mode gave tables
and slots (in the graph, as parts; in checkpoints, without), alike with
use_tpu=False, so a model_dir continues either way; warm starts find them,
and remap a vocabulary's rows (`VocabInfo`)."""
import types

import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf

from harness import estimators
from harness import inputs
from harness import models
from harness import oracle

pytestmark = pytest.mark.filterwarnings('ignore::UserWarning')
fc = tf.feature_column
D, B, L = inputs.DIM, inputs.BATCH, inputs.MAX_LENGTH
NS = estimators.NUM_SHARDS


class _GraphVariablesHook(tf.compat.v1.train.SessionRunHook):
  """The global variables' graph names, as hooks and user code see them."""

  def begin(self):
    self.names = sorted(v.op.name for v in tf.compat.v1.global_variables())


@pytest.mark.parametrize('iterations_per_loop', [1, 2])
def test_tables_have_the_graph_names_of_tf_tpu_mode(tmp_path,
                                                    iterations_per_loop):
  """TF's TPU mode made `<column scope>/embedding_weights/part_0` and slots
  `.../embedding_weights/Adagrad/part_0` (one part per host); checkpoints keep
  the legacy names without the part."""
  columns = models.weighted_columns()[:1] + [tpu_fc.embedding_column(
      fc.categorical_column_with_identity('ids3', 5), 4)]
  hook = _GraphVariablesHook()

  def input_fn(params):
    return inputs.weighted_ids(params).map(
        lambda f, l: (dict(f, ids3=f['ids1']), l))

  estimator = tpu_fc.TPUEstimator(
      model_fn=models.columns_model_fn(columns), train_batch_size=2,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path), tpu_config=tpu_fc.TPUConfig(
          num_shards=2, iterations_per_loop=iterations_per_loop)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=columns,
          optimization_parameters=tpu_fc.AdagradParameters(0.1)))
  estimator.train(input_fn, steps=2, hooks=[hook])
  shared = 'ids1_weighted_by_values_ids2_weighted_by_values_shared_embedding'
  plain = 'dense_features/ids3_embedding/embedding_weights'
  assert {shared + '/part_0', shared + '/Adagrad/part_0', plain + '/part_0',
          plain + '/Adagrad/part_0'} <= set(hook.names)
  assert not [name for name in hook.names if name.startswith('tpu_embedding/')]
  saved = {name for name, _ in tf.train.list_variables(str(tmp_path))}
  assert {shared, shared + '/Adagrad', plain, plain + '/Adagrad'} <= saved


class _InitialValuesHook(tf.compat.v1.train.SessionRunHook):
  """The values of graph variables `names` once the session is initialized."""

  def __init__(self, names):
    self._names = names

  def begin(self):
    variables = {v.op.name: v for v in tf.compat.v1.global_variables()}
    self._variables = [variables[name] for name in self._names]

  def after_create_session(self, session, coord):
    self.values = session.run(self._variables)


@pytest.mark.parametrize('how', ['warm_start_by_names', 'init_from_checkpoint'])
def test_tables_initialize_from_a_checkpoint_as_tf_tpu_modes_parts(tmp_path, how):
  """TF's TPU mode made tables and slots as the one part of a partitioned
  variable, so TF's warm start by variable names and `init_from_checkpoint`
  in a `scaffold_fn` find them by their legacy names; so do tpu_fc's (before:
  `... Adagrad/part_0 is not found`, and a crash without a slice info)."""
  columns = [tpu_fc.embedding_column(
      fc.categorical_column_with_identity('ids3', 5), 4)]
  plain = 'dense_features/ids3_embedding/embedding_weights'

  def input_fn(params):
    return inputs.weighted_ids(params).map(
        lambda f, l: ({'ids3': f['ids1']}, l))

  def estimator(model_dir, warm_start_from=None, init_from=None):
    def model_fn(features, labels, mode, params):
      spec = models.columns_model_fn(columns)(features, labels, mode, params)
      if init_from is None:
        return spec

      def scaffold_fn():
        tf.compat.v1.train.init_from_checkpoint(
            init_from, {'dense_features/': 'dense_features/'})
        return tf.compat.v1.train.Scaffold()
      return spec._replace(scaffold_fn=scaffold_fn)

    return tpu_fc.TPUEstimator(
        model_fn=model_fn, train_batch_size=2, warm_start_from=warm_start_from,
        config=tpu_fc.RunConfig(model_dir=str(model_dir)),
        embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
            feature_columns=columns,
            optimization_parameters=tpu_fc.AdagradParameters(0.1)))

  source = estimator(tmp_path / 'source')
  source.train(input_fn, steps=2)
  warm_start = init_from = None
  if how == 'warm_start_by_names':
    warm_start = types.SimpleNamespace(  # a tf.estimator.WarmStartSettings
        ckpt_to_initialize_from=str(tmp_path / 'source'),
        vars_to_warm_start=[plain, plain + '/Adagrad'],
        var_name_to_vocab_info=None, var_name_to_prev_var_name=None)
  else:
    init_from = str(tmp_path / 'source')
  hook = _InitialValuesHook([plain + '/part_0', plain + '/Adagrad/part_0'])
  estimator(tmp_path / 'warm', warm_start, init_from).train(
      input_fn, steps=1, hooks=[hook])
  np.testing.assert_array_equal(hook.values[0], source.get_variable_value(plain))
  np.testing.assert_array_equal(hook.values[1],
                                source.get_variable_value(plain + '/Adagrad'))


def test_checkpoint_names_match_between_tpu_and_cpu(tmp_path):
  """DenseFeatures, shared, input_layer and sequence: same names both ways."""
  fa = inputs.Feature('a', inputs.A_SP)
  fb, fc_ = inputs.Feature('p', inputs.B_SP), inputs.Feature('q', inputs.A_SP)
  fd = inputs.Feature('d', inputs.B_SP, weights=[1.0, 0.5, 2.0, 1.5, 0.75])
  fs = inputs.Feature('s', inputs.S_SP, seq_len=L)

  def column_fn():
    shared = tpu_fc.shared_embedding_columns(
        [fb.categorical(), fc_.categorical()], D,
        initializer=models.const_init(models.init_table(1)))
    return ([fa.column(models.init_table(0))] + shared,
            [fd.column(models.init_table(2))],
            [fs.column(models.init_table(3))])

  def model_fn(features, labels, mode, params):
    del labels
    dense_columns, v1_columns, sequence_columns = column_fn()
    net = tf.concat([
        tf.keras.layers.DenseFeatures(dense_columns)(features),
        tf.compat.v1.feature_column.input_layer(features, v1_columns)], 1)
    sequence, _ = tf.keras.experimental.SequenceFeatures(sequence_columns)(
        features)
    bias = tf.compat.v1.get_variable('bias', [4 * D],
                                     initializer=models.const_init(
                                         models.BIAS0))
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
  input_fn = inputs.input_fn([fa, fb, fc_, fd, fs],
                             inputs.coefficients(14, 4 * D),
                             inputs.coefficients(15, L, D))
  names = {}
  for use_tpu in (True, False):
    estimator = estimators.user_estimator(tmp_path / str(use_tpu), model_fn, spec,
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
  feat = inputs.Feature('a', inputs.A_SP, combiner='sum')
  init = models.init_table(19)
  params = tpu_fc.AdagradParameters(0.1)

  column_fn, spec = estimators.one_column(feat, init, params)
  c = inputs.coefficients(19, D)
  input_fn = inputs.input_fn([feat], c)
  estimator = estimators.user_estimator(
      tmp_path, models.user_model_fn(column_fn), spec)
  estimator.train(input_fn, steps=1)
  estimator.train(input_fn, steps=1)
  table = oracle.Table('dense_features/a_embedding/embedding_weights', init,
                       params, [feat])
  table.step({'a': c / NS}, 0.1)
  table.step({'a': c / NS}, 0.1)
  table.check(estimator, 2)
  oracle.check_bias(estimator, c, 2, 1.0 / NS)


@pytest.mark.parametrize('order', ['cpu_then_tpu', 'tpu_then_cpu'])
def test_cross_restore_between_cpu_and_tpu_adagrad(tmp_path, order):
  """A model_dir trained one way continues the other way from its tables and slots.

  Mean loss, so d(loss)/d(act) = c / B on both; model Adagrad (CPU) and spec
  AdagradParameters (TPU) apply the same rule, so 2 steps = 2 reference steps
  (one update each, the TPU's gradients accumulated over its cores).
  """
  feat = inputs.Feature('a', inputs.A_SP, combiner='mean')
  init = models.init_table(16)
  params = tpu_fc.AdagradParameters(0.2, initial_accumulator=0.1)

  column_fn, spec = estimators.one_column(feat, init, params)
  model_fn = models.user_model_fn(
      column_fn, reduction='mean',
      model_optimizer=lambda: tf.compat.v1.train.AdagradOptimizer(
          0.2, initial_accumulator_value=0.1))
  c = inputs.coefficients(16, D)
  input_fn = inputs.input_fn([feat], c)
  table = oracle.Table('dense_features/a_embedding/embedding_weights', init,
                       params, [feat])
  accumulator = np.full(D, 0.1, np.float32)
  bias = np.full(D, models.BIAS0, np.float32)
  modes = [False, True] if order == 'cpu_then_tpu' else [True, False]
  for step, use_tpu in enumerate(modes, 1):
    estimator = estimators.user_estimator(tmp_path, model_fn, spec,
                                          use_tpu=use_tpu)
    estimator.train(input_fn, steps=1)
    table.step({'a': c / B}, 0.2, num_shards=NS if use_tpu else 1)
    table.check(estimator, step)
    g = c.sum(0) / B
    accumulator = accumulator + g * g
    bias = bias - 0.2 * g / np.sqrt(accumulator)
    np.testing.assert_allclose(estimator.get_variable_value('bias'), bias,
                               **oracle.TOL)
    assert estimator.get_variable_value('global_step') == step


WORDS = ['apple', 'banana', 'cherry']
NEW_WORDS = ['cherry', 'date', 'apple', 'elderberry']


def _word_column(vocabulary_size):
  """A table of a vocabulary's rows (the input gives them as ids)."""
  return tpu_fc.embedding_column(
      tf.feature_column.categorical_column_with_identity('word',
                                                         vocabulary_size), 2,
      initializer=tf.compat.v1.truncated_normal_initializer(seed=1))


@pytest.mark.parametrize('use_tpu', [False, True], ids=['cpu', 'tpu'])
def test_a_warm_start_remaps_a_vocabulary_with_vocab_info(tmp_path, use_tpu):
  """`WarmStartSettings(var_name_to_vocab_info={table: tf.estimator.
  VocabInfo(...)})`: each row of the new vocabulary gets its word's old row,
  a new word the backup initializer's zeros (tf.compat.v1.train.warm_start's),
  also into the emulated TPU's table (as on a TPU, not a trainable variable:
  warm_start finds it by a list of names, not a regex)."""
  table = 'dense_features/word_embedding/embedding_weights'
  files = {}
  for name, words in (('old', WORDS), ('new', NEW_WORDS)):
    files[name] = str(tmp_path / (name + '_words.txt'))
    with open(files[name], 'w') as f:
      f.write('\n'.join(words) + '\n')

  def input_fn(params):
    del params
    return tf.data.Dataset.from_tensors(
        ({'word': tf.sparse.from_dense(tf.constant([[1], [2]], tf.int64))},
         tf.zeros([2, 1]))).repeat()

  def estimator(name, words, warm_start_from=None):
    column = _word_column(len(words))
    return tpu_fc.TPUEstimator(
        model_fn=models.embedding_model_fn(
            [column], lambda net, features, labels: tf.reduce_sum(net),
            layer=tf.keras.layers.DenseFeatures, rate=0.0, cross_shard=False),
        use_tpu=use_tpu, train_batch_size=2,
        config=tpu_fc.RunConfig(model_dir=str(tmp_path / name)),
        warm_start_from=warm_start_from,
        embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
            feature_columns=[column],
            optimization_parameters=(
                tpu_fc.StochasticGradientDescentParameters(0.))))

  old = estimator('old', WORDS)
  old.train(input_fn, max_steps=1)
  with tpu_fc.legacy_names.installed():
    settings = tf.estimator.WarmStartSettings(
        old.model_dir, vars_to_warm_start=[table],  # (global variables too)
        var_name_to_vocab_info={table: tf.estimator.VocabInfo(
            new_vocab=files['new'], new_vocab_size=len(NEW_WORDS),
            num_oov_buckets=0, old_vocab=files['old'],
            backup_initializer=tf.compat.v1.zeros_initializer())})
  new = estimator('new', NEW_WORDS, settings)
  new.train(input_fn, max_steps=1)
  old_rows = old.get_variable_value(table)
  np.testing.assert_array_equal(new.get_variable_value(table), [
      old_rows[WORDS.index(word)] if word in WORDS else [0., 0.]
      for word in NEW_WORDS])
