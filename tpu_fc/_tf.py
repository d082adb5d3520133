"""TensorFlow as both lanes need it: imported after `tpu_fc` chose the Keras.

Importing any `tpu_fc` module first runs `tpu_fc/__init__.py`, which sets
`TF_USE_LEGACY_KERAS` where needed before this import of TensorFlow.
"""
import tensorflow as tf

from tpu_fc import _version_tuple

TF_VERSION = _version_tuple(tf.__version__)
