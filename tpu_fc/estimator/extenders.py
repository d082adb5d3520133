"""`tf.estimator.add_metrics` (tensorflow_estimator's `extenders.py`) for
tpu_fc's estimators."""
from tpu_fc import _tf_internals as internals
from tpu_fc.estimator import estimator as estimator_lib
from tpu_fc.estimator.model_fn import ModeKeys

_VALID_METRIC_FN_ARGS = frozenset(['features', 'labels', 'predictions',
                                   'config'])


def add_metrics(estimator, metric_fn):
  """A new `Estimator` of `estimator`'s model and model_dir whose evaluation
  adds `metric_fn`'s metrics (replacing those of the same name).

  As TF 2.15's: the new Estimator calls `estimator.model_fn`, which runs the
  model as an export does (a `TPUEstimator`'s on the CPU), and `metric_fn`
  takes any of `features`, `labels`, `predictions`, `config` and returns
  {name: (value, update_op) or a Keras metric}.
  """
  estimator_lib.check_estimator(estimator)
  estimator_lib.check_fn_args(metric_fn, 'metric_fn', _VALID_METRIC_FN_ARGS)

  def new_model_fn(features, labels, mode, config):
    spec = estimator.model_fn(features, labels, mode, config)
    if mode != ModeKeys.EVAL:
      return spec
    available = {'features': features, 'labels': labels,
                 'predictions': spec.predictions, 'config': config}
    metrics = dict(spec.eval_metric_ops or {})
    metrics.update(metric_fn(**{name: available[name]
                                for name in internals.fn_args(metric_fn)}))
    return spec._replace(eval_metric_ops=metrics)

  return estimator_lib.Estimator(
      model_fn=new_model_fn, model_dir=estimator.model_dir,
      config=estimator.config,
      warm_start_from=estimator._warm_start_settings)  # pylint: disable=protected-access
