"""Early stopping (`tf.estimator.experimental.stop_if_*_hook`) for tpu_fc's TPUEstimator.

TF 2.15's functions, rules and log lines: the chief's hook calls its predicate
every `run_every_secs` (or `run_every_steps`) and, once it holds, sets the
graph's `signal_early_stopping/STOP` variable and stops training; another
worker's hook stops when it reads that variable set (it lives with the other
variables, on a parameter server in a cluster).  The `stop_if_*` predicates read
the evaluations that `evaluate` (and `train_and_evaluate`) wrote to the eval
dir's event files.  With `use_tpu=True` a hook runs once per `iterations_per_loop`
steps, as it did on a TPU.  TF's functions refuse tpu_fc's estimator (they
type-check for tensorflow_estimator's), hence these.
"""
import collections
import operator
import os

from tpu_fc._tf import tf
from tpu_fc.estimator.estimator import check_estimator

_EVENT_FILE_GLOB_PATTERN = 'events.out.tfevents.*'


def make_early_stopping_hook(estimator, should_stop_fn, run_every_secs=60,
                             run_every_steps=None):
  """A hook that stops training once `should_stop_fn()` returns True.

  Args:
    estimator: the `TPUEstimator` the hook's training runs in.
    should_stop_fn: a callable of no arguments returning a bool.
    run_every_secs: call `should_stop_fn` at most every this many seconds.
    run_every_steps: or every this many steps (then `run_every_secs=None`).

  Raises:
    TypeError: `estimator` is not tpu_fc's `TPUEstimator`.
    ValueError: both `run_every_secs` and `run_every_steps` are set.
  """
  check_estimator(estimator)
  if run_every_secs is not None and run_every_steps is not None:
    raise ValueError('Only one of `run_every_secs` and `run_every_steps` must '
                     'be set.')
  if estimator.config.is_chief:
    return _StopOnPredicateHook(should_stop_fn, run_every_secs, run_every_steps)
  return _CheckForStoppingHook()


def _eval_dir(estimator, eval_dir):
  check_estimator(estimator)
  return estimator.eval_dir() if eval_dir is None else eval_dir


def stop_if_higher_hook(estimator, metric_name, threshold, eval_dir=None,
                        min_steps=0, run_every_secs=60, run_every_steps=None):
  """Stops once an evaluation at step >= `min_steps` has `metric_name` > `threshold`."""
  return _threshold_hook(estimator, metric_name, threshold, True, eval_dir,
                         min_steps, run_every_secs, run_every_steps)


def stop_if_lower_hook(estimator, metric_name, threshold, eval_dir=None,
                       min_steps=0, run_every_secs=60, run_every_steps=None):
  """Stops once an evaluation at step >= `min_steps` has `metric_name` < `threshold`."""
  return _threshold_hook(estimator, metric_name, threshold, False, eval_dir,
                         min_steps, run_every_secs, run_every_steps)


def stop_if_no_increase_hook(estimator, metric_name,
                             max_steps_without_increase, eval_dir=None,
                             min_steps=0, run_every_secs=60,
                             run_every_steps=None):
  """Stops once `metric_name` has not increased for that many steps of evaluations."""
  return _no_improvement_hook(estimator, metric_name,
                              max_steps_without_increase, True, eval_dir,
                              min_steps, run_every_secs, run_every_steps)


def stop_if_no_decrease_hook(estimator, metric_name,
                             max_steps_without_decrease, eval_dir=None,
                             min_steps=0, run_every_secs=60,
                             run_every_steps=None):
  """Stops once `metric_name` has not decreased for that many steps of evaluations."""
  return _no_improvement_hook(estimator, metric_name,
                              max_steps_without_decrease, False, eval_dir,
                              min_steps, run_every_secs, run_every_steps)


def read_eval_metrics(eval_dir):
  """{global step: {metric: value}} of the scalar summaries in `eval_dir`, by step."""
  metrics_by_step = collections.defaultdict(dict)
  for event in _events(eval_dir):
    if not event.HasField('summary'):
      continue
    metrics = {value.tag: value.simple_value for value in event.summary.value
               if value.HasField('simple_value')}
    if metrics:
      metrics_by_step[event.step].update(metrics)
  return collections.OrderedDict(sorted(metrics_by_step.items()))


def _events(eval_dir):
  """The `Event`s of `eval_dir`'s event files; a corrupt file's rest is skipped."""
  if not tf.io.gfile.exists(eval_dir):
    return
  for event_file in tf.io.gfile.glob(
      os.path.join(eval_dir, _EVENT_FILE_GLOB_PATTERN)):
    try:
      yield from tf.compat.v1.train.summary_iterator(event_file)
    except tf.errors.DataLossError as error:
      tf.compat.v1.logging.warning(
          'Skipping rest of the file due to encountering data corruption '
          'error; file path: %s; original error raised by '
          '`tf.train.summary_iterator`: %s', event_file, error)


def _evaluations(eval_dir, metric_name, min_steps):
  """(step, value of `metric_name`) of each evaluation at step >= `min_steps`."""
  for step, metrics in read_eval_metrics(eval_dir).items():
    if step < min_steps:
      continue
    if metric_name not in metrics:
      raise KeyError(
          'Early stopping watches the metric "{}", but the evaluation of step '
          '{} in {} has only: {}. Name one of these as metric_name (the keys '
          'of eval_metrics, or "loss").'.format(
              metric_name, step, eval_dir, ', '.join(sorted(metrics))))
    yield step, metrics[metric_name]


def _threshold_hook(estimator, metric_name, threshold, higher_is_better,
                    eval_dir, min_steps, run_every_secs, run_every_steps):
  eval_dir = _eval_dir(estimator, eval_dir)
  is_better = operator.gt if higher_is_better else operator.lt
  greater_or_lesser = 'greater than' if higher_is_better else 'less than'

  def threshold_crossed():
    for step, value in _evaluations(eval_dir, metric_name, min_steps):
      if is_better(value, threshold):
        tf.compat.v1.logging.info(
            'At step %s, metric "%s" has value %s which is %s the configured '
            'threshold (%s) for early stopping.', step, metric_name, value,
            greater_or_lesser, threshold)
        return True
    return False

  return make_early_stopping_hook(estimator, threshold_crossed,
                                  run_every_secs, run_every_steps)


def _no_improvement_hook(estimator, metric_name, max_steps_without_improvement,
                         higher_is_better, eval_dir, min_steps, run_every_secs,
                         run_every_steps):
  eval_dir = _eval_dir(estimator, eval_dir)
  is_better = operator.gt if higher_is_better else operator.lt
  increase_or_decrease = 'increase' if higher_is_better else 'decrease'

  def no_improvement():
    best_value = best_step = None
    for step, value in _evaluations(eval_dir, metric_name, min_steps):
      if best_value is None or is_better(value, best_value):
        best_value, best_step = value, step
      if step - best_step >= max_steps_without_improvement:
        tf.compat.v1.logging.info(
            'No %s in metric "%s" for %s steps, which is greater than or equal '
            'to max steps (%s) configured for early stopping.',
            increase_or_decrease, metric_name, step - best_step,
            max_steps_without_improvement)
        return True
    return False

  return make_early_stopping_hook(estimator, no_improvement, run_every_secs,
                                  run_every_steps)


def _get_or_create_stop_var():
  """The graph's `signal_early_stopping/STOP` (False until the chief stops);
  TF's name of it, and the hooks' `_stop_var`, which TF's tests read."""
  with tf.compat.v1.variable_scope('signal_early_stopping', values=[],
                                   reuse=tf.compat.v1.AUTO_REUSE):
    return tf.compat.v1.get_variable(
        'STOP', shape=[], dtype=tf.bool,
        initializer=tf.compat.v1.initializers.constant(False),
        collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES], trainable=False)


class _StopOnPredicateHook(tf.compat.v1.train.SessionRunHook):
  """The chief's: stops (and sets the stop variable) when the predicate holds."""

  def __init__(self, should_stop_fn, run_every_secs=60, run_every_steps=None):
    if not callable(should_stop_fn):
      raise TypeError('`should_stop_fn` must be callable.')
    self._should_stop_fn = should_stop_fn
    self._timer = tf.compat.v1.train.SecondOrStepTimer(
        every_secs=run_every_secs, every_steps=run_every_steps)
    self._global_step = None
    self._stop_var = None
    self._stop = None

  def begin(self):
    self._global_step = tf.compat.v1.train.get_global_step()
    self._stop_var = _get_or_create_stop_var()
    self._stop = tf.compat.v1.assign(self._stop_var, True)

  def before_run(self, run_context):
    del run_context
    return tf.compat.v1.train.SessionRunArgs(self._global_step)

  def after_run(self, run_context, run_values):
    global_step = run_values.results
    if not self._timer.should_trigger_for_step(global_step):
      return
    self._timer.update_last_triggered_step(global_step)
    if self._should_stop_fn():
      tf.compat.v1.logging.info('Requesting early stopping at global step %d',
                                global_step)
      run_context.session.run(self._stop)
      run_context.request_stop()


class _CheckForStoppingHook(tf.compat.v1.train.SessionRunHook):
  """A non-chief worker's: stops once the chief has set the stop variable."""

  def __init__(self):
    self._stop_var = None

  def begin(self):
    self._stop_var = _get_or_create_stop_var()

  def before_run(self, run_context):
    del run_context
    return tf.compat.v1.train.SessionRunArgs(self._stop_var)

  def after_run(self, run_context, run_values):
    if run_values.results:
      tf.compat.v1.logging.info('Early stopping requested, suspending run.')
      run_context.request_stop()


# What TF 2.15 exported as `tf.estimator.experimental.<name>`.
TF_EXPERIMENTAL_FUNCTIONS = (make_early_stopping_hook, stop_if_higher_hook,
                         stop_if_lower_hook, stop_if_no_increase_hook,
                         stop_if_no_decrease_hook)
