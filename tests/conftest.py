"""Fixtures shared by the test modules, and the markers' rules.

`legacy_only` (a test running TF 2.15's own classes) is skipped on the latest
lane; `subprocess` must mark every test that runs a process through
`harness.scripts`, which checks it against the test running now.
"""
import logging

import pytest

from harness import lanes
from harness import scripts
from tpu_fc._tf import tf

# Two logical CPUs, the devices of the tests' MirroredStrategy (its replicas
# as TPU cores), made before TensorFlow makes its devices.
tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices('CPU')[0],
    [tf.config.LogicalDeviceConfiguration()] * 2)


def pytest_collection_modifyitems(items):
  if lanes.LEGACY:
    return
  skip = pytest.mark.skip(reason=lanes.SKIP_REASON)
  for item in items:
    if item.get_closest_marker('legacy_only'):
      item.add_marker(skip)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
  """Before the test's fixtures: one of them may run a process for it."""
  scripts.current_test = item


class _ListHandler(logging.Handler):

  def __init__(self):
    super().__init__(level=logging.DEBUG)
    self.messages = []

  def emit(self, record):
    self.messages.append(record.getMessage())


@pytest.fixture(name='tf_log')
def _tf_log():
  """Messages TensorFlow logs (INFO and up) during the test."""
  logger = logging.getLogger('tensorflow')
  handler = _ListHandler()
  level = logger.level
  logger.setLevel(logging.INFO)
  logger.addHandler(handler)
  yield handler.messages
  logger.removeHandler(handler)
  logger.setLevel(level)
