"""Step 2: the model's embedding configs in TF2 mid-level terms.

`spec.to_mid_level()` turns the legacy spec into `tf.tpu.experimental.embedding`
TableConfigs, FeatureConfigs and an optimizer.  `mid_level_configs()` below writes
the same configs by hand, as the migrated model will declare them (steps 4 and 5
use it); `main` prints both and checks that they agree, table names included: the
names are the checkpoint keys of the tables after step 3.

    python step2_mid_level_config.py
"""
import argparse

import tpu_fc  # noqa: F401  (before tensorflow: selects tf-keras on TF >= 2.16)
import tensorflow as tf

import step1_train

embedding = tf.tpu.experimental.embedding


def mid_level_configs():
  """(feature_config, optimizer): the model's embeddings, written in TF2 terms."""
  optimizer = embedding.Adagrad(learning_rate=0.1, initial_accumulator_value=0.1)
  user = embedding.TableConfig(
      vocabulary_size=step1_train.USERS, dim=4, combiner='mean',
      name='tbl_user')
  item_query = embedding.TableConfig(
      vocabulary_size=step1_train.ITEMS, dim=4, combiner='mean',
      name='tbl_item_query_shared_embedding')
  tag = embedding.TableConfig(
      vocabulary_size=step1_train.TAGS, dim=3, combiner='sqrtn',
      name='tbl_tag_weighted_by_tag_weight')
  feature_config = {
      'user': embedding.FeatureConfig(table=user, name='user'),
      'item': embedding.FeatureConfig(table=item_query, name='item'),
      'query': embedding.FeatureConfig(table=item_query, name='query'),
      'tag': embedding.FeatureConfig(table=tag, name='tag'),  # weights: 'tag_weight'
  }
  return feature_config, optimizer


def _table_summary(table, default_optimizer):
  """What makes two tables equivalent: shape, combiner, every optimizer setting."""
  optimizer = table.optimizer or default_optimizer
  return (table.name, table.vocabulary_size, table.dim, table.combiner,
          type(optimizer).__name__, sorted(vars(optimizer).items()))


def _feature_summary(feature_config, default_optimizer):
  return {name: _table_summary(feature.table, default_optimizer)
          for name, feature in feature_config.items()}


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.parse_args(argv)
  mid_level = step1_train.embedding_config_spec().to_mid_level()
  print('spec.to_mid_level().tables:')
  for table in mid_level.tables:
    print('  {:<34} {:>3} x {}  combiner={:<6} {}(learning_rate={})'.format(
        table.name, table.vocabulary_size, table.dim, table.combiner,
        type(table.optimizer).__name__, table.optimizer.learning_rate))
  print('spec.to_mid_level().feature_config:')
  for name, feature in mid_level.feature_config.items():
    weights = mid_level.weight_keys.get(name)
    print('  {:<6} -> {}{}'.format(name, feature.table.name,
                                   '  (weights: {})'.format(weights)
                                   if weights else ''))
  feature_config, optimizer = mid_level_configs()
  from_spec = _feature_summary(mid_level.feature_config, mid_level.optimizer)
  by_hand = _feature_summary(feature_config, optimizer)
  if from_spec != by_hand:
    raise ValueError('mid_level_configs() differs from spec.to_mid_level():\n'
                     '  spec:    {}\n  by hand: {}'.format(from_spec, by_hand))
  print('mid_level_configs() declares the same tables and features.')
  return mid_level


if __name__ == '__main__':
  main()
