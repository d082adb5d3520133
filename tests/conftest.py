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


# The files of the most work (CPU seconds of each lane's suite, measured per
# file), longest first, the rest after them in their order: xdist's
# `--dist loadfile --no-loadscope-reorder` (setup.cfg) hands the workers whole
# files in collection order, so the long ones start first and the workers end
# together, not one running a long file while the other idles.  (xdist's own
# order, by number of tests, put the few slow tests of process-running files
# last.)
LONGEST_FIRST = (
    'test_cluster.py', 'test_export.py', 'test_migration_guide.py',
    'test_legacy_scripts.py', 'test_keras_rs.py', 'test_tfrs.py',
    'test_checkpoint_conversion.py', 'test_host_engine.py', 'test_demo.py',
    'test_tpu_emulation_tables.py', 'test_mid_level_tpu_embedding.py',
    'test_heads_tpu_estimator.py', 'test_bad_input.py', 'test_contract.py')


def pytest_collection_modifyitems(items):
  rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # (stable)
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
