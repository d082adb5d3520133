"""spec.to_mid_level(): configs that the real TF2 mid-level API accepts, on both lanes."""
import dataclasses

import numpy as np
import pytest

import tpu_fc
import tensorflow as tf

from harness import inputs
from harness import models
from harness import oracle

fc = tf.feature_column
embedding = tf.tpu.experimental.embedding


@pytest.fixture
def mid_level():
  spec = tpu_fc.EmbeddingConfigSpec(
      feature_columns=models.spec_columns(),
      optimization_parameters=tpu_fc.AdagradParameters(0.1, 0.2))
  return spec.to_mid_level()


def test_tables_are_sorted_and_named_after_legacy_variables(mid_level):
  assert [t.name for t in mid_level.tables] == [
      'tbl_a', 'tbl_b_c_shared_embedding', 'tbl_d_weighted_by_d_weight',
      'tbl_s', 'tbl_t']
  sizes = {t.name: (t.vocabulary_size, t.dim, t.combiner)
           for t in mid_level.tables}
  assert sizes == {
      'tbl_a': (10, 4, 'sum'),
      'tbl_b_c_shared_embedding': (6, 2, 'mean'),
      'tbl_d_weighted_by_d_weight': (7, 3, 'sqrtn'),
      'tbl_s': (5, 2, 'mean'),
      'tbl_t': (8, 2, 'mean')}


def test_features_split_between_embedding_core_and_tensor_core(mid_level):
  assert sorted(mid_level.feature_config) == ['a', 'b', 'c', 'd', 's']
  assert sorted(mid_level.tensor_core_feature_config) == ['t']
  features = mid_level.feature_config
  assert features['b'].table is features['c'].table
  assert features['s'].max_sequence_length == 3
  assert features['a'].max_sequence_length == 0
  assert mid_level.weight_keys == {'d': 'd_weight'}
  assert mid_level.tensor_core_feature_config['t'].table.name == 'tbl_t'


def test_optimizers_global_and_per_table_rate(mid_level):
  assert isinstance(mid_level.optimizer, embedding.Adagrad)
  assert mid_level.optimizer.learning_rate == 0.1
  assert mid_level.optimizer.initial_accumulator_value == 0.2
  by_name = {t.name: t.optimizer for t in mid_level.tables}
  assert by_name['tbl_s'] is mid_level.optimizer
  per_table = by_name['tbl_a']
  assert isinstance(per_table, embedding.Adagrad)
  assert per_table.initial_accumulator_value == 0.2
  step = tf.compat.v1.train.get_or_create_global_step()
  step.assign(3)
  assert float(per_table.learning_rate()) == pytest.approx(float(models.rate_fn(3)))


def test_builds_a_real_tpu_embedding_on_cpu(mid_level):
  engine = embedding.TPUEmbedding(mid_level.feature_config, mid_level.optimizer)
  shapes = {t.name: tuple(v.shape)
            for t, v in engine.embedding_tables.items()}
  assert shapes == {'tbl_a': (10, 4), 'tbl_b_c_shared_embedding': (6, 2),
                    'tbl_d_weighted_by_d_weight': (7, 3), 'tbl_s': (5, 2)}


def test_serving_embedding_lookup_accepts_the_config(mid_level):
  engine = embedding.TPUEmbeddingForServing(mid_level.feature_config,
                                            mid_level.optimizer)
  tables = engine.embedding_tables
  ids = tf.sparse.from_dense(np.array([[1, 2], [3, 0]], np.int64))
  weights = tf.sparse.from_dense(np.array([[1., 2.], [3., 0.]], np.float32))
  features = {'a': ids, 'b': ids, 'c': ids, 'd': ids, 'd_weight': weights,
              's': ids}
  inputs, input_weights = mid_level.split_features(features)
  out = embedding.serving_embedding_lookup(
      inputs, input_weights, tables, mid_level.feature_config)
  assert tuple(out['a'].shape) == (2, 4)
  assert tuple(out['s'].shape) == (2, 3, 2)
  table_d = {t.name: v for t, v in tables.items()}[
      'tbl_d_weighted_by_d_weight'].numpy()
  # sqrtn with weights: sum(w_i e_i) / sqrt(sum(w_i^2)), computed independently.
  expected = (1. * table_d[1] + 2. * table_d[2]) / np.sqrt(1. + 4.)
  np.testing.assert_allclose(out['d'].numpy()[0], expected, rtol=1e-6)


def test_dict_path_with_legacy_and_mid_level_tables():
  """A spec can hold a migrated (mid-level) table next to a legacy one."""
  migrated = embedding.TableConfig(
      vocabulary_size=5, dim=2, optimizer=embedding.SGD(0.3), combiner='sum',
      name='migrated')
  spec = tpu_fc.EmbeddingConfigSpec(
      feature_to_config_dict={
          'x': tpu_fc.FeatureConfig('legacy', weight_key='x_w'),
          'y': embedding.FeatureConfig(table=migrated)},
      table_to_config_dict={
          'legacy': tpu_fc.TableConfig(9, 3, combiner=None, learning_rate=0.7),
          'migrated': migrated},
      optimization_parameters=tpu_fc.AdamParameters(0.01))
  mid_level = spec.to_mid_level()
  tables = {t.name: t for t in mid_level.tables}
  assert tables['legacy'].combiner == 'sum'  # None: dense ids, summed
  assert isinstance(tables['legacy'].optimizer, embedding.Adam)
  assert tables['legacy'].optimizer.learning_rate == 0.7
  assert tables['legacy'].optimizer.epsilon == 1e-08
  assert isinstance(tables['migrated'].optimizer, embedding.SGD)
  assert tables['migrated'].optimizer.learning_rate == 0.3
  assert mid_level.feature_config['y'].table is tables['migrated']
  assert mid_level.weight_keys == {'x': 'x_w'}
  engine = embedding.TPUEmbedding(mid_level.feature_config, mid_level.optimizer)
  assert {t.name: tuple(v.shape) for t, v in engine.embedding_tables.items()} == {
      'legacy': (9, 3), 'migrated': (5, 2)}


@pytest.mark.parametrize('parameters', [
    tpu_fc.ProximalAdagradParameters(0.1),
    tpu_fc.MomentumParameters(0.1, 0.9),
    tpu_fc.RMSPropParameters(0.1, 0.9, 0.0, 1e-6)])
def test_optimizers_without_mid_level_twin_refuse_clearly(parameters):
  spec = tpu_fc.EmbeddingConfigSpec(feature_columns=models.spec_columns(),
                                    optimization_parameters=parameters)
  with pytest.raises(NotImplementedError,
                     match='tf.tpu.experimental.embedding'):
    spec.to_mid_level()


# The migrated serving lookup (`tpu_fc.serving`: these configs, `split_features`
# and TF's own `TPUEmbeddingForServing`) gives the legacy activations derived by
# hand (test_host_engine's numpy model).  Positive weights only: TF's CPU
# lookup of several weighted ids prunes non-positive ones, a TPU does not
# (LEGACY_SEMANTICS §9).
SERVED_SPARSE = inputs.Ids('sparse', [(0, 0, 3), (0, 2, 0), (1, 0, 5), (1, 1, 1),
                               (1, 2, 5), (3, 1, 2), (3, 2, 3)],
                    weights=[0.5, 2.0, 1.0, 0.5, 1.5, 3.0, 0.25])
SERVED_RAGGED = inputs.Ids('ragged', [[1, 1, 4], [], [0, 6], [6, 2]],
                    weights=[[0.5, 1.5, 2.0], [], [1.0, 2.0], [0.25, 4.0]])
SERVED = [
    inputs.Feat('sparse_mean', dataclasses.replace(SERVED_SPARSE, weights=None),
         'mean', seed=1),
    inputs.Feat('ragged_sum', dataclasses.replace(SERVED_RAGGED, weights=None), 'sum',
         seed=2),
    inputs.Feat('sparse_weighted', SERVED_SPARSE, 'sqrtn', weighted=True, seed=3),
    inputs.Feat('ragged_weighted', SERVED_RAGGED, 'mean', weighted=True, dim=2, seed=4),
    inputs.Feat('seq_sparse', inputs.SEQUENCE_SPARSE, seq_len=2, seed=5),
    inputs.Feat('seq_ragged', inputs.SEQUENCE_RAGGED, seq_len=2, dim=2, seed=6),
]


def _served(columns, feats):
  """The activations the migrated serving model looks up for `feats`."""
  spec = tpu_fc.EmbeddingConfigSpec(
      feature_columns=columns,
      optimization_parameters=tpu_fc.AdagradParameters(0.1))
  model = tpu_fc.serving.MidLevelServingModel(
      spec, lambda activations, features: activations)
  features = {}
  for feat in feats:
    features.update(feat.inputs())
  return spec.to_mid_level(), model(features)


def test_migrated_serving_lookup_gives_the_legacy_activations():
  _, activations = _served([feat.column() for feat in SERVED], SERVED)
  for feat in SERVED:
    expected, _ = oracle.np_activation(feat, feat.init())
    np.testing.assert_allclose(activations[feat.name], expected, rtol=1e-5,
                               atol=1e-6, err_msg=feat.name)


def test_migrated_shared_columns_look_up_one_table():
  first, second = tpu_fc.shared_embedding_columns(
      [fc.categorical_column_with_identity(name, 7)
       for name in ('left', 'right')], 3,
      initializer=tf.compat.v1.constant_initializer(SERVED[0].init()))
  feats = [inputs.Feat('left', dataclasses.replace(SERVED_SPARSE, weights=None),
                seed=1),
           inputs.Feat('right', dataclasses.replace(SERVED_RAGGED, weights=None),
                seed=1)]
  mid_level, activations = _served([first, second], feats)
  assert [t.name for t in mid_level.tables] == [
      'tbl_left_right_shared_embedding']
  for feat in feats:
    np.testing.assert_allclose(activations[feat.name],
                               oracle.np_activation(feat, feat.init())[0], rtol=1e-5,
                               atol=1e-6, err_msg=feat.name)
