"""The Estimator driver on TF core (tf.estimator is gone in TF >= 2.16).

The Estimator core (`estimator`, `model_fn`, `run_config`, `sessions`,
`checkpoints`, `training`, `exporters`, `early_stopping`, ...) knows no TPU;
`tpu/` holds `TPUEstimator` and the TPU emulation on top of it.
"""
from tpu_fc.estimator.exporters import BestExporter
from tpu_fc.estimator.exporters import Exporter
from tpu_fc.estimator.exporters import FinalExporter
from tpu_fc.estimator.exporters import LatestExporter
from tpu_fc.estimator.model_fn import EstimatorSpec
from tpu_fc.estimator.model_fn import ModeKeys
from tpu_fc.estimator.tpu.tpu_config import InputPipelineConfig
from tpu_fc.estimator.tpu.tpu_config import RunConfig
from tpu_fc.estimator.tpu.tpu_config import TPUConfig
from tpu_fc.estimator.tpu.tpu_estimator import TPUEstimator
from tpu_fc.estimator.tpu.tpu_estimator_spec import TPUEstimatorSpec
from tpu_fc.estimator.training import EvalSpec
from tpu_fc.estimator.training import train_and_evaluate
from tpu_fc.estimator.training import TrainSpec

__all__ = [
    'BestExporter',
    'EstimatorSpec',
    'EvalSpec',
    'Exporter',
    'FinalExporter',
    'InputPipelineConfig',
    'LatestExporter',
    'ModeKeys',
    'RunConfig',
    'TPUConfig',
    'TPUEstimator',
    'TPUEstimatorSpec',
    'TrainSpec',
    'train_and_evaluate',
]
