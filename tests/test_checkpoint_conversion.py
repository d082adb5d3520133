"""Checkpoint conversion legacy <-> mid-level, `tpu-fc inspect` / `convert-checkpoint`.

Checkpoints are written by tpu_fc's TPUEstimator (emulated TPU: the embedding
optimizer's legacy slots; use_tpu=False: the model optimizer's) and, on the legacy
lane, by TF 2.15's real TPUEstimator.  Expected values are read back from the
source checkpoint by name; the converted checkpoint must restore into a real
`TPUEmbedding` / `TPUEmbeddingForServing` with those values and convert back bit
for bit.
"""
import json
import os
import re
import sys
import tempfile

import numpy as np
import pytest

import tpu_fc
from tpu_fc import __main__ as cli
from tpu_fc import checkpoint_conversion as conversion
from tpu_fc import legacy_names
from tpu_fc import naming
from tpu_fc._tf import tf

from harness.checkpoints import (A_TABLE, BATCH, OPTIMIZERS, SHARED_TABLE,
                                 assert_converted_back, checkpoint_values,
                                 input_fn, make_spec, model_fn,
                                 tpu_embedding_variables, train,
                                 trained_once)

fc = tf.feature_column


def legacy_slot_names(spec):
  return {table: ['{}/{}'.format(table, suffix)
                  for suffix, _ in spec.optimization_parameters.SLOTS]
          for table in (A_TABLE, SHARED_TABLE)}


@pytest.fixture(scope='module')
def legacy(tmp_path_factory):
  """legacy(optimizer): (spec, legacy model_dir trained 2 steps) of an
  `OPTIMIZERS` name, trained once: the tests given it only read it."""
  return trained_once(tmp_path_factory)


@pytest.fixture(scope='module', params=sorted(OPTIMIZERS))
def trained(request, legacy, tmp_path_factory):
  """(spec, legacy model_dir, mid-level checkpoint prefix) per optimizer."""
  spec, model_dir = legacy(request.param)
  mid_level = conversion.to_mid_level_checkpoint(
      spec, str(model_dir),
      str(tmp_path_factory.mktemp('mid_level_' + request.param)))
  return spec, model_dir, mid_level


def test_mid_level_checkpoint_has_the_legacy_values(trained):
  spec, model_dir, mid_level = trained
  legacy = checkpoint_values(model_dir)
  converted = checkpoint_values(mid_level)
  tables = {'tbl_a': A_TABLE, 'tbl_b_c_shared_embedding': SHARED_TABLE}
  for table, legacy_name in tables.items():
    np.testing.assert_array_equal(
        converted['embedding/{}/.ATTRIBUTES/VARIABLE_VALUE'.format(table)],
        legacy[legacy_name])
    for suffix, slot in spec.optimization_parameters.SLOTS:
      np.testing.assert_array_equal(
          converted['embedding/{}.S{}/.ATTRIBUTES/VARIABLE_VALUE'.format(
              table, slot)], legacy['{}/{}'.format(legacy_name, suffix)])
  np.testing.assert_array_equal(
      converted['dense/dense.Skernel/.ATTRIBUTES/VARIABLE_VALUE'],
      legacy['dense/kernel'])
  assert converted['global_step/.ATTRIBUTES/VARIABLE_VALUE'] == 2
  assert not any(naming.DUMMY_VARIABLE_PREFIX in name for name in converted)


@pytest.mark.parametrize('serving', [False, True], ids=['TPUEmbedding',
                                                        'TPUEmbeddingForServing'])
def test_mid_level_checkpoint_restores_into_a_real_tpu_embedding(trained, serving):
  spec, model_dir, mid_level = trained
  config = spec.to_mid_level()
  embedding_class = (tf.tpu.experimental.embedding.TPUEmbeddingForServing
                     if serving else tf.tpu.experimental.embedding.TPUEmbedding)
  embedding = embedding_class(config.feature_config, config.optimizer)
  status = tf.train.Checkpoint(embedding=embedding).read(mid_level)
  tables = {t.name: v for t, v in embedding.embedding_tables.items()}
  status.assert_existing_objects_matched()
  legacy = checkpoint_values(model_dir)
  np.testing.assert_array_equal(tables['tbl_a'].numpy(), legacy[A_TABLE])
  np.testing.assert_array_equal(tables['tbl_b_c_shared_embedding'].numpy(),
                                legacy[SHARED_TABLE])


def test_round_trip_gives_the_original_checkpoint_bit_for_bit(trained, tmp_path):
  spec, model_dir, mid_level = trained
  back = conversion.to_legacy_checkpoint(spec, mid_level, str(tmp_path))
  assert_converted_back(back, checkpoint_values(model_dir))
  assert tf.train.latest_checkpoint(str(tmp_path)) == back


def test_names_with_dots_convert_both_ways(tmp_path):
  """TF escapes '.' as '..' and '/' as '.S' in object checkpoint keys: a scope
  named 'head.v2.Scale' must come back as itself, not as 'head/v2/cale'."""
  spec = make_spec()
  train(tmp_path / 'legacy', spec, head_scope='head.v2.Scale')
  original = checkpoint_values(tmp_path / 'legacy')
  assert 'head.v2.Scale/dense/kernel' in original
  mid_level = conversion.to_mid_level_checkpoint(
      spec, str(tmp_path / 'legacy'), str(tmp_path / 'mid'))
  report = conversion.inspect_checkpoint(mid_level)
  assert 'head.v2.Scale/dense/kernel' in [
      v['name'] for v in report['dense_variables']]
  back = checkpoint_values(conversion.to_legacy_checkpoint(
      spec, mid_level, str(tmp_path / 'back')))
  np.testing.assert_array_equal(back['head.v2.Scale/dense/kernel'],
                                original['head.v2.Scale/dense/kernel'])
  estimator = train(tmp_path / 'back', spec, steps=1, head_scope='head.v2.Scale')
  assert estimator.get_variable_value('global_step') == 3


def test_tensor_core_tables_convert_for_tpu_embedding_v0_and_back(tmp_path):
  """A `tpu_tensor_core` column's table (trained by the model's optimizer):
  `tensor_core/<table>` restores into a `TPUEmbeddingV0` of the spec's
  `tensor_core_feature_config`; its model-optimizer slot stays dense; back,
  the original checkpoint bit for bit."""
  t = tpu_fc.embedding_column(
      fc.categorical_column_with_identity('a', 10), 4,
      embedding_lookup_device='tpu_tensor_core', tensor_core_shape=[None, 2])
  w = make_spec().feature_columns[1]
  spec = tpu_fc.EmbeddingConfigSpec(
      feature_columns=[t, w], optimization_parameters=OPTIMIZERS['adagrad'])
  train(tmp_path / 'legacy', spec, columns=[t, w])  # (the spec moves t apart)
  original = checkpoint_values(tmp_path / 'legacy')
  mid_level = conversion.to_mid_level_checkpoint(spec, str(tmp_path / 'legacy'),
                                                 str(tmp_path / 'mid'))
  config = spec.to_mid_level()
  v0 = tpu_fc.mid_level.TPUEmbeddingV0(config.tensor_core_feature_config,
                                       config.optimizer)
  status = tf.train.Checkpoint(tensor_core=v0).read(mid_level)
  v0.build()
  status.assert_existing_objects_matched()
  (table,) = v0.embedding_tables.values()
  np.testing.assert_array_equal(table.numpy(), original[A_TABLE])
  report = conversion.inspect_checkpoint(mid_level)
  assert 'tbl_a' in [entry['name'] for entry in report['tables']]
  assert A_TABLE + '/Adagrad' in [v['name'] for v in report['dense_variables']]
  back = checkpoint_values(conversion.to_legacy_checkpoint(
      spec, mid_level, str(tmp_path / 'back')))
  assert sorted(back) == sorted(n for n in original if not naming.is_dummy(n))
  for name, value in back.items():
    np.testing.assert_array_equal(value, original[name], err_msg=name)


def test_converted_back_checkpoint_resumes_training(legacy, tmp_path):
  spec, model_dir = legacy('adagrad')
  mid_level = conversion.to_mid_level_checkpoint(
      spec, str(model_dir), str(tmp_path / 'mid'))
  conversion.to_legacy_checkpoint(spec, mid_level, str(tmp_path / 'back'))
  estimator = train(tmp_path / 'back', spec, steps=1)
  assert estimator.get_variable_value('global_step') == 3


def test_native_mid_level_checkpoint_gets_dense_features_names(tmp_path):
  spec = make_spec(OPTIMIZERS['adam'])
  config = spec.to_mid_level()
  embedding = tf.tpu.experimental.embedding.TPUEmbedding(
      config.feature_config, config.optimizer)
  tables = embedding.embedding_tables  # builds tables and slots
  rng = np.random.RandomState(3)
  for child in tf.train.TrackableView(embedding).children(embedding).values():
    if isinstance(child, tf.Variable):
      child.assign(rng.uniform(size=child.shape).astype(np.float32))
  tables = {t.name: v.numpy() for t, v in tables.items()}
  prefix = tf.train.Checkpoint(embedding=embedding).write(str(tmp_path / 'ck'))
  legacy = checkpoint_values(
      conversion.to_legacy_checkpoint(spec, prefix, str(tmp_path / 'legacy')))
  np.testing.assert_array_equal(legacy[A_TABLE], tables['tbl_a'])
  np.testing.assert_array_equal(legacy[SHARED_TABLE],
                                tables['tbl_b_c_shared_embedding'])
  np.testing.assert_array_equal(
      legacy['dense_features/w_weighted_by_w_weight_embedding/embedding_weights'],
      tables['tbl_w_weighted_by_w_weight'])
  assert sorted(n for n in legacy if n.startswith(A_TABLE + '/')) == sorted(
      legacy_slot_names(spec)[A_TABLE])
  assert legacy['global_step'] == 0


def test_object_checkpoint_with_the_embedding_elsewhere_is_named_so(tmp_path):
  """A Keras-style checkpoint, the TPUEmbedding under `model/embedding`: not
  read as legacy, and the conversion says where the tables must be."""
  spec = make_spec()
  config = spec.to_mid_level()
  holder = tf.Module()
  holder.embedding = tf.tpu.experimental.embedding.TPUEmbedding(
      config.feature_config, config.optimizer)
  holder.embedding.build()
  prefix = tf.train.Checkpoint(model=holder).write(str(tmp_path / 'ck'))
  assert conversion.inspect_checkpoint(prefix)['format'] == (
      'object-based, no embedding/ key')
  with pytest.raises(conversion.CheckpointConversionError, match=re.escape(
      "is an object-based checkpoint, but its tables are not under the root "
      "key 'embedding' (its keys begin ['model']): save the TPUEmbedding as tf.train.Checkpoint(embedding=<the "
      "TPUEmbedding>, ...) to convert it.")):
    conversion.to_legacy_checkpoint(spec, prefix, str(tmp_path / 'x'))


def test_use_tpu_false_partitioned_tables_convert_with_fresh_slots(tmp_path):
  spec = make_spec(OPTIMIZERS['adam'])
  train(tmp_path, spec, use_tpu=False, partitioned=True)
  values = checkpoint_values(tmp_path)
  partitioned_a = 'input/input_layer/a_embedding/embedding_weights'
  assert values[partitioned_a].shape == (10, 4)  # parts saved as one variable
  with pytest.raises(conversion.CheckpointConversionError,
                     match=r"Table tbl_a \(feature\(s\) \['a'\]\): expected one "
                     r'checkpoint variable for it, found .*' + partitioned_a):
    conversion.to_mid_level_checkpoint(spec, str(tmp_path), str(tmp_path / 'x'))
  with pytest.raises(conversion.CheckpointConversionError,
                     match=r'lacks the AdamParameters slot.*--fresh-slots'):
    conversion.to_mid_level_checkpoint(
        spec, str(tmp_path), str(tmp_path / 'x'), {'tbl_a': partitioned_a})
  mid_level = checkpoint_values(conversion.to_mid_level_checkpoint(
      spec, str(tmp_path), str(tmp_path / 'mid'), {'tbl_a': partitioned_a},
      fresh_slots=True))
  key = 'embedding/{}/.ATTRIBUTES/VARIABLE_VALUE'
  np.testing.assert_array_equal(mid_level[key.format('tbl_a')],
                                values[partitioned_a])
  initial = spec.optimization_parameters.slot_initial_values()
  for slot, value in initial.items():
    np.testing.assert_array_equal(
        mid_level[key.format('tbl_a.S' + slot)], np.full((10, 4), value))
  # The model optimizer's slots of the table are kept, as dense variables.
  assert 'dense/{}.SAdagrad/.ATTRIBUTES/VARIABLE_VALUE'.format(
      partitioned_a.replace('/', '.S')) in mid_level


def test_table_names_mistakes_are_refused(trained, tmp_path):
  """A misspelled table, or a checkpoint name the checkpoint lacks: refused,
  naming it and what there is (before: the first was ignored silently)."""
  spec, model_dir, mid_level = trained
  with pytest.raises(conversion.CheckpointConversionError, match=re.escape(
      "table_names (--table-name) names ['tbl_aa'], which the spec has no table "
      "of; its tables are ['tbl_a', 'tbl_b_c_shared_embedding', "
      "'tbl_w_weighted_by_w_weight'].")):
    conversion.to_mid_level_checkpoint(spec, str(model_dir), str(tmp_path / 'x'),
                                       {'tbl_aa': A_TABLE})
  with pytest.raises(conversion.CheckpointConversionError, match=re.escape(
      "Table tbl_a: table_names (--table-name) gives it the checkpoint variable "
      "'a_embeding', which the checkpoint does not hold; its variables of rank "
      "2 are [") + '.*' + re.escape(A_TABLE)):
    conversion.to_mid_level_checkpoint(spec, str(model_dir), str(tmp_path / 'x'),
                                       {'tbl_a': 'a_embeding'})
  with pytest.raises(conversion.CheckpointConversionError,
                     match=re.escape("names ['tbl_zz'], which the spec has no")):
    conversion.to_legacy_checkpoint(spec, mid_level, str(tmp_path / 'x'),
                                    {'tbl_zz': 'anything'})
  assert not os.path.exists(tmp_path / 'x')


def test_slots_of_another_optimizer_are_refused(legacy, tmp_path):
  spec, model_dir = legacy('adam')
  with pytest.raises(conversion.CheckpointConversionError) as error:
    conversion.to_mid_level_checkpoint(make_spec(OPTIMIZERS['sgd']),
                                       str(model_dir), str(tmp_path / 'x'))
  assert str(error.value) == (
      "Table tbl_a: the checkpoint holds ['{0}/Adam/m', '{0}/Adam/v'], which "
      'StochasticGradientDescentParameters has no slot for.'.format(A_TABLE))
  assert not os.path.exists(tmp_path / 'x')
  # Back to legacy too: a mid-level checkpoint's Adam slots are no SGD's.
  mid_level = conversion.to_mid_level_checkpoint(
      spec, str(model_dir), str(tmp_path / 'mid'))
  with pytest.raises(conversion.CheckpointConversionError) as error:
    conversion.to_legacy_checkpoint(make_spec(OPTIMIZERS['sgd']), mid_level,
                                    str(tmp_path / 'back'))
  assert str(error.value) == (
      "Table tbl_a: the mid-level checkpoint holds the slot(s) "
      "['tbl_a/momenta', 'tbl_a/velocities'], which "
      'StochasticGradientDescentParameters has no slot for.')
  assert not os.path.exists(tmp_path / 'back')


def test_changed_vocabulary_is_refused(legacy, tmp_path):
  _, model_dir = legacy('adagrad')
  changed = make_spec(a_vocabulary=12)
  with pytest.raises(conversion.CheckpointConversionError) as error:
    conversion.to_mid_level_checkpoint(changed, str(model_dir),
                                       str(tmp_path / 'x'))
  assert str(error.value) == (
      'Table tbl_a: checkpoint variable {} has shape [10, 4], but the table is '
      '[vocabulary_size, dimension] = [12, 4] (vocabulary or dimension '
      'changed?).'.format(A_TABLE))


@pytest.mark.parametrize('optimizer', [
    tpu_fc.MomentumParameters(0.1, 0.9), tpu_fc.RMSPropParameters(0.1, 0.9, 0.9, 1e-3),
    tpu_fc.ProximalAdagradParameters(0.1)], ids=lambda o: type(o).__name__)
def test_optimizers_without_a_mid_level_twin_are_refused(legacy, optimizer,
                                                        tmp_path):
  _, model_dir = legacy('adagrad')
  with pytest.raises(NotImplementedError, match='has no twin'):
    conversion.to_mid_level_checkpoint(make_spec(optimizer), str(model_dir),
                                       str(tmp_path / 'x'))


# The optimizers TF 2.15's engine takes from dict configs only.
DICT_OPTIMIZERS = {
    'adagrad_momentum': tpu_fc.AdagradMomentumParameters(0.1, momentum=0.9,
                                                         use_nesterov=True),
    'proximal_yogi': tpu_fc.ProximalYogiParameters(
        0.1, l1_regularization_strength=0.01),
    'frequency_estimator': tpu_fc.FrequencyEstimatorParameters(
        tau=0.1, max_delta=10.0, outlier_threshold=2.0, weight_exponent=1.0),
}


def make_dict_spec(optimizer):
  """Features a and b in dict-configured tables 'ta' and 'tb' (of dimension
  1 for a FrequencyEstimator)."""
  dim = 1 if isinstance(optimizer, tpu_fc.FrequencyEstimatorParameters) else 3
  return tpu_fc.EmbeddingConfigSpec(
      feature_to_config_dict={'a': tpu_fc.FeatureConfig('ta'),
                              'b': tpu_fc.FeatureConfig('tb')},
      table_to_config_dict={'ta': tpu_fc.TableConfig(10, dim),
                            'tb': tpu_fc.TableConfig(7, dim)},
      optimization_parameters=optimizer)


@pytest.fixture(scope='module', params=sorted(DICT_OPTIMIZERS))
def trained_dict(request, tmp_path_factory):
  """(spec, legacy model_dir) of a dict-configured spec per optimizer."""
  spec = make_dict_spec(DICT_OPTIMIZERS[request.param])
  model_dir = tmp_path_factory.mktemp('dict_' + request.param)
  train(model_dir, spec, activations=['a', 'b'])
  return spec, model_dir


def test_inspect_names_the_dict_only_optimizers(trained_dict, capsys):
  """Their tables (named by the dicts) hold the slots under TF 2.15's
  engine's names, and `tpu-fc inspect` names the optimizer."""
  spec, model_dir = trained_dict
  params = spec.optimization_parameters
  name = type(params).__name__[:-len('Parameters')]
  cli.main(['inspect', str(model_dir), '--json'])
  report = json.loads(capsys.readouterr().out)
  tables = {t['name']: t for t in report['tables']}
  assert sorted(tables) == ['ta', 'tb']
  dim = 1 if name == 'FrequencyEstimator' else 3
  suffixes = {  # TF 2.15's `_*Handler.get_default_slot_variable_names`
      'AdagradMomentum': ['AdagradMomentum/Accumulator',
                          'AdagradMomentum/Momentum'],
      'ProximalYogi': ['ProximalYogi', 'ProximalYogi_1'],
      'FrequencyEstimator': ['FrequencyEstimator']}[name]
  assert tables['ta'] == {
      'name': 'ta', 'shape': [10, dim], 'optimizer': name + ' (TPU embedding)',
      'slots': {suffix: [10, dim] for suffix in suffixes}}
  if params._NO_MID_LEVEL_TWIN:  # pylint: disable=protected-access
    with pytest.raises(NotImplementedError, match='has no twin'):
      conversion.to_mid_level_checkpoint(spec, str(model_dir),
                                         str(model_dir / 'x'))


@pytest.mark.parametrize('trained_dict', ['adagrad_momentum'], indirect=True)
def test_adagrad_momentum_slots_convert_both_ways(trained_dict, tmp_path,
                                                  capsys):
  """Legacy `<table>/AdagradMomentum/Accumulator` and `/Momentum` are the
  mid-level `accumulators` and `momenta` of TF's own TPUEmbedding, and back."""
  spec, model_dir = trained_dict
  legacy = checkpoint_values(model_dir)
  mid_level = conversion.to_mid_level_checkpoint(spec, str(model_dir),
                                                 str(tmp_path / 'mid'))
  variables = tpu_embedding_variables(spec, mid_level)
  for table in ('ta', 'tb'):
    assert sorted(variables[table]) == ['accumulators', 'momenta', 'parameters']
    np.testing.assert_array_equal(variables[table]['parameters'].numpy(),
                                  legacy[table])
    for suffix, slot in (('AdagradMomentum/Accumulator', 'accumulators'),
                         ('AdagradMomentum/Momentum', 'momenta')):
      np.testing.assert_array_equal(variables[table][slot].numpy(),
                                    legacy['{}/{}'.format(table, suffix)],
                                    err_msg=slot)
      assert np.any(legacy['{}/{}'.format(table, suffix)] != 0), slot  # trained
  cli.main(['inspect', mid_level])
  assert 'ta  [10, 3]  optimizer: AdagradMomentum' in capsys.readouterr().out
  back = conversion.to_legacy_checkpoint(spec, mid_level, str(tmp_path / 'back'))
  assert_converted_back(back, legacy)


def test_wrong_direction_and_missing_checkpoint_are_refused(trained, tmp_path):
  spec, model_dir, mid_level = trained
  with pytest.raises(conversion.CheckpointConversionError,
                     match='already a mid-level'):
    conversion.to_mid_level_checkpoint(spec, mid_level, str(tmp_path))
  with pytest.raises(conversion.CheckpointConversionError,
                     match='is not a mid-level'):
    conversion.to_legacy_checkpoint(spec, str(model_dir), str(tmp_path))
  with pytest.raises(conversion.CheckpointConversionError,
                     match='No checkpoint found in directory'):
    conversion.to_legacy_checkpoint(spec, str(tmp_path), str(tmp_path / 'x'))


# CLI ---------------------------------------------------------------------------------

SPEC_MODULE = '''
import tpu_fc
from tpu_fc._tf import tf
fc = tf.feature_column
def spec():
  a = tpu_fc.embedding_column(fc.categorical_column_with_identity('a', 10), 4)
  w = tpu_fc.embedding_column(fc.weighted_categorical_column(
      fc.categorical_column_with_identity('w', 5), 'w_weight'), 2)
  b, c = tpu_fc.shared_embedding_columns(
      [fc.categorical_column_with_identity('b', 7),
       fc.categorical_column_with_identity('c', 7)], 3)
  return tpu_fc.EmbeddingConfigSpec(
      feature_columns=[a, w, b, c],
      optimization_parameters=tpu_fc.AdamParameters(0.1))
'''


def test_cli_inspect_and_convert_both_ways(legacy, tmp_path, capsys):
  _, model_dir = legacy('adam')
  spec_file = _spec_file(tmp_path)
  spec_ref = '{}:spec'.format(spec_file)

  cli.main(['inspect', str(model_dir), '--json'])
  report = json.loads(capsys.readouterr().out)
  assert report['format'] == 'legacy' and report['global_step'] == 2
  tables = {t['name']: t for t in report['tables']}
  assert sorted(tables) == sorted([
      A_TABLE, SHARED_TABLE,
      'dense_features/w_weighted_by_w_weight_embedding/embedding_weights'])
  assert tables[A_TABLE] == {'name': A_TABLE, 'shape': [10, 4],
                             'slots': {'Adam/m': [10, 4], 'Adam/v': [10, 4]},
                             'optimizer': 'Adam (TPU embedding)'}
  dense = {v['name'] for v in report['dense_variables']}
  assert {'dense/kernel', 'dense/kernel/Adagrad', 'dense/bias'} <= dense
  assert report['size_bytes'] > 0

  cli.main(['convert-checkpoint', '--to', 'mid-level', '--spec', spec_ref,
            str(model_dir), str(tmp_path / 'mid')])
  mid_level = capsys.readouterr().out.strip()
  cli.main(['inspect', mid_level])
  text = capsys.readouterr().out
  assert 'format:      mid-level' in text
  assert 'tbl_a  [10, 4]  optimizer: Adam' in text
  cli.main(['convert-checkpoint', '--to', 'legacy', '--spec', spec_ref,
            str(tmp_path / 'mid'), str(tmp_path / 'back')])
  back = checkpoint_values(capsys.readouterr().out.strip())
  original = checkpoint_values(model_dir)
  for name, value in back.items():
    np.testing.assert_array_equal(value, original[name], err_msg=name)


def test_conversion_refuses_to_repoint_a_model_dir(legacy, tmp_path, capsys):
  """Into the directory it reads, or a mid-level checkpoint into a legacy
  model_dir: refused, the model_dir untouched (its next train() would fail)."""
  spec, model_dir = legacy('adam')
  before = sorted(os.listdir(model_dir))
  state = (model_dir / 'checkpoint').read_text()
  for destination in (model_dir, model_dir / '.'):
    with pytest.raises(conversion.CheckpointConversionError, match=(
        'Refusing to write the mid-level checkpoint into .*: it is the '
        'directory .* is read from. Choose a new directory.')):
      conversion.to_mid_level_checkpoint(spec, str(model_dir),
                                         str(destination))
  train(tmp_path / 'other', spec)
  with pytest.raises(SystemExit, match='it is a legacy model_dir'):
    cli.main(['convert-checkpoint', '--to', 'mid-level', '--spec',
              '{}:spec'.format(_spec_file(tmp_path)), str(model_dir),
              str(tmp_path / 'other')])
  mid_level = conversion.to_mid_level_checkpoint(
      spec, str(model_dir), str(tmp_path / 'mid'))
  with pytest.raises(conversion.CheckpointConversionError,
                     match='it is the directory'):
    conversion.to_legacy_checkpoint(spec, mid_level, str(tmp_path / 'mid'))
  assert sorted(os.listdir(model_dir)) == before
  assert (model_dir / 'checkpoint').read_text() == state


def test_conversion_back_into_a_model_dir_keeps_its_checkpoints(tmp_path):
  """A mid-level checkpoint converted into the legacy model_dir it came from:
  refused while that would overwrite a checkpoint (of its step or later, also
  by the next train()), else added beside the earlier ones, all still listed."""
  spec = make_spec()
  legacy = tmp_path / 'legacy'
  train(legacy, spec)  # step 2
  before = {name: (legacy / name).read_bytes() for name in os.listdir(legacy)
            if name.startswith('model.ckpt')}
  listed = tf.train.get_checkpoint_state(str(legacy)).all_model_checkpoint_paths
  mid_level = conversion.to_mid_level_checkpoint(spec, str(legacy),
                                                 str(tmp_path / 'mid'))
  with pytest.raises(conversion.CheckpointConversionError, match=(
      r'Refusing to write .*model.ckpt-2: .* holds .*model.ckpt-2.*, of global '
      r'step 2 or later')):
    conversion.to_legacy_checkpoint(spec, mid_level, str(legacy))
  assert {name: (legacy / name).read_bytes() for name in before} == before
  # Trained on elsewhere to step 4, then brought back.
  conversion.to_legacy_checkpoint(spec, mid_level, str(tmp_path / 'elsewhere'))
  train(tmp_path / 'elsewhere', spec)
  step_4 = conversion.to_mid_level_checkpoint(
      spec, str(tmp_path / 'elsewhere'), str(tmp_path / 'mid_4'))
  conversion.to_legacy_checkpoint(spec, step_4, str(legacy))
  state = tf.train.get_checkpoint_state(str(legacy))
  assert list(state.all_model_checkpoint_paths) == list(listed) + [
      str(legacy / 'model.ckpt-4')]
  assert 'model_checkpoint_path: "model.ckpt-4"' in (
      legacy / 'checkpoint').read_text()  # relative, as the estimator writes
  assert {name: (legacy / name).read_bytes() for name in before} == before
  assert train(legacy, spec, steps=1).get_variable_value('global_step') == 5


def _spec_file(tmp_path):
  """SPEC_MODULE as a file, for `--spec FILE.py:spec`."""
  spec_file = tmp_path / 'model_spec.py'
  spec_file.write_text(SPEC_MODULE)
  return spec_file


def test_cli_reports_bad_input_without_traceback(tmp_path):
  spec_file = _spec_file(tmp_path)
  with pytest.raises(SystemExit) as error:
    cli.main(['convert-checkpoint', '--to', 'legacy', '--spec',
              '{}:spec'.format(spec_file), str(tmp_path), str(tmp_path / 'x')])
  assert str(error.value) == (
      'tpu-fc convert-checkpoint: error: No checkpoint found in directory '
      '{}.'.format(tmp_path))
  with pytest.raises(SystemExit, match="has no attribute 'nope'"):
    cli.main(['inspect', str(tmp_path), '--spec', '{}:nope'.format(spec_file)])
  with pytest.raises(SystemExit, match=re.escape(
      "tpu-fc inspect: error: --spec no_such_module:spec: cannot import "
      "no_such_module (No module named 'no_such_module'; relative module paths "
      "start at")):
    cli.main(['inspect', str(tmp_path), '--spec', 'no_such_module:spec'])
  with pytest.raises(SystemExit, match=re.escape(
      'tpu-fc convert-checkpoint: error: Refusing to write the legacy '
      'checkpoint into {}: it is a file. Choose a directory.'.format(spec_file))):
    cli.main(['convert-checkpoint', '--to', 'legacy', '--spec',
              '{}:spec'.format(spec_file), str(tmp_path), str(spec_file)])


LEGACY_SCRIPT = '''
"""The same spec as SPEC_MODULE, written with TF 2.15's names only."""
import tensorflow.compat.v1 as tf
fc = tf.feature_column
tpu = tf.tpu.experimental
def make_spec():
  a = tpu.embedding_column(fc.categorical_column_with_identity('a', 10), 4)
  w = tpu.embedding_column(fc.weighted_categorical_column(
      fc.categorical_column_with_identity('w', 5), 'w_weight'), 2)
  b, c = tpu.shared_embedding_columns(
      [fc.categorical_column_with_identity('b', 7),
       fc.categorical_column_with_identity('c', 7)], 3)
  return tf.estimator.tpu.experimental.EmbeddingConfigSpec(
      feature_columns=[a, w, b, c],
      optimization_parameters=tpu.AdamParameters(0.1))
spec = make_spec()
if __name__ == '__main__':
  raise SystemExit('the script ran its main block')
'''


def test_spec_names_a_legacy_script_as_run_loads_it(tmp_path, monkeypatch,
                                                    capsys):
  train(tmp_path / 'legacy', make_spec(OPTIMIZERS['adam']))
  (tmp_path / 'legacy_model.py').write_text(LEGACY_SCRIPT)
  # A wrapper next to it imports it: the script's folder must be on sys.path.
  (tmp_path / 'wrapper.py').write_text('from legacy_model import make_spec\n')
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(sys, 'path', list(sys.path))
  try:
    for reference in ('legacy_model.py:spec', 'wrapper.py:make_spec',
                      'legacy_model:spec'):
      spec = legacy_names.spec_from_reference(reference)
      assert isinstance(spec, tpu_fc.EmbeddingConfigSpec), reference
      assert type(spec.optimization_parameters) is tpu_fc.AdamParameters
      assert not legacy_names.is_installed()  # bound for the load only
    cli.main(['convert-checkpoint', '--to', 'mid-level', '--spec',
              'wrapper.py:make_spec', 'legacy', 'mid'])
    written = os.path.abspath(capsys.readouterr().out.strip())
    assert written.startswith(str(tmp_path / 'mid'))
    cli.main(['inspect', 'legacy', '--spec', 'legacy_model.py:spec'])
    assert 'Adam' in capsys.readouterr().out
  finally:
    sys.modules.pop('legacy_model', None)
  with pytest.raises(SystemExit, match='no such file missing.py'):
    cli.main(['inspect', 'legacy', '--spec', 'missing.py:spec'])


# Legacy lane: a checkpoint of TF 2.15's real TPUEstimator -------------------------------

@pytest.mark.legacy_only
def test_real_tpu_estimator_checkpoint_converts(tmp_path):
  from tensorflow_estimator.python.estimator.tpu import tpu_estimator  # pylint: disable=g-import-not-at-top
  from tensorflow_estimator.python.estimator.tpu import tpu_config  # pylint: disable=g-import-not-at-top
  spec = make_spec()
  legacy_columns = [
      tf.compat.v1.tpu.experimental.embedding_column(
          fc.categorical_column_with_identity('a', 10), 4),
      tf.compat.v1.tpu.experimental.embedding_column(fc.weighted_categorical_column(
          fc.categorical_column_with_identity('w', 5), 'w_weight'), 2),
  ] + tf.compat.v1.tpu.experimental.shared_embedding_columns(
      [fc.categorical_column_with_identity('b', 7),
       fc.categorical_column_with_identity('c', 7)], 3)
  estimator = tpu_estimator.TPUEstimator(
      model_fn=model_fn, use_tpu=False, train_batch_size=BATCH,
      params={'columns': legacy_columns,
              'spec_class': tf.compat.v1.estimator.tpu.TPUEstimatorSpec},
      config=tpu_config.RunConfig(model_dir=str(tmp_path), tf_random_seed=1))
  estimator.train(input_fn, steps=2)
  mid_level = checkpoint_values(conversion.to_mid_level_checkpoint(
      spec, str(tmp_path), str(tmp_path / 'mid')))
  legacy = checkpoint_values(tmp_path)
  # The model's Adagrad trained the tables on the CPU; its slot is Adagrad's.
  for table, name in (('tbl_a', A_TABLE), ('tbl_b_c_shared_embedding', SHARED_TABLE)):
    np.testing.assert_array_equal(
        mid_level['embedding/{}/.ATTRIBUTES/VARIABLE_VALUE'.format(table)],
        legacy[name])
    np.testing.assert_array_equal(
        mid_level['embedding/{}.Saccumulators/.ATTRIBUTES/VARIABLE_VALUE'.format(
            table)], legacy[name + '/Adagrad'])


# Mid-level export --------------------------------------------------------------------


class _SumOfActivations(tf.Module):
  """A stand-in migrated dense model: the sum of every activation."""

  def __call__(self, activations, features):
    del features
    return {'score': tf.add_n([tf.reduce_sum(value, axis=1)
                               for value in activations.values()])}


def _example(ids):
  feature = {key: tf.train.Feature(int64_list=tf.train.Int64List(value=value))
             for key, value in ids.items()}
  feature['w_weight'] = tf.train.Feature(
      float_list=tf.train.FloatList(value=[1.0] * len(ids['w'])))
  return tf.train.Example(features=tf.train.Features(
      feature=feature)).SerializeToString()


def test_mid_level_export_refuses_string_ids(trained, tmp_path):
  """A vocabulary column's feature parsed as strings: refused at export (the
  mid-level lookup takes ids; before: every request failed in a Cast)."""
  spec, _, mid_level = trained
  feature_spec = {key: tf.io.VarLenFeature(tf.int64) for key in 'awbc'}
  feature_spec['a'] = tf.io.VarLenFeature(tf.string)
  feature_spec['w_weight'] = tf.io.VarLenFeature(tf.float32)
  with pytest.raises(ValueError, match=re.escape(
      'Feature a: feature_spec parses it as string, but the mid-level lookup '
      'takes integer ids')):
    tpu_fc.serving.export_mid_level_saved_model(
        str(tmp_path / 'export'), spec, _SumOfActivations(), feature_spec,
        mid_level)
  assert not os.path.exists(tmp_path / 'export')


@pytest.mark.parametrize('source', ['mid_level', 'legacy'])
def test_mid_level_export_serves_tables_and_rejects_bad_ids(
    trained, source, tmp_path, monkeypatch):
  """From either checkpoint format; tpu_fc writes nothing outside `export_dir`."""
  spec, model_dir, mid_level = trained
  feature_spec = {key: tf.io.VarLenFeature(tf.int64) for key in 'awbc'}
  feature_spec['w_weight'] = tf.io.VarLenFeature(tf.float32)
  (tmp_path / 'tmp').mkdir()
  monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path / 'tmp'))
  tpu_fc.serving.export_mid_level_saved_model(
      str(tmp_path / 'export'), spec, _SumOfActivations(), feature_spec,
      mid_level if source == 'mid_level' else str(model_dir))
  # (AutoGraph writes the code of the functions it converts there: TF's own.)
  assert [name for name in os.listdir(tmp_path / 'tmp')
          if not name.startswith('__autograph_generated_file')] == []
  tmp_path = tmp_path / 'export'
  serve = tf.saved_model.load(str(tmp_path)).signatures['serving_default']
  legacy = checkpoint_values(model_dir)
  ids = {'a': [3], 'w': [4], 'b': [1], 'c': [6]}
  terms = np.concatenate([
      legacy[A_TABLE][3], legacy[SHARED_TABLE][[1, 6]].ravel(),
      legacy['dense_features/w_weighted_by_w_weight_embedding/'
             'embedding_weights'][4]])
  expected = terms.sum()
  # Sums of the same float32 terms in another order differ by at most one
  # rounding (EPS32 of the running sum's magnitude) per addition.
  bound = len(terms) * np.finfo(np.float32).eps * np.abs(terms).sum()
  np.testing.assert_allclose(serve(examples=tf.constant([_example(ids)]))['score'],
                             [expected], rtol=0, atol=bound)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match=r'Feature a \(table tbl_a\): ids \[12\] are out of '
                     r'range \[0, 10\)'):
    serve(examples=tf.constant([_example(dict(ids, a=[12]))]))
  np.testing.assert_allclose(serve(examples=tf.constant([_example(ids)]))['score'],
                             [expected], rtol=0, atol=bound)
  saved = tf.train.list_variables(str(tmp_path / 'variables' / 'variables'))
  assert not any(slot in name for name, _ in saved
                 for slot in ('accumulators', 'momenta', 'velocities', 'linears'))
