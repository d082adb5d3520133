"""`numpy_input_fn` and `pandas_input_fn` (`tf.compat.v1.estimator.inputs`)
read as TF 2.15's (on the legacy lane against TF's own), and a tutorial's
numpy input_fn trains a TPUEstimator."""
import sys

import numpy as np
import pandas as pd
import pytest

import tpu_fc
from tpu_fc._tf import tf
from tpu_fc.estimator import inputs as estimator_inputs

from harness import estimators
from harness import inputs
from harness import lanes
from harness import oracle

# The linear model's data and batch (`estimators.linear_estimator`).
N, BATCH = inputs.N, estimators.LINEAR_BATCH
X, Y = inputs.X, inputs.Y

pytestmark = pytest.mark.filterwarnings('ignore:`tf.layers.dense` is deprecated')


def _numpy_input_fns():
  """tpu_fc's numpy_input_fn, and on the legacy lane TF 2.15's."""
  return [estimator_inputs.numpy_input_fn] + (
      [tf.compat.v1.estimator.inputs.numpy_input_fn] if lanes.LEGACY else [])


def _batches_of(input_fn, most=12):
  """(static shapes, batches) of what `input_fn()` gives until its input ends
  (at most `most` batches); a MonitoredSession starts TF's queue runners."""
  with tf.Graph().as_default():
    result = input_fn()
    shapes = tf.nest.map_structure(lambda tensor: tensor.shape.as_list(),
                                   result)
    batches = []
    with tf.compat.v1.train.MonitoredSession() as session:  # (ends quietly
      while len(batches) < most:                            # at OutOfRange)
        batches.append(session.run(result))
  return shapes, batches


def _assert_read(input_fn_builders, kwargs, expected_shapes, expected, ends):
  """The input_fn each builder makes of `kwargs` (not shuffling) gives
  tensors of `expected_shapes`, the batches `expected`, then (`ends`) the
  end of its input."""
  for builder in input_fn_builders:
    shapes, batches = _batches_of(  # (one more: the end of input)
        builder(shuffle=False, **kwargs), most=len(expected) + ends)
    assert shapes == expected_shapes, builder
    assert len(batches) == len(expected), builder
    for batch, want in zip(batches, expected):
      tf.nest.map_structure(np.testing.assert_array_equal, batch, want)


ROWS = 5
A = np.arange(ROWS, dtype=np.float64)
B = np.arange(ROWS * 2, dtype=np.int64).reshape(ROWS, 2) * 10
TARGET = np.arange(ROWS, dtype=np.int32) * -1


def _rows(indices):
  return ({'a': A[indices], 'b': B[indices]}, TARGET[indices])


@pytest.mark.parametrize('case', ['epochs', 'forever', 'array_and_dict'])
def test_numpy_input_fn_reads_as_tf_2_15(case):
  """Rows in order, `batch_size` at a time across epochs (the last batch
  short), a static batch only when reading forever; x's keys sorted; an
  array x gives one tensor, a dict y a dict (TF 2.15's own agrees)."""
  kwargs, expected_shapes, expected = {
      'epochs': (dict(x={'b': B, 'a': A}, y=TARGET, batch_size=2,
                      num_epochs=2),
                 ({'a': [None], 'b': [None, 2]}, [None]),
                 [_rows([0, 1]), _rows([2, 3]), _rows([4, 0]), _rows([1, 2]),
                  _rows([3, 4])]),
      'forever': (dict(x={'a': A, 'b': B}, y=TARGET, batch_size=3,
                       num_epochs=None),
                  ({'a': [3], 'b': [3, 2]}, [3]),
                  [_rows([0, 1, 2]), _rows([3, 4, 0]), _rows([1, 2, 3]),
                   _rows([4, 0, 1])]),
      'array_and_dict': (dict(x=B, y={'t': TARGET}, batch_size=4),
                         ([None, 2], {'t': [None]}),
                         [(B[:4], {'t': TARGET[:4]}),
                          (B[4:], {'t': TARGET[4:]})]),
  }[case]
  _assert_read(_numpy_input_fns(), kwargs, expected_shapes, expected,
               ends=case != 'forever')


def test_numpy_input_fn_shuffles_and_reads_per_thread_as_tf_2_15():
  """Shuffled, or read by 2 threads (each reading every epoch): every row as
  often as TF 2.15's gives it; TF's errors for bad arguments."""
  for numpy_input_fn in _numpy_input_fns():
    for kwargs, times in ((dict(shuffle=True, num_epochs=3,
                                queue_capacity=4), 3),
                          (dict(shuffle=False, num_epochs=1,
                                num_threads=2), 2)):
      _, batches = _batches_of(numpy_input_fn(
          {'a': A}, TARGET, batch_size=2, **kwargs))
      rows = sorted(np.concatenate([batch['a'] for batch, _ in batches]))
      assert rows == sorted(list(A) * times), (numpy_input_fn, kwargs)
      for batch, target in batches:  # the rows stay whole
        np.testing.assert_array_equal(target, -batch['a'])
  calls = [
      lambda fn: fn({'a': A}, shuffle=None),
      lambda fn: fn({'a': A}, TARGET[:3], shuffle=False)(),
      lambda fn: fn({'a': A}, {'a': TARGET}, shuffle=False)(),
      lambda fn: fn([1, 2], shuffle=False)(),
      lambda fn: fn({}, shuffle=False)(),
  ]
  expected = [
      (ValueError, 'shuffle must be provided and explicitly set as boolean '
       '(it is recommended to set it as True for training); got None'),
      (ValueError, 'Length of tensors in x and y is mismatched. All elements '
       'in x and y must have the same length.\nShapes in x: {\'a\': (5,)}\n'
       'Shapes in y: (3,)\n'),
      (ValueError, "1 duplicate keys are found in both x and y: {'a'}"),
      (TypeError, 'x must be a dict or array; got list'),
      (ValueError, 'x cannot be an empty dict'),
  ]
  for numpy_input_fn in _numpy_input_fns():
    with tf.Graph().as_default():
      assert [oracle.outcome(call, numpy_input_fn) for call in calls] == (
          expected)


def test_pandas_input_fn_without_pandas_fails_as_tf_2_15s(monkeypatch):
  """pandas is no dependency of tpu_fc (only of its tests): without it, TF
  2.15's TypeError (its text, `inputs/pandas_io.py`)."""
  monkeypatch.setitem(sys.modules, 'pandas', None)  # (import pandas fails)
  assert oracle.outcome(estimator_inputs.pandas_input_fn, None,
                        shuffle=False) == (
                            TypeError, 'pandas_input_fn should not be called '
                            'without pandas installed')


def _pandas_input_fns():
  """tpu_fc's pandas_input_fn, and on the legacy lane TF 2.15's."""
  return [estimator_inputs.pandas_input_fn] + (
      [tf.compat.v1.estimator.inputs.pandas_input_fn] if lanes.LEGACY else [])


INDEX = np.arange(100, 100 + ROWS)


def _frame(**columns):
  return pd.DataFrame(columns, index=INDEX)


def _frame_rows(indices):
  """The rows of `_frame(b=B[:, 0], a=A)` and TARGET."""
  return {'a': A[indices], 'b': B[indices, 0]}, TARGET[indices]


@pytest.mark.parametrize('case', ['series', 'frame', 'forever', 'no_target'])
def test_pandas_input_fn_reads_as_tf_2_15(case):
  """A DataFrame's rows in order, `batch_size` at a time in TF1 graph mode,
  as `numpy_input_fn` reads arrays (the index is not a feature); a Series
  target is a tensor, a DataFrame's a dict by its columns, also one named as
  a feature; none: features only (TF 2.15's own agrees)."""
  x = _frame(b=B[:, 0], a=A)
  kwargs, expected_shapes, expected = {
      'series': (dict(x=x, y=pd.Series(TARGET, index=INDEX), batch_size=2),
                 ({'a': [None], 'b': [None]}, [None]),
                 [_frame_rows([0, 1]), _frame_rows([2, 3]), _frame_rows([4])]),
      'frame': (dict(x=x, y=_frame(t=TARGET, a=TARGET * 2), batch_size=3),
                ({'a': [None], 'b': [None]}, {'t': [None], 'a': [None]}),
                [({'a': A[:3], 'b': B[:3, 0]},
                  {'t': TARGET[:3], 'a': TARGET[:3] * 2}),
                 ({'a': A[3:], 'b': B[3:, 0]},
                  {'t': TARGET[3:], 'a': TARGET[3:] * 2})]),
      'forever': (dict(x=x, y=pd.Series(TARGET, index=INDEX), batch_size=3,
                       num_epochs=None),
                  ({'a': [3], 'b': [3]}, [3]),
                  [_frame_rows([0, 1, 2]), _frame_rows([3, 4, 0]),
                   _frame_rows([1, 2, 3])]),
      'no_target': (dict(x=x, batch_size=4),
                    {'a': [None], 'b': [None]},
                    [{'a': A[:4], 'b': B[:4, 0]}, {'a': A[4:], 'b': B[4:, 0]}]),
  }[case]
  _assert_read(_pandas_input_fns(), kwargs, expected_shapes, expected,
               ends=case != 'forever')


def test_pandas_input_fn_shuffles_and_refuses_as_tf_2_15():
  """Shuffled (a queue_capacity of None: 4 times the rows), every row once
  per epoch with its target; TF 2.15's errors for bad arguments."""
  x = _frame(a=A)
  y = pd.Series(-A, index=INDEX)
  for pandas_input_fn in _pandas_input_fns():
    _, batches = _batches_of(pandas_input_fn(
        x, y, batch_size=2, shuffle=True, num_epochs=2, queue_capacity=None))
    rows = sorted(np.concatenate([batch['a'] for batch, _ in batches]))
    assert rows == sorted(list(A) * 2), pandas_input_fn
    for batch, target in batches:
      np.testing.assert_array_equal(target, -batch['a'])
  with_target = _frame(a=A, target=A)
  calls = [
      lambda fn: fn(x, y, shuffle=None),
      lambda fn: fn(x, y, shuffle=False, target_column=3),
      lambda fn: fn(with_target, y, shuffle=False),
      lambda fn: fn(x, pd.Series(-A), shuffle=False),
  ]
  expected = [
      (ValueError, 'shuffle must be provided and explicitly set as boolean '
       '(it is recommended to set it as True for training); got None'),
      (TypeError, 'target_column must be a string type'),
      (ValueError, 'Cannot use name target for target column: DataFrame '
       'already has a column with that name: {}'.format(with_target.columns)),
      (ValueError, 'Index for x and y are mismatched.\nIndex for x: {}\n'
       'Index for y: {}\n'.format(x.index, pd.RangeIndex(ROWS))),
  ]
  for pandas_input_fn in _pandas_input_fns():
    assert [oracle.outcome(call, pandas_input_fn) for call in calls] == (
        expected), pandas_input_fn


@pytest.mark.parametrize('use_tpu', [False, True], ids=['cpu', 'tpu'])
def test_a_tutorial_input_fn_of_numpy_arrays_trains_a_tpu_estimator(
    tmp_path, use_tpu):
  """`numpy_input_fn(x, y, shuffle=False)` wrapped for TPUEstimator's params:
  one epoch ends training (use_tpu=False), or, read forever (the static
  batch a TPU needs), an in-graph loop takes a new batch each step; the
  model trains as on the same batches from a Dataset."""
  with tpu_fc.legacy_names.installed():
    numpy_input_fn = tf.compat.v1.estimator.inputs.numpy_input_fn
  estimator = estimators.linear_estimator(tmp_path / 'numpy', use_tpu)
  estimator.train(lambda params: numpy_input_fn(
      X, Y, batch_size=params['batch_size'], shuffle=False,
      num_epochs=None if use_tpu else 1)(), max_steps=2 * N // BATCH)
  assert estimator.get_variable_value('global_step') == (
      2 * N // BATCH if use_tpu else N // BATCH)
  dataset = estimators.linear_estimator(tmp_path / 'dataset', use_tpu)
  dataset.train(inputs.linear,
                max_steps=estimator.get_variable_value('global_step'))
  np.testing.assert_allclose(estimator.get_variable_value('dense/kernel'),
                             dataset.get_variable_value('dense/kernel'),
                             rtol=1e-6)
