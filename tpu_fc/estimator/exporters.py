"""`tf.estimator`'s exporters for `train_and_evaluate`, without tensorflow_estimator.

`Exporter`, `LatestExporter`, `FinalExporter` and `BestExporter` behave as in
TF 2.15: after each evaluation `train_and_evaluate` calls `export()`, which
writes a SavedModel with the estimator's `export_saved_model` into a
timestamped directory under `<model_dir>/export/<name>`; `exports_to_keep`
deletes the oldest; `BestExporter` exports when `compare_fn` says the new
evaluation is better than the best one, which it first reads back from the
evaluation event files (so a restarted job does not export a worse model).
"""
from __future__ import annotations

import abc
import os
from typing import Any, Callable, Mapping

from tpu_fc._tf import tf
from tpu_fc import _tf_internals as internals
from tpu_fc.estimator.estimator import check_fn_args
from tpu_fc.estimator.model_fn import LOSS_METRIC_KEY

_COMPARE_FN_ARGS = frozenset(['best_eval_result', 'current_eval_result'])
_EXPORT_VERSION_DIGITS = 10  # the seconds timestamp export_saved_model names dirs by


class Exporter(object):
  """A kind of model export (`tf.estimator.Exporter`).

  As in TF, the abstract members are documentation only: they are not enforced.
  """

  @abc.abstractproperty
  def name(self) -> str:
    """The directory name under the export base; neither `None` nor empty."""

  @abc.abstractmethod
  def export(self, estimator: Any, export_path: str, checkpoint_path: str,
             eval_result: Mapping[str, Any], is_the_final_export: bool
             ) -> bytes | None:
    """Exports `checkpoint_path`; returns the export directory, or None if skipped.

    `is_the_final_export` is True for the evaluation at the end of training
    (never when `TrainSpec.max_steps` is None).

    Args:
      estimator: the `TPUEstimator` to export.
      export_path: the export base (`<model_dir>/export/<name>`); the
        SavedModel goes into a timestamped directory below it.
      checkpoint_path: the checkpoint just evaluated.
      eval_result: that evaluation's metrics dict.
      is_the_final_export: see above.

    Returns:
      The export directory (bytes, as `export_saved_model` returns it), or
      None when this exporter skipped the export.
    """


class _SavedModelExporter(Exporter):
  """Exports the serving graph and the checkpoint, then deletes all but the
  `exports_to_keep` newest exports (None: keeps all): what every exporter
  writes.  The public exporters name `Exporter` as a base too, the one the
  API docs show."""

  def __init__(self, name, serving_input_receiver_fn, assets_extra=None,
               as_text=False, exports_to_keep=None):
    self._name = name
    self._serving_input_receiver_fn = serving_input_receiver_fn
    self._assets_extra = assets_extra
    self._as_text = as_text
    self._exports_to_keep = exports_to_keep

  @property
  def name(self):
    return self._name

  def export(self, estimator, export_path, checkpoint_path, eval_result,
             is_the_final_export):
    del eval_result, is_the_final_export
    export_result = estimator.export_saved_model(
        export_path, self._serving_input_receiver_fn,
        assets_extra=self._assets_extra, as_text=self._as_text,
        checkpoint_path=checkpoint_path)
    _garbage_collect_exports(export_path, self._exports_to_keep)
    return export_result


def _garbage_collect_exports(export_dir_base, exports_to_keep):
  """Deletes all but the `exports_to_keep` newest exports (None: keeps all).

  Exports are the subdirectories named by a 10-digit timestamp; others (a
  `temp-` directory of an export in progress) are left alone.
  """
  if exports_to_keep is None:
    return
  versions = []
  for entry in tf.io.gfile.listdir(export_dir_base):
    name = tf.compat.as_str_any(entry).rstrip('/')
    if len(name) == _EXPORT_VERSION_DIGITS and name.isdigit():
      versions.append((int(name), os.path.join(export_dir_base, name)))
  for _, path in sorted(versions)[:-exports_to_keep]:
    try:
      tf.io.gfile.rmtree(path)
    except tf.errors.NotFoundError as e:
      tf.compat.v1.logging.warn('Can not delete %s recursively: %s', path, e)


class LatestExporter(_SavedModelExporter, Exporter):
  """Exports after every evaluation, keeping the `exports_to_keep` newest.

  Args:
    name: the export directory's name under `<model_dir>/export`.
    serving_input_receiver_fn: as `TPUEstimator.export_saved_model` takes it.
    assets_extra: as `TPUEstimator.export_saved_model` takes it.
    as_text: as `TPUEstimator.export_saved_model` takes it.
    exports_to_keep: the newest exports kept (older timestamped directories
      are deleted); None: all.

  Raises:
    ValueError: `exports_to_keep` <= 0.
  """

  def __init__(self, name: str, serving_input_receiver_fn: Callable[[], Any],
               assets_extra: Mapping[str, str] | None = None,
               as_text: bool = False, exports_to_keep: int | None = 5):
    if exports_to_keep is not None and exports_to_keep <= 0:
      raise ValueError(
          '`exports_to_keep`, if provided, must be positive number')
    super().__init__(name, serving_input_receiver_fn, assets_extra, as_text,
                     exports_to_keep)


class FinalExporter(_SavedModelExporter, Exporter):
  """Exports once, after the evaluation at the end of training.

  The end of training is the global step reaching `TrainSpec.max_steps`:
  without `max_steps` it never exports.

  Args:
    name, serving_input_receiver_fn, assets_extra, as_text: as in
      `LatestExporter`.
  """

  def __init__(self, name: str, serving_input_receiver_fn: Callable[[], Any],
               assets_extra: Mapping[str, str] | None = None,
               as_text: bool = False):
    super().__init__(name, serving_input_receiver_fn, assets_extra, as_text)

  def export(self, estimator, export_path, checkpoint_path, eval_result,
             is_the_final_export):
    if not is_the_final_export:
      return None
    tf.compat.v1.logging.info(
        'Performing the final export in the end of training.')
    return super().export(estimator, export_path, checkpoint_path,
                          eval_result, is_the_final_export)


def _loss_smaller(best_eval_result, current_eval_result):
  """BestExporter's default `compare_fn`: True if the current loss is smaller."""
  for name, result in (('best_eval_result', best_eval_result),
                       ('current_eval_result', current_eval_result)):
    if not result or LOSS_METRIC_KEY not in result:
      raise ValueError(
          '{} cannot be empty or no loss is found in it.'.format(name))
  return (best_eval_result[LOSS_METRIC_KEY] >
          current_eval_result[LOSS_METRIC_KEY])


def _verify_compare_fn_args(compare_fn):
  args = internals.fn_args(compare_fn)
  for name in ('best_eval_result', 'current_eval_result'):
    if name not in args:
      raise ValueError('compare_fn (%s) must include %s argument.' %
                       (compare_fn, name))
  check_fn_args(compare_fn, 'compare_fn', _COMPARE_FN_ARGS)


class BestExporter(_SavedModelExporter, Exporter):
  """Exports when an evaluation is better (`compare_fn`) than the best so far.

  The best so far starts as the best evaluation in the event files matching
  `event_file_pattern` (relative to model_dir), read on the first export for a
  model_dir, so the exporter survives restarts; the first export always
  happens.

  Args:
    name: the export directory's name under `<model_dir>/export`.
    serving_input_receiver_fn: as `TPUEstimator.export_saved_model` takes it.
    event_file_pattern: the event files holding earlier evaluations, relative
      to model_dir (the default matches `evaluate()` without a name); None:
      the best starts unknown.
    compare_fn: `(best_eval_result, current_eval_result) -> bool`, True when
      the current evaluation is better; the default compares `loss` (smaller
      is better) and raises `ValueError` for a result without one.
    assets_extra, as_text: as in `LatestExporter`.
    exports_to_keep: as in `LatestExporter`.

  Raises:
    ValueError: `compare_fn` None or not taking exactly `best_eval_result`
      and `current_eval_result`, or `exports_to_keep` <= 0.
  """

  def __init__(self,
               name: str = 'best_exporter',
               serving_input_receiver_fn: Callable[[], Any] | None = None,
               event_file_pattern: str | None = 'eval/*.tfevents.*',
               compare_fn: Callable[..., bool] = _loss_smaller,
               assets_extra: Mapping[str, str] | None = None,
               as_text: bool = False,
               exports_to_keep: int | None = 5):
    self._compare_fn = compare_fn
    if self._compare_fn is None:
      raise ValueError('`compare_fn` must not be None.')
    _verify_compare_fn_args(self._compare_fn)
    if exports_to_keep is not None and exports_to_keep <= 0:
      raise ValueError('`exports_to_keep`, if provided, must be a positive '
                       'number. Got %s' % exports_to_keep)
    super().__init__(name, serving_input_receiver_fn, assets_extra, as_text,
                     exports_to_keep)
    self._event_file_pattern = event_file_pattern
    self._model_dir = None
    self._best_eval_result = None
    self._has_exported = False

  def export(self, estimator, export_path, checkpoint_path, eval_result,
             is_the_final_export):
    if self._model_dir != estimator.model_dir and self._event_file_pattern:
      tf.compat.v1.logging.info('Loading best metric from event files.')
      self._model_dir = estimator.model_dir
      self._best_eval_result = self._best_eval_result_in(
          os.path.join(self._model_dir, self._event_file_pattern))
    if (self._best_eval_result is None or not self._has_exported or
        self._compare_fn(best_eval_result=self._best_eval_result,
                         current_eval_result=eval_result)):
      tf.compat.v1.logging.info('Performing best model export.')
      self._best_eval_result = eval_result
      export_result = super().export(estimator, export_path, checkpoint_path,
                                     eval_result, is_the_final_export)
      self._has_exported = True
      return export_result
    return None

  def _best_eval_result_in(self, event_file_pattern):
    """The best of the evaluations (scalar summaries) in the matching event files."""
    best_eval_result = None
    for event_file in tf.io.gfile.glob(event_file_pattern):
      for event in tf.compat.v1.train.summary_iterator(event_file):
        if not event.HasField('summary'):
          continue
        event_eval_result = {
            value.tag: value.simple_value for value in event.summary.value
            if value.HasField('simple_value')}
        if event_eval_result and (best_eval_result is None or self._compare_fn(
            best_eval_result, event_eval_result)):
          best_eval_result = event_eval_result
    return best_eval_result
