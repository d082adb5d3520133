"""Legacy TPUEstimator scripts, unchanged (TF's names only), through
`python -m tpu_fc run`: the emulated TPU trains, evaluates and predicts."""
import json
import textwrap

import numpy as np
import pytest

from harness import scripts

LEGACY_SCRIPT = '''
"""A TPUEstimator script written for TF 2.15: legacy names only."""
import json
import sys

import numpy as np
import tensorflow.compat.v1 as tf

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
with open(sys.argv[1], 'w') as f:
  json.dump({
      'loss': float(metrics['loss']),
      'accuracy': float(metrics['accuracy']),
      'global_step': int(metrics['global_step']),
      'num_predictions': len(predictions),
      'probabilities': [float(p['probability'][0]) for p in predictions],
      'estimator': type(estimator).__module__,
      'variables': estimator.get_variable_names(),
  }, f)
'''


@pytest.mark.subprocess
def test_legacy_script_runs_unchanged(tmp_path):
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
