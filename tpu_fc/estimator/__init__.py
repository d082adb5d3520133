"""TPUEstimator-style driver on TF core (tf.estimator is gone in TF >= 2.16)."""
from tpu_fc.estimator.config import InputPipelineConfig
from tpu_fc.estimator.config import RunConfig
from tpu_fc.estimator.config import TPUConfig
from tpu_fc.estimator.estimator import TPUEstimator
from tpu_fc.estimator.exporters import BestExporter
from tpu_fc.estimator.exporters import Exporter
from tpu_fc.estimator.exporters import FinalExporter
from tpu_fc.estimator.exporters import LatestExporter
from tpu_fc.estimator.spec import EstimatorSpec
from tpu_fc.estimator.spec import ModeKeys
from tpu_fc.estimator.spec import TPUEstimatorSpec
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
