"""`tpu_fc.mid_level.TPUEmbedding`: TF's mid-level API trained on the host.

Judged by what we did not write: its lookups against TF's own CPU lookup
(`tf.tpu.experimental.embedding.serving_embedding_lookup`), its checkpoints
against TF's own `TPUEmbedding` (restored both ways), its updates against the
reference oracle and against the legacy model trained by the emulated
TPUEstimator (the migration's promise), and TF's TPU rule for several cores
derived by hand.
"""
import functools

import numpy as np
import pytest

from harness import estimators
from harness import inputs
from harness import mid_level
from harness import models
from harness import oracle
from harness import scripts
import tpu_fc
from tpu_fc import _tf_internals as internals
from tpu_fc._tf import tf

embedding_api = tf.tpu.experimental.embedding
pytestmark = pytest.mark.filterwarnings('ignore::UserWarning')


def _tables(start=0.0):
  """Two tables of known rows: video (6 x 2, mean) and user (4 x 3, sum)."""
  def rows(vocabulary, dim):
    return tf.constant_initializer(
        start + np.arange(vocabulary * dim).reshape(vocabulary, dim) / 10)
  return (embedding_api.TableConfig(vocabulary_size=6, dim=2, name='video',
                                    combiner='mean', initializer=rows(6, 2)),
          embedding_api.TableConfig(vocabulary_size=4, dim=3, combiner='sum',
                                    initializer=rows(4, 3)))


def _feature_config(combiner='mean', max_sequence_length=0):
  video, user = _tables()
  video.combiner = combiner
  return {'watched': embedding_api.FeatureConfig(table=video),
          'liked': embedding_api.FeatureConfig(
              table=video, max_sequence_length=max_sequence_length),
          'user': embedding_api.FeatureConfig(table=user)}


def _inputs(liked_kind):
  liked = tf.ragged.constant([[1], [4, 5, 5]], tf.int64)
  weights = tf.ragged.constant([[2.0], [1.0, 0.5, 0.25]])
  if liked_kind == 'sparse':
    liked, weights = liked.to_sparse(), weights.to_sparse()
  features = {'watched': tf.sparse.from_dense(tf.constant([[1, 2], [3, 0]],
                                                          tf.int64)),
              'liked': liked, 'user': tf.constant([0, 3], tf.int64)}
  return features, {'watched': None, 'liked': weights, 'user': None}


@pytest.mark.parametrize('combiner', ['mean', 'sum', 'sqrtn'])
@pytest.mark.parametrize('liked_kind', ['sparse', 'ragged'])
@pytest.mark.parametrize('weighted', [False, True])
def test_lookup_equals_tfs_cpu_lookup(combiner, liked_kind, weighted):
  config = _feature_config(combiner)
  embedding = tpu_fc.mid_level.TPUEmbedding(config, embedding_api.SGD(0.1))
  features, weights = _inputs(liked_kind)
  weights = weights if weighted else None
  embedding.enqueue(features, weights)
  got = embedding.dequeue()
  want = embedding_api.serving_embedding_lookup(
      features, weights, embedding.embedding_tables, config)
  for name in config:
    np.testing.assert_allclose(got[name], want[name], rtol=1e-6,
                               err_msg=name)


@pytest.mark.parametrize('liked_kind', ['sparse', 'ragged'])
def test_sequence_lookup_equals_tfs_cpu_lookup(liked_kind):
  config = _feature_config(max_sequence_length=2)
  embedding = tpu_fc.mid_level.TPUEmbedding(config, embedding_api.SGD(0.1))
  features, _ = _inputs(liked_kind)
  embedding.enqueue(features)
  got = embedding.dequeue()['liked']
  assert got.shape == (2, 2, 2)  # [batch, max_sequence_length, dim]
  want = embedding_api.serving_embedding_lookup(
      features, None, embedding.embedding_tables, config)['liked']
  np.testing.assert_allclose(got, want, rtol=1e-6)


# On one core; on two, tests/test_contract.py's mid_level path (every input
# kind).
CASES = [(kind, name, 1) for kind in ('sparse', 'ragged')
         for name in mid_level.MID_LEVEL_OPTIMIZERS]


@pytest.mark.parametrize('kind, optimizer, cores', CASES,
                         ids=['{}-{}-{}cores'.format(*case) for case in CASES])
def test_two_steps_match_the_reference(kind, optimizer, cores):
  embedding = mid_level.tpu_embedding(optimizer, cores)
  table, slots = mid_level.train(embedding, kind, 2, cores)
  want = oracle.expected_step('mid_level', optimizer, steps=2,
                               num_shards=cores)
  want.assert_matches(table, {slot: slots[slot]
                              for _, slot in want.params.SLOTS})


# Every optimizer against the legacy model on one core, where nothing else
# compares the legacy model's tables with the migrated loop's; on two cores
# tests/test_contract.py judges both (embedding_core and mid_level, every
# column optimizer, every input kind) by the oracle, so two cores here only
# where that leaves a gap or the cores change the rule: AdagradMomentum (no
# column optimizer), per-core Adam (one core is Adam), FTRL (the most
# nonlinear of the summed gradients), and pipelined Adam.
EQUIVALENCE = ([(name, 1, False) for name in mid_level.MID_LEVEL_OPTIMIZERS
                if name != 'adam_per_core'] +
               [('adagrad_momentum', 2, False), ('adam_per_core', 2, False),
                ('ftrl', 2, False), ('adam', 2, True), ('adagrad', 1, True)])


@pytest.mark.parametrize(
    'optimizer, cores, pipelined', EQUIVALENCE,
    ids=['{}-{}cores{}'.format(n, c, '-pipelined' if p else '')
         for n, c, p in EQUIVALENCE])
def test_migrated_loop_equals_the_legacy_model(tmp_path, optimizer, cores,
                                               pipelined):
  """The legacy model_fn on the emulated TPUEstimator and its migrated TF2
  loop train the same tables and slots from the same data (pipelined: each
  lookup misses the previous step's update, in both; the squared loss makes
  the gradients depend on what was looked up).  An AdagradMomentum table is
  declared in the legacy model's dict configs (the column spec refuses it)."""
  legacy = estimators.contract_estimator(tmp_path, 'embedding_core', optimizer,
                             num_shards=cores, pipelined=pipelined,
                             squared=pipelined)
  legacy.train(inputs.contract_input_fn('sparse'), steps=4)
  table, slots = mid_level.train(
      mid_level.tpu_embedding(optimizer, cores, pipelined), 'sparse', 4,
      cores, squared=pipelined)
  name = estimators.table_variable('embedding_core', optimizer)
  np.testing.assert_allclose(table, legacy.get_variable_value(name), atol=1e-6,
                             rtol=0)
  for suffix, slot in estimators.EMBEDDING_OPTIMIZERS[optimizer].SLOTS:
    np.testing.assert_allclose(
        slots[slot], legacy.get_variable_value(name + '/' + suffix),
        atol=1e-6, rtol=0, err_msg=slot)


@pytest.mark.parametrize('accumulation', [True, False],
                         ids=['summed', 'per_core'])
def test_two_cores_by_hand(accumulation):
  """TF's TPU rules, derived by hand.  Accumulation (the default): id 2 gets
  1.0 + 0.5 in one update (Adagrad: accumulator 0.1 + 1.5²).  Off: 1.0 from
  core 0 (its holder), then 0.5 from core 1 (accumulator 0.1 + 1.0² + 0.5²).
  Id 1 (held by core 1) gets 2.0 from core 1 only either way."""
  table = embedding_api.TableConfig(vocabulary_size=3, dim=1, combiner='sum',
                                    initializer=tf.zeros_initializer())
  embedding = tpu_fc.mid_level.TPUEmbedding(
      embedding_api.FeatureConfig(table=table),
      embedding_api.Adagrad(0.12, initial_accumulator_value=0.1,
                            use_gradient_accumulation=accumulation),
      num_cores=2)
  embedding.enqueue(tf.constant([2, 2, 2, 1], tf.int64))  # cores 0, 0, 1, 1
  embedding.dequeue()
  embedding.apply_gradients(tf.constant([[0.5], [0.5], [0.5], [2.0]]))
  summed = -0.12 * 1.5 / np.sqrt(0.1 + 1.5 ** 2)
  per_core = (-0.12 * 1.0 / np.sqrt(0.1 + 1.0) -
              0.12 * 0.5 / np.sqrt(0.1 + 1.0 + 0.25))
  want_id2, other_id2 = (summed, per_core) if accumulation else (per_core,
                                                                 summed)
  got = embedding.embedding_tables[table].numpy()[:, 0]
  np.testing.assert_allclose(
      got, [0.0, -0.12 * 2.0 / np.sqrt(0.1 + 4.0), want_id2], rtol=1e-6)
  assert abs(got[2] - other_id2) > 1e-2  # the other rule is far outside
  accumulators = embedding._variables['table_0']['accumulators']  # pylint: disable=protected-access
  np.testing.assert_allclose(
      accumulators.numpy()[:, 0],
      [0.1, 4.1, 0.1 + 1.5 ** 2 if accumulation else 1.35], rtol=1e-6)


def _trained(optimizer):
  config = _feature_config()
  embedding = tpu_fc.mid_level.TPUEmbedding(config, optimizer)
  features, weights = _inputs('sparse')
  embedding.enqueue(features, weights)
  embedding.apply_gradients(tf.nest.map_structure(tf.ones_like,
                                                  embedding.dequeue()))
  return embedding


def _named_variables(embedding):
  """{'<table>' or '<table>/<slot>': variable} of either class."""
  return {(table if slot == 'parameters' else table + '/' + slot): variable
          for table, variables in embedding._variables.items()  # pylint: disable=protected-access
          for slot, variable in variables.items()}


@pytest.mark.parametrize('optimizer', [
    lambda: embedding_api.Adagrad(0.1), lambda: embedding_api.Adam(0.1),
    lambda: embedding_api.FTRL(0.1),
    lambda: embedding_api.AdagradMomentum(0.1, momentum=0.9,
                                          use_nesterov=True)],
    ids=['adagrad', 'adam', 'ftrl', 'adagrad_momentum'])
def test_checkpoints_restore_into_tfs_class_and_back(tmp_path, optimizer):
  ours = _trained(optimizer())
  path = tf.train.Checkpoint(embedding=ours).save(str(tmp_path / 'ours'))
  keys = {name for name, _ in tf.train.list_variables(path)}
  theirs = embedding_api.TPUEmbedding(_feature_config(), optimizer())
  status = tf.train.Checkpoint(embedding=theirs).restore(path)
  theirs.build()
  status.assert_consumed()  # every key of ours is one of TF's objects
  ours_values = {k: v.numpy() for k, v in _named_variables(ours).items()}
  theirs_variables = _named_variables(theirs)
  assert sorted(ours_values) == sorted(theirs_variables)
  for name, value in ours_values.items():
    np.testing.assert_array_equal(theirs_variables[name].numpy(), value,
                                  err_msg=name)
  # ... and back, after TF's object changed them: TF's keys are ours.
  for variable in theirs_variables.values():
    variable.assign(variable * 2 + 1)
  path = tf.train.Checkpoint(embedding=theirs).save(str(tmp_path / 'theirs'))
  assert {name for name, _ in tf.train.list_variables(path)} == keys
  back = tpu_fc.mid_level.TPUEmbedding(_feature_config(), optimizer())
  tf.train.Checkpoint(embedding=back).restore(path).assert_existing_objects_matched()
  back.build(tf.nest.map_structure(lambda value: value.shape,
                                   _inputs('sparse')[0]))  # restored on
  # creation, as TF's class is
  for name, variable in _named_variables(back).items():
    np.testing.assert_array_equal(variable.numpy(),
                                  theirs_variables[name].numpy(), err_msg=name)


@pytest.fixture
def fresh_global_step():
  """An eager global step lives in the default graph's collection: this test's
  own, dropped after it."""
  tf.compat.v1.reset_default_graph()
  yield
  tf.compat.v1.reset_default_graph()


def test_step_functions_carry_over_to_a_traced_loop(tmp_path, fresh_global_step):
  """A column's `learning_rate_fn` and the spec's gradient multiplier, both of
  the global step: `to_mid_level()` in eager code binds the global step (a
  traced step cannot create it), `scale_gradients` applies the multiplier
  that TF's `TPUEmbedding` has no setting for; 4 steps of the migrated loop
  train what the emulated TPUEstimator trains.  Without the multiplier the
  tables differ (checked below), so the comparison sees it."""
  column = tpu_fc.embedding_column(
      tf.feature_column.categorical_column_with_identity('ids', models.VOCAB),
      models.DIM, combiner='mean',
      initializer=tf.compat.v1.constant_initializer(models.START),
      learning_rate_fn=lambda step: 0.4 / (1.0 + tf.cast(step, tf.float32)))

  def spec():
    return tpu_fc.EmbeddingConfigSpec(
        feature_columns=[column],
        optimization_parameters=estimators.EMBEDDING_OPTIMIZERS['adagrad'],
        experimental_gradient_multiplier_fn=(
            lambda step: 0.5 + 0.25 * tf.cast(step, tf.float32)))

  legacy = tpu_fc.TPUEstimator(
      model_fn=models.contract_model_fn(estimators.MODEL_OPTIMIZERS['sgd'][0]),
      train_batch_size=len(inputs.IDS), params={'column': column},
      config=tpu_fc.RunConfig(model_dir=str(tmp_path), tpu_config=tpu_fc.TPUConfig(
          num_shards=2, iterations_per_loop=2)), embedding_config_spec=spec())
  legacy.train(inputs.contract_input_fn('sparse'), steps=4)
  want = legacy.get_variable_value(models.TABLE)

  def migrated(scaled):
    config = spec().to_mid_level()
    embedding = tpu_fc.mid_level.TPUEmbedding(
        config.feature_config, config.optimizer, num_cores=2)
    global_step = tf.compat.v1.train.get_global_step()
    step = tf.function(mid_level.step(
        embedding, 'sparse', 2,
        scale_gradients=config.scale_gradients if scaled else None))
    for _ in range(4):
      step()
      global_step.assign_add(1)
    return next(iter(embedding.embedding_tables.values())).numpy()

  np.testing.assert_allclose(migrated(scaled=True), want, atol=1e-6, rtol=0)
  tf.compat.v1.reset_default_graph()  # a new global step
  assert np.abs(migrated(scaled=False) - want).max() > 1e-3


@pytest.mark.parametrize('function', [False, True], ids=['eager', 'function'])
def test_eager_steps_and_tf_function_steps_match_the_reference(function):
  """(Their results may differ in the last bit: Grappler rewrites a traced
  step's arithmetic.)"""
  table, slots = mid_level.train(mid_level.tpu_embedding('adam', 2),
                                         'ragged', 3, 2, function=function)
  oracle.expected_step('mid_level', 'adam', steps=3).assert_matches(
      table, slots)


def test_dequeue_gives_the_configs_structure_in_plain_containers():
  """As the feature config was given (a dict of a dict and a list here), not
  TF's tracking wrappers, which a tf.function cannot return on TF 2.15."""
  video, user = _tables()
  embedding = tpu_fc.mid_level.TPUEmbedding(
      {'watched': {'now': embedding_api.FeatureConfig(table=video)},
       'users': [embedding_api.FeatureConfig(table=user)]},
      embedding_api.SGD(0.1))

  def lookup():
    embedding.enqueue({'watched': {'now': tf.constant([1, 2], tf.int64)},
                       'users': [tf.constant([0, 3], tf.int64)]},
                      training=False)
    return embedding.dequeue()

  for activations in (tf.function(lookup)(), lookup()):  # traced, then eager
    assert type(activations) is dict and type(activations['watched']) is dict
    assert type(activations['users']) is list
  np.testing.assert_allclose(activations['watched']['now'],
                             [[0.2, 0.3], [0.4, 0.5]], rtol=1e-6)
  np.testing.assert_allclose(activations['users'][0],
                             [[0.0, 0.1, 0.2], [0.9, 1.0, 1.1]], rtol=1e-6)


def test_every_checkpoint_of_a_traced_pipelined_loop_holds_its_last_update(
    tmp_path):
  """Each call of a traced step parks its update for the next lookup; each
  save applies it first (before: only the first save after tracing did)."""
  embedding = mid_level.tpu_embedding('sgd', 1, pipelined=True)
  step = tf.function(mid_level.step(embedding, 'sparse', 1))

  checkpoint = tf.train.Checkpoint(embedding=embedding)
  (table,) = embedding.embedding_tables.values()
  for save in range(2):
    step()
    step()
    path = checkpoint.save(str(tmp_path / 'ckpt'))
    saved = tf.train.load_variable(path, 'embedding/ids/.ATTRIBUTES/VARIABLE_VALUE')
    np.testing.assert_array_equal(saved, table.numpy())
    # SGD on a linear loss: every step moves the table by the same amount.
    want = oracle.expected_step('mid_level', 'sgd', steps=2 * (save + 1),
                                 num_shards=1)
    want.assert_matches(saved, {})


def test_the_tape_reaches_no_table():
  """As on a TPU, the model's tape sees activations, not tables: a Keras
  optimizer over everything trainable cannot update a table twice."""
  embedding = mid_level.tpu_embedding('sgd', 1)
  with tf.GradientTape() as tape:
    embedding.enqueue({'ids': inputs.contract_ids('sparse')})
    loss = tf.reduce_sum(embedding.dequeue()['ids'])
  table = next(iter(embedding.embedding_tables.values()))
  assert tape.gradient(loss, table) is None


def _misuse_cases():
  def unbuilt_apply(embedding):
    embedding.apply_gradients({'ids': tf.zeros([4, 2])})

  def dequeue_first(embedding):
    embedding.build({'ids': tf.TensorShape([4, 2])})
    embedding.dequeue()

  def build_without_output_shapes(embedding):  # (TF's TPU class's error)
    embedding.build()

  def wrong_structure(embedding):
    embedding.enqueue([inputs.contract_ids('sparse')])

  def strings(embedding):
    embedding.enqueue({'ids': 'not a tensor'})

  def dense_weights(embedding):
    embedding.enqueue({'ids': tf.constant([1, 2], tf.int64)},
                      weights={'ids': tf.constant([1.0, 2.0])})

  def gradient_shape(embedding):
    embedding.enqueue({'ids': inputs.contract_ids('sparse')})
    embedding.apply_gradients({'ids': tf.zeros([4, 3])})

  def gradient_type(embedding):
    embedding.enqueue({'ids': inputs.contract_ids('sparse')})
    embedding.apply_gradients({'ids': np.zeros([4, 2], np.float32)})

  def inference_step(embedding):
    embedding.enqueue({'ids': inputs.contract_ids('sparse')}, training=False)
    embedding.apply_gradients({'ids': tf.zeros([4, 2])})

  def two_functions(embedding):
    tf.function(lambda: embedding.enqueue(
        {'ids': inputs.contract_ids('sparse')}))()
    embedding.dequeue()

  def id_out_of_range(embedding):
    embedding.enqueue({'ids': tf.constant([1, 9], tf.int64)})

  def float_ids(embedding):
    embedding.enqueue({'ids': tf.ragged.constant([[1.0], [2.0, 3.0]])})

  def dense_float_ids(embedding):  # (not cast silently: 1.7 is no id)
    embedding.enqueue({'ids': tf.constant([1.7, 2.0])})

  def two_applies(embedding):
    embedding.enqueue({'ids': inputs.contract_ids('sparse')})
    embedding.apply_gradients({'ids': tf.ones([4, 2])})
    embedding.apply_gradients({'ids': tf.ones([4, 2])})

  def one_weight_too_few(embedding):
    embedding.enqueue({'ids': tf.ragged.constant([[1], [2, 3]], tf.int64)},
                      weights={'ids': tf.ragged.constant([[1.0], [2.0]])})

  return [
      (unbuilt_apply, RuntimeError, 'apply_gradients called on unbuilt '
       'TPUEmbedding object. Please either call enqueue first'),
      (dequeue_first, RuntimeError, 'dequeue called before enqueue'),
      (build_without_output_shapes, ValueError,
       r'Input Feature ids has output shape set as <unknown> which is not '
       r'fully defined\. Please specify the fully defined shape in either '
       r'FeatureConfig or for the build method\.'),
      (wrong_structure, (ValueError, TypeError), 'structure'),
      (strings, ValueError, 'Input ids is of unknown type'),
      (dense_weights, ValueError, 'Weight specified for dense input ids'),
      (gradient_shape, ValueError, r'Found gradient of shape \(4, 3\) at path '
       r'ids. Expected shape \(4, 2\)'),
      (gradient_type, ValueError, 'found non-tensor type'),
      (inference_step, RuntimeError, r'enqueue\(training=False\)'),
      (two_functions, RuntimeError, 'must run where enqueue ran'),
      (id_out_of_range, tf.errors.InvalidArgumentError,
       r'Feature ids \(table ids\): ids \[9\] are out of range \[0, 6\)'),
      (float_ids, ValueError, r"Input ids: the values contained by the inputs "
       r"have type <dtype: 'float32'> and cannot be processed. All values "
       r"should be indices, either of type `int32` or `int64`."),
      (dense_float_ids, ValueError, r"Input ids: the values .* type <dtype: "
       r"'float32'>"),
      (one_weight_too_few, ValueError, r'Feature ids: the weights given to '
       r'enqueue must hold one weight per id, at the same indices; got 2 '
       r'weights for 3 ids.'),
      (two_applies, RuntimeError, 'apply_gradients called twice after one '
       'enqueue'),
  ]


@pytest.mark.parametrize('misuse, error, text', _misuse_cases(),
                         ids=[case[0].__name__ for case in _misuse_cases()])
def test_misuse_gets_tfs_error_or_a_clear_one(misuse, error, text):
  with pytest.raises(error, match=text):
    misuse(mid_level.tpu_embedding('adagrad', 1))


def test_quantized_lookups_follow_tfs_formula_and_gradients_pass_unchanged():
  """`QuantizationConfig(5, -1, 1)`: buckets -1, -0.5, 0, 0.5, 1 (quantum 0.5).

  Row 1 = [0.3, -0.8], row 2 = [0.74, 2.0]: clipped and rounded to the
  nearest bucket, [0.5, -1.0] and [0.5, 1.0], then their mean [0.5, 0.0]; an
  SGD step of gradient 1 (learning rate 1) moves each row by -1/2, as
  unquantized (a TPU's quantization is forward only).
  """
  rows = np.array([[0, 0], [0.3, -0.8], [0.74, 2.0]], np.float32)
  table = embedding_api.TableConfig(
      vocabulary_size=3, dim=2, initializer=tf.constant_initializer(rows),
      quantization_config=embedding_api.QuantizationConfig(5, -1.0, 1.0))
  embedding = tpu_fc.mid_level.TPUEmbedding(
      {'ids': embedding_api.FeatureConfig(table=table)},
      embedding_api.SGD(learning_rate=1.0))
  embedding.enqueue({'ids': tf.ragged.constant([[1, 2]], tf.int64)})
  np.testing.assert_array_equal(embedding.dequeue()['ids'], [[0.5, 0.0]])
  embedding.apply_gradients({'ids': tf.ones([1, 2])})
  np.testing.assert_array_equal(
      embedding.embedding_tables[table],
      rows - np.array([[0, 0], [0.5, 0.5], [0.5, 0.5]], np.float32))


def test_a_custom_combiner_is_refused_naming_the_table():
  table = embedding_api.TableConfig(vocabulary_size=3, dim=2, name='video')
  table.combiner = lambda values: values  # (TF 2.21's CustomCombiner is one)
  with pytest.raises(NotImplementedError, match="TableConfig 'video': "
                     'combiner .* is not supported by tpu_fc'):
    tpu_fc.mid_level.TPUEmbedding(
        {'ids': embedding_api.FeatureConfig(table=table)},
        embedding_api.SGD(learning_rate=1.0))


def test_tables_are_named_and_optimized_as_tfs_class_does():
  first, second = (embedding_api.TableConfig(vocabulary_size=3, dim=1),
                   embedding_api.TableConfig(vocabulary_size=3, dim=1))
  optimizer = embedding_api.SGD(0.5)
  tpu_fc.mid_level.TPUEmbedding(
      [embedding_api.FeatureConfig(table=first),
       embedding_api.FeatureConfig(table=second)], optimizer)
  assert (first.name, second.name) == ('table_0', 'table_1')
  assert first.optimizer is optimizer
  with pytest.raises(ValueError, match='Tables must have a unique name'):
    tpu_fc.mid_level.TPUEmbedding(
        [embedding_api.FeatureConfig(table=embedding_api.TableConfig(
            vocabulary_size=3, dim=1, name='same')),
         embedding_api.FeatureConfig(table=embedding_api.TableConfig(
             vocabulary_size=3, dim=1, name='same'))], optimizer)


def test_options_of_the_mid_level_optimizer_follow_the_tpu_rules():
  """A learning-rate callable, gradient and weight clipping, weight decay and
  `slot_variable_creation_fn`, against the reference (1 and 2 cores)."""
  rate = tf.Variable(0.3)
  created = []

  def slot_variable_creation_fn(table, slot_names, slot_initializers):
    created.extend(slot_names)  # (as a TPU can create them: partials)
    return {name: tf.Variable(functools.partial(init, table.shape), name=name)
            for name, init in zip(slot_names, slot_initializers)}

  for cores in (1, 2):
    optimizer = embedding_api.Adagrad(
        lambda: rate * 2, initial_accumulator_value=0.2, clipvalue=0.3,
        clip_weight_min=-0.55, clip_weight_max=0.6, weight_decay_factor=0.1,
        multiply_weight_decay_factor_by_learning_rate=True,
        slot_variable_creation_fn=slot_variable_creation_fn)
    table = embedding_api.TableConfig(
        vocabulary_size=models.VOCAB, dim=models.DIM, name='ids',
        initializer=tf.constant_initializer(models.START))
    embedding = tpu_fc.mid_level.TPUEmbedding(
        {'ids': embedding_api.FeatureConfig(table=table)}, optimizer,
        num_cores=cores)
    got, slots = mid_level.train(embedding, 'sparse', 2, cores)
    params = tpu_fc.optimizers.from_mid_level(optimizer)
    want = oracle.ReferenceSteps(params, models.START, {
        'accumulators': np.full((models.VOCAB, models.DIM), 0.2,
                                np.float32)}, gradient_roundings=2)
    ids, core_of, grads = oracle.occurrences(cores)
    for _ in range(2):
      want.step(ids, grads, 0.6, cores=core_of, num_cores=cores)
    want.assert_matches(got, slots, err_msg='{} cores'.format(cores))
    assert np.min(got) >= np.float32(-0.55) and np.max(got) <= np.float32(0.6)
  assert created == ['accumulators', 'accumulators']


def test_under_one_device_strategy_steps_match_the_reference():
  with tf.distribute.OneDeviceStrategy('/cpu:0').scope():
    embedding = mid_level.tpu_embedding('adagrad', 2)
    table, slots = mid_level.train(embedding, 'ragged', 2, 2)
  oracle.expected_step('mid_level', 'adagrad', steps=2).assert_matches(
      table, slots)


OUTPUT_IDS = [[1, 2, 3], [4], [5, 0], []]  # a batch of 4


def _output_shape_ids(kind):
  """Each example's ids: `OUTPUT_IDS`, or for 'dense' one id each."""
  if kind == 'dense':
    return [row[:1] or [0] for row in OUTPUT_IDS]
  return OUTPUT_IDS


def _output_shape_input(kind):
  """`_output_shape_ids(kind)` as a Tensor, SparseTensor or RaggedTensor."""
  if kind == 'dense':
    return tf.constant([row[0] for row in _output_shape_ids(kind)], tf.int64)
  ids = tf.ragged.constant(OUTPUT_IDS, tf.int64)
  return ids.to_sparse() if kind == 'sparse' else ids


def _output_shape_embedding(output_shape, num_cores=1, optimizer=None):
  video, _ = _tables()
  config = {'a': embedding_api.FeatureConfig(table=video,
                                             output_shape=output_shape)}
  return config, tpu_fc.mid_level.TPUEmbedding(
      config, optimizer or embedding_api.SGD(0.1), num_cores=num_cores)


OUTPUT_SHAPE_CASES = [  # kind, output_shape per core, cores, sequence length
    ('dense', [2, 2], 1, 0), ('sparse', [2, 2], 1, 0), ('ragged', [2, 2], 1, 0),
    ('ragged', [4, 2], 1, 2), ('ragged', [2, 4], 1, 2), ('ragged', [2], 2, 0),
    ('ragged', [2, 3], 2, 3)]


@pytest.mark.parametrize('kind, output_shape, cores, length',
                         OUTPUT_SHAPE_CASES)
def test_output_shape_lookups_and_updates_follow_tfs_rule(kind, output_shape,
                                                          cores, length):
  """The activations: TF's CPU lookup of the feature (its per-core output
  shape for all cores together, the cores' outputs stacked), reshaped as a TPU
  dequeues it.  The update, by hand: SGD moves each looked-up id's row by
  -lr x the loss coefficient at its place in the output (a sequence keeps
  `length` ids per example), divided among an example's ids by the mean
  combiner."""
  config, embedding = _output_shape_embedding(output_shape, cores)
  features = {'a': _output_shape_input(kind)}
  embedding.enqueue(features)
  activations = embedding.dequeue()
  dim = 2
  shape = [cores * output_shape[0]] + output_shape[1:] + [dim]
  assert activations['a'].shape == shape
  whole = {'a': embedding_api.FeatureConfig(
      table=config['a'].table, output_shape=[4 * max(length, 1)])}
  want = embedding_api.serving_embedding_lookup(
      features, None, embedding.embedding_tables, whole)['a']
  np.testing.assert_allclose(activations['a'], np.reshape(want, shape),
                             rtol=1e-6)

  coefficients = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)
  with tf.GradientTape() as tape:
    tape.watch(activations)
    loss = tf.reduce_sum(activations['a'] * coefficients)
  embedding.apply_gradients(tape.gradient(loss, activations))
  per_place = coefficients.reshape(-1, dim)  # one row per example or position
  table = np.arange(12, dtype=np.float32).reshape(6, 2) / 10
  for example, ids in enumerate(_output_shape_ids(kind)):
    if length:
      for position, row in enumerate(ids[:length]):
        table[row] -= 0.1 * per_place[example * length + position]
    else:
      for row in ids:
        table[row] -= 0.1 * per_place[example] / len(ids)
  np.testing.assert_allclose(embedding.embedding_tables[config['a'].table],
                             table, rtol=1e-6, atol=1e-6)


def test_a_checkpoint_after_an_output_shape_sequence_restores(tmp_path):
  """What the first enqueue made of the output shape is kept where TF's
  checkpoint of the object accepts it."""
  _, embedding = _output_shape_embedding([4, 2])
  embedding.enqueue({'a': _output_shape_input('ragged')})
  embedding.apply_gradients({'a': tf.ones([4, 2, 2])})
  prefix = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / 'c'))
  _, restored = _output_shape_embedding([4, 2])
  restored.enqueue({'a': _output_shape_input('ragged')})
  tf.train.Checkpoint(embedding=restored).restore(prefix).assert_consumed()
  [trained], [read] = (list(e.embedding_tables.values())
                       for e in (embedding, restored))
  np.testing.assert_array_equal(read, trained)


def _output_shape_misuses():
  def not_a_factor():
    _output_shape_embedding([3, 1])[1].enqueue(
        {'a': _output_shape_input('ragged')})

  def inconsistent_with_the_output_shape():  # (TF's check of a TPU's enqueue)
    _output_shape_embedding([3])[1].enqueue({'a': _output_shape_input('dense')})

  def dense_of_another_batch():
    _output_shape_embedding([3, 1])[1].enqueue(
        {'a': _output_shape_input('dense')})

  def weights_of_a_sequence():
    ids = _output_shape_input('ragged')
    _output_shape_embedding([4, 2])[1].enqueue(
        {'a': ids}, weights={'a': tf.ones_like(ids, tf.float32)})

  def traced_dense_of_another_batch():  # (the traced graph's check was
    _, embedding = _output_shape_embedding([3, 1])  # optimized away on a
    tf.function(lambda ids: embedding.enqueue({'a': ids}))(  # static batch)
        tf.constant([1, 2], tf.int64))

  def dynamic_dense_of_another_batch():
    _, embedding = _output_shape_embedding([3])
    tf.function(lambda ids: embedding.enqueue({'a': ids}), input_signature=[
        tf.TensorSpec([None], tf.int64)])(tf.constant([1, 2], tf.int64))

  def batch_changed():
    _, embedding = _output_shape_embedding([4, 2])
    embedding.enqueue({'a': _output_shape_input('ragged')})  # 2 ids each
    embedding.enqueue({'a': tf.ragged.constant([[1]] * 8, tf.int64)})

  def batch_not_static():
    _, embedding = _output_shape_embedding([4, 2])
    tf.function(lambda ids: embedding.enqueue({'a': ids}), input_signature=[
        tf.RaggedTensorSpec([None, None], tf.int64)]).get_concrete_function()

  def not_fully_defined():  # (TF's error, from build)
    _output_shape_embedding([None, 2])[1].build()

  return [
      (not_a_factor, ValueError, r'Output shape set in the FeatureConfig should'
       r' be the factor of the input data batch size. But instead got output '
       r'shape \(3, 1\), input data batch size 4 \(feature a'),
      (inconsistent_with_the_output_shape, ValueError,
       r'Inconsistent shape founded for input feature a, Output shape is set '
       r'to be \(3,\), But got incoming output shape \(4,\)'),
      (dense_of_another_batch, ValueError,
       r'Feature a: its output_shape \(3, 1\) holds 3 examples on each of 1 '
       r'core\(s\), but this batch has 4 examples'),
      (traced_dense_of_another_batch, ValueError,
       r'Feature a: its output_shape \(3, 1\) holds 3 examples .* this batch '
       r'has 2'),
      (dynamic_dense_of_another_batch, tf.errors.InvalidArgumentError,
       r'Feature a: its output_shape \(3,\) holds 3 examples .* this batch has 2'),
      (weights_of_a_sequence, ValueError,
       'Weight specified for a, but this is a sequence feature'),
      (batch_changed, ValueError, 'Feature a: the first enqueue made its '
       r'output_shape \(4, 2\) a sequence of 2 ids per example, this one one '
       'combined activation per example: the batch size changed'),
      (batch_not_static, ValueError, 'Feature a: .* not static'),
      (not_fully_defined, ValueError, r'Input Feature a has output shape set '
       r'as \(None, 2\) which is not fully defined. Please specify the fully '
       'defined shape in either FeatureConfig or for the build method.'),
  ]


@pytest.mark.parametrize('misuse, error, text', _output_shape_misuses(),
                         ids=[case[0].__name__
                              for case in _output_shape_misuses()])
def test_output_shape_misuse_gets_a_clear_error(misuse, error, text):
  with pytest.raises(error, match=text):
    misuse()


def test_v0_looks_up_as_tf_and_gets_row_gradients_an_optimizer_applies(
    tmp_path):
  """Tensor-core tables: TF's own TPUEmbeddingV0 lookup, outside a
  TPUStrategy; one SGD step moves only the looked-up rows (by hand: each id
  of example e gets COEF / |IDS[e]|), never the whole table."""
  table = embedding_api.TableConfig(
      vocabulary_size=models.VOCAB, dim=models.DIM, name='ids',
      combiner='mean', initializer=tf.constant_initializer(models.START))
  config = {'ids': embedding_api.FeatureConfig(table=table)}
  embedding = tpu_fc.mid_level.TPUEmbeddingV0(config, embedding_api.SGD(0.1))
  features = {'ids': inputs.contract_ids('ragged')}
  variable = embedding.embedding_tables[table]
  with tf.GradientTape() as tape:
    activations = embedding(features)
    loss = tf.reduce_sum(activations['ids'] * models.COEF)
  np.testing.assert_allclose(
      activations['ids'], embedding_api.serving_embedding_lookup(
          features, None, embedding.embedding_tables, config)['ids'],
      rtol=1e-6)
  gradient = tape.gradient(loss, variable)
  assert isinstance(gradient, tf.IndexedSlices)
  tf.compat.v1.train.GradientDescentOptimizer(0.5).apply_gradients(
      [(gradient, variable)])
  want = models.START.copy()
  for row_ids in inputs.IDS:
    for row in row_ids:
      want[row] -= 0.5 * models.COEF / len(row_ids)
  np.testing.assert_allclose(variable.numpy(), want, rtol=1e-6)
  saved = tf.train.Checkpoint(embedding=embedding).save(str(tmp_path / 'v0'))
  assert 'embedding/ids/.ATTRIBUTES/VARIABLE_VALUE' in {
      name for name, _ in tf.train.list_variables(saved)}


MIGRATED_SCRIPT = """
import numpy as np
import tensorflow as tf

emb = tf.tpu.experimental.embedding
table = emb.TableConfig(vocabulary_size=6, dim=2, name='ids',
                        initializer=tf.constant_initializer(START))
embedding = emb.TPUEmbedding({'ids': emb.FeatureConfig(table=table)},
                             emb.Adagrad(0.2, initial_accumulator_value=0.1))

@tf.function
def step(ids):
  embedding.enqueue({'ids': ids})
  with tf.GradientTape() as tape:
    activations = embedding.dequeue()
    tape.watch(activations)
    loss = tf.reduce_sum(activations['ids'] * [1.0, -2.0])
  embedding.apply_gradients(tape.gradient(loss, activations))

for _ in range(2):
  step(tf.ragged.constant(IDS, tf.int64))
print('TYPE', type(embedding).__module__)
print('TABLE', embedding.embedding_tables[table].numpy().tolist())
"""


@pytest.mark.subprocess
def test_a_migrated_script_trains_unchanged_under_tpu_fc_run(tmp_path):
  script = tmp_path / 'migrated.py'
  script.write_text('START = {}\nIDS = {}\n'.format(
      models.START.tolist(), inputs.IDS) + MIGRATED_SCRIPT)
  result = scripts.run_python(['-m', 'tpu_fc', 'run', str(script)],
                              cwd=str(tmp_path))
  assert result.returncode == 0, result.stderr[-3000:]
  lines = dict(line.split(' ', 1) for line in result.stdout.splitlines()
               if line.startswith(('TYPE', 'TABLE')))
  assert lines['TYPE'] == 'tpu_fc.mid_level'
  oracle.expected_step('mid_level', 'adagrad', steps=2,
                        num_shards=1).assert_matches(
                            np.array(eval(lines['TABLE']), np.float32))  # pylint: disable=eval-used


def test_install_binds_tf_names_outside_a_tpu_strategy_only():
  from tpu_fc import legacy_names  # pylint: disable=g-import-not-at-top
  table = embedding_api.TableConfig(vocabulary_size=3, dim=1)
  with legacy_names.installed():
    names = tf.tpu.experimental.embedding
    built = names.TPUEmbedding(embedding_api.FeatureConfig(table=table),
                               embedding_api.SGD(0.1))
    assert type(built) is tpu_fc.mid_level.TPUEmbedding
    assert isinstance(built, names.TPUEmbedding)
    assert type(names.TPUEmbeddingV0(embedding_api.FeatureConfig(table=table),
                                     embedding_api.SGD(0.1))) is (
                                         tpu_fc.mid_level.TPUEmbeddingV0)
  assert embedding_api.TPUEmbedding is internals.TFTPUEmbedding
  with pytest.raises(RuntimeError, match='should be created under TPUStrategy'):
    embedding_api.TPUEmbeddingV0(embedding_api.FeatureConfig(table=table),
                                 embedding_api.SGD(0.1))


def test_a_class_defined_on_an_installed_name_subclasses_tpu_fcs():
  """As TF2 users subclass TF's class to add helpers: the subclass's own
  __init__ and methods run (before: the base class was built instead)."""
  from tpu_fc import legacy_names  # pylint: disable=g-import-not-at-top
  table = embedding_api.TableConfig(vocabulary_size=3, dim=1,
                                    initializer=tf.constant_initializer(0.5))
  with legacy_names.installed():
    class Looking(tf.tpu.experimental.embedding.TPUEmbedding):

      def __init__(self, feature_config, optimizer):
        super().__init__(feature_config, optimizer)
        self.looked_up = 0

      def lookup(self, features):
        self.looked_up += 1
        self.enqueue(features, training=False)
        return self.dequeue()

    embedding = Looking({'a': embedding_api.FeatureConfig(table=table)},
                        embedding_api.SGD(0.1))
    assert tf.tpu.experimental.embedding.TPUEmbedding.enqueue is (
        tpu_fc.mid_level.TPUEmbedding.enqueue)
  assert isinstance(embedding, tpu_fc.mid_level.TPUEmbedding)
  activations = embedding.lookup({'a': tf.constant([1, 2], tf.int64)})
  np.testing.assert_array_equal(activations['a'], [[0.5], [0.5]])
  assert embedding.looked_up == 1


def _device_types(op_type):
  from tensorflow.python.framework import kernels  # pylint: disable=g-import-not-at-top
  return {kernel.device_type
          for kernel in kernels.get_registered_kernels_for_op(op_type).kernel}


@pytest.mark.skipif('GPU' not in _device_types('MatMul'),
                    reason='this TF build registers no GPU kernels')
def test_every_op_of_a_training_step_has_a_gpu_kernel():
  """What can run on a GPU, read from this TF build's kernel registry (there
  is no GPU here): every op of a traced step, but the formatting of a failed
  input check's message, which soft placement puts on the host."""
  embedding = mid_level.tpu_embedding('adam_per_core', 2)

  def step(ids):
    embedding.enqueue({'ids': ids})
    with tf.GradientTape() as tape:
      activations = embedding.dequeue()
      tape.watch(activations)
      loss = models.contract_loss(activations['ids'])
    embedding.apply_gradients(tape.gradient(loss, activations))

  graph = tf.function(step).get_concrete_function(
      inputs.contract_ids('sparse')).graph
  op_types = {op.type for op in graph.get_operations()}
  for function in graph._functions.values():  # pylint: disable=protected-access
    op_types |= {node.op for node in function.definition.node_def}
  assert {'Unique', 'UnsortedSegmentSum', 'ResourceScatterUpdate',
          'DynamicPartition'} <= op_types  # the engine's step is in there
  host_only = {op_type for op_type in op_types
               if not _device_types(op_type) & {'GPU', 'DEFAULT'}}
  assert host_only == {'StringFormat'}, host_only
