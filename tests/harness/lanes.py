"""Which TensorFlow lane the tests run on, and TF 2.15's own classes.

The legacy lane (TF 2.15.1 with tensorflow-estimator) has TF's real legacy
TPU embedding classes and TPUEstimator: the reference implementations.  A
test that runs them carries `@pytest.mark.legacy_only` (tests/conftest.py
skips it on the latest lane); a test of tpu_fc on every lane that also
compares with TF where it can reads `LEGACY`.
"""
from tpu_fc._tf import TF_VERSION

LEGACY = TF_VERSION == (2, 15)
NAME = 'legacy' if LEGACY else 'latest'
SKIP_REASON = "runs TF 2.15's own classes (the legacy lane's)"

if LEGACY:
  # pylint: disable=g-import-not-at-top,unused-import
  from tensorflow.python.tpu import tpu_embedding as tf_tpu_embedding
  from tensorflow_estimator.python.estimator.tpu import _tpu_estimator_embedding as tf_estimator_embedding
  # pylint: enable=g-import-not-at-top,unused-import
else:
  tf_tpu_embedding = tf_estimator_embedding = None
