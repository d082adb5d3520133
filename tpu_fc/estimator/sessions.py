"""The session runs of train / evaluate / predict, sequenced as tf.estimator does.

Each takes what the driver built in the default graph (`model_fn.BuiltGraph`),
adds Estimator's bookkeeping (loss summary and metric, standard hooks) and runs
a `MonitoredSession`. No model code is built here.
"""
import contextlib

import numpy as np

from tpu_fc._tf import tf
from tpu_fc import _tf_internals as internals
from tpu_fc.estimator import checkpoints
from tpu_fc.estimator import input_errors
from tpu_fc.estimator.model_fn import LOSS_METRIC_KEY
from tpu_fc.estimator.run_config import TaskType

_GLOBAL_STEP = tf.compat.v1.GraphKeys.GLOBAL_STEP


def train(built, hooks, saving_listeners, config, saves_input_position=False,
          task_hooks=()):
  """Trains until a hook stops the session; returns the last loss value.

  Args:
    built: the TRAIN `BuiltGraph`, its spec's training hooks with the driver's
      progress logging.
    hooks: input, caller and stop hooks, run before the spec's own.
    saving_listeners: `CheckpointSaverListener`s for the checkpoint hook.
    config: the estimator's `RunConfig`.
    saves_input_position: the checkpoints hold the input's position (the
      input hooks then run before the first save).
    task_hooks: the hooks that ready a cluster task's session
      (`distributed.TaskSessionHook`), run after all others.
  """
  spec = built.spec
  graph = tf.compat.v1.get_default_graph()
  summaries = graph.get_collection(tf.compat.v1.GraphKeys.SUMMARIES)
  if not any(summary.op.name == LOSS_METRIC_KEY for summary in summaries):
    tf.compat.v1.summary.scalar(LOSS_METRIC_KEY, spec.loss)
  graph.add_to_collection(tf.compat.v1.GraphKeys.LOSSES, spec.loss)

  worker_hooks = (list(hooks) + [tf.compat.v1.train.NanTensorHook(spec.loss)] +
                  list(spec.training_hooks))

  chief_hooks = []
  saver_hooks = [
      h for h in worker_hooks + list(spec.training_chief_hooks)
      if isinstance(h, tf.compat.v1.train.CheckpointSaverHook)
  ]
  if ((config.save_checkpoints_secs or config.save_checkpoints_steps) and
      not saver_hooks):
    chief_hooks = [
        tf.compat.v1.train.CheckpointSaverHook(
            config.model_dir,
            save_secs=config.save_checkpoints_secs,
            save_steps=config.save_checkpoints_steps,
            scaffold=spec.scaffold,
            save_graph_def=config.checkpoint_save_graph_def)
    ]
    saver_hooks = chief_hooks
  saving_listeners = (checkpoints.before_save_listeners(built.before_save) +
                      list(saving_listeners or []))
  if saving_listeners:
    if not saver_hooks:
      raise ValueError(
          'There should be a CheckpointSaverHook to use saving_listeners. '
          'Please set one of the RunConfig.save_checkpoints_steps or '
          'RunConfig.save_checkpoints_secs.')
    # Estimator attaches listeners to the first saver hook, even a caller's.
    listeners = internals.saver_listeners(saver_hooks[0])
    listeners.extend(l for l in saving_listeners if l not in listeners)

  save_summary_steps, log_step_count_steps, summary_hooks = _summary_settings(
      config, spec.scaffold)
  worker_hooks += summary_hooks
  chief_only_hooks = tuple(chief_hooks) + tuple(spec.training_chief_hooks)
  if saves_input_position and config.is_chief:
    # The input hooks initialize the iterator and move it to its saved position
    # before the checkpoint hook's first save, which writes that position.
    worker_hooks, chief_only_hooks = worker_hooks + list(chief_only_hooks), ()
  worker_hooks += task_hooks
  in_loop = built.loop_iterations is not None
  with input_errors.explained(), _hooks_fetching_loop_tensors_explained(
      in_loop and _TRAINING_LOOP), internals.training.MonitoredTrainingSession(
      master=config.master,
      is_chief=config.is_chief,
      checkpoint_dir=config.model_dir,
      scaffold=spec.scaffold,
      hooks=worker_hooks,
      chief_only_hooks=chief_only_hooks,
      save_checkpoint_secs=0,
      save_summaries_steps=save_summary_steps,
      config=config.session_config,
      max_wait_secs=config.session_creation_timeout_secs,
      log_step_count_steps=log_step_count_steps,
      save_graph_def=config.checkpoint_save_graph_def) as session:
    loss = None
    steps = 0
    while not session.should_stop():
      steps += 1
      _, loss = session.run([spec.train_op, spec.loss])
  if steps == 0:
    tf.compat.v1.logging.warn('Training with estimator made no steps. '
                              'Perhaps input is empty or misspecified.')
  return loss


def _summary_settings(config, scaffold):
  """`(save_summaries_steps, log_step_count_steps, hooks)` of a training
  session, as TF's Estimator sets them: in a cluster with a master (which
  also evaluates) and workers, worker 0 alone writes the summaries and step
  rates, with hooks of its own; elsewhere the session's defaults do."""
  jobs = config.cluster_spec.jobs if config.cluster_spec else ()
  if TaskType.WORKER not in jobs or TaskType.MASTER not in jobs:
    return config.save_summary_steps, config.log_step_count_steps, []
  hooks = []
  if config.task_type == TaskType.WORKER and config.task_id == 0:
    if config.save_summary_steps and config.save_summary_steps > 0:
      hooks.append(tf.compat.v1.train.SummarySaverHook(
          save_steps=config.save_summary_steps, output_dir=config.model_dir,
          scaffold=scaffold))
    if config.log_step_count_steps and config.log_step_count_steps > 0:
      hooks.append(tf.compat.v1.train.StepCounterHook(
          every_n_steps=config.log_step_count_steps,
          output_dir=config.model_dir))
  return 0, None, hooks


# TF's wordings for a hook's tensor it cannot fetch from the body of the
# emulated TPU training loop: another graph's (a v2 loop's body is a function:
# `LoggingTensorHook`'s check, then `Session.run`'s) or a v1 loop's unfetchable
# op (an `InaccessibleTensorError`).
_LOOP_FETCH_ERRORS = (
    'should have graph attribute that is equal to current graph',
    'is not an element of this graph',
    'has been marked as not fetchable',
)


# (loop, what one session.run of it runs, the hooks, where their tensors go).
_TRAINING_LOOP = ('training', 'iterations_per_loop steps', 'training_hooks',
                  'host_call')
_EVALUATION_LOOP = ('evaluation', 'all the steps of evaluate',
                    'evaluation_hooks', 'eval_metrics')


@contextlib.contextmanager
def _hooks_fetching_loop_tensors_explained(loop):
  """Says why a hook cannot fetch a model_fn tensor in an emulated TPU `loop`.

  `loop` is `_TRAINING_LOOP` or `_EVALUATION_LOOP`, or falsy where the graph
  has no loop: there TF's error stands alone.
  """
  try:
    yield
  except ValueError as error:
    if not loop or not any(wording in str(error)
                           for wording in _LOOP_FETCH_ERRORS):
      raise
    raise type(error)(
        '{}\nWith use_tpu=True the model_fn runs inside the TPU {} loop ({} '
        'per session.run), so, as on a TPU, {} cannot fetch its tensors (e.g. '
        'LoggingTensorHook on the loss). Pass them to {} instead, or add the '
        'hook only when use_tpu=False.'.format(error, *loop)) from error


def evaluation_graph(built):
  """What evaluating the EVAL `BuiltGraph` runs, as TF's
  `Estimator._evaluate_build_graph` returns it: (scaffold, update op, metric
  values with `loss` and `global_step`, the spec's evaluation hooks).

  The loss is the mean of the spec's loss, or an evaluation loop's own
  (`built.eval_loss`).
  """
  spec = built.spec
  eval_metric_ops = dict(spec.eval_metric_ops)
  if LOSS_METRIC_KEY in eval_metric_ops:
    raise ValueError(
        'Metric with name "%s" is not allowed, because Estimator '
        'already defines a default metric with the same name.' %
        LOSS_METRIC_KEY)
  eval_metric_ops[LOSS_METRIC_KEY] = (built.eval_loss or
                                      tf.compat.v1.metrics.mean(spec.loss))
  metrics = sorted(eval_metric_ops.items())
  eval_dict = {name: value for name, (value, _) in metrics}
  update_ops = [update_op for _, (_, update_op) in metrics]
  if _GLOBAL_STEP in eval_dict:
    raise ValueError(
        'Metric with name `global_step` is not allowed, because Estimator '
        'already defines a default metric with the same name.')
  eval_dict[_GLOBAL_STEP] = tf.compat.v1.train.get_global_step()

  scaffold = spec.scaffold
  if scaffold.local_init_op:
    # A custom local_init_op must also initialize the eval step counter.
    internals.get_or_create_eval_step()
    default_local_init_op = tf.compat.v1.train.Scaffold.default_local_init_op()
    scaffold = checkpoints.copied_scaffold(
        scaffold,
        local_init_op=tf.group(scaffold.local_init_op, default_local_init_op))
  return (scaffold, tf.group(*update_ops), eval_dict,
          list(spec.evaluation_hooks))


def evaluate(built, hooks, checkpoint_path, config):
  """Evaluates once; returns metric values plus `loss` and `global_step`.

  Runs the metric update ops until a hook stops or input ends.
  """
  scaffold, update_op, eval_dict, model_hooks = evaluation_graph(built)
  with _hooks_fetching_loop_tensors_explained(
      built.eval_loss is not None and _EVALUATION_LOOP):
    return run_evaluation(checkpoint_path, scaffold, update_op, eval_dict,
                          list(hooks) + model_hooks, config)


def run_evaluation(checkpoint_path, scaffold, update_op, eval_dict, hooks,
                   config):
  """Runs an `evaluation_graph`: restores `checkpoint_path` (None: the
  scaffold initializes), runs `update_op` until a hook stops or input ends;
  returns the final values of `eval_dict`."""
  with input_errors.explained():
    return internals.evaluate_once(
        checkpoint_path=checkpoint_path,
        master=config.evaluation_master,
        scaffold=scaffold,
        eval_ops=update_op,
        final_ops=eval_dict,
        hooks=hooks,
        config=config.session_config)


def predict(built, hooks, checkpoint_path, config, predict_keys,
            yield_single_examples):
  """Starts a prediction session now; returns the generator of its outputs.

  The session (hooks' begin, graph finalization, restore) is created in the
  current default graph; the returned generator runs it without making that
  graph the default, so code between predictions is unaffected.
  """
  spec = built.spec
  predictions = _extract_keys(spec.predictions, predict_keys)
  session = tf.compat.v1.train.MonitoredSession(
      session_creator=tf.compat.v1.train.ChiefSessionCreator(
          checkpoint_filename_with_path=checkpoint_path,
          master=config.master,
          scaffold=spec.scaffold,
          config=config.session_config),
      hooks=list(hooks) + list(spec.prediction_hooks))
  return _generate_predictions(session, predictions, yield_single_examples,
                               built.runs_per_prediction_batch)


def _generate_predictions(session, predictions, yield_single_examples,
                          runs_per_batch):
  """Yields single examples, or batches of `runs_per_batch` runs' outputs
  joined (the last one, at the input's end, of the runs left)."""
  runs = []
  # The `with` ends the session quietly when input runs out (OutOfRange).
  with input_errors.explained(), session:
    while not session.should_stop():
      values = session.run(predictions)
      if not yield_single_examples:
        runs.append(values)
        if len(runs) == runs_per_batch:
          yield _joined(runs)
          runs = []
      elif not isinstance(predictions, dict):
        yield from values
      else:
        for i in range(_extract_batch_length(values)):
          yield {key: value[i] for key, value in values.items()}
  if runs:
    yield _joined(runs)


def _joined(runs):
  """The outputs of prediction runs, joined along the batch dimension."""
  if len(runs) == 1:
    return runs[0]
  if isinstance(runs[0], dict):
    return {key: np.concatenate([values[key] for values in runs])
            for key in runs[0]}
  return np.concatenate(runs)


def _extract_keys(predictions, predict_keys):
  if not predict_keys:
    return predictions
  if not isinstance(predictions, dict):
    raise ValueError(
        'predict_keys argument is not valid in case of non-dict predictions.')
  existing_keys = predictions.keys()
  predictions = {
      key: value for key, value in predictions.items() if key in predict_keys
  }
  if not predictions:
    raise ValueError('Expected to run at least one output from %s, '
                     'provided %s.' % (existing_keys, predict_keys))
  return predictions


def _extract_batch_length(values):
  batch_length = None
  for key, value in values.items():
    batch_length = batch_length or value.shape[0]
    if value.shape[0] != batch_length:
      raise ValueError('Batch length of predictions should be same. %s has '
                       'different batch length than others.' % key)
  return batch_length
