"""tf.estimator's hooks around a TPUEstimator, as TF 2.15 runs them:
`InMemoryEvaluatorHook` and `make_stop_at_checkpoint_step_hook` (on the legacy
lane also TF's own, given tpu_fc's estimator)."""
import os

import pytest

import tpu_fc
from tpu_fc._tf import tf
from tpu_fc.estimator import hooks as hooks_lib

from harness import estimators
from harness import inputs
from harness import lanes
from harness import models

pytestmark = pytest.mark.filterwarnings('ignore:`tf.layers.dense` is deprecated')


def _evaluations(eval_dir):
  """[(step, loss, mean_logit)] of the evaluations written to `eval_dir`."""
  found = []
  for path in sorted(tf.io.gfile.glob(os.path.join(eval_dir, 'events*'))):
    for event in tf.compat.v1.train.summary_iterator(path):
      values = {value.tag: value.simple_value for value in event.summary.value}
      if 'loss' in values:
        found.append((event.step, values['loss'], values['mean_logit']))
  return found


@pytest.mark.parametrize('use_tpu', [False, True], ids=['cpu', 'tpu'])
def test_in_memory_evaluator_hook_evaluates_the_variables_being_trained(
    tmp_path, use_tpu):
  """At the start, every 2 session runs (an emulated TPU loop of 2 steps is
  one) and at the end; its last evaluation is the final checkpoint's.  On
  the legacy lane TF 2.15's own hook, given tpu_fc's estimator, evaluates
  the same."""
  hook_classes = [hooks_lib.InMemoryEvaluatorHook]
  if lanes.LEGACY:
    hook_classes.append(tf.estimator.experimental.InMemoryEvaluatorHook)
  evaluations = []
  for number, hook_class in enumerate(hook_classes):
    estimator = estimators.linear_estimator(tmp_path / str(number), use_tpu)
    estimator.train(inputs.linear, max_steps=4, hooks=[hook_class(
        estimator, estimators.linear_eval_input_fn,
        steps=estimators.LINEAR_EVAL_STEPS, every_n_iter=2)])
    evaluations.append(_evaluations(estimator.eval_dir()))
    final = estimator.evaluate(estimators.linear_eval_input_fn,
                               steps=estimators.LINEAR_EVAL_STEPS,
                               name='checkpoint')
    step, loss, mean_logit = evaluations[-1][-1]
    assert (step, loss, mean_logit) == (4, pytest.approx(final['loss']),
                                        pytest.approx(final['mean_logit']))
  assert [step for step, _, _ in evaluations[0]] == (
      [0, 4, 4] if use_tpu else [0, 2, 4, 4])
  assert all(theirs == ours for theirs, ours in zip(evaluations[1:],
                                                    evaluations[:1]))


def test_make_stop_at_checkpoint_step_hook(tmp_path, monkeypatch):
  """The chief's is a StopAtStepHook; a worker's stops once the latest
  checkpoint holds the last step (here the chief's, saving every step, in
  the same model_dir), as TF 2.15's does given tpu_fc's estimator."""
  makers = [hooks_lib.make_stop_at_checkpoint_step_hook]
  if lanes.LEGACY:
    makers.append(tf.estimator.experimental.make_stop_at_checkpoint_step_hook)
  for number, make in enumerate(makers):
    model_dir = str(tmp_path / str(number))

    def estimator(**config):
      return tpu_fc.TPUEstimator(
          model_fn=models.linear_model_fn, use_tpu=False,
          train_batch_size=estimators.LINEAR_BATCH,
          params={'hook_on_loss': None, 'spec': tpu_fc.TPUEstimatorSpec},
          config=tpu_fc.RunConfig(model_dir=model_dir, **config))

    chief = estimator(save_checkpoints_steps=1)
    assert isinstance(make(chief, 3), tf.compat.v1.train.StopAtStepHook)
    with monkeypatch.context() as patch:
      patch.setenv('TF_CONFIG', '{"cluster": {"chief": ["localhost:1"], '
                   '"worker": ["localhost:2"]}, "task": {"type": "worker", '
                   '"index": 0}}')
      worker = estimator()
    hook = make(worker, 3, wait_after_file_check_secs=0)
    assert not isinstance(hook, tf.compat.v1.train.StopAtStepHook)
    chief.train(inputs.linear, hooks=[hook])
    assert chief.get_variable_value('global_step') == 3
