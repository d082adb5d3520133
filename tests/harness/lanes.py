"""Which TensorFlow lane the tests run on, and TF 2.15's own classes.

The legacy lane (TF 2.15.1 with tensorflow-estimator) has TF's real legacy
TPU embedding classes and TPUEstimator: the reference implementations.  A
test that runs them carries `@pytest.mark.legacy_only` (tests/conftest.py
skips it on the latest lane); a test of tpu_fc on every lane that also
compares with TF where it can reads `LEGACY`.
"""
import importlib
import types

import tpu_fc
from tpu_fc._tf import TF_VERSION
from tpu_fc._tf import tf

LEGACY = TF_VERSION == (2, 15)
NAME = 'legacy' if LEGACY else 'latest'
SKIP_REASON = "runs TF 2.15's own classes (the legacy lane's)"

if LEGACY:
  # pylint: disable=g-import-not-at-top,unused-import
  from tensorflow.python.tpu import tpu_embedding as tf_tpu_embedding
  from tensorflow_estimator.python.estimator.tpu import _tpu_estimator_embedding as tf_estimator_embedding
  # train_and_evaluate's private executor, whose API tpu_fc's keeps.
  from tensorflow_estimator.python.estimator import training as tf_training
  # pylint: enable=g-import-not-at-top,unused-import
else:
  tf_tpu_embedding = tf_estimator_embedding = tf_training = None


# TPUEstimator and what it takes (tpu_fc's names; TF 2.15 keeps them in
# tf.compat.v1.estimator.tpu), and the estimator library's names around it.
_TPU_NAMES = ('TPUEstimator', 'TPUEstimatorSpec', 'RunConfig', 'TPUConfig')
_ESTIMATOR_NAMES = ('train_and_evaluate', 'TrainSpec', 'EvalSpec',
                    'LatestExporter', 'FinalExporter', 'BestExporter')


def driver(name):
  """TPUEstimator and what it takes, tpu_fc's ('tpu_fc') or TF 2.15's own
  ('tf', legacy lane), under the same names."""
  if name == 'tpu_fc':
    return types.SimpleNamespace(**{
        attribute: getattr(tpu_fc, attribute) for attribute in
        _TPU_NAMES + _ESTIMATOR_NAMES + (
            'EmbeddingConfigSpec', 'embedding_column', 'AdagradParameters')})
  tpu = tf.compat.v1.estimator.tpu
  return types.SimpleNamespace(
      EmbeddingConfigSpec=tpu.experimental.EmbeddingConfigSpec,
      embedding_column=tf.compat.v1.tpu.experimental.embedding_column,
      AdagradParameters=tf.compat.v1.tpu.experimental.AdagradParameters,
      **{attribute: getattr(tpu, attribute) for attribute in _TPU_NAMES},
      **{attribute: getattr(tf.compat.v1.estimator, attribute)
         for attribute in _ESTIMATOR_NAMES})


# The drivers a test compares: tpu_fc's, and on the legacy lane TF 2.15's.
DRIVERS = ('tpu_fc', 'tf') if LEGACY else ('tpu_fc',)


def core_driver(name):
  """The core Estimator (no TPU) and what a script uses around it, tpu_fc's
  ('tpu_fc') or TF 2.15's own ('tf', legacy lane), under the same names;
  `TPUEstimator` and `TPURunConfig` are the TPU's."""
  if name == 'tpu_fc':
    # pylint: disable=g-import-not-at-top
    from tpu_fc.estimator import early_stopping
    from tpu_fc.estimator import estimator
    from tpu_fc.estimator import run_config
    # pylint: enable=g-import-not-at-top
    return types.SimpleNamespace(
        Estimator=estimator.Estimator, RunConfig=run_config.RunConfig,
        EstimatorSpec=tpu_fc.EstimatorSpec,
        stop_if_no_decrease_hook=early_stopping.stop_if_no_decrease_hook,
        TPUEstimator=tpu_fc.TPUEstimator, TPURunConfig=tpu_fc.RunConfig)
  tpu = tf.compat.v1.estimator.tpu
  return types.SimpleNamespace(
      Estimator=tf.estimator.Estimator, RunConfig=tf.estimator.RunConfig,
      EstimatorSpec=tf.estimator.EstimatorSpec,
      stop_if_no_decrease_hook=(
          tf.estimator.experimental.stop_if_no_decrease_hook),
      TPUEstimator=tpu.TPUEstimator, TPURunConfig=tpu.RunConfig)


def core_module(name, role):
  """The core Estimator's module of `role` ('estimator', 'model_fn',
  'early_stopping', ...): tpu_fc's ('tpu_fc') or tensorflow_estimator's
  ('tf', legacy lane), named alike where TF's own tests read them."""
  return importlib.import_module(
      {'tpu_fc': 'tpu_fc.estimator.',
       'tf': 'tensorflow_estimator.python.estimator.'}[name] + role)
