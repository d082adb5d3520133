"""What a model_fn's spec gets on the emulated TPU, as TPUEstimator on a TPU.

Against TF 2.15's `tpu_estimator.py` (which needs a TPU to run): `scaffold_fn`
runs once the embedding tables exist, in one-step runs too; a host_call's
`tf.compat.v1.summary` op is refused with TF's text in every loop length; a
plain `EstimatorSpec`'s chief hooks are refused and its scaffold ignored with
TF's warning; a hook fetching a model_fn tensor from the evaluation loop is
told why.
"""
import numpy as np
import pytest

from harness import estimators
from harness import inputs
from harness import models
import tpu_fc
from tpu_fc._tf import tf

TABLE_AND_SLOT = {models.TABLE, models.TABLE + '/Adagrad'}


def model_fn(features, labels, mode, params):
  del labels
  net = tf.compat.v1.keras.layers.DenseFeatures([params['column']])(features)
  loss = models.contract_loss(net)
  train_op = None
  if mode == tpu_fc.ModeKeys.TRAIN:
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(
        tf.compat.v1.train.GradientDescentOptimizer(models.LR))
    train_op = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
  option = params['option']
  if option == 'plain_spec_chief_hook':
    return tpu_fc.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                training_chief_hooks=[
                                    tf.compat.v1.train.StepCounterHook()])
  if option == 'plain_spec_saver':
    return tpu_fc.EstimatorSpec(
        mode, loss=loss, train_op=train_op,
        scaffold=tf.compat.v1.train.Scaffold(saver=tf.compat.v1.train.Saver()))
  kwargs = {}
  if option == 'scaffold_saver':
    kwargs['scaffold_fn'] = lambda: tf.compat.v1.train.Scaffold(
        saver=tf.compat.v1.train.Saver(max_to_keep=1))
  if option == 'v1_summary_in_host_call':
    kwargs['host_call'] = (lambda loss: [tf.compat.v1.summary.scalar(
        'host_loss', loss[0])], [tf.reshape(loss, [1])])
  if option == 'eval_hook_on_loss':
    kwargs['evaluation_hooks'] = [tf.compat.v1.train.LoggingTensorHook(
        {'loss': loss}, every_n_iter=1)]
  return tpu_fc.TPUEstimatorSpec(mode, loss=loss, train_op=train_op, **kwargs)


def estimator(model_dir, option=None, iterations_per_loop=2):
  column = models.contract_column('embedding_core')
  return tpu_fc.TPUEstimator(
      model_fn=model_fn, use_tpu=True, train_batch_size=len(inputs.IDS),
      eval_batch_size=len(inputs.IDS),
      params={'column': column, 'option': option},
      config=tpu_fc.RunConfig(
          model_dir=str(model_dir), save_checkpoints_steps=1,
          tpu_config=tpu_fc.TPUConfig(
              num_shards=estimators.NUM_SHARDS,
              iterations_per_loop=iterations_per_loop)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=[column],
          optimization_parameters=estimators.EMBEDDING_OPTIMIZERS['adagrad']))


def constant_input_fn(params):
  """The batch as tensors, not a Dataset: one step per session.run."""
  del params
  return {'ids': inputs.contract_ids('sparse')}, tf.zeros([len(inputs.IDS), 1])


@pytest.mark.parametrize('input_fn, iterations_per_loop', [
    (inputs.contract_input_fn('sparse'), 1), (constant_input_fn, 2),
    (inputs.contract_input_fn('sparse'), 2)], ids=['one_step_loop', 'tensors',
                                              'loop'])
def test_a_scaffold_fn_saver_saves_the_tables(tmp_path, input_fn,
                                              iterations_per_loop):
  tpu = estimator(tmp_path, 'scaffold_saver', iterations_per_loop)
  tpu.train(input_fn, max_steps=4)
  saved = dict(tf.train.list_variables(tpu.latest_checkpoint()))
  assert TABLE_AND_SLOT <= set(saved)
  assert not any('dummy' in name for name in saved)
  assert len(tf.train.get_checkpoint_state(
      str(tmp_path)).all_model_checkpoint_paths) == 1  # its max_to_keep
  assert tpu.evaluate(input_fn, steps=1)['global_step'] == 4


@pytest.mark.parametrize('iterations_per_loop', [1, 2])
def test_a_v1_summary_in_host_call_gets_tfs_error(tmp_path,
                                                  iterations_per_loop):
  with pytest.raises(ValueError, match='Please use tf.contrib.summary instead '
                     'of tf.summary inside of host_calls.'):
    estimator(tmp_path, 'v1_summary_in_host_call', iterations_per_loop).train(
        inputs.contract_input_fn('sparse'), max_steps=2)


def test_a_plain_spec_with_chief_hooks_gets_tfs_error(tmp_path):
  with pytest.raises(ValueError, match='training_chief_hooks returned by '
                     'EstimatorSpec is not supported in TPUEstimator.If you '
                     'want to pass training hooks, please pass via '
                     'training_hooks.'):
    estimator(tmp_path, 'plain_spec_chief_hook').train(
        inputs.contract_input_fn('sparse'), max_steps=2)


@pytest.mark.parametrize('iterations_per_loop', [1, 2])
def test_a_plain_specs_scaffold_is_ignored_with_tfs_warning(
    tmp_path, tf_log, iterations_per_loop):
  """Its Saver, made before the tables exist, would have left them unsaved."""
  tpu = estimator(tmp_path, 'plain_spec_saver', iterations_per_loop)
  tpu.train(inputs.contract_input_fn('sparse'), max_steps=2)
  assert TABLE_AND_SLOT <= set(dict(tf.train.list_variables(
      tpu.latest_checkpoint())))
  assert ('EstimatorSpec.Scaffold is ignored by TPU train/eval. Please use '
          'TPUEstimatorSpec.') in tf_log


def test_an_evaluation_hook_on_a_model_fn_tensor_is_told_why(tmp_path):
  tpu = estimator(tmp_path, 'eval_hook_on_loss')
  tpu.train(inputs.contract_input_fn('sparse'), max_steps=1)
  with pytest.raises(ValueError, match='(?s)inside the TPU evaluation loop .*'
                     'evaluation_hooks cannot fetch its tensors .*Pass them '
                     'to eval_metrics instead'):
    tpu.evaluate(inputs.contract_input_fn('sparse'), steps=2)


def test_numpy_features_train_as_tensors(tmp_path):
  """An input_fn may return numpy arrays (TF converts them), on the TPU too."""
  def input_fn(params):
    features, labels = constant_input_fn(params)
    return dict(features, extra=np.zeros([len(inputs.IDS), 1], np.float32)), (
        labels)

  tpu = estimator(tmp_path)
  tpu.train(input_fn, max_steps=1)
  assert tpu.get_variable_value('global_step') == 1


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
  estimator(tmp_path, iterations_per_loop=10).train(
      inputs.contract_input_fn('sparse'), max_steps=200, hooks=[hook])
  assert hook.seen == list(range(0, 200, 10))
