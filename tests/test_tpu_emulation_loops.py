"""In-graph loops on the emulated TPU: iterations_per_loop steps per
session.run with the step-by-step result, an evaluation's steps in one run,
hooks between the loops (a hook on a model_fn tensor inside one is refused,
saying to use host_call), host_call every n steps of each loop."""
import os
import re

import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf

from harness import estimators
from harness import inputs
from harness import models
from harness import scripts

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


LOOP_RUNS = [dict(max_steps=7), dict(steps=4)]


@pytest.fixture(name='stepwise', scope='module')
def _stepwise(tmp_path_factory):
  """LOOP_RUNS one step per run: what every looped input kind must give."""
  return _train(tmp_path_factory.mktemp('stepwise'), 1, LOOP_RUNS)


@pytest.mark.parametrize('looped_input_fn', [input_fn, iterator_input_fn],
                         ids=['dataset', 'iterator_tensors'])
@pytest.mark.filterwarnings('ignore:`tf.layers.dense` is deprecated')
def test_loop_gives_the_step_by_step_result_in_fewer_runs(tmp_path, stepwise,
                                                          looped_input_fn):
  """Also for an input_fn returning an iterator's `get_next()` tensors (here
  with sparse ids): a new batch each step, as a TPU's infeed enqueues them."""
  stepwise, stepwise_runs = stepwise
  looped, looped_runs = _train(tmp_path, 3, LOOP_RUNS, looped_input_fn)
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


HOOK_EXPLANATION = ('training_hooks cannot fetch its tensors .*Pass them to '
                    'host_call instead')


@pytest.mark.parametrize('hook, wording', [
    ('logging', 'should have graph attribute that is equal to current graph'),
    ('nan', 'is not an element of this graph')])
def test_hook_on_a_model_fn_tensor_says_to_use_host_call(tmp_path, tf_log, hook,
                                                          wording):
  """The hook works on the CPU; under the TPU loop the error (TF's, worded as
  the hook fetches) says why and what to do."""
  estimators.train_linear(tmp_path / 'cpu', use_tpu=False, hook_on_loss=hook)
  if hook == 'logging':
    assert any(m.startswith('loss = ') for m in tf_log)
  with pytest.raises(ValueError, match='(?s)' + wording + '.*' + HOOK_EXPLANATION):
    estimators.train_linear(tmp_path / 'tpu', use_tpu=True, hook_on_loss=hook)


TF1_HOOK_SCRIPT = """
import tpu_fc
import tensorflow as tf
from harness import estimators
tf.compat.v1.disable_v2_behavior()
try:
  estimators.train_linear({!r}, use_tpu=True, hook_on_loss='nan')
except ValueError as error:
  print(type(error).__name__, error)
"""


@pytest.mark.subprocess
def test_hook_on_a_model_fn_tensor_under_tf1_control_flow_says_to_use_host_call(
    tmp_path):
  """A TF1 loop's body op is not fetchable: TF's error class and wording, then
  the explanation."""
  finished = scripts.run_python(
      ['-c', TF1_HOOK_SCRIPT.format(str(tmp_path))], cwd=str(tmp_path),
      env=scripts.env())
  assert finished.returncode == 0, finished.stderr[-4000:]
  assert re.search('^InaccessibleTensorError .*has been marked as not '
                   'fetchable.*' + HOOK_EXPLANATION,
                   finished.stdout, re.S), finished.stdout


def _summary_steps(directory):
  """The steps of the summaries written to `directory`, in order."""
  return sorted(event.step
                for path in tf.io.gfile.glob(os.path.join(directory, 'events*'))
                for event in tf.compat.v1.train.summary_iterator(path)
                for _ in event.summary.value)


@pytest.mark.parametrize('run', ['loop', 'one_step', 'cpu', pytest.param(
    'tf_cpu', marks=pytest.mark.legacy_only)])
def test_host_call_runs_every_n_steps_of_each_tpu_loop(tmp_path, run):
  """TPUConfig(experimental_host_call_every_n_steps=3), iterations_per_loop=4,
  10 steps: on a TPU, at steps 0 and 3 of each loop (loops of 4, 4 and 2
  steps: steps 0, 3, 4, 7, 8), in a loop or one step per run; with
  use_tpu=False every step, as TF 2.15's own TPUEstimator(use_tpu=False)."""
  driver = tf.compat.v1.estimator.tpu if run == 'tf_cpu' else tpu_fc
  use_tpu = run in ('loop', 'one_step')
  summary_dir = str(tmp_path / 'host_call')
  estimator = driver.TPUEstimator(
      model_fn=models.linear_model_fn, use_tpu=use_tpu,
      train_batch_size=estimators.LINEAR_BATCH,
      params={'hook_on_loss': None, 'spec': driver.TPUEstimatorSpec,
              'summary_dir': summary_dir},
      config=driver.RunConfig(
          model_dir=str(tmp_path / 'model'), tpu_config=driver.TPUConfig(
              iterations_per_loop=4, num_shards=2 if use_tpu else None,
              experimental_host_call_every_n_steps=3)))
  if run == 'one_step':  # the same batch every step: one step per run
    batch = estimators.LINEAR_BATCH
    estimator.train(lambda params: (tf.constant(inputs.X[:batch]),
                                    tf.constant(inputs.Y[:batch])), max_steps=10)
  else:
    estimator.train(inputs.linear, max_steps=10)
  steps = _summary_steps(summary_dir)
  on_tpu_steps = [0, 3, 4, 7, 8] if use_tpu else list(range(10))
  if run == 'tf_cpu':
    # (TF's host_call reads the global step in the run that increments it,
    # unordered: step k logs k or k + 1)
    assert len(steps) == len(on_tpu_steps), steps
    assert all(step in (k, k + 1)
               for k, step in zip(on_tpu_steps, steps)), steps
  else:  # the step's global step, read at its start as on a TPU
    assert steps == on_tpu_steps
