"""In-graph loops on the emulated TPU: iterations_per_loop steps per
session.run with the step-by-step result, an evaluation's steps in one run,
hooks between the loops."""
import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf

from harness import estimators
from harness import inputs
from harness import models

pytestmark = pytest.mark.filterwarnings('ignore::UserWarning')
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


class _EvalRunsHook(tf.compat.v1.train.SessionRunHook):
  """Counts the runs of an evaluation and reads the eval step after each."""

  def __init__(self):
    self.eval_steps = []

  def after_run(self, run_context, run_values):
    del run_values
    self.eval_steps.append(run_context.session.run(
        tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.EVAL_STEP)[0]))


@pytest.mark.parametrize('input_kind', ['dataset', 'iterator_tensors'])
@pytest.mark.parametrize('steps', [2, 6])
def test_tpu_evaluation_runs_all_steps_in_one_run(tmp_path, steps, input_kind):
  """`test_eval_steps_not_effected_by_training_iterations`: hooks see one
  run, after which the eval step is `steps`; the metrics are those of all
  `steps` batches (here the MAE over batches whose labels grow by 1 each).
  An input_fn may return a Dataset or its iterator's `get_next()` tensors
  (a new batch each step, as a TPU's infeed enqueues them)."""
  def model_fn(features, labels, mode, params):
    del params
    predictions = tf.compat.v1.layers.dense(
        features['x'], 1, kernel_initializer=tf.compat.v1.zeros_initializer())
    loss = tf.compat.v1.losses.absolute_difference(labels, predictions)
    if mode == tpu_fc.ModeKeys.EVAL:
      return tpu_fc.TPUEstimatorSpec(mode, loss=loss, eval_metrics=(
          lambda labels, predictions: {'mae': tf.compat.v1.metrics.mean(
              tf.abs(labels - predictions))}, [labels, predictions]))
    return models.tpu_spec(mode, loss, rate=0.0)

  def input_fn(params):
    del params
    batches = tf.data.Dataset.range(100).map(
        lambda i: ({'x': tf.ones([4, 2])}, tf.fill([4, 1], tf.cast(i, tf.float32))))
    if input_kind == 'dataset':
      return batches
    return tf.compat.v1.data.make_one_shot_iterator(batches).get_next()

  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn, train_batch_size=4, eval_batch_size=4,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path), tpu_config=tpu_fc.TPUConfig(
          num_shards=2, iterations_per_loop=4)))
  estimator.train(input_fn, steps=1)
  hook = _EvalRunsHook()
  metrics = estimator.evaluate(input_fn, steps=steps, hooks=[hook])
  assert hook.eval_steps == [steps]
  mean_label = (steps - 1) / 2  # labels 0, 1, ..., steps - 1; predictions 0
  assert metrics['mae'] == pytest.approx(mean_label)
  assert metrics['loss'] == pytest.approx(mean_label)  # shard 0's, per batch


class StepsSeen(tf.compat.v1.train.SessionRunHook):
  """The global step a hook fetches in each run, as TF's hooks fetch it."""

  def __init__(self):
    self.seen = []

  def begin(self):
    self._step = tf.compat.v1.train.get_global_step()

  def before_run(self, run_context):
    return tf.compat.v1.train.SessionRunArgs(self._step)

  def after_run(self, run_context, run_values):
    self.seen.append(run_values.results)


def test_a_hook_fetches_the_step_before_each_loop(tmp_path):
  """Never a step inside the in-graph loop (it ran 10 steps per run)."""
  hook = StepsSeen()
  estimators.option_estimator(tmp_path, iterations_per_loop=10).train(
      inputs.contract_input_fn('sparse'), max_steps=200, hooks=[hook])
  assert hook.seen == list(range(0, 200, 10))
