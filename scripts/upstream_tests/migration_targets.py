"""Runs the migration targets' own tests, unchanged, against tpu_fc.

TFRS's tests run after `tpu_fc.install()` (which binds TFRS's `TPUEmbedding`);
keras-rs's `distributed_embedding_test.py` with tpu_fc's `DistributedEmbedding`
bound where the test module reads it.  The test files are not in this
repository: take them from the libraries' sources at the pinned versions,
e.g. with a checkout of github.com/tensorflow/recommenders at v0.7.7 and of
github.com/keras-team/keras-rs at v0.4.0:

    git -C recommenders show v0.7.7:tensorflow_recommenders/layers/embedding/tpu_embedding_layer_test.py > /tmp/up/tpu_embedding_layer_test.py
    git -C keras-rs show v0.4.0:keras_rs/src/layers/embedding/distributed_embedding_test.py > /tmp/up/distributed_embedding_test.py
    mkdir -p /tmp/up/keras_rs_testing/testing && git -C keras-rs show v0.4.0:keras_rs/src/testing/test_case.py > /tmp/up/keras_rs_testing/testing/test_case.py  # (and its __init__.py)

    scripts/lane.sh latest python scripts/upstream_tests/migration_targets.py \\
        [--keras-rs-testing /tmp/up/keras_rs_testing] [--tpu-branch] \\
        -- PYTEST_ARGS...

--keras-rs-testing: a directory holding keras-rs's `testing` package, which
its wheel lacks.  --tpu-branch: keras-rs's tests take their TPU branch
(placement 'sparsecore'; `TPU_NAME` set) on the emulated SparseCore, their
shared strategy the default one (their TPU CI's has one replica a host: the
tests give every replica the whole batch).  Nothing contacts a TPU.
"""
import argparse
import os
import sys


def main(argv):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--keras-rs-testing')
  parser.add_argument('--tpu-branch', action='store_true')
  parser.add_argument('pytest_args', nargs='*')
  args = parser.parse_args(argv)
  if args.tpu_branch:
    os.environ['TPU_NAME'] = 'tpu_fc-emulated'  # (read by the tests alone)

  import tpu_fc  # pylint: disable=g-import-not-at-top
  tpu_fc.install()
  if args.keras_rs_testing:
    _bind_keras_rs(args)

  import pytest  # pylint: disable=g-import-not-at-top
  return pytest.main(['-p', 'no:cacheprovider'] + args.pytest_args)


def _bind_keras_rs(args):
  """tpu_fc's layer where keras-rs's test reads it; keras-rs's `testing`
  package on its path; the TPU branch's strategy set before it asks a TPU."""
  import keras_rs.src  # pylint: disable=g-import-not-at-top
  from keras_rs.src.layers.embedding import distributed_embedding  # pylint: disable=g-import-not-at-top
  from keras_rs.src.utils import tpu_test_utils  # pylint: disable=g-import-not-at-top

  from tpu_fc import keras_rs as tpu_fc_keras_rs  # pylint: disable=g-import-not-at-top
  from tpu_fc._tf import tf  # pylint: disable=g-import-not-at-top
  keras_rs.src.__path__.append(os.path.abspath(args.keras_rs_testing))
  distributed_embedding.DistributedEmbedding = (
      tpu_fc_keras_rs.DistributedEmbedding)
  if args.tpu_branch:
    tpu_test_utils._shared_strategy = tf.distribute.get_strategy()  # pylint: disable=protected-access


if __name__ == '__main__':
  sys.exit(main(sys.argv[1:]))
