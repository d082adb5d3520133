"""tpu_fc: legacy TPU embedding feature columns and TPUEstimator on TF 2.15 and newer.

The legacy `tf.compat.v1.tpu.experimental` embedding API, re-based on the TF2
mid-level TPU embedding API, with a TPUEstimator-style driver of its own.
"""
from tpu_fc import _tf  # noqa: F401  (sets TF_USE_LEGACY_KERAS before TF loads)
from tpu_fc import export
from tpu_fc.columns import embedding_column
from tpu_fc.columns import shared_embedding_columns
from tpu_fc.estimator import BestExporter
from tpu_fc.estimator import EstimatorSpec
from tpu_fc.estimator import EvalSpec
from tpu_fc.estimator import Exporter
from tpu_fc.estimator import FinalExporter
from tpu_fc.estimator import InputPipelineConfig
from tpu_fc.estimator import LatestExporter
from tpu_fc.estimator import ModeKeys
from tpu_fc.estimator import RunConfig
from tpu_fc.estimator import TPUConfig
from tpu_fc.estimator import TPUEstimator
from tpu_fc.estimator import TPUEstimatorSpec
from tpu_fc.estimator import train_and_evaluate
from tpu_fc.estimator import TrainSpec
from tpu_fc.migration import install
from tpu_fc.migration import uninstall
from tpu_fc.optimizers import AdagradParameters
from tpu_fc.optimizers import AdamParameters
from tpu_fc.optimizers import FtrlParameters
from tpu_fc.optimizers import MomentumParameters
from tpu_fc.optimizers import ProximalAdagradParameters
from tpu_fc.optimizers import RMSPropParameters
from tpu_fc.optimizers import StochasticGradientDescentParameters
from tpu_fc.spec import EmbeddingConfigSpec
from tpu_fc.spec import FeatureConfig
from tpu_fc.spec import MidLevelConfig
from tpu_fc.spec import TableConfig

__version__ = '0.1.0'
