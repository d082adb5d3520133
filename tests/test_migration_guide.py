"""The migration guide's examples, run in order on one trained model (both lanes).

The unchanged legacy script of step 0 trains a model under `python -m tpu_fc run`
(emulated TPU).  Every later step must give the same predictions on the same rows
(within 1e-5): the step-1 estimator, the TF2 forward pass on the checkpoint that
step 3 converts (with the example and with the page's CLI commands), and both
SavedModels of step 5.  The TF2 loop of step 4 (tpu_fc's mid-level
`TPUEmbedding`) must continue training as the estimator does, to float32
rounding, and its checkpoint must convert back into the estimator's variables.  On the legacy lane, TF 2.15's own TPUEstimator runs the
step-0 script under plain python and predicts the same from the same checkpoint.
On the latest lane (keras-rs), step 7's Keras model restores step 0's tables
and slots by name and saves them back bit for bit, and trains as the
estimator does.
"""
import json
import os
import re
import shutil
import sys

import numpy as np
import pytest

from tpu_fc import __main__ as cli
from tpu_fc import legacy_names
from tpu_fc._tf import tf

from harness import scripts

GUIDE = os.path.join(scripts.REPO, 'migration_guide')
EXAMPLES = os.path.join(GUIDE, 'examples')
sys.path.insert(0, EXAMPLES)

import step1_train  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
import step2_mid_level_config  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
import step3_convert_checkpoint  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
# Step 4 calls `tpu_fc.install()` on import (step 5 imports it); bound here for
# the import only, so the other test modules of the session see TF's names.
with legacy_names.installed():
  import step4_tf2_loop  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position
  import step5_serve  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

TRAIN_STEPS = 20
MORE_STEPS = 5
ATOL = 1e-5
# The step-4 loop trains with the estimator's embedding engine (same lookups,
# same Adagrad); only the dense layers' gradients are another float32 graph, a
# few ulps apart (observed: 2 ulps of a probability, 1e-7 of a variable).
LOOP_ATOL = 1e-6
LOOP_VARIABLES_RTOL, LOOP_VARIABLES_ATOL = 1e-6, 1e-7
SPEC_REFERENCE = os.path.join(EXAMPLES, 'step1_train.py') + ':embedding_config_spec'


def assert_same_predictions(actual, expected):
  np.testing.assert_allclose(actual, expected, rtol=0, atol=ATOL)


def run_example(*args):
  """Runs `python ARGS...` in the examples directory, as a user would."""
  process = scripts.run_python(args, cwd=EXAMPLES, env=scripts.env())
  assert process.returncode == 0, process.stderr[-3000:]


@pytest.fixture(name='installed')
def _installed():
  """`tf.tpu.experimental.embedding.TPUEmbedding` is tpu_fc's, as when step 4
  runs as a script (its `tpu_fc.install()`)."""
  with legacy_names.installed():
    yield


@pytest.fixture(name='work_dir', scope='module')
def _work_dir(tmp_path_factory):
  return tmp_path_factory.mktemp('migration_guide')


@pytest.fixture(name='trained', scope='module')
def _trained(work_dir):
  """(model_dir, predictions) of the step-0 script run unchanged by tpu_fc."""
  model_dir = str(work_dir / 'legacy')
  predictions_file = str(work_dir / 'step0.npy')
  run_example('-m', 'tpu_fc', 'run', 'step0_legacy_train.py',
              '--model_dir', model_dir, '--train_steps', str(TRAIN_STEPS),
              '--predictions_file', predictions_file)
  return model_dir, np.load(predictions_file)


@pytest.fixture(name='trained_further', scope='module')
def _trained_further(trained, work_dir):
  """(model_dir, predictions) of the step-1 estimator trained MORE_STEPS
  steps past the step-0 model (a copy of its model_dir)."""
  model_dir, _ = trained
  further = str(work_dir / 'legacy_trained_further')
  shutil.copytree(model_dir, further)
  return further, step1_train.main([
      '--model_dir', further, '--train_steps', str(TRAIN_STEPS + MORE_STEPS)])


@pytest.fixture(name='converted', scope='module')
def _converted(trained, work_dir):
  """Mid-level checkpoint prefixes written by the step-3 example and by the CLI."""
  model_dir, _ = trained
  by_example = step3_convert_checkpoint.main([model_dir, str(work_dir / 'mid')])
  cli.main(['convert-checkpoint', '--to', 'mid-level', '--spec', SPEC_REFERENCE,
            model_dir, str(work_dir / 'mid_cli')])
  return by_example, tf.train.latest_checkpoint(str(work_dir / 'mid_cli'))


@pytest.mark.subprocess
def test_step0_script_trains_and_predicts(trained):
  model_dir, predictions = trained
  assert tf.train.latest_checkpoint(model_dir).endswith(
      'model.ckpt-{}'.format(TRAIN_STEPS))
  assert predictions.shape == (len(step1_train.PREDICT_DATA[1]),)
  assert np.all((predictions > 0) & (predictions < 1))


@pytest.mark.subprocess
@pytest.mark.legacy_only
def test_step0_tf215_tpu_estimator_predicts_the_same(trained, work_dir):
  """TF's own TPUEstimator (use_tpu=False) runs the script under plain python."""
  model_dir, predictions = trained
  copy = str(work_dir / 'legacy_for_tf215')
  shutil.copytree(model_dir, copy)
  predictions_file = str(work_dir / 'tf215.npy')
  run_example('step0_legacy_train.py', '--model_dir', copy, '--train_steps', '0',
              '--no-use_tpu', '--predictions_file', predictions_file)
  assert_same_predictions(np.load(predictions_file), predictions)


def _renames_on_page():
  """(legacy name, tpu_fc name) rows of the step-1 page's table."""
  with open(os.path.join(GUIDE, 'step1_import_from_tpu_fc.md')) as page:
    return re.findall(r'^\| `(tf\.[\w.]+)` \| `(tpu_fc\.[\w.]+)` \|$',
                      page.read(), re.MULTILINE)


def _code_after_docstring(path):
  with open(os.path.join(EXAMPLES, path)) as source:
    return source.read().split('"""', 2)[2]


def test_step1_is_step0_with_the_names_the_page_lists():
  renames = _renames_on_page()
  assert len(renames) >= 9
  renamed = _code_after_docstring('step0_legacy_train.py')
  for legacy, new in sorted(renames, key=lambda pair: -len(pair[0])):
    renamed = renamed.replace(legacy, new)
  step1 = _code_after_docstring('step1_train.py').replace(
      '\nimport tpu_fc  # before tensorflow: selects tf-keras on TF >= 2.16\n', '',
      1)
  assert renamed.replace('\n\n', '\n') == step1.replace('\n\n', '\n')


@pytest.mark.subprocess
def test_step1_predicts_the_same(trained):
  model_dir, predictions = trained
  assert_same_predictions(
      step1_train.main(['--model_dir', model_dir, '--train_steps', '0']),
      predictions)


@pytest.mark.subprocess
def test_step2_configs_match_the_trained_tables(trained):
  mid_level = step2_mid_level_config.main([])
  reader = tf.train.load_checkpoint(trained[0])
  legacy_table_shapes = sorted(
      shape for name, shape in reader.get_variable_to_shape_map().items()
      if name.endswith(('/embedding_weights', '_shared_embedding')))
  assert sorted([t.vocabulary_size, t.dim] for t in mid_level.tables) == (
      legacy_table_shapes)


def test_step2_refuses_hand_written_configs_that_differ(monkeypatch):
  feature_config, optimizer = step2_mid_level_config.mid_level_configs()
  user = feature_config['user'].table
  feature_config['user'] = tf.tpu.experimental.embedding.FeatureConfig(
      table=tf.tpu.experimental.embedding.TableConfig(
          vocabulary_size=user.vocabulary_size, dim=user.dim, combiner='sum',
          name=user.name), name='user')
  monkeypatch.setattr(step2_mid_level_config, 'mid_level_configs',
                      lambda: (feature_config, optimizer))
  with pytest.raises(ValueError, match='differs from spec.to_mid_level'):
    step2_mid_level_config.main([])


def _checkpoint_values(prefix):
  reader = tf.train.load_checkpoint(prefix)
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()
          if name != '_CHECKPOINTABLE_OBJECT_GRAPH'}


def assert_same_variables(actual_prefix, expected_prefix, rtol=0, atol=0):
  """The two checkpoints hold the same names, floats within rtol / atol."""
  actual = _checkpoint_values(actual_prefix)
  expected = _checkpoint_values(expected_prefix)
  assert sorted(actual) == sorted(expected)
  for name, value in expected.items():
    if np.asarray(value).dtype.kind == 'f':
      np.testing.assert_allclose(actual[name], value, rtol=rtol, atol=atol,
                                 err_msg=name)
    else:
      np.testing.assert_array_equal(actual[name], value, err_msg=name)


@pytest.mark.subprocess
def test_step3_example_and_cli_convert_alike(converted, capsys):
  by_example, by_cli = converted
  example_values = _checkpoint_values(by_example)
  cli_values = _checkpoint_values(by_cli)
  assert sorted(example_values) == sorted(cli_values)
  for name, value in example_values.items():
    np.testing.assert_array_equal(cli_values[name], value, err_msg=name)

  capsys.readouterr()
  cli.main(['inspect', os.path.dirname(by_cli), '--json'])
  report = json.loads(capsys.readouterr().out)
  assert report['format'] == 'mid-level'
  assert report['global_step'] == TRAIN_STEPS
  feature_config, _ = step2_mid_level_config.mid_level_configs()
  assert {t['name']: (t['shape'], t['optimizer']) for t in report['tables']} == {
      f.table.name: ([f.table.vocabulary_size, f.table.dim], 'Adagrad')
      for f in feature_config.values()}
  dense = step4_tf2_loop.DenseModel(feature_config).legacy_variables()
  assert {v['name']: v['shape'] for v in report['dense_variables']} == {
      name: variable.shape.as_list() for name, variable in dense.items()}


@pytest.mark.subprocess
@pytest.mark.usefixtures('installed')
def test_step4_forward_pass_on_the_converted_checkpoint(trained, converted):
  _, predictions = trained
  for prefix in converted:
    assert_same_predictions(step4_tf2_loop.main(['--checkpoint', prefix]),
                            predictions)


@pytest.mark.subprocess
@pytest.mark.usefixtures('installed')
def test_step4_loop_trains_as_the_estimator_and_converts_back(
    trained, trained_further, converted, work_dir):
  _, predictions = trained
  tf2_dir = str(work_dir / 'tf2')
  after_tf2_loop = step4_tf2_loop.main([
      '--checkpoint', converted[0], '--train_steps', str(MORE_STEPS),
      '--save_dir', tf2_dir])
  assert np.abs(after_tf2_loop - predictions).max() > 1e-3  # it did train

  estimator_dir, after_estimator = trained_further
  np.testing.assert_allclose(after_tf2_loop, after_estimator, rtol=0,
                             atol=LOOP_ATOL)

  back_dir = str(work_dir / 'back_to_legacy')
  cli.main(['convert-checkpoint', '--to', 'legacy', '--spec', SPEC_REFERENCE,
            tf2_dir, back_dir])
  assert tf.train.latest_checkpoint(back_dir).endswith(
      'model.ckpt-{}'.format(TRAIN_STEPS + MORE_STEPS))
  # Tables, Adagrad accumulators and dense layers: the estimator's.
  assert_same_variables(tf.train.latest_checkpoint(back_dir),
                        tf.train.latest_checkpoint(estimator_dir),
                        rtol=LOOP_VARIABLES_RTOL, atol=LOOP_VARIABLES_ATOL)
  assert_same_predictions(
      step1_train.main(['--model_dir', back_dir, '--train_steps', '0']),
      after_tf2_loop)

  # Run as a plain script, step 4 installs tpu_fc's TPUEmbedding itself and
  # trains exactly as imported.
  script_dir = str(work_dir / 'tf2_by_script')
  run_example('step4_tf2_loop.py', '--checkpoint', converted[0],
              '--train_steps', str(MORE_STEPS), '--save_dir', script_dir)
  assert_same_variables(tf.train.latest_checkpoint(script_dir),
                        tf.train.latest_checkpoint(tf2_dir))


@pytest.mark.subprocess
@pytest.mark.usefixtures('installed')
def test_step5_both_saved_models_serve_the_same(trained, converted, work_dir):
  model_dir, predictions = trained
  served = step5_serve.main(['--model_dir', model_dir,
                             '--checkpoint', converted[0],
                             '--export_dir', str(work_dir / 'export')])
  assert sorted(served) == ['legacy', 'mid_level']
  for answers in served.values():
    assert_same_predictions(answers, predictions)


def _embedding_variables(prefix):
  """The tables, their slots and the global step of a legacy checkpoint."""
  return {name: value for name, value in _checkpoint_values(prefix).items()
          if 'embedding' in name or name == 'global_step'}


@pytest.mark.subprocess
@pytest.mark.usefixtures('installed')
def test_step6_tfrs_model_continues_as_the_estimator_and_converts_back(
    trained, trained_further, work_dir):
  """TFRS's layer (tpu_fc's after `install()`) restored from the legacy
  model_dir: its predictions, and converted back its tables, Adagrad slots
  and global step bit for bit; 5 steps of `model.fit` give the estimator's
  5 more (emulated TPU) within the step-4 loop's bounds."""
  pytest.importorskip('tensorflow_recommenders')
  import step6_tfrs  # pylint: disable=g-import-not-at-top  (calls install())
  model_dir, predictions = trained
  assert_same_predictions(
      step6_tfrs.main(['--model_dir', model_dir,
                       '--save_dir', str(work_dir / 'tfrs0')]), predictions)
  back = _embedding_variables(_converted_back(work_dir / 'tfrs0', work_dir))
  original = _embedding_variables(tf.train.latest_checkpoint(model_dir))
  assert sorted(back) == sorted(original)
  for name, value in original.items():
    np.testing.assert_array_equal(back[name], value, err_msg=name)

  estimator_dir, after_estimator = trained_further
  after_fit = step6_tfrs.main([
      '--model_dir', model_dir, '--train_steps', str(MORE_STEPS),
      '--save_dir', str(work_dir / 'tfrs')])
  assert np.abs(after_fit - predictions).max() > 1e-3  # it did train
  np.testing.assert_allclose(after_fit, after_estimator, rtol=0,
                             atol=LOOP_ATOL)
  _assert_converted_back_as_the_estimator(work_dir / 'tfrs', work_dir,
                                          estimator_dir)

  # As a plain script (its own `tpu_fc.install()`), it trains as imported.
  run_example('step6_tfrs.py', '--model_dir', model_dir, '--train_steps',
              str(MORE_STEPS), '--save_dir', str(work_dir / 'tfrs_by_script'))
  assert_same_variables(tf.train.latest_checkpoint(str(work_dir /
                                                       'tfrs_by_script')),
                        tf.train.latest_checkpoint(str(work_dir / 'tfrs')))


def _assert_converted_back_as_the_estimator(mid_level_dir, work_dir,
                                            estimator_dir):
  """A save of MORE_STEPS more steps, converted back, holds the tables,
  slots and global step of the estimator's MORE_STEPS more (the step-4
  loop's bounds)."""
  back = _embedding_variables(_converted_back(mid_level_dir, work_dir))
  expected = _embedding_variables(tf.train.latest_checkpoint(estimator_dir))
  assert sorted(back) == sorted(expected)
  assert back['global_step'] == TRAIN_STEPS + MORE_STEPS
  for name, value in expected.items():
    np.testing.assert_allclose(back[name], value, rtol=LOOP_VARIABLES_RTOL,
                               atol=LOOP_VARIABLES_ATOL, err_msg=name)


def _converted_back(mid_level_dir, work_dir):
  """The page's `convert-checkpoint --to legacy` of a step-6 save."""
  back_dir = str(work_dir / (mid_level_dir.name + '_legacy'))
  cli.main(['convert-checkpoint', '--to', 'legacy', '--spec', SPEC_REFERENCE,
            str(mid_level_dir), back_dir])
  return tf.train.latest_checkpoint(back_dir)


def _step7():
  """The step-7 example module (keras-rs: Python >= 3.11, the latest lane)."""
  pytest.importorskip('keras_rs')
  import step7_keras_rs  # pylint: disable=g-import-not-at-top,import-outside-toplevel
  return step7_keras_rs


@pytest.mark.subprocess
def test_step7_keras_rs_restores_and_saves_the_legacy_model_bit_for_bit(
    trained, work_dir):
  """The tables, Adagrad accumulators and global step (the dense layers are
  Keras' weights)."""
  model_dir, predictions = trained
  assert_same_predictions(
      _step7().main(['--model_dir', model_dir,
                     '--save_dir', str(work_dir / 'keras_rs0')]),
      predictions)
  back = _embedding_variables(_converted_back(work_dir / 'keras_rs0',
                                              work_dir))
  original = _embedding_variables(tf.train.latest_checkpoint(model_dir))
  assert sorted(back) == sorted(original)
  for name, value in original.items():
    np.testing.assert_array_equal(back[name], value, err_msg=name)


@pytest.mark.subprocess
def test_step7_keras_rs_trains_as_the_estimator(trained, trained_further,
                                                 work_dir):
  model_dir, predictions = trained
  keras_rs_dir = work_dir / 'keras_rs'
  after_fit = _step7().main([
      '--model_dir', model_dir, '--train_steps', str(MORE_STEPS),
      '--save_dir', str(keras_rs_dir)])
  assert np.abs(after_fit - predictions).max() > 1e-3  # it did train
  estimator_dir, after_estimator = trained_further
  np.testing.assert_allclose(after_fit, after_estimator, rtol=0,
                             atol=LOOP_ATOL)
  back = _embedding_variables(_converted_back(keras_rs_dir, work_dir))
  expected = _embedding_variables(tf.train.latest_checkpoint(estimator_dir))
  assert sorted(back) == sorted(expected)
  assert back['global_step'] == TRAIN_STEPS + MORE_STEPS
  for name, value in expected.items():  # tables, accumulators
    np.testing.assert_allclose(back[name], value, rtol=LOOP_VARIABLES_RTOL,
                               atol=LOOP_VARIABLES_ATOL, err_msg=name)

  # Run as a plain script, step 7 trains bit for bit as imported.
  script_dir = str(work_dir / 'keras_rs_by_script')
  run_example('step7_keras_rs.py', '--model_dir', model_dir,
              '--train_steps', str(MORE_STEPS), '--save_dir', script_dir)
  assert_same_variables(tf.train.latest_checkpoint(script_dir),
                        tf.train.latest_checkpoint(str(keras_rs_dir)))


@pytest.mark.subprocess
def test_step8_two_replicas_continue_as_the_estimator(trained, trained_further,
                                                      work_dir):
  """Step 6's model on two devices (MirroredStrategy, each replica a TPU
  core with half of each global batch), run as a script: 5 steps of
  `model.fit` give the tables, slots and global step the estimator's 5 more
  give, as step 6's one replica does."""
  pytest.importorskip('tensorflow_recommenders')
  model_dir, _ = trained
  scaled = work_dir / 'scaled'
  run_example('step8_scale_out.py', '--model_dir', model_dir,
              '--train_steps', str(MORE_STEPS), '--devices', '2',
              '--save_dir', str(scaled))
  _assert_converted_back_as_the_estimator(scaled, work_dir,
                                          trained_further[0])


def test_guide_links_every_example():
  with open(os.path.join(GUIDE, 'README.md')) as readme:
    text = readme.read()
  for example in sorted(os.listdir(EXAMPLES)):
    if example.endswith('.py'):
      assert 'examples/' + example in text, example
