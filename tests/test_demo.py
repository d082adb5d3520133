"""`python -m tpu_fc demo`, the README's main command, on a few steps."""
import logging
import math
import os
import re
import tempfile

import numpy as np
import pytest

from tpu_fc import demo
from tpu_fc._tf import tf


def test_demo_trains_exports_and_serves(tmp_path, capsys):
  model_dir = tmp_path / 'model'
  result = demo.main(model_dir=str(model_dir), steps=20)
  out = capsys.readouterr().out
  assert result.metrics['global_step'] == 20
  assert math.isfinite(result.metrics['loss'])
  assert 'tbl_item_query_item_shared_embedding' in out
  assert 'Before training (step 0):' in out
  assert 'After training (step 20):' in out
  assert re.search(
      r'Trained 20 steps of 64 examples in [\d.]+s: \d+ examples/s', out)
  assert result.examples_per_second > 0
  # The export is in model_dir, named, and serves what estimator.predict gives.
  assert os.path.isfile(os.path.join(result.export_dir, 'saved_model.pb'))
  assert result.export_dir.startswith(str(model_dir / 'export'))
  assert 'Exported a SavedModel (CPU lookup): {}\n'.format(
      result.export_dir) in out
  np.testing.assert_allclose(result.served, result.predicted, rtol=0,
                             atol=1e-5)
  assert sorted(set(result.labels)) == [0, 1]
  for label, probability in zip(result.labels, result.served):
    assert '\n  {:>5}  {:.3f}\n'.format(int(label), probability) in out
  assert 'Same as estimator.predict: max difference' in out


@pytest.fixture
def temp_root(tmp_path, monkeypatch):
  """tempfile's directory, empty: what a run leaves there can be seen."""
  monkeypatch.setattr(tempfile, 'tempdir', str(tmp_path))
  return tmp_path


def test_demo_without_model_dir_leaves_nothing_behind(temp_root, capsys):
  result = demo.main(steps=10)
  assert result.metrics['global_step'] == 10
  assert result.export_dir.startswith(str(temp_root))
  assert not list(temp_root.iterdir())
  assert 'removed at the end' in capsys.readouterr().out


def test_demo_removes_its_temporary_dir_on_error(temp_root):
  with pytest.raises(ValueError, match='Must specify steps > 0'):
    demo.main(steps=0)  # fails in train(), after evaluate() wrote to the dir
  assert not list(temp_root.iterdir())


def test_demo_gives_tfs_logger_its_level_back(temp_root):
  """The demo quiets TF's logger while it runs, not for its caller after it
  (a test's log capture, say), even when it fails."""
  logger = tf.get_logger()
  before = logger.level
  logger.setLevel(logging.INFO)
  try:
    with pytest.raises(ValueError, match='Must specify steps > 0'):
      demo.main(steps=0)
    assert logger.level == logging.INFO
  finally:
    logger.setLevel(before)
