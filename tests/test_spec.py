"""tpu_fc.EmbeddingConfigSpec validation, side by side with TF 2.15's real spec.

Legacy lane: the reference is `tensorflow_estimator`'s `EmbeddingConfigSpec` built
with TF's own columns, `*Parameters` and `tensorflow.python.tpu.tpu_embedding`
`FeatureConfig`/`TableConfig`; tpu_fc's side uses tpu_fc's own columns, parameters
and configs.  Both lanes: the expected texts are written out here from
LEGACY_SEMANTICS §3 (and TF 2.15's source for the class tuples they embed).
`to_mid_level()` is tested elsewhere.
"""
import numpy as np
import pytest

from harness import lanes
from harness.oracle import outcome
import tpu_fc  # before tensorflow
import tensorflow as tf  # pylint: disable=g-bad-import-order
from tensorflow.python.tpu import feature_column_v2 as tf_tpu_fc  # pylint: disable=g-bad-import-order


fc = tf.feature_column
E = tf.tpu.experimental.embedding

EXACTLY_ONE = ('Exactly one of `feature_columns` and the pair '
               '`feature_to_config_dict` and `table_to_config_dict` must be be '
               'specified.')
# The supported-column tuple of TF 2.15's spec (its _SUPPORTED_FEATURE_COLUMNS +
# _TPU_EMBEDDING_COLUMN_CLASSES + _EMBEDDING_COLUMN_CLASSES, in that order).
SUPPORTED_COLUMNS = (
    "(<class 'tensorflow.python.feature_column.feature_column._NumericColumn'>, "
    "<class 'tensorflow.python.feature_column.feature_column_v2.NumericColumn'>, "
    "<class 'tensorflow.python.tpu.feature_column._TPUEmbeddingColumn'>, "
    "<class 'tensorflow.python.tpu.feature_column._TPUSharedEmbeddingColumn'>, "
    "<class 'tensorflow.python.tpu.feature_column_v2._TPUEmbeddingColumnV2'>, "
    "<class 'tensorflow.python.tpu.feature_column_v2._TPUSharedEmbeddingColumnV2'>, "
    "<class 'tensorflow.python.feature_column.feature_column._EmbeddingColumn'>, "
    "<class 'tensorflow.python.feature_column.feature_column_v2.EmbeddingColumn'>, "
    "<class 'tensorflow.python.feature_column.feature_column._SharedEmbeddingColumn'>)")
# TF 2.15's _SUPPORTED_OPTIMIZERS, with the module path tpu_fc's classes have.
SUPPORTED_OPTIMIZERS = '({})'.format(', '.join(
    "<class 'tpu_fc.optimizers.{}'>".format(n) for n in (
        'ProximalAdagradParameters', 'AdagradParameters', 'AdamParameters',
        'FtrlParameters', 'StochasticGradientDescentParameters',
        'MomentumParameters', 'RMSPropParameters')))
TPU_COLUMN_TYPES = (
    "(<class 'tensorflow.python.tpu.feature_column_v2._TPUEmbeddingColumnV2'>, "
    "<class 'tensorflow.python.tpu.feature_column_v2._TPUSharedEmbeddingColumnV2'>)")

IDENTITY_TYPE = ("<class 'tensorflow.python.feature_column.feature_column_v2."
                 "IdentityCategoricalColumn'>")


def _normalize(result):
  """Messages embedding optimizer class reprs differ only in module path:
  TF's classes live in tensorflow.python.tpu.tpu_embedding, tpu_fc's in
  tpu_fc.optimizers, so TF's text is compared after this replacement."""
  if result is None:
    return None
  error, text = result
  return error, text.replace('tensorflow.python.tpu.tpu_embedding.',
                             'tpu_fc.optimizers.')




class _Side:
  """The factories of one side: tpu_fc's, or TF 2.15's (legacy lane only)."""

  def __init__(self, ours):
    self.ours = ours
    if ours:
      self.spec = tpu_fc.EmbeddingConfigSpec
      self.embedding_column = tpu_fc.embedding_column
      self.shared = tpu_fc.shared_embedding_columns
      self.params = tpu_fc
      self.FeatureConfig = tpu_fc.FeatureConfig  # pylint: disable=invalid-name
      self.TableConfig = tpu_fc.TableConfig  # pylint: disable=invalid-name
    else:
      self.spec = lanes.tf_estimator_embedding.EmbeddingConfigSpec
      self.embedding_column = tf_tpu_fc.embedding_column_v2
      self.shared = tf_tpu_fc.shared_embedding_columns_v2
      self.params = lanes.tf_tpu_embedding
      self.FeatureConfig = lanes.tf_tpu_embedding.FeatureConfig  # pylint: disable=invalid-name
      self.TableConfig = lanes.tf_tpu_embedding.TableConfig  # pylint: disable=invalid-name

  def adagrad(self):
    return self.params.AdagradParameters(0.1)

  def columns(self):
    return [self.embedding_column(fc.categorical_column_with_identity('a', 8), 4)]

  def dicts(self):
    return dict(feature_to_config_dict={'f': self.FeatureConfig('t')},
                table_to_config_dict={'t': self.TableConfig(8, 4)})


OURS = _Side(True)
THEIRS = _Side(False) if lanes.LEGACY else None


# --------------------------------------------------------------------------------
# Validation cases (LEGACY_SEMANTICS §3).
# --------------------------------------------------------------------------------

def _bad_optimizer_15(s):
  # TF 2.15's AdagradMomentumParameters on both sides: the error names its class.
  return lanes.tf_tpu_embedding.AdagradMomentumParameters(0.1, 0.9)


# The optimizers TF 2.15's spec refuses with feature columns (its engine takes
# them from dict configs): name -> its arguments.
COLUMN_REFUSED = {
    'AdagradMomentumParameters': dict(learning_rate=0.1, momentum=0.9),
    'ProximalYogiParameters': {},
    'FrequencyEstimatorParameters': dict(tau=0.1, max_delta=100.0,
                                         outlier_threshold=2.0,
                                         weight_exponent=1.0),
}


def _column_refused(name):
  return lambda s: getattr(s.params, name)(**COLUMN_REFUSED[name])


CASES = [
    # 1. exactly one of columns / both dicts.
    ('nothing', lambda s: {}, ValueError, EXACTLY_ONE),
    ('only_optimizer', lambda s: dict(optimization_parameters=s.adagrad()),
     ValueError, EXACTLY_ONE),
    ('empty_columns', lambda s: dict(feature_columns=[],
                                     optimization_parameters=s.adagrad()),
     ValueError, EXACTLY_ONE),
    ('only_feature_dict', lambda s: dict(
        feature_to_config_dict=s.dicts()['feature_to_config_dict'],
        optimization_parameters=s.adagrad()), ValueError, EXACTLY_ONE),
    ('only_table_dict', lambda s: dict(
        table_to_config_dict=s.dicts()['table_to_config_dict'],
        optimization_parameters=s.adagrad()), ValueError, EXACTLY_ONE),
    ('empty_dicts', lambda s: dict(feature_to_config_dict={},
                                   table_to_config_dict={}), ValueError,
     EXACTLY_ONE),
    ('columns_and_dicts', lambda s: dict(feature_columns=s.columns(),
                                         optimization_parameters=s.adagrad(),
                                         **s.dicts()), ValueError, EXACTLY_ONE),
    ('order_exactly_one_before_partition',
     lambda s: dict(partition_strategy='xyz'), ValueError, EXACTLY_ONE),
    # 2. partition strategy.
    ('bad_partition_strategy', lambda s: dict(
        feature_columns=s.columns(), optimization_parameters=s.adagrad(),
        partition_strategy='xyz'), ValueError,
     'Invalid partition_strategy xyz. Must be one of "mod" or "div".'),
    ('bad_partition_strategy_upper', lambda s: dict(
        partition_strategy='MOD', **s.dicts()), ValueError,
     'Invalid partition_strategy MOD. Must be one of "mod" or "div".'),
    ('bad_partition_strategy_none', lambda s: dict(
        feature_columns=s.columns(), partition_strategy=None), ValueError,
     'Invalid partition_strategy None. Must be one of "mod" or "div".'),
    ('order_partition_before_column_type', lambda s: dict(
        feature_columns=[fc.categorical_column_with_identity('x', 3)],
        partition_strategy='x'), ValueError,
     'Invalid partition_strategy x. Must be one of "mod" or "div".'),
    # 3. columns: column types, then the optimizer.
    ('unsupported_column_categorical', lambda s: dict(
        feature_columns=s.columns() + [fc.categorical_column_with_identity('x', 3)],
        optimization_parameters=s.adagrad()), TypeError,
     'All feature columns must be supported types in {}. Got {}'.format(
         SUPPORTED_COLUMNS, IDENTITY_TYPE)),
    ('unsupported_column_indicator', lambda s: dict(
        feature_columns=[fc.indicator_column(
            fc.categorical_column_with_identity('x', 3))],
        optimization_parameters=s.adagrad()), TypeError,
     'All feature columns must be supported types in {}. Got {}'.format(
         SUPPORTED_COLUMNS, "<class 'tensorflow.python.feature_column."
         "feature_column_v2.IndicatorColumn'>")),
    ('unsupported_column_string', lambda s: dict(
        feature_columns=['a'], optimization_parameters=s.adagrad()), TypeError,
     'All feature columns must be supported types in {}. Got {}'.format(
         SUPPORTED_COLUMNS, "<class 'str'>")),
    ('order_column_type_before_optimizer', lambda s: dict(
        feature_columns=[fc.categorical_column_with_identity('x', 3)]),
     TypeError, 'All feature columns must be supported types in {}. Got {}'.format(
         SUPPORTED_COLUMNS, IDENTITY_TYPE)),
    ('optimizer_none', lambda s: dict(feature_columns=s.columns()), ValueError,
     'optimization_parameters must be an instance of type {}. Got {}.'.format(
         SUPPORTED_OPTIMIZERS, "<class 'NoneType'>")),
    ('optimizer_string', lambda s: dict(feature_columns=s.columns(),
                                        optimization_parameters='adagrad'),
     ValueError, 'optimization_parameters must be an instance of type {}. Got '
     '{}.'.format(SUPPORTED_OPTIMIZERS, "<class 'str'>")),
    ('optimizer_v1_train_optimizer', lambda s: dict(
        feature_columns=s.columns(),
        optimization_parameters=tf.compat.v1.train.AdagradOptimizer(0.1)),
     ValueError, 'optimization_parameters must be an instance of type {}. Got '
     '{}.'.format(SUPPORTED_OPTIMIZERS, "<class 'tensorflow.python.training."
                  "adagrad.AdagradOptimizer'>")),
    pytest.param(
        'optimizer_adagrad_momentum', lambda s: dict(
            feature_columns=s.columns(),
            optimization_parameters=_bad_optimizer_15(s)),
        ValueError, 'optimization_parameters must be an instance of type {}. Got '
        '{}.'.format(SUPPORTED_OPTIMIZERS,
                     "<class 'tensorflow.python.tpu.tpu_embedding."
                     "AdagradMomentumParameters'>"),
        marks=pytest.mark.legacy_only, id='optimizer_adagrad_momentum'),
] + [
    ('optimizer_{}_with_columns'.format(name), lambda s, name=name: dict(
        feature_columns=s.columns(),
        optimization_parameters=_column_refused(name)(s)),
     ValueError, 'optimization_parameters must be an instance of type {}. Got '
     "{}.".format(SUPPORTED_OPTIMIZERS,
                  "<class 'tpu_fc.optimizers.{}'>".format(name)))
    for name in COLUMN_REFUSED
] + [
    # 4. dicts: feature configs (type, then table), then table configs.
    ('feature_config_not_feature_config', lambda s: dict(
        feature_to_config_dict={'f': {'table_id': 't'}},
        table_to_config_dict=s.dicts()['table_to_config_dict']), TypeError,
     "Config for feature f must be of type `FeatureConfig`. Got <class 'dict'>"),
    ('feature_config_string', lambda s: dict(
        feature_to_config_dict={'f': 't'},
        table_to_config_dict=s.dicts()['table_to_config_dict']), TypeError,
     "Config for feature f must be of type `FeatureConfig`. Got <class 'str'>"),
    ('feature_refers_to_missing_table', lambda s: dict(
        feature_to_config_dict={'f': s.FeatureConfig('t'),
                                'g': s.FeatureConfig('missing')},
        table_to_config_dict=s.dicts()['table_to_config_dict']), ValueError,
     'Feature g refers to table missing which is not in the '
     'table_to_config_dict.'),
    ('table_config_not_table_config', lambda s: dict(
        feature_to_config_dict={'f': s.FeatureConfig('t')},
        table_to_config_dict={'t': 'x'}), TypeError,
     "Config for table t must be of type `TableConfig`. Got <class 'str'>"),
    ('table_config_tuple', lambda s: dict(
        feature_to_config_dict={'f': s.FeatureConfig('t')},
        table_to_config_dict={'t': (8, 4)}), TypeError,
     "Config for table t must be of type `TableConfig`. Got <class 'tuple'>"),
    ('order_feature_dict_in_order', lambda s: dict(
        feature_to_config_dict={'g': s.FeatureConfig('missing'), 'f': 'bad'},
        table_to_config_dict=s.dicts()['table_to_config_dict']), ValueError,
     'Feature g refers to table missing which is not in the '
     'table_to_config_dict.'),
    ('order_features_before_tables', lambda s: dict(
        feature_to_config_dict={'f': 'bad'}, table_to_config_dict={'t': 'bad'}),
     TypeError,
     "Config for feature f must be of type `FeatureConfig`. Got <class 'str'>"),
]

# Accepted on both sides (no exception).
ACCEPTED = [
    ('columns_div', lambda s: dict(feature_columns=s.columns(),
                                   optimization_parameters=s.adagrad())),
    ('columns_mod', lambda s: dict(feature_columns=s.columns(),
                                   optimization_parameters=s.adagrad(),
                                   partition_strategy='mod')),
    ('columns_and_only_feature_dict', lambda s: dict(
        feature_columns=s.columns(), optimization_parameters=s.adagrad(),
        feature_to_config_dict=s.dicts()['feature_to_config_dict'])),
    ('numeric_and_plain_embedding_columns', lambda s: dict(
        feature_columns=s.columns() + [
            fc.numeric_column('n'),
            fc.embedding_column(fc.categorical_column_with_identity('e', 3), 2)],
        optimization_parameters=s.adagrad())),
    ('dicts_without_optimizer', lambda s: dict(**s.dicts())),  # unchecked
    ('dicts_with_junk_optimizer', lambda s: dict(optimization_parameters='junk',
                                                 **s.dicts())),
] + [
    ('dicts_with_{}'.format(name), lambda s, name=name: dict(
        optimization_parameters=_column_refused(name)(s), **s.dicts()))
    for name in COLUMN_REFUSED
]


def _case_params(cases):
  params = []
  for case in cases:
    if hasattr(case, 'marks'):  # already a pytest.param
      params.append(pytest.param(*case.values[1:], id=case.id, marks=case.marks))
    else:
      params.append(pytest.param(*case[1:], id=case[0]))
  return params


@pytest.mark.parametrize('build,error,text', _case_params(CASES))
def test_spec_validation(build, error, text):
  ours = outcome(OURS.spec, **build(OURS))
  assert ours == (error, text)
  if lanes.LEGACY:
    assert _normalize(outcome(THEIRS.spec, **build(THEIRS))) == _normalize(ours)


@pytest.mark.parametrize('build', _case_params(ACCEPTED))
def test_spec_accepts(build):
  kwargs = build(OURS)
  spec = OURS.spec(**kwargs)
  assert spec.partition_strategy == kwargs.get('partition_strategy', 'div')
  if lanes.LEGACY:
    their_kwargs = build(THEIRS)
    theirs = THEIRS.spec(**their_kwargs)
    assert _field_summary(spec) == _field_summary(theirs)


def _names(columns):
  return None if columns is None else [getattr(c, 'name', c) for c in columns]


def _field_summary(spec):
  summary = spec._asdict()
  summary['feature_columns'] = _names(spec.feature_columns)
  summary['tensor_core_feature_columns'] = _names(spec.tensor_core_feature_columns)
  opt = spec.optimization_parameters
  summary['optimization_parameters'] = (
      opt if opt is None or isinstance(opt, str) else
      (type(opt).__name__, {k: v for k, v in vars(opt).items()
                            if not k.startswith('_')}))
  for key in ('feature_to_config_dict', 'table_to_config_dict'):
    if summary[key] is not None:
      summary[key] = {k: (type(v).__name__, tuple(v)[:2])
                      for k, v in summary[key].items()}
  return summary


# --------------------------------------------------------------------------------
# Fields and the tensor-core split.
# --------------------------------------------------------------------------------

@pytest.mark.legacy_only
def test_namedtuple_fields_match_tf():
  assert tpu_fc.EmbeddingConfigSpec._fields == THEIRS.spec._fields  # pylint: disable=protected-access


def _multiplier(global_step):
  return tf.cast(global_step, tf.float32)


def _split_columns(s):
  ident = lambda name: fc.categorical_column_with_identity(name, 8)
  return [
      s.embedding_column(ident('a'), 4),
      s.embedding_column(ident('b'), 4, embedding_lookup_device='tpu_tensor_core',
                         tensor_core_shape=[None, 2]),
      s.embedding_column(ident('c'), 4, embedding_lookup_device='cpu'),
      s.embedding_column(ident('d'), 4, embedding_lookup_device='tpu_embedding_core'),
  ] + s.shared([ident('e'), ident('f')], 3,
               embedding_lookup_device='tpu_tensor_core',
               tensor_core_shape=[8, 3]) + s.shared([ident('g'), ident('h')], 3)


@pytest.mark.parametrize('side', ['ours', pytest.param('tf', marks=pytest.mark.legacy_only)])
def test_spec_fields_and_tensor_core_split(side):
  s = OURS if side == 'ours' else THEIRS
  columns = _split_columns(s)
  spec = s.spec(feature_columns=columns, optimization_parameters=s.adagrad(),
                clipping_limit=5.0, pipeline_execution_with_tensor_core=True,
                experimental_gradient_multiplier_fn=_multiplier,
                partition_strategy='mod', profile_data_directory='/tmp/profile')
  by_name = {c.name: c for c in columns}
  assert spec.feature_columns == [by_name[n] for n in (
      'a_embedding', 'c_embedding', 'd_embedding', 'g_shared_embedding',
      'h_shared_embedding')]
  assert spec.tensor_core_feature_columns == [by_name[n] for n in (
      'b_embedding', 'e_shared_embedding', 'f_shared_embedding')]
  assert spec.clipping_limit == 5.0
  assert spec.pipeline_execution_with_tensor_core is True
  assert spec.experimental_gradient_multiplier_fn is _multiplier
  assert spec.partition_strategy == 'mod'
  assert spec.profile_data_directory == '/tmp/profile'
  assert spec.feature_to_config_dict is None and spec.table_to_config_dict is None
  assert type(spec.optimization_parameters).__name__ == 'AdagradParameters'
  assert spec.optimization_parameters.learning_rate == 0.1


@pytest.mark.legacy_only
def test_spec_fields_match_tf():
  kwargs = dict(clipping_limit=1.5, pipeline_execution_with_tensor_core=True,
                experimental_gradient_multiplier_fn=_multiplier,
                partition_strategy='mod', profile_data_directory='/tmp/p')
  ours = OURS.spec(feature_columns=_split_columns(OURS),
                   optimization_parameters=OURS.params.FtrlParameters(0.2),
                   **kwargs)
  theirs = THEIRS.spec(feature_columns=_split_columns(THEIRS),
                       optimization_parameters=THEIRS.params.FtrlParameters(0.2),
                       **kwargs)
  assert _field_summary(ours) == _field_summary(theirs)
  # Dict path: the dicts are kept as given.
  ours_dicts, theirs_dicts = OURS.dicts(), THEIRS.dicts()
  ours = OURS.spec(optimization_parameters=OURS.adagrad(), **ours_dicts)
  theirs = THEIRS.spec(optimization_parameters=THEIRS.adagrad(), **theirs_dicts)
  assert _field_summary(ours) == _field_summary(theirs)
  assert ours.feature_to_config_dict is ours_dicts['feature_to_config_dict']
  assert ours.table_to_config_dict is ours_dicts['table_to_config_dict']
  assert ours.feature_columns is None and ours.tensor_core_feature_columns is None


def test_tf_own_columns_split_in_tpu_fc_spec():
  # TF's own columns (present on both lanes) go through tpu_fc's spec, and TF's
  # class-attribute quirk (last device-specific column wins) does not mislead it.
  tc = tf_tpu_fc.embedding_column_v2(fc.categorical_column_with_identity('tc', 5), 2,
                                     embedding_lookup_device='tpu_tensor_core',
                                     tensor_core_shape=[None, 2])
  cpu = tf_tpu_fc.embedding_column_v2(fc.categorical_column_with_identity('cpu', 5),
                                      2, embedding_lookup_device='cpu')
  plain = tf_tpu_fc.embedding_column_v2(fc.categorical_column_with_identity('p', 5),
                                        2)
  ours_tc = tpu_fc.embedding_column(fc.categorical_column_with_identity('otc', 5),
                                    2, embedding_lookup_device='tpu_tensor_core',
                                    tensor_core_shape=[None, 2])
  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=[tc, cpu, plain, ours_tc],
                                    optimization_parameters=OURS.adagrad())
  assert spec.feature_columns == [cpu, plain]
  assert spec.tensor_core_feature_columns == [tc, ours_tc]


@pytest.mark.legacy_only
@pytest.mark.parametrize('name', [
    'StochasticGradientDescentParameters', 'AdagradParameters', 'AdamParameters',
    'FtrlParameters', 'ProximalAdagradParameters', 'MomentumParameters',
    'RMSPropParameters'])
def test_tf_2_15_parameters_accepted(name):
  required = dict(learning_rate=0.3)
  if name == 'MomentumParameters':
    required.update(momentum=0.9)
  if name == 'RMSPropParameters':
    required.update(rho=0.9, momentum=0.1, epsilon=1e-4)
  theirs = getattr(lanes.tf_tpu_embedding, name)(weight_decay_factor=0.5, **required)
  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=OURS.columns(),
                                    optimization_parameters=theirs)
  converted = spec.optimization_parameters
  assert type(converted) is getattr(tpu_fc, name)
  assert converted == getattr(tpu_fc, name)(weight_decay_factor=0.5, **required)
  assert {k: v for k, v in vars(converted).items() if not k.startswith('_')} == (
      vars(theirs))
  # TF's real spec accepts the same object.
  THEIRS.spec(feature_columns=THEIRS.columns(), optimization_parameters=theirs)


@pytest.mark.legacy_only
def test_tf_2_15_configs_accepted():
  init = tf.compat.v1.zeros_initializer()
  features = {'f': lanes.tf_tpu_embedding.FeatureConfig('t1', max_sequence_length=3),
              'g': lanes.tf_tpu_embedding.FeatureConfig('t0', weight_key='g_weight')}
  tables = {'t1': lanes.tf_tpu_embedding.TableConfig(
                8, 4, initializer=init, combiner='sum',
                optimization_parameters=lanes.tf_tpu_embedding.AdamParameters(0.2)),
            't0': lanes.tf_tpu_embedding.TableConfig(5, 2, learning_rate=0.7)}
  THEIRS.spec(feature_to_config_dict=features, table_to_config_dict=tables)
  spec = tpu_fc.EmbeddingConfigSpec(  # (t0 takes the spec's optimizer)
      feature_to_config_dict=features, table_to_config_dict=tables,
      optimization_parameters=tpu_fc.AdagradParameters(0.1))
  layout = spec.embedding_layout()
  assert [t.name for t in layout.tables] == ['t0', 't1']
  t0, t1 = layout.tables
  assert (t1.vocabulary_size, t1.dimension, t1.combiner, t1.initializer) == (
      8, 4, 'sum', init)
  assert t1.optimizer == tpu_fc.AdamParameters(0.2)
  assert (t0.vocabulary_size, t0.dimension, t0.learning_rate, t0.optimizer) == (
      5, 2, 0.7, None)
  assert [(f.name, f.table, f.max_sequence_length, f.weight_key)
          for f in layout.features] == [('f', 't1', 3, None),
                                        ('g', 't0', 0, 'g_weight')]


def test_mid_level_configs_accepted():
  mid_a = E.TableConfig(vocabulary_size=8, dim=3, combiner='sqrtn', name='mid_a',
                        optimizer=E.Adagrad(learning_rate=0.4))
  mid_b = E.TableConfig(vocabulary_size=6, dim=2, name='mid_b')
  features = {
      'x': E.FeatureConfig(table=mid_a, max_sequence_length=4),
      'y': E.FeatureConfig(table=mid_b),  # found by name
      'z': tpu_fc.FeatureConfig('legacy'),
  }
  tables = {'tbl_a': mid_a, 'mid_b': mid_b,
            'legacy': tpu_fc.TableConfig(4, 2, combiner='sum')}
  spec = tpu_fc.EmbeddingConfigSpec(feature_to_config_dict=features,
                                    table_to_config_dict=tables,
                                    optimization_parameters=OURS.adagrad())
  layout = spec.embedding_layout()
  assert [(t.name, t.vocabulary_size, t.dimension, t.combiner)
          for t in layout.tables] == [('legacy', 4, 2, 'sum'),
                                      ('mid_b', 6, 2, 'mean'),
                                      ('tbl_a', 8, 3, 'sqrtn')]
  assert layout.table('tbl_a').optimizer == tpu_fc.AdagradParameters(
      0.4, initial_accumulator=0.1)
  assert [(f.name, f.table, f.max_sequence_length) for f in layout.features] == [
      ('x', 'tbl_a', 4), ('y', 'mid_b', 0), ('z', 'legacy', 0)]


def test_mid_level_feature_with_missing_table():
  orphan = E.TableConfig(vocabulary_size=3, dim=2, name='orphan')
  result = outcome(tpu_fc.EmbeddingConfigSpec,
                     feature_to_config_dict={'f': E.FeatureConfig(table=orphan)},
                     table_to_config_dict={'t': tpu_fc.TableConfig(3, 2)})
  assert result == (ValueError, 'Feature f refers to table orphan which is not '
                     'in the table_to_config_dict.')
  result = outcome(tpu_fc.EmbeddingConfigSpec,
                     feature_to_config_dict={'f': tpu_fc.FeatureConfig('t')},
                     table_to_config_dict={'t': E.FeatureConfig(table=orphan)})
  assert result[0] is TypeError
  assert result[1].startswith('Config for table t must be of type `TableConfig`.')


# --------------------------------------------------------------------------------
# tpu_fc.TableConfig / FeatureConfig validation (TF 2.15's tpu_embedding texts).
# --------------------------------------------------------------------------------

def _rate_fn(step):
  return 0.1 * step


CONFIG_CASES = [
    ('TableConfig', 'vocabulary_zero', lambda p: ((0, 4), {}), ValueError,
     'vocabulary_size must >= 1. Received: 0.'),
    ('TableConfig', 'vocabulary_float', lambda p: ((5.0, 4), {}), ValueError,
     'vocabulary_size must >= 1. Received: 5.0.'),
    ('TableConfig', 'vocabulary_string', lambda p: (('5', 4), {}), ValueError,
     'vocabulary_size must >= 1. Received: 5.'),
    ('TableConfig', 'dimension_zero', lambda p: ((5, 0), {}), ValueError,
     'dimension must be a positive int. Received: 0.'),
    ('TableConfig', 'dimension_float', lambda p: ((5, 2.5), {}), ValueError,
     'dimension must be a positive int. Received: 2.5.'),
    ('TableConfig', 'initializer_not_callable',
     lambda p: ((5, 2), dict(initializer='zeros')), ValueError,
     'initializer must be callable if specified. Received: zeros.'),
    ('TableConfig', 'combiner', lambda p: ((5, 2), dict(combiner='max')),
     ValueError, 'combiner must be "mean", "sum", "sqrtn" or None. Received: max.'),
    ('TableConfig', 'both_rates',
     lambda p: ((5, 2), dict(learning_rate=0.1, learning_rate_fn=_rate_fn)),
     ValueError, 'At most one of learning_rate and learning_rate_fn can be None. '
     'Received: 0.1 and {}'.format(_rate_fn)),
    ('TableConfig', 'optimizer_string',
     lambda p: ((5, 2), dict(optimization_parameters='adagrad')), ValueError,
     '`optimization_parameters` must inherit from `_OptimizationParameters`. '
     "Received: `type(optimization_parameters)`=<class 'str'>."),
    ('TableConfig', 'optimizer_mid_level',
     lambda p: ((5, 2), dict(optimization_parameters=E.SGD())), ValueError,
     '`optimization_parameters` must inherit from `_OptimizationParameters`. '
     "Received: `type(optimization_parameters)`=<class 'tensorflow.python.tpu."
     "tpu_embedding_v2_utils.SGD'>."),
    ('TableConfig', 'order_vocabulary_before_dimension', lambda p: ((0, 0), {}),
     ValueError, 'vocabulary_size must >= 1. Received: 0.'),
    ('TableConfig', 'order_combiner_before_rates',
     lambda p: ((5, 2), dict(combiner='x', learning_rate=1.0,
                             learning_rate_fn=_rate_fn)),
     ValueError, 'combiner must be "mean", "sum", "sqrtn" or None. Received: x.'),
    ('FeatureConfig', 'max_sequence_length_negative',
     lambda p: (('t',), dict(max_sequence_length=-1)), ValueError,
     'max_sequence_length must be zero or a positive int, got -1.'),
    ('FeatureConfig', 'max_sequence_length_float',
     lambda p: (('t',), dict(max_sequence_length=1.5)), ValueError,
     'max_sequence_length must be zero or a positive int, got 1.5.'),
]


@pytest.mark.parametrize('cls,build,error,text', [
    pytest.param(c[0], *c[2:], id='{}-{}'.format(c[0], c[1])) for c in CONFIG_CASES])
def test_config_validation(cls, build, error, text):
  args, kwargs = build(None)
  assert outcome(getattr(tpu_fc, cls), *args, **kwargs) == (error, text)
  if lanes.LEGACY:
    assert outcome(getattr(lanes.tf_tpu_embedding, cls), *args, **kwargs) == (error, text)


@pytest.mark.parametrize('kwargs', [
    {}, dict(combiner=None), dict(combiner='sqrtn', hot_id_replication=True,
                                  learning_rate=0.5),
    dict(learning_rate_fn=_rate_fn, initializer=tf.compat.v1.ones_initializer()),
])
def test_table_config_fields(kwargs):
  ours = tpu_fc.TableConfig(7, 3, **kwargs)
  expected = dict(vocabulary_size=7, dimension=3, combiner='mean',
                  hot_id_replication=False, learning_rate=None,
                  learning_rate_fn=None, optimization_parameters=None)
  expected.update({k: v for k, v in kwargs.items() if k != 'initializer'})
  fields = ours._asdict()
  initializer = fields.pop('initializer')
  assert fields == expected
  if 'initializer' in kwargs:
    assert initializer is kwargs['initializer']
  else:  # truncated normal, mean 0, stddev 1/sqrt(dimension)
    assert initializer.get_config()['mean'] == 0.0
    assert initializer.get_config()['stddev'] == pytest.approx(1 / np.sqrt(3))
  if lanes.LEGACY:
    theirs = lanes.tf_tpu_embedding.TableConfig(7, 3, **kwargs)
    assert ours._fields == theirs._fields
    theirs_fields = theirs._asdict()
    their_init = theirs_fields.pop('initializer')
    assert theirs_fields == fields
    assert type(initializer) is type(their_init)
    assert initializer.get_config() == their_init.get_config()


def test_feature_config_fields():
  assert tuple(tpu_fc.FeatureConfig('t')) == ('t', 0, None)
  assert tpu_fc.FeatureConfig('t', 2, 'w')._asdict() == dict(
      table_id='t', max_sequence_length=2, weight_key='w')
  if lanes.LEGACY:
    assert tpu_fc.FeatureConfig._fields == lanes.tf_tpu_embedding.FeatureConfig._fields
    assert tuple(tpu_fc.FeatureConfig('t', 2, 'w')) == tuple(
        lanes.tf_tpu_embedding.FeatureConfig('t', 2, 'w'))


@pytest.mark.parametrize('side', ['ours', pytest.param('theirs', marks=pytest.mark.legacy_only)])
@pytest.mark.parametrize('name', sorted(COLUMN_REFUSED))
@pytest.mark.parametrize('where', ['table', 'spec'])
def test_dict_configs_take_what_the_column_spec_refuses(name, where, side):
  """TF 2.15's engine takes any of its `*Parameters` from dict configs: per
  table (`TableConfig.optimization_parameters`) or for the spec; TF 2.15's own
  objects become tpu_fc's."""
  params = _column_refused(name)(OURS if side == 'ours' else THEIRS)
  table = (tpu_fc.TableConfig if side == 'ours' else lanes.tf_tpu_embedding.TableConfig)(
      8, 1, optimization_parameters=params if where == 'table' else None)
  spec = tpu_fc.EmbeddingConfigSpec(
      feature_to_config_dict={'f': tpu_fc.FeatureConfig('t')},
      table_to_config_dict={'t': table},
      optimization_parameters=(params if where == 'spec' else
                               tpu_fc.StochasticGradientDescentParameters(1.0)))
  (layout_table,) = spec.embedding_layout().tables
  got = (layout_table.optimizer if where == 'table' else
         spec.optimization_parameters)
  assert got == getattr(tpu_fc, name)(**COLUMN_REFUSED[name])


@pytest.mark.parametrize('where', ['table', 'spec'])
def test_frequency_estimator_tables_have_dimension_1(where):
  """TF 2.15's check where its engine creates such a table, naming it."""
  params = _column_refused('FrequencyEstimatorParameters')(OURS)
  spec = tpu_fc.EmbeddingConfigSpec(
      feature_to_config_dict={'f': tpu_fc.FeatureConfig('t'),
                              'g': tpu_fc.FeatureConfig('wide')},
      table_to_config_dict={
          't': tpu_fc.TableConfig(8, 1),
          'wide': tpu_fc.TableConfig(
              8, 3, optimization_parameters=params if where == 'table' else
              None)},
      optimization_parameters=(params if where == 'spec' else OURS.adagrad()))
  assert outcome(spec.embedding_layout) == (
      ValueError, 'FrequencyEstimator tables should only have a dimension of '
      "1. Received dimension 3 (table 'wide'): its one number per id is the "
      'estimate; make the table dimension=1.')


def test_table_config_parameters():
  ours = tpu_fc.TableConfig(5, 2, optimization_parameters=tpu_fc.AdamParameters(0.1))
  assert ours.optimization_parameters == tpu_fc.AdamParameters(0.1)
  if lanes.LEGACY:
    converted = tpu_fc.TableConfig(
        5, 2, optimization_parameters=lanes.tf_tpu_embedding.FtrlParameters(0.3, beta=0.5))
    assert type(converted.optimization_parameters) is tpu_fc.FtrlParameters
    assert converted.optimization_parameters == tpu_fc.FtrlParameters(0.3, beta=0.5)


# --------------------------------------------------------------------------------
# embedding_layout(): legacy table names, sorted tables and features.
# --------------------------------------------------------------------------------

def _layout_columns(s, reverse=False):
  ident = lambda name, n=8: fc.categorical_column_with_identity(name, n)
  columns = [
      s.embedding_column(ident('a'), 4, combiner='sum'),
      s.embedding_column(fc.weighted_categorical_column(ident('d', 6), 'd_weight'),
                         3, learning_rate_fn=_rate_fn),
      s.embedding_column(fc.sequence_categorical_column_with_identity('s', 5), 2,
                         max_sequence_length=3),
  ] + s.shared([fc.weighted_categorical_column(ident('c', 7), 'c_weight'),
                ident('b', 7)], 5, combiner='sqrtn')
  return columns[::-1] if reverse else columns


EXPECTED_TABLES = [  # (name, vocabulary_size, dimension, combiner)
    ('tbl_a', 8, 4, 'sum'),
    ('tbl_b_c_weighted_by_c_weight_shared_embedding', 7, 5, 'sqrtn'),
    ('tbl_d_weighted_by_d_weight', 6, 3, 'mean'),
    ('tbl_s', 5, 2, 'mean'),
]
EXPECTED_FEATURES = [  # (name, table, max_sequence_length, weight_key)
    ('a', 'tbl_a', 0, None),
    ('b', 'tbl_b_c_weighted_by_c_weight_shared_embedding', 0, None),
    ('c', 'tbl_b_c_weighted_by_c_weight_shared_embedding', 0, 'c_weight'),
    ('d', 'tbl_d_weighted_by_d_weight', 0, 'd_weight'),
    ('s', 'tbl_s', 3, None),
]


@pytest.mark.parametrize('reverse', [False, True])
def test_embedding_layout_from_columns(reverse):
  spec = tpu_fc.EmbeddingConfigSpec(
      feature_columns=_layout_columns(OURS, reverse),
      optimization_parameters=OURS.adagrad())
  layout = spec.embedding_layout()
  assert [(t.name, t.vocabulary_size, t.dimension, t.combiner)
          for t in layout.tables] == EXPECTED_TABLES
  assert [(f.name, f.table, f.max_sequence_length, f.weight_key)
          for f in layout.features] == EXPECTED_FEATURES
  assert layout.table('tbl_d_weighted_by_d_weight').learning_rate_fn is _rate_fn
  assert [f.name for f in layout.features_of(
      'tbl_b_c_weighted_by_c_weight_shared_embedding')] == ['b', 'c']
  if lanes.LEGACY:
    tables, features = lanes.tf_estimator_embedding.get_configs_from_feature_columns(
        _layout_columns(THEIRS, reverse))
    assert [(t.name, t.vocabulary_size, t.dimension, t.combiner,
             t.learning_rate_fn) for t in layout.tables] == [
                 (k, tables[k].vocabulary_size, tables[k].dimension,
                  tables[k].combiner, tables[k].learning_rate_fn)
                 for k in sorted(tables)]
    assert [(f.name, f.table, f.max_sequence_length, f.weight_key)
            for f in layout.features] == [
                (k, features[k].table_id, features[k].max_sequence_length,
                 features[k].weight_key) for k in sorted(features)]


def test_embedding_layout_excludes_tensor_core_columns():
  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=_split_columns(OURS),
                                    optimization_parameters=OURS.adagrad())
  assert [t.name for t in spec.embedding_layout().tables] == [
      'tbl_a', 'tbl_c', 'tbl_d', 'tbl_g_h_shared_embedding']
  assert [f.name for f in spec.embedding_layout().features] == [
      'a', 'c', 'd', 'g', 'h']
  assert [t.name for t in spec.tensor_core_layout().tables] == [
      'tbl_b', 'tbl_e_f_shared_embedding']


def test_embedding_layout_from_dicts_sorted():
  features = {'z': tpu_fc.FeatureConfig('t2'), 'm': tpu_fc.FeatureConfig('t1', 2),
              'a': tpu_fc.FeatureConfig('t2', weight_key='a_w')}
  tables = {'t2': tpu_fc.TableConfig(9, 2), 't1': tpu_fc.TableConfig(4, 3)}
  layout = tpu_fc.EmbeddingConfigSpec(
      feature_to_config_dict=features, table_to_config_dict=tables,
      optimization_parameters=OURS.adagrad()).embedding_layout()
  assert [(t.name, t.vocabulary_size, t.dimension) for t in layout.tables] == [
      ('t1', 4, 3), ('t2', 9, 2)]
  assert [(f.name, f.table, f.max_sequence_length, f.weight_key)
          for f in layout.features] == [('a', 't2', 0, 'a_w'), ('m', 't1', 2, None),
                                        ('z', 't2', 0, None)]


DUPLICATES = [
    ('same_categorical_twice', lambda s: [
        s.embedding_column(fc.categorical_column_with_identity('x', 4), 2),
        s.embedding_column(fc.categorical_column_with_identity('x', 4), 3)], 'x'),
    ('weighted_and_plain', lambda s: [
        s.embedding_column(fc.categorical_column_with_identity('d', 4), 2),
        s.embedding_column(fc.weighted_categorical_column(
            fc.categorical_column_with_identity('d', 4), 'w'), 2)], 'd'),
    ('shared_and_single', lambda s: s.shared(
        [fc.categorical_column_with_identity('x', 4),
         fc.categorical_column_with_identity('y', 4)], 2) + [
             s.embedding_column(fc.categorical_column_with_identity('y', 4), 2)],
     'y'),
]


@pytest.mark.parametrize('build,feature', _case_params(DUPLICATES))
def test_feature_used_with_multiple_embeddings(build, feature):
  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=build(OURS),
                                    optimization_parameters=OURS.adagrad())
  expected = (ValueError, 'Feature column {} is used with multiple embeddings and '
              'this is not supported.'.format(feature))
  assert outcome(spec.embedding_layout) == expected
  if lanes.LEGACY:
    assert outcome(lanes.tf_estimator_embedding.get_configs_from_feature_columns,
                    build(THEIRS)) == expected


@pytest.mark.parametrize('other', ['numeric', 'plain_embedding'])
def test_layout_rejects_non_tpu_columns_like_tf(other):
  # TF's spec accepts numeric and plain embedding columns; its
  # get_configs_from_feature_columns (the TPU path) then rejects them.
  column = (fc.numeric_column('n') if other == 'numeric' else
            fc.embedding_column(fc.categorical_column_with_identity('e', 3), 2))
  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=OURS.columns() + [column],
                                    optimization_parameters=OURS.adagrad())
  expected = (TypeError, 'Unsupported feature column {}. Supported types are '
              '{}.'.format(type(column), TPU_COLUMN_TYPES))
  assert outcome(spec.embedding_layout) == expected
  if lanes.LEGACY:
    assert outcome(lanes.tf_estimator_embedding.get_configs_from_feature_columns,
                    THEIRS.columns() + [column]) == expected
