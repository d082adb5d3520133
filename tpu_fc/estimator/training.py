"""`train_and_evaluate`, `TrainSpec`, `EvalSpec`: TF 2.15's, for tpu_fc's TPUEstimator.

Same fields, defaults, checks and error texts as `tf.estimator`'s, and the same
schedule:

* **Locally** (no cluster in `TF_CONFIG`): one `train()` call whose checkpoint
  listener evaluates every new checkpoint (not the one written at the start)
  once `throttle_secs` have passed since the last evaluation, and the last
  checkpoint at the end if it was not evaluated yet; the exporters run after
  each evaluation, `is_the_final_export` once the global step reaches
  `max_steps`.  Returns `(eval_result, export_results)` of the last evaluation.
  `start_delay_secs` is not used locally (nor was it in TF).
* **In a cluster** (`TF_CONFIG`): the chief and the workers train (a worker
  first waits `5 s × (task index + 1)`, at most 60 s or
  `RunConfig.experimental_max_worker_delay_secs`), ps tasks serve, the legacy
  `master` trains and evaluates as in local mode, and the `evaluator` waits
  `start_delay_secs`, then evaluates (and exports) each new checkpoint, at most
  once every `throttle_secs`, until one has reached `max_steps`.

Specs and exporters made with tensorflow_estimator's classes are accepted too,
so a script may mix TF 2.15's names with tpu_fc's estimator.
"""
from __future__ import annotations

import collections
import os
import time
from typing import Any, Callable, Iterable

from tpu_fc import _tf_internals as internals
from tpu_fc._tf import tf
from tpu_fc.estimator import distributed
from tpu_fc.estimator import exporters as exporter_lib
from tpu_fc.estimator import hooks as hooks_lib
from tpu_fc.estimator import run_config
from tpu_fc.estimator.estimator import check_estimator
from tpu_fc.estimator.estimator import check_positive

_MAX_DELAY_SECS = 60
_DELAY_SECS_PER_WORKER = 5
_ERROR_LOG_INTERVAL_SECS = 600
_GLOBAL_STEP = tf.compat.v1.GraphKeys.GLOBAL_STEP
_TRAINER_JOBS = (run_config.TaskType.CHIEF, run_config.TaskType.MASTER,
                 run_config.TaskType.WORKER)
_TENSORFLOW_ESTIMATOR_MODULE = 'tensorflow_estimator.'


def _is_tensorflow_estimator_instance(value, class_name):
  """Whether `value` is an instance of tensorflow_estimator's `class_name`.

  Checked by name, so that tensorflow_estimator is never imported.
  """
  return any(cls.__name__ == class_name and
             cls.__module__.startswith(_TENSORFLOW_ESTIMATOR_MODULE)
             for cls in type(value).__mro__)


def _is_exporter(value):
  return (isinstance(value, exporter_lib.Exporter) or
          _is_tensorflow_estimator_instance(value, 'Exporter'))


def _validate_input_fn(input_fn):
  if not callable(input_fn):
    raise TypeError('`input_fn` must be callable, given: {}'.format(input_fn))


def _validate_hooks(hooks):
  return tuple(hooks_lib.checked_types(
      hooks, tf.compat.v1.train.SessionRunHook,
      'All hooks must be `SessionRunHook` instances, given: {}'))


def _validate_exporters(exporters):
  """`exporters` as a tuple: one `Exporter`, an iterable of them, or None."""
  if not exporters:
    return ()
  if _is_exporter(exporters):
    exporters = [exporters]
  unique_names = []
  try:
    for exporter in exporters:
      if not _is_exporter(exporter):
        raise TypeError  # reported below, as for a non-iterable
      if not exporter.name:
        raise ValueError('An Exporter cannot have a name that is `None` or'
                         ' empty. All exporter names:'
                         ' {}'.format([e.name for e in exporters]))
      if not isinstance(exporter.name, str):
        raise ValueError('An Exporter must have a string name. Given: '
                         '{}'.format(type(exporter.name)))
      if exporter.name in unique_names:
        raise ValueError(
            '`exporters` must have unique names. Such a name cannot be `None`.'
            ' All exporter names: {}'.format([e.name for e in exporters]))
      unique_names.append(exporter.name)
  except TypeError:
    raise TypeError('`exporters` must be an Exporter,'  # pylint: disable=raise-missing-from
                    ' an iterable of Exporter, or `None`,'
                    ' found %s.' % exporters)
  return tuple(exporters)


class TrainSpec(
    collections.namedtuple(
        'TrainSpec', ['input_fn', 'max_steps', 'hooks', 'saving_listeners'])):
  """The training part of `train_and_evaluate` (`tf.estimator.TrainSpec`).

  `max_steps` is the only stop condition (None: train forever); `hooks` run on
  every training task, `saving_listeners` on the chief.

  Args:
    input_fn: the training input_fn, as `TPUEstimator.train` takes it.
    max_steps: the global step training stops at (a positive int); None:
      until the input ends; reaching it also makes the last evaluation's
      exports final (`FinalExporter`).
    hooks: `tf.compat.v1.train.SessionRunHook`s of the training.
    saving_listeners: `tf.compat.v1.train.CheckpointSaverListener`s of the
      chief's checkpoint saves.

  Raises:
    TypeError: `input_fn` not callable, a hook or listener of another type.
    ValueError: `max_steps` <= 0.
  """

  def __new__(cls, input_fn: Callable[..., Any], max_steps: int | None = None,
              hooks: Iterable[Any] | None = None,
              saving_listeners: Iterable[Any] | None = None):
    _validate_input_fn(input_fn)
    check_positive(max_steps, 'max_steps')
    return super(TrainSpec, cls).__new__(
        cls, input_fn=input_fn, max_steps=max_steps,
        hooks=_validate_hooks(hooks),
        saving_listeners=tuple(hooks_lib.checked_types(
            saving_listeners, tf.compat.v1.train.CheckpointSaverListener,
            'All saving_listeners must be `CheckpointSaverListener` '
            'instances, given: {}')))


class EvalSpec(
    collections.namedtuple('EvalSpec', [
        'input_fn', 'steps', 'name', 'hooks', 'exporters', 'start_delay_secs',
        'throttle_secs'
    ])):
  """The evaluation and export part of `train_and_evaluate` (`tf.estimator.EvalSpec`).

  `steps` batches per evaluation (None: until input ends), summaries under
  `eval_<name>`, `exporters` run after each evaluation, evaluations at least
  `throttle_secs` apart; `start_delay_secs` delays the evaluator task.

  Args:
    input_fn: the evaluation input_fn, as `TPUEstimator.evaluate` takes it.
    steps: batches per evaluation (a positive int); None: until the input
      ends (the emulated TPU needs steps, as a TPU does).
    name: the evaluation's name: summaries under `eval_<name>`; None: `eval`.
    hooks: `tf.compat.v1.train.SessionRunHook`s of each evaluation.
    exporters: an `Exporter` or an iterable of them (tpu_fc's or
      tensorflow_estimator's), run after each evaluation, each into
      `<model_dir>/export/<its name>`; None: no export.
    start_delay_secs: how long the `evaluator` task of a cluster waits before
      its first evaluation (not used locally).
    throttle_secs: the least time between two evaluations: a checkpoint
      written sooner after the last evaluation is not evaluated (the last one
      always is).

  Raises:
    TypeError: `input_fn` not callable, `name` not a string, a hook or
      exporter of another type.
    ValueError: `steps` <= 0, a negative delay, or exporters without a name,
      with a name that is not a string, or with the same name.
  """

  def __new__(cls,
              input_fn: Callable[..., Any],
              steps: int | None = 100,
              name: str | None = None,
              hooks: Iterable[Any] | None = None,
              exporters: Any = None,
              start_delay_secs: float = 120,
              throttle_secs: float = 600):
    _validate_input_fn(input_fn)
    check_positive(steps, 'steps')
    if name is not None and not isinstance(name, str):
      raise TypeError('`name` must be string, given: {}'.format(name))
    hooks = _validate_hooks(hooks)
    exporters = _validate_exporters(exporters)
    for field, secs in (('start_delay_secs', start_delay_secs),
                        ('throttle_secs', throttle_secs)):
      if secs < 0:
        raise ValueError('Must specify {} >= 0, given: {}'.format(field, secs))
    return super(EvalSpec, cls).__new__(
        cls, input_fn, steps, name, hooks, exporters, start_delay_secs,
        throttle_secs)


def _as_spec(spec, spec_class, error):
  """`spec` as tpu_fc's `spec_class` (also from tensorflow_estimator's), else `error`."""
  if isinstance(spec, spec_class):
    return spec
  if _is_tensorflow_estimator_instance(spec, spec_class.__name__):
    return spec_class(**spec._asdict())
  raise TypeError(error.format(type(spec)))


_EVAL_SPEC_ERROR = '`eval_spec` must have type `tf.estimator.EvalSpec`. Got: {}'


def _assert_eval_spec(eval_spec):
  """TF's error where a task needs the `EvalSpec` the executor may lack."""
  if not isinstance(eval_spec, EvalSpec):
    raise TypeError(_EVAL_SPEC_ERROR.format(type(eval_spec)))


def train_and_evaluate(estimator: Any, train_spec: TrainSpec,
                       eval_spec: EvalSpec) -> tuple[Any, Any] | None:
  """Trains, evaluates and exports `estimator` (a `TPUEstimator`) as TF 2.15 did.

  See the module doc for the schedule.

  Args:
    estimator: a `tpu_fc.TPUEstimator` (after `install()`, TF's own
      `tf.estimator.train_and_evaluate` is called for TF's estimators).
    train_spec: a `TrainSpec` (tpu_fc's or tensorflow_estimator's).
    eval_spec: an `EvalSpec` (tpu_fc's or tensorflow_estimator's).

  Returns:
    Locally, `(eval_result, export_results)` of the last evaluation: its
    metrics dict and the exporters' results (both None when training had
    already reached `max_steps`); None on the tasks of a cluster.

  Raises:
    TypeError: `estimator` is not tpu_fc's, a spec of another type, or
      `estimator.evaluate` returned no dict.
    ValueError: an `evaluator` task with an id other than 0; in a cluster
      a task type that is missing, `local` or unknown; `estimator.evaluate`
      returned no metrics or no `global_step`.
    RuntimeError: locally, no new checkpoint to evaluate at the end of
      training; in a cluster, no master or cluster to start this task's
      server with.
  """
  eval_spec = _as_spec(eval_spec, EvalSpec, _EVAL_SPEC_ERROR)
  executor = _TrainingExecutor(
      estimator=estimator, train_spec=train_spec, eval_spec=eval_spec)
  config = estimator.config
  if config.task_type == 'evaluator' and config.task_id > 0:
    raise ValueError(
        'For distributed training, there can only be one `evaluator` task '
        '(with task id 0).  Given task id {}'.format(config.task_id))
  return executor.run()


class _EvalStatus(object):
  """What an evaluation attempt found."""
  EVALUATED = 'evaluated'
  MISSING_CHECKPOINT = 'missing checkpoint'
  NO_NEW_CHECKPOINT = 'no new checkpoint'


class _EvalResult(
    collections.namedtuple('EvalResult',
                           ['status', 'metrics', 'checkpoint_path'])):
  """One evaluation attempt; an evaluated one's metrics checked as TF checks
  what `evaluate` returned, before an exporter or listener sees them."""

  def __new__(cls, status, metrics=None, checkpoint_path=None):
    if status == _EvalStatus.EVALUATED:
      if not metrics:
        raise ValueError('Internal error: `Estimator.evaluate` should never '
                         'return empty metrics.')
      if not isinstance(metrics, dict):
        raise TypeError('`Estimator.evaluate` should return dict. Given '
                        '{}.'.format(type(metrics)))
      if _GLOBAL_STEP not in metrics:
        raise ValueError(
            'Internal error: `Estimator.evaluate` result should have '
            '`global_step` in result. Given {}'.format(metrics))
    return super(_EvalResult, cls).__new__(cls, status, metrics,
                                           checkpoint_path)


class _ContinuousEvalListener(object):
  """Asked before and after each evaluation (TF's private hook of the same
  name): False from either stops evaluating, and locally training too."""

  def before_eval(self):
    """False: skip this evaluation and stop."""
    return True

  def after_eval(self, eval_result):
    """False: stop after this `_EvalResult`."""
    del eval_result
    return True


class _Evaluator(object):
  """Evaluates the latest checkpoint, if it is new, and runs the exporters."""

  def __init__(self, estimator, eval_spec, max_training_steps):
    self._estimator = estimator
    self._eval_spec = eval_spec
    self._max_training_steps = max_training_steps
    self._previous_checkpoint_path = None
    self._last_warning_time = 0

  def evaluate_and_export(self):
    """Returns (`_EvalResult`, export results)."""
    checkpoint_path = self._estimator.latest_checkpoint()
    if not checkpoint_path:
      self._log_err_msg('Estimator is not trained yet. Will start an '
                        'evaluation when a checkpoint is ready.')
      return _EvalResult(_EvalStatus.MISSING_CHECKPOINT), []
    if checkpoint_path == self._previous_checkpoint_path:
      self._log_err_msg(
          'No new checkpoint ready for evaluation. Skip the current '
          'evaluation pass as evaluation results are expected to be same '
          'for the same checkpoint.')
      return _EvalResult(_EvalStatus.NO_NEW_CHECKPOINT), []
    metrics = self._estimator.evaluate(
        input_fn=self._eval_spec.input_fn, steps=self._eval_spec.steps,
        name=self._eval_spec.name, checkpoint_path=checkpoint_path,
        hooks=self._eval_spec.hooks)
    eval_result = _EvalResult(_EvalStatus.EVALUATED, metrics, checkpoint_path)
    is_the_final_export = bool(
        self._max_training_steps and
        metrics[_GLOBAL_STEP] >= self._max_training_steps)
    export_results = self._export(eval_result, is_the_final_export)
    self._last_warning_time = 0
    self._previous_checkpoint_path = checkpoint_path
    return eval_result, export_results

  def _log_err_msg(self, message):
    """Warns with `message`, at most once every 10 minutes."""
    now = time.time()
    if now - self._last_warning_time > _ERROR_LOG_INTERVAL_SECS:
      tf.compat.v1.logging.warning(message)
      self._last_warning_time = now

  def _export(self, eval_result, is_the_final_export):
    export_dir_base = os.path.join(
        tf.compat.as_str_any(self._estimator.model_dir), 'export')
    return [
        exporter.export(
            estimator=self._estimator,
            export_path=os.path.join(export_dir_base, exporter.name),
            checkpoint_path=eval_result.checkpoint_path,
            eval_result=eval_result.metrics,
            is_the_final_export=is_the_final_export)
        for exporter in self._eval_spec.exporters]


class _NewCheckpointListenerForEvaluate(
    tf.compat.v1.train.CheckpointSaverListener):
  """Evaluates new checkpoints during training, at most every `throttle_secs`.

  Its `after_save` returns True, which stops training, when the
  `_ContinuousEvalListener` stops evaluating.
  """

  def __init__(self, evaluator, eval_throttle_secs, continuous_eval_listener):
    self._evaluator = evaluator
    self._eval_throttle_secs = eval_throttle_secs
    self._continuous_eval_listener = continuous_eval_listener
    self.eval_result, self.export_results = None, None

  def begin(self):
    # Looked up where TF's training looks it up (TF's tests replace it there).
    self._timer = internals.basic_session_run_hooks.SecondOrStepTimer(
        every_secs=self._eval_throttle_secs)
    self._is_first_run = True

  def after_save(self, session, global_step_value):
    del session
    if self._is_first_run:  # the checkpoint of the untrained (or restored) model
      self._is_first_run = False
      return False
    if not self._continuous_eval_listener.before_eval():
      tf.compat.v1.logging.info(
          'Exiting training and evaluation loop, as requested by '
          '_ContinuousEvalListener.before_eval.')
      return True
    if not self._timer.should_trigger_for_step(global_step_value):
      tf.compat.v1.logging.info(
          'Skip the current checkpoint eval due to throttle secs '
          '({} secs).'.format(self._eval_throttle_secs))
      return False
    self._evaluate(global_step_value)
    if not self._continuous_eval_listener.after_eval(self.eval_result):
      tf.compat.v1.logging.info('Exiting evaluation, as requested by '
                                '_ContinuousEvalListener.after_eval.')
      return True
    return False

  def end(self, session, global_step_value):
    del session
    if (global_step_value != self._timer.last_triggered_step() and
        self._continuous_eval_listener.before_eval()):
      self._evaluate(global_step_value)
      self._continuous_eval_listener.after_eval(self.eval_result)

  def _evaluate(self, global_step_value):
    self._timer.update_last_triggered_step(global_step_value)
    self.eval_result, self.export_results = (
        self._evaluator.evaluate_and_export())
    if self.eval_result.status != _EvalStatus.EVALUATED:
      raise RuntimeError('There was no new checkpoint after the training. '
                         'Eval status: {}'.format(self.eval_result.status))


class _TrainingExecutor(object):
  """Runs this task's part of `train_and_evaluate`: its `run_<task type>`.

  TF's private class, with its constructor and methods: `run` looks the
  task's method up when it runs, so one replaced on an executor (as TF's
  tests do) is the one that runs; `train_hooks` join every training's hooks.
  """

  def __init__(self, estimator, train_spec, eval_spec, train_hooks=None,
               continuous_eval_listener=None):
    check_estimator(estimator)
    self._estimator = estimator
    self._train_spec = _as_spec(
        train_spec, TrainSpec,
        '`train_spec` must have type `tf.estimator.TrainSpec`. Got: {}')
    if eval_spec:  # else the tasks that evaluate raise (`_assert_eval_spec`)
      eval_spec = _as_spec(
          eval_spec, EvalSpec, '`eval_spec` must be either `None` or have '
          'type `tf.estimator.EvalSpec`. Got: {}')
    self._eval_spec = eval_spec
    self._train_hooks = _validate_hooks(train_hooks)
    if (continuous_eval_listener and
        not isinstance(continuous_eval_listener, _ContinuousEvalListener)):
      raise TypeError('`continuous_eval_listener` must have type '
                      '`_ContinuousEvalListener`.')
    self._continuous_eval_listener = (
        continuous_eval_listener or _ContinuousEvalListener())

  @property
  def estimator(self):
    return self._estimator

  def run(self):
    config = self._estimator.config
    if not config.cluster_spec and config.task_type != 'evaluator':
      tf.compat.v1.logging.info(
          'Running training and evaluation locally (non-distributed).')
      return self.run_local()
    if not config.task_type:
      raise ValueError(
          '`estimator.config` must have task_type set. This usually means '
          'TF_CONFIG environment is not set correctly.')
    if config.task_type == 'local':
      raise ValueError(
          '`task.type` in TF_CONFIG cannot be `local`. Leaving `cluster` and '
          '`task` properties in TF_CONFIG absent triggers train and evaluate '
          '`Estimator` locally (non-distributed).')
    tasks = [name[len('run_'):] for name in dir(self)
             if name.startswith('run_') and name != 'run_local' and
             callable(getattr(self, name))]
    if config.task_type not in tasks:
      raise ValueError(
          'Task type {} is not supported. Supported task types are {}'.format(
              config.task_type, tasks))
    getattr(self, 'run_' + config.task_type)()
    return None

  def _evaluating_listener(self, continuous_eval_listener):
    evaluator = _Evaluator(self._estimator, self._eval_spec,
                           self._train_spec.max_steps)
    return _NewCheckpointListenerForEvaluate(
        evaluator, self._eval_spec.throttle_secs, continuous_eval_listener)

  def _train(self, saving_listeners):
    self._estimator.train(
        input_fn=self._train_spec.input_fn,
        max_steps=self._train_spec.max_steps,
        hooks=list(self._train_spec.hooks) + list(self._train_hooks),
        saving_listeners=saving_listeners)

  def run_local(self):
    """Trains, evaluating each new checkpoint; returns the last evaluation's
    (metrics, export results)."""
    _assert_eval_spec(self._eval_spec)
    tf.compat.v1.logging.info(
        'Start train and evaluate loop. The evaluate will happen '
        'after every checkpoint. Checkpoint frequency is determined '
        'based on RunConfig arguments: save_checkpoints_steps {} or '
        'save_checkpoints_secs {}.'.format(
            self._estimator.config.save_checkpoints_steps,
            self._estimator.config.save_checkpoints_secs))
    listener = self._evaluating_listener(self._continuous_eval_listener)
    self._train(self._train_spec.saving_listeners + (listener,))
    metrics = listener.eval_result.metrics if listener.eval_result else None
    return metrics, listener.export_results

  def run_chief(self):
    self._train_in_cluster(self._train_spec.saving_listeners)

  def run_worker(self):
    self._train_in_cluster(())

  def run_master(self):
    """The legacy layout's chief: trains, and evaluates as in local mode."""
    _assert_eval_spec(self._eval_spec)
    self._train_in_cluster(
        self._train_spec.saving_listeners +
        (self._evaluating_listener(_ContinuousEvalListener()),))

  def run_ps(self):
    _start_std_server(self._estimator.config).join()

  def _train_in_cluster(self, saving_listeners):
    config = self._estimator.config
    tf_config = run_config.read_tf_config()
    if not tf_config:
      tf.compat.v1.logging.warn(
          'TF_CONFIG should not be empty in distributed environment.')
    if tf_config.get('environment') != 'google':  # else the manager starts it
      _start_std_server(config)
    if config.task_type == 'worker':
      max_delay_secs = _MAX_DELAY_SECS
      if config.experimental_max_worker_delay_secs is not None:
        max_delay_secs = int(config.experimental_max_worker_delay_secs)
      start_delay_secs = min(max_delay_secs,
                             (config.task_id + 1) * _DELAY_SECS_PER_WORKER)
      if start_delay_secs > 0:
        tf.compat.v1.logging.info('Waiting %d secs before starting training.',
                                  start_delay_secs)
        time.sleep(start_delay_secs)
    self._train(saving_listeners)

  def run_evaluator(self):
    """Evaluates each new checkpoint until one has reached max_steps (or the
    continuous-eval listener stops it), each pass at least `throttle_secs`
    long (the last one too, as in TF)."""
    _assert_eval_spec(self._eval_spec)
    start_delay_secs = self._eval_spec.start_delay_secs
    if start_delay_secs:
      tf.compat.v1.logging.info('Waiting %f secs before starting eval.',
                                start_delay_secs)
      time.sleep(start_delay_secs)
    max_steps = self._train_spec.max_steps
    evaluator = _Evaluator(self._estimator, self._eval_spec, max_steps)
    listener = self._continuous_eval_listener
    while True:
      start = time.time()
      if not listener.before_eval():
        tf.compat.v1.logging.info('Exiting evaluation, as requested by '
                                  '_ContinuousEvalListener.before_eval.')
        return
      eval_result, _ = evaluator.evaluate_and_export()
      if not listener.after_eval(eval_result):
        tf.compat.v1.logging.info('Exiting evaluation, as requested by '
                                  '_ContinuousEvalListener.after_eval.')
        return
      self._throttle(start, eval_result)
      if eval_result.status == _EvalStatus.EVALUATED:
        global_step = eval_result.metrics.get(_GLOBAL_STEP)
        if global_step and max_steps and global_step >= max_steps:
          tf.compat.v1.logging.info(
              'Exiting evaluation, global_step=%s >= train max_steps=%s',
              global_step, max_steps)
          return

  def _throttle(self, start, eval_result):
    throttle_secs = self._eval_spec.throttle_secs
    difference = throttle_secs - (time.time() - start)
    if difference > 0:
      tf.compat.v1.logging.info(
          'Waiting %f secs before starting next eval run.', difference)
      time.sleep(difference)
    elif throttle_secs == 0 and eval_result.status != _EvalStatus.EVALUATED:
      tf.compat.v1.logging.warning(
          'EvalSpec.throttle_secs is set as 0. This might overload the job '
          'before finding (next) new checkpoint. Please consider to increase '
          'it.')


def _start_std_server(config):
  """This task's server (shared with the estimator's), as Estimator started it:
  none for a cluster of one trainer without a master, else an error without a
  master or without this task's cluster, type and id."""
  if not (config.cluster_spec and config.task_type and
          config.task_id is not None):
    raise RuntimeError('Could not start server; be sure to specify '
                       'cluster_spec, task_type, and task in RunConfig or set '
                       'the TF_CONFIG environment variable.')
  if not config.master:
    jobs = config.cluster_spec.jobs
    if (len(jobs) == 1 and len(config.cluster_spec.job_tasks(jobs[0])) == 1 and
        config.task_type in _TRAINER_JOBS):
      tf.compat.v1.logging.info(
          'Skip starting Tensorflow server as there is only one '
          'node in the cluster.')
      return None
    raise RuntimeError(
        'Could not start server; be sure to specify master in '
        'RunConfig or set the TF_CONFIG environment variable.')
  tf.compat.v1.logging.info('Start Tensorflow server.')
  return distributed.server(config)
