"""`restore_embedding` / `save_embedding`: a mid-level API object's tables and
slots, by table name, from legacy and mid-level checkpoints and back.

The legacy checkpoints are written by tpu_fc's TPUEstimator (emulated TPU);
the values expected are read back from them by their legacy names, the slot
suffixes those TF 2.15 gives (`oracle.SLOT_SUFFIX`), not tpu_fc's table.
Restored objects are tpu_fc's `TPUEmbedding` and TF's own
`TPUEmbeddingForServing`; a checkpoint written by `save_embedding` is read by
TF's `tf.train.Checkpoint` and converted back by `to_legacy_checkpoint`.
"""
import functools
import re

import numpy as np
import pytest

import tpu_fc
from tpu_fc import checkpoint_conversion as conversion
from tpu_fc._tf import tf

from harness import oracle
from harness.checkpoints import (A_TABLE, OPTIMIZERS, SHARED_TABLE,
                                 checkpoint_values, make_spec, trained_once)


W_TABLE = 'dense_features/w_weighted_by_w_weight_embedding/embedding_weights'
LEGACY_NAMES = {'tbl_a': A_TABLE, 'tbl_w_weighted_by_w_weight': W_TABLE,
                'tbl_b_c_shared_embedding': SHARED_TABLE}
Error = conversion.CheckpointConversionError


@pytest.fixture(scope='module')
def legacy(tmp_path_factory):
  """legacy(optimizer): (spec, legacy model_dir trained 2 steps) of an
  `OPTIMIZERS` name, trained once: the module's tests only read it."""
  return trained_once(tmp_path_factory)


@pytest.fixture(scope='module', params=sorted(OPTIMIZERS))
def trained(request, legacy):
  """(spec, legacy model_dir trained 2 steps) per embedding optimizer."""
  return legacy(request.param)


def embedding_of(spec, cls=tpu_fc.mid_level.TPUEmbedding):
  config = spec.to_mid_level()
  return cls(config.feature_config, config.optimizer)


def variables_of(embedding):
  """{'<table>' or '<table>/<legacy suffix>': value} of an embedding."""
  values = {}
  for table, variable in embedding.embedding_tables.items():
    values[table.name] = variable.numpy()
    suffixes = oracle.SLOT_SUFFIX[type(
        tpu_fc.optimizers.from_mid_level(table.optimizer)).__name__]
    variables = embedding._variables[table.name]  # pylint: disable=protected-access
    for slot, suffix in suffixes.items():
      values['{}/{}'.format(table.name, suffix)] = variables[slot].numpy()
  return values


def legacy_values_by_table(model_dir, spec):
  """The legacy checkpoint's tables and slots, keyed as `variables_of`."""
  legacy = checkpoint_values(model_dir)
  suffixes = oracle.SLOT_SUFFIX[type(spec.optimization_parameters).__name__]
  values = {}
  for table, name in LEGACY_NAMES.items():
    values[table] = legacy[name]
    for suffix in suffixes.values():
      values['{}/{}'.format(table, suffix)] = legacy['{}/{}'.format(name,
                                                                    suffix)]
  return values


def assert_same(got, want):
  assert sorted(got) == sorted(want)
  for name, value in want.items():
    np.testing.assert_array_equal(got[name], value, err_msg=name)


@pytest.mark.parametrize('cls', [
    tpu_fc.mid_level.TPUEmbedding,
    tf.tpu.experimental.embedding.TPUEmbeddingForServing],
                         ids=['tpu_fc', 'TPUEmbeddingForServing'])
def test_a_legacy_checkpoint_restores_by_the_naming_rules(trained, cls):
  """No spec: `tbl_a` is found as `.../a_embedding/embedding_weights`, the
  shared table as its collection's name; every slot by its legacy suffix."""
  spec, model_dir = trained
  embedding = embedding_of(spec, cls)
  assert conversion.restore_embedding(embedding, str(model_dir)) == 2
  assert_same(variables_of(embedding), legacy_values_by_table(model_dir, spec))


def test_save_and_convert_back_is_the_legacy_checkpoint_bit_for_bit(
    trained, tmp_path):
  """legacy -> restore -> save -> `to_legacy_checkpoint`: the original
  tables, slots and global step; the saved checkpoint is what TF's own class
  and `restore_embedding` read."""
  spec, model_dir = trained
  embedding = embedding_of(spec)
  step = conversion.restore_embedding(embedding, str(model_dir))
  saved = conversion.save_embedding(embedding, str(tmp_path / 'mid'), step)
  assert saved == str(tmp_path / 'mid' / 'ckpt-2')
  back = checkpoint_values(conversion.to_legacy_checkpoint(
      spec, saved, str(tmp_path / 'back')))
  original = checkpoint_values(model_dir)
  for name in list(LEGACY_NAMES.values()) + ['global_step']:
    below = [n for n in original if n == name or n.startswith(name + '/')]
    for variable in below:
      np.testing.assert_array_equal(back[variable], original[variable],
                                    err_msg=variable)
  tf_class = embedding_of(spec, tf.tpu.experimental.embedding.TPUEmbeddingForServing)
  status = tf.train.Checkpoint(embedding=tf_class).read(saved)
  tf_class.embedding_tables  # pylint: disable=pointless-statement  (builds, restores)
  status.assert_existing_objects_matched()
  assert_same(variables_of(tf_class), variables_of(embedding))
  again = embedding_of(spec)
  assert conversion.restore_embedding(again, str(tmp_path / 'mid')) == 2
  assert_same(variables_of(again), variables_of(embedding))


def test_a_converted_mid_level_checkpoint_restores(trained, tmp_path):
  spec, model_dir = trained
  mid_level = conversion.to_mid_level_checkpoint(spec, str(model_dir),
                                                 str(tmp_path / 'mid'))
  embedding = embedding_of(spec)
  assert conversion.restore_embedding(embedding, mid_level) == 2
  assert_same(variables_of(embedding), legacy_values_by_table(model_dir, spec))


def test_slots_held_outside_the_object_are_restored_and_saved(legacy,
                                                              tmp_path):
  """Slots a `slot_variable_creation_fn` keeps elsewhere (as a Keras
  optimizer does for TFRS) are no checkpoint children of the object, yet
  restored and saved with its tables."""
  spec, model_dir = legacy('adagrad')
  held = []

  def slots_elsewhere(table, slot_names, initializers):
    slots = {name: tf.Variable(functools.partial(
        initializer, shape=table.shape, dtype=tf.float32))
             for name, initializer in zip(slot_names, initializers)}
    held.append(slots)
    return slots

  config = spec.to_mid_level()
  for table in config.tables:  # (each has the spec's optimizer as its own)
    table.optimizer = tf.tpu.experimental.embedding.Adagrad(
        0.1, initial_accumulator_value=0.2,
        slot_variable_creation_fn=slots_elsewhere)
  embedding = tpu_fc.mid_level.TPUEmbedding(config.feature_config, None)
  conversion.restore_embedding(embedding, str(model_dir))
  assert_same(variables_of(embedding), legacy_values_by_table(model_dir, spec))
  assert len(held) == 3
  saved = checkpoint_values(conversion.save_embedding(embedding,
                                                      str(tmp_path / 'mid')))
  np.testing.assert_array_equal(
      saved['embedding/tbl_a.Saccumulators/.ATTRIBUTES/VARIABLE_VALUE'],
      checkpoint_values(model_dir)[A_TABLE + '/Adagrad'])


def test_a_serving_object_without_optimizer_takes_the_tables(trained):
  spec, model_dir = trained
  config = spec.to_mid_level()
  embedding = tf.tpu.experimental.embedding.TPUEmbeddingForServing(
      config.feature_config, None)
  conversion.restore_embedding(embedding, str(model_dir))
  legacy = legacy_values_by_table(model_dir, spec)
  for table, variable in embedding.embedding_tables.items():
    np.testing.assert_array_equal(variable.numpy(), legacy[table.name])


def write_legacy(directory, values):
  """A name-based checkpoint of `values`, as a TPUEstimator writes it."""
  with tf.Graph().as_default():
    variables = {name: tf.compat.v1.Variable(value, name=name)
                 for name, value in values.items()}
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      return tf.compat.v1.train.Saver(variables).save(
          session, str(directory / 'model.ckpt'))


def test_ambiguous_tables_are_named_by_the_spec_or_table_names(tmp_path):
  """A dict-configured engine's `tbl_a` beside a column's table of `tbl_a`:
  the naming rules find both and refuse; the spec's column, or
  `table_names`, picks one."""
  spec = make_spec(tpu_fc.StochasticGradientDescentParameters(0.1))
  values = {A_TABLE: np.full((10, 4), 1, np.float32),
            'tbl_a': np.full((10, 4), 2, np.float32),
            W_TABLE: np.full((5, 2), 3, np.float32),
            SHARED_TABLE: np.full((7, 3), 4, np.float32),
            'global_step': np.int64(7)}
  prefix = write_legacy(tmp_path, values)
  embedding = embedding_of(spec)
  with pytest.raises(Error, match=re.escape(
      "Table tbl_a (feature(s) ['a']): expected one checkpoint variable for "
      "it, found ['dense_features/a_embedding/embedding_weights', 'tbl_a']")):
    conversion.restore_embedding(embedding, prefix)
  assert conversion.restore_embedding(embedding, prefix, spec) == 7
  tables = {t.name: v.numpy() for t, v in embedding.embedding_tables.items()}
  np.testing.assert_array_equal(tables['tbl_a'], values[A_TABLE])
  conversion.restore_embedding(embedding, prefix,
                               table_names={'tbl_a': 'tbl_a'})
  tables = {t.name: v.numpy() for t, v in embedding.embedding_tables.items()}
  np.testing.assert_array_equal(tables['tbl_a'], values['tbl_a'])


def refused(embedding, checkpoint, message, **kwargs):
  """Asserts restoring refuses with `message` (a regex) and assigns nothing."""
  before = variables_of(embedding)
  with pytest.raises(Error, match=message):
    conversion.restore_embedding(embedding, checkpoint, **kwargs)
  assert_same(variables_of(embedding), before)


def test_what_does_not_fit_is_refused_naming_table_and_field(legacy,
                                                             tmp_path):
  spec, model_dir = legacy('adagrad')
  legacy_dir = str(model_dir)
  mid_level = conversion.to_mid_level_checkpoint(spec, legacy_dir,
                                                 str(tmp_path / 'mid'))
  for checkpoint in (legacy_dir, mid_level):
    refused(embedding_of(make_spec(OPTIMIZERS['adagrad'], a_vocabulary=12)),
            checkpoint, r'Table tbl_a: checkpoint variable .* has shape '
            r'\[10, 4\], but the table is \[vocabulary_size, dimension\] = '
            r'\[12, 4\]')
  refused(embedding_of(make_spec(OPTIMIZERS['adam'])), legacy_dir, re.escape(
      "Table tbl_a: the checkpoint lacks the AdamParameters slot variable(s) "
      "['{0}/Adam/m', '{0}/Adam/v'] (it has ['{0}/Adagrad'])".format(A_TABLE)))
  refused(embedding_of(make_spec(OPTIMIZERS['adam'])), mid_level, re.escape(
      "Table tbl_a: the mid-level checkpoint lacks the AdamParameters slot "
      "'momenta'"))
  refused(embedding_of(make_spec(OPTIMIZERS['sgd'])), mid_level, re.escape(
      "Table tbl_a: the mid-level checkpoint holds the slot(s) "
      "['tbl_a/accumulators'], which StochasticGradientDescentParameters has "
      "no slot for"))
  refused(embedding_of(make_spec(OPTIMIZERS['sgd'])), legacy_dir, re.escape(
      "Table tbl_a: the checkpoint holds ['{}/Adagrad'], which "
      "StochasticGradientDescentParameters has no slot for".format(A_TABLE)))
  table = tf.tpu.experimental.embedding.TableConfig(3, 2, name='tbl_zz')
  extra = tpu_fc.mid_level.TPUEmbedding(
      dict(spec.to_mid_level().feature_config,
           zz=tf.tpu.experimental.embedding.FeatureConfig(table)),
      tf.tpu.experimental.embedding.Adagrad(0.1))
  refused(extra, legacy_dir, re.escape(
      "Table tbl_zz (feature(s) ['zz']): expected one checkpoint variable for "
      "it, found none"))
  refused(extra, mid_level, re.escape(
      'Table tbl_zz is not in the mid-level checkpoint'))
  refused(extra, legacy_dir, re.escape(
      'Table tbl_zz of the embedding is not a table of the spec'), spec=spec)
  refused(extra, legacy_dir, re.escape(
      "table_names (--table-name) names ['tbl_z'], which the embedding has "
      "no table of"), table_names={'tbl_z': 'x'})


def test_save_never_overwrites(legacy, tmp_path):
  spec, model_dir = legacy('sgd')
  embedding = embedding_of(spec)
  conversion.save_embedding(embedding, str(tmp_path / 'mid'), global_step=3)
  for step in (3, 2):
    with pytest.raises(Error, match=re.escape(
        'of global step {} or later'.format(step))):
      conversion.save_embedding(embedding, str(tmp_path / 'mid'), step)
  assert conversion.save_embedding(embedding, str(tmp_path / 'mid'), 4).endswith(
      'ckpt-4')
  with pytest.raises(Error, match='it is a legacy model_dir'):
    conversion.save_embedding(embedding, str(model_dir))
  (tmp_path / 'file').write_text('')
  with pytest.raises(Error, match='it is a file'):
    conversion.save_embedding(embedding, str(tmp_path / 'file'))
