"""Legacy TPUEstimator scripts, unchanged (TF's names only), through
`python -m tpu_fc run`: the emulated TPU trains, evaluates and predicts; a
user's model script (tests/scripts/legacy_user_model.py) through all four
modes, under TF1 and TF2 behaviour, and on TF 2.15 by TF's own TPUEstimator."""
import json
import os
import textwrap

import numpy as np
import pytest

from harness import lanes
from harness import scripts


LEGACY_SCRIPT = '''
"""A TPUEstimator script written for TF 2.15: legacy names only."""
import json
import sys

import numpy as np
import tensorflow.compat.v1 as tf
from tensorflow.python.tpu.tpu_embedding import ProximalAdagradParameters  # pylint: disable=unused-import

VOCAB, DIM, BATCH = 10, 4, 8
rng = np.random.RandomState(0)
IDS = rng.randint(0, VOCAB, size=(32, 2)).astype(np.int64)
X = rng.normal(size=(32, 1)).astype(np.float32)
Y = (IDS[:, :1] % 2).astype(np.float32)


def columns():
  ids = tf.feature_column.categorical_column_with_identity('ids', VOCAB)
  return [tf.tpu.experimental.embedding_column(ids, DIM, combiner='mean')]


def make_input_fn(repeat, n=32):
  def input_fn(params):
    data = tf.data.Dataset.from_tensor_slices(({'ids': IDS[:n], 'x': X[:n]},
                                               Y[:n]))
    if repeat:
      data = data.repeat()
    data = data.batch(params['batch_size'], drop_remainder=True)
    def to_sparse(features, labels):
      features = dict(features)
      features['ids'] = tf.RaggedTensor.from_tensor(features['ids']).to_sparse()
      return features, labels
    return data.map(to_sparse)
  return input_fn


def model_fn(features, labels, mode, params):
  net = tf.feature_column.input_layer(features, columns())
  net = tf.concat([net, features['x']], 1)
  logits = tf.layers.dense(net, 1)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.tpu.TPUEstimatorSpec(
        mode, predictions={'probability': tf.sigmoid(logits)})
  loss = tf.losses.sigmoid_cross_entropy(labels, logits)
  optimizer = tf.train.AdagradOptimizer(0.1)
  if params['use_tpu']:
    optimizer = tf.tpu.CrossShardOptimizer(optimizer)
  train_op = optimizer.minimize(loss, global_step=tf.train.get_global_step())

  def metric_fn(labels, logits):
    return {'accuracy': tf.metrics.accuracy(
        labels, tf.cast(logits > 0, tf.float32))}
  return tf.estimator.tpu.TPUEstimatorSpec(
      mode, loss=loss, train_op=train_op,
      eval_metrics=(metric_fn, [labels, logits]))


spec = tf.estimator.tpu.experimental.EmbeddingConfigSpec(
    feature_columns=columns(),
    optimization_parameters=tf.tpu.experimental.AdagradParameters(0.1))
config = tf.estimator.tpu.RunConfig(
    model_dir=sys.argv[2],
    tpu_config=tf.estimator.tpu.TPUConfig(num_shards=2))
estimator = tf.estimator.tpu.TPUEstimator(
    model_fn=model_fn, config=config, use_tpu=True, train_batch_size=BATCH,
    eval_batch_size=BATCH, predict_batch_size=BATCH,
    embedding_config_spec=spec)
estimator.train(make_input_fn(True), max_steps=5)
metrics = estimator.evaluate(make_input_fn(False), steps=2)
predictions = list(estimator.predict(make_input_fn(False, n=16)))
shared_and_other = tf.tpu.experimental.shared_embedding_columns(
    [tf.feature_column.categorical_column_with_identity('ids', 100),
     tf.feature_column.categorical_column_with_identity('more', 100)], 8) + [
         tf.tpu.experimental.embedding_column(
             tf.feature_column.categorical_column_with_identity('other', 20),
             2, combiner='sum')]
v2_spec = tf.compat.v2.estimator.tpu.experimental.EmbeddingConfigSpec(
    feature_columns=shared_and_other,
    optimization_parameters=tf.tpu.experimental.FtrlParameters(0.05))
with open(sys.argv[1], 'w') as f:
  json.dump({
      'loss': float(metrics['loss']),
      'accuracy': float(metrics['accuracy']),
      'global_step': int(metrics['global_step']),
      'num_predictions': len(predictions),
      'probabilities': [float(p['probability'][0]) for p in predictions],
      'estimator': type(estimator).__module__,
      'variables': estimator.get_variable_names(),
      'spec_type': type(spec).__module__ + '.' + type(spec).__name__,
      'v2_spec_type': type(v2_spec).__module__ + '.' + type(v2_spec).__name__,
      'column_names': [c.name for c in shared_and_other],
      'tables': [t.name for t in v2_spec.to_mid_level().tables],
      'mode_train': tf.estimator.ModeKeys.TRAIN,
  }, f)
'''


@pytest.mark.subprocess
def test_legacy_script_runs_unchanged(tmp_path):
  """Its names resolve to tpu_fc's (also a path import of TF 2.15's, the v2
  namespace's spec, shared columns' tables), and it trains, evaluates and
  predicts."""
  script = tmp_path / 'legacy_train.py'
  script.write_text(textwrap.dedent(LEGACY_SCRIPT))
  out = tmp_path / 'result.json'
  proc = scripts.run_python(
      ['-m', 'tpu_fc', 'run', str(script), str(out), str(tmp_path / 'model')],
      env=scripts.env(), cwd=str(tmp_path))
  assert proc.returncode == 0, proc.stderr[-4000:]
  result = json.loads(out.read_text())
  assert np.isfinite(result['loss'])
  assert 0.0 <= result['accuracy'] <= 1.0
  assert result['global_step'] == 5
  assert result['num_predictions'] == 16
  assert all(0.0 < p < 1.0 for p in result['probabilities'])
  assert result['estimator'].startswith('tpu_fc.')
  assert 'input_layer/ids_embedding/embedding_weights' in result['variables']
  assert 'input_layer/ids_embedding/embedding_weights/Adagrad' in (
      result['variables'])
  assert result['spec_type'] == 'tpu_fc.spec.EmbeddingConfigSpec'
  assert result['v2_spec_type'] == 'tpu_fc.spec.EmbeddingConfigSpec'
  assert result['column_names'] == [
      'ids_shared_embedding', 'more_shared_embedding', 'other_embedding']
  assert result['tables'] == ['tbl_ids_more_shared_embedding', 'tbl_other']
  assert result['mode_train'] == 'train'


# A legacy script as users wrote it (tests/scripts/legacy_user_model.py), run
# unchanged by `python -m tpu_fc run`, and on TF 2.15 by TF's own TPUEstimator.

USER_MODEL = os.path.join(scripts.SCRIPTS, 'legacy_user_model.py')


def _run_user_model(tmp_path, name, runs, v1=True, on_tpu_fc=True):
  """{run name: result} of the script's `runs`, in a process of its own."""
  result = tmp_path / (name + '.json')
  args = (['-m', 'tpu_fc', 'run'] if on_tpu_fc else []) + [
      USER_MODEL, str(result), str(tmp_path / name)] + (['--v1'] if v1 else [])
  for run in runs:
    args += ['--run', run]
  finished = scripts.run_python(args, cwd=str(tmp_path), env=scripts.env(),
                                timeout=600)
  assert finished.returncode == 0, finished.stderr[-6000:]
  return json.loads(result.read_text())


def _assert_same_training(got, want):
  """Same variables, bit for bit (the same kernels on the same values, in the
  same order), and as many host_call summaries."""
  assert sorted(got['variables']) == sorted(want['variables'])
  for name, value in want['variables'].items():
    np.testing.assert_array_equal(got['variables'][name], value, err_msg=name)
  assert len(got['summaries']) == len(want['summaries'])


def _assert_same_model(got, want):
  """Same training, and so the same metrics, predictions and served
  predictions, bit for bit."""
  _assert_same_training(got, want)
  assert got['metrics'] == want['metrics']
  np.testing.assert_array_equal(got['predictions'], want['predictions'])
  np.testing.assert_array_equal(got['served'], want['served'])


def _assert_host_call_logged_at(run, steps):
  """host_call's summaries at `steps`, its tags unprefixed by any loop's name
  scope; it reads the global step in the run that increments it (as in TF):
  step k logs k or k + 1."""
  assert [tag for tag, _ in run['summaries']] == ['loss'] * len(steps)
  assert all(step in (k, k + 1) for k, (_, step) in zip(
      steps, run['summaries'])), run['summaries']


@pytest.fixture(scope='module')
def user_model_runs(tmp_path_factory):
  """The script under TF1 behaviour (disable_v2_behavior), emulated TPU with 2
  shards looping 3 steps per run or 1 (also with host_call every 2 steps),
  with 1 shard, on the CPU, and with a dynamic batch; and with TF2 behaviour,
  2 shards looping.  The runs that differ from `loop` only in how training
  runs (`step`, `every_2`) only train: evaluation, predictions and the export
  read the variables, which must equal `loop`'s bit for bit."""
  tmp_path = tmp_path_factory.mktemp('user_model')
  runs = _run_user_model(tmp_path, 'v1', [
      'loop:tpu:2:3', 'step:tpu:2:1:train_only', 'one_shard:tpu:0:3',
      'cpu:cpu:0:3', 'dynamic:tpu:2:3:dynamic_batch',
      'every_2:tpu:2:3:host_call_every_2:train_only'])
  runs['v2_loop'] = _run_user_model(tmp_path, 'v2', ['loop:tpu:2:3'],
                                    v1=False)['loop']
  if lanes.LEGACY:
    runs['tf_cpu'] = _run_user_model(tmp_path, 'tf', ['cpu:cpu:0:3'],
                                     on_tpu_fc=False)['cpu']
  return runs


@pytest.mark.subprocess
@pytest.mark.parametrize('name', ['loop', 'one_shard', 'cpu', 'v2_loop'])
def test_user_model_trains_evaluates_predicts_and_exports(user_model_runs, name):
  """Static shapes (`tf.zeros(logits.shape)`), Keras `Input(tensor=...)`,
  multivalent sequence ids and recall_at_k through all four modes: the exported
  model serves what predict gave."""
  run = user_model_runs[name]
  assert 'error' not in run, run.get('error')
  assert run['metrics']['global_step'] == 6
  assert set(run['metrics']) == {'loss', 'recall_at_1', 'accuracy',
                                 'global_step'}
  assert len(run['predictions']) == 32
  # (on the emulated TPU each core predicts its slice of a batch, as on a
  # TPU, where the export serves the 8 rows at once: float32's last bit)
  np.testing.assert_allclose(run['served'], run['predictions'][:8], rtol=1e-6)
  assert run['profiles'] >= 1  # the ProfilerHook wrote timelines
  _assert_host_call_logged_at(run, range(6))  # every step


@pytest.mark.subprocess
def test_tf1_loop_runs_host_call_every_n_steps_of_each_loop(user_model_runs):
  """experimental_host_call_every_n_steps=2 in loops of 3 steps: steps 0 and
  2 of each loop (0, 2, 3, 5), under TF1 control flow (a v1 cond in a v1
  while_loop); the model trains as with host_call every step."""
  run = user_model_runs['every_2']
  _assert_host_call_logged_at(run, [0, 2, 3, 5])
  _assert_same_training(
      dict(run, summaries=user_model_runs['loop']['summaries']),
      user_model_runs['loop'])


@pytest.mark.subprocess
def test_tf1_loop_runs_iterations_per_loop_steps_per_run(user_model_runs):
  """Under disable_v2_behavior, as with TF2 control flow: 3 steps per
  session.run, each the same as one step per run (the history table's
  learning_rate_fn read in the loop: TF1 once failed to build it there)."""
  assert user_model_runs['loop']['training_runs'] == 2
  assert user_model_runs['step']['training_runs'] == 6
  _assert_same_training(user_model_runs['step'], user_model_runs['loop'])
  assert user_model_runs['step']['profiles'] >= 1
  _assert_host_call_logged_at(user_model_runs['step'], range(6))
  _assert_same_model(user_model_runs['v2_loop'], user_model_runs['loop'])


@pytest.mark.subprocess
@pytest.mark.legacy_only
def test_cpu_run_is_tf_2_15s(user_model_runs):
  _assert_same_model(user_model_runs['cpu'], user_model_runs['tf_cpu'])


@pytest.mark.subprocess
def test_a_dynamic_batch_gets_tf_2_15s_error_naming_the_feature(
    user_model_runs):
  error = user_model_runs['dynamic']['error']
  assert error.startswith('The features to the model returned by input_fn must '
                          'have static shape. Tensor: ')
  assert "Feature 'price' has shape (?, 1)" in error
  assert 'drop_remainder=True' in error
