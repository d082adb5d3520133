"""tpu_fc: legacy TPU embedding feature columns and TPUEstimator on TF 2.15 and newer.

The legacy `tf.compat.v1.tpu.experimental` embedding API, re-based on the TF2
mid-level TPU embedding API, with a TPUEstimator-style driver of its own.

`import tpu_fc` is cheap: it only selects tf-keras for TensorFlow >= 2.16 (which
must happen before TensorFlow is first imported) and loads TensorFlow with the
first public name used, so `tpu-fc --help` answers without TensorFlow.
"""
import importlib
import os
import pkgutil
import sys
from importlib import metadata

__version__ = '0.1.0'


def _version_tuple(version):
  return tuple(int(p) for p in version.split('.')[:2] if p.isdigit())


def _prefer_legacy_keras():
  """Sets TF_USE_LEGACY_KERAS=1 where TF >= 2.16 and tf-keras are installed.

  TF >= 2.16 ships Keras 3 as `tf.keras`, which has no `DenseFeatures`; the
  legacy feature-column layers live in tf-keras and are only picked up when the
  variable is set before TensorFlow is imported.  On TF 2.15 (no tf-keras) the
  same variable breaks `tf.keras`, and a choice the user made stays theirs.
  """
  if 'tensorflow' in sys.modules or 'TF_USE_LEGACY_KERAS' in os.environ:
    return
  try:
    tf_version = metadata.version('tensorflow')
    metadata.version('tf-keras')
  except metadata.PackageNotFoundError:
    return
  if _version_tuple(tf_version) >= (2, 16):
    os.environ['TF_USE_LEGACY_KERAS'] = '1'


_prefer_legacy_keras()

# Public name -> the module that defines it, imported on first use.
_PUBLIC = {
    'embedding_column': 'tpu_fc.columns',
    'shared_embedding_columns': 'tpu_fc.columns',
    'install': 'tpu_fc.legacy_names',
    'uninstall': 'tpu_fc.legacy_names',
    'EmbeddingConfigSpec': 'tpu_fc.spec',
    'FeatureConfig': 'tpu_fc.spec',
    'MidLevelConfig': 'tpu_fc.spec',
    'TableConfig': 'tpu_fc.spec',
}
_PUBLIC.update(dict.fromkeys((
    'AdagradMomentumParameters', 'AdagradParameters', 'AdamParameters',
    'FrequencyEstimatorParameters', 'FtrlParameters', 'MomentumParameters',
    'ProximalAdagradParameters', 'ProximalYogiParameters', 'RMSPropParameters',
    'StochasticGradientDescentParameters'), 'tpu_fc.optimizers'))
_PUBLIC.update(dict.fromkeys((
    'BestExporter', 'EstimatorSpec', 'EvalSpec', 'Exporter', 'FinalExporter',
    'InputPipelineConfig', 'LatestExporter', 'ModeKeys', 'RunConfig',
    'TPUConfig', 'TPUEstimator', 'TPUEstimatorSpec', 'train_and_evaluate',
    'TrainSpec'), 'tpu_fc.estimator'))

__all__ = sorted(_PUBLIC) + ['export', 'mid_level', 'tfrs']


def __getattr__(name):
  if name in _PUBLIC:
    value = getattr(importlib.import_module(_PUBLIC[name]), name)
  elif name in {module.name for module in pkgutil.iter_modules(__path__)}:
    value = importlib.import_module('tpu_fc.' + name)  # e.g. tpu_fc.export
  else:
    raise AttributeError(f"module 'tpu_fc' has no attribute {name!r}")
  globals()[name] = value
  return value


def __dir__():
  return sorted(set(globals()) | set(__all__))
