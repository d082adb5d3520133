"""iterations_per_loop on the emulated TPU: that many steps per session.run, same result."""
import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf

fc = tf.feature_column
N, BATCH, VOCAB, DIM = 24, 4, 7, 3
IDS = (np.arange(N * 2).reshape(N, 2) * 5) % VOCAB
X = np.linspace(-1, 1, N * 2).astype(np.float32).reshape(N, 2)
Y = (X[:, :1] > 0).astype(np.float32)


def input_fn(params):
  dataset = tf.data.Dataset.from_tensor_slices(({'ids': IDS, 'x': X}, Y))
  return dataset.repeat().batch(params['batch_size'], drop_remainder=True).map(
      lambda f, l: (dict(f, ids=tf.sparse.from_dense(f['ids'])), l))


def _columns():
  return [tpu_fc.embedding_column(
      fc.categorical_column_with_identity('ids', VOCAB), DIM,
      initializer=tf.compat.v1.constant_initializer(
          np.linspace(-1, 1, VOCAB * DIM).reshape(VOCAB, DIM)))]


def model_fn(features, labels, mode, params):
  embedded = tf.keras.layers.DenseFeatures(_columns())(features)
  net = tf.concat([embedded, features['x']], axis=1)
  logits = tf.compat.v1.layers.dense(
      net, 1, kernel_initializer=tf.compat.v1.constant_initializer(0.1))
  loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
  optimizer = tf.compat.v1.tpu.CrossShardOptimizer(
      tf.compat.v1.train.AdagradOptimizer(0.3))
  return tpu_fc.TPUEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(
      loss, tf.compat.v1.train.get_global_step()))


def iterator_input_fn(params):
  """The same batches as tensors of the iterator's `get_next()`."""
  return tf.compat.v1.data.make_one_shot_iterator(input_fn(params)).get_next()


def _train(model_dir, iterations_per_loop, runs, input_fn=input_fn):
  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn, use_tpu=True, train_batch_size=BATCH,
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=_columns(),
          optimization_parameters=tpu_fc.AdamParameters(0.05)),
      config=tpu_fc.RunConfig(
          model_dir=str(model_dir),
          tpu_config=tpu_fc.TPUConfig(iterations_per_loop=iterations_per_loop,
                                      num_shards=2)))
  session_runs = []

  class CountRuns(tf.compat.v1.train.SessionRunHook):

    def after_run(self, run_context, run_values):
      session_runs.append(1)

  for kwargs in runs:
    estimator.train(input_fn, hooks=[CountRuns()], **kwargs)
  return estimator, len(session_runs)


@pytest.mark.parametrize('looped_input_fn', [input_fn, iterator_input_fn],
                         ids=['dataset', 'iterator_tensors'])
@pytest.mark.filterwarnings('ignore:`tf.layers.dense` is deprecated')
def test_loop_gives_the_step_by_step_result_in_fewer_runs(tmp_path,
                                                          looped_input_fn):
  """Also for an input_fn returning an iterator's `get_next()` tensors (here
  with sparse ids): a new batch each step, as a TPU's infeed enqueues them."""
  runs = [dict(max_steps=7), dict(steps=4)]
  stepwise, stepwise_runs = _train(tmp_path / 'one', 1, runs)
  looped, looped_runs = _train(tmp_path / 'three', 3, runs, looped_input_fn)
  assert stepwise.get_variable_value('global_step') == 11
  assert looped.get_variable_value('global_step') == 11
  assert stepwise_runs == 11
  assert looped_runs == 3 + 2  # 3+3+1 steps, then 3+1
  names = stepwise.get_variable_names()
  assert looped.get_variable_names() == names
  for name in names:
    np.testing.assert_allclose(looped.get_variable_value(name),
                               stepwise.get_variable_value(name),
                               rtol=1e-6, atol=1e-7, err_msg=name)
