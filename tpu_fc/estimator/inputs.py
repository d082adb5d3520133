"""`tf.compat.v1.estimator.inputs`: input functions over numpy arrays and pandas
DataFrames, as TF 2.15 gave them (tensorflow_estimator's `numpy_io.py` and
`pandas_io.py`), for TF versions without them.

TF fed the rows through a queue filled by `num_threads` Python threads, each
reading the data `num_epochs` times from a start (random when shuffling), in
`batch_size` rows at a time, through a `RandomShuffleQueue` of
`queue_capacity` when shuffling.  Here a `tf.data` pipeline takes the rows
the same way (the threads' reads interleaved `batch_size` rows at a time,
shuffled in a buffer of `queue_capacity`) and the input function returns the
tensors of its iterator's `get_next()`, as TF returned its queue's dequeue:
with no `num_epochs`, batches of `batch_size` (a static batch, across the
epochs); else of up to `batch_size`, the last one short, then the end of
input.  The rows are read from the arrays as TF's feeding did, in Python, so
the arrays are not copied into the graph.  TF's queue-filling summary is not
written.
"""
import collections
import random
import uuid

import numpy as np

from tpu_fc._tf import tf

# The key under which a target array travels with the features (TF's).
_TARGET_KEY = '__target_key__'


def _ordered_features(x):
  """`x` (an array or dict of arrays) as an OrderedDict sorted by key."""
  if isinstance(x, dict):
    if not x:
      raise ValueError('x cannot be an empty dict')
    return collections.OrderedDict(sorted(x.items(), key=lambda t: t[0]))
  if isinstance(x, np.ndarray):
    if x.size == 0:
      raise ValueError('x cannot be an empty array')
    return collections.OrderedDict({'__direct_np_input__': x})
  raise TypeError('x must be a dict or array; got {}'.format(type(x).__name__))


def _check_shuffle(shuffle):
  if not isinstance(shuffle, bool):
    raise ValueError('shuffle must be provided and explicitly set as boolean '
                     '(it is recommended to set it as True for training); '
                     'got {}'.format(shuffle))


def _warn_of_threads(shuffle, num_threads, num_epochs):
  """TF's warnings for several feeding threads."""
  if num_threads > 1 and num_epochs is not None:
    tf.compat.v1.logging.warn(
        'enqueue_data was called with num_epochs and num_threads > 1. '
        'num_epochs is applied per thread, so this will produce more '
        'epochs than you probably intend. '
        'If you want to limit epochs, use one thread.')
  if shuffle and num_threads > 1 and num_epochs is not None:
    tf.compat.v1.logging.warn(
        'enqueue_data was called with shuffle=True, num_threads > 1, and '
        'num_epochs. This will create multiple threads, all reading the '
        'array/dataframe in order adding to the same shuffling queue; the '
        'results will likely not be sufficiently shuffled.')
  if not shuffle and num_threads > 1:
    tf.compat.v1.logging.warn(
        'enqueue_data was called with shuffle=False and num_threads > 1. '
        'This will create multiple threads, all reading the '
        'array/dataframe in order. If you want examples read in order, use'
        ' one thread; if you want multiple threads, enable shuffling.')


def _batches(data, batch_size, num_epochs, shuffle, capacity, num_threads):
  """{name: batch tensor} of the rows of `data` (an OrderedDict of arrays of
  one length), taken as TF's feeding queue gave them (see module)."""
  _warn_of_threads(shuffle, num_threads, num_epochs)
  columns = list(data.values())
  length = len(columns[0])
  starts = [random.Random().randrange(length) if shuffle else 0
            for _ in range(num_threads)]

  def thread_rows(start):
    return tf.data.Dataset.range(length).repeat(num_epochs).map(
        lambda row: (row + start) % length)

  rows = tf.data.Dataset.from_tensor_slices(np.array(starts, np.int64))
  rows = rows.interleave(thread_rows, cycle_length=num_threads,
                         block_length=batch_size)
  if shuffle:
    rows = rows.shuffle(capacity)
  rows = rows.batch(batch_size, drop_remainder=num_epochs is None)
  dtypes = [tf.as_dtype(column.dtype) for column in columns]

  def read(indices):
    values = tf.numpy_function(
        lambda indices: [column[indices] for column in columns], [indices],
        dtypes, stateful=False)
    for value, column in zip(values, columns):
      value.set_shape(indices.shape.concatenate(column.shape[1:]))
    return dict(zip(data, values))

  batch = rows.map(read)
  return tf.compat.v1.data.make_one_shot_iterator(batch).get_next()


def numpy_input_fn(x,
                   y=None,
                   batch_size=128,
                   num_epochs=1,
                   shuffle=None,
                   queue_capacity=1000,
                   num_threads=1):
  """An input_fn giving batches of the rows of numpy arrays (TF 2.15's).

  Args:
    x: an array (the features as one tensor) or a dict of arrays.
    y: an array (the target), a dict of arrays, or None (features only).
    batch_size: rows per batch.
    num_epochs: times the data is read (per thread); None: forever.
    shuffle: whether to read in random order; must be given.
    queue_capacity: the rows shuffled together.
    num_threads: readers of the data, each reading it `num_epochs` times.

  Returns:
    `() -> features` or `() -> (features, target)`, dicts where x (y) was one.
  """
  _check_shuffle(shuffle)

  def input_fn():
    data = _ordered_features(x)
    feature_keys = list(data)
    if y is None:
      target_keys = None
    elif isinstance(y, dict):
      if not y:
        raise ValueError('y cannot be empty dict, use None instead.')
      ordered_y = collections.OrderedDict(sorted(y.items(), key=lambda t: t[0]))
      target_keys = list(ordered_y)
      duplicate_keys = set(feature_keys) & set(target_keys)
      if duplicate_keys:
        raise ValueError('{} duplicate keys are found in both x and y: '
                         '{}'.format(len(duplicate_keys), duplicate_keys))
      data.update(ordered_y)
    else:
      target_keys = _TARGET_KEY
      while target_keys in data:
        target_keys += '_n'
      data[target_keys] = y

    def of_y(values):
      """The target's entries of `values` (by key): one, or a dict as y."""
      if isinstance(target_keys, str):
        return values[target_keys]
      return {key: values[key] for key in target_keys}

    if len(set(value.shape[0] for value in data.values())) != 1:
      shapes = {key: value.shape for key, value in data.items()}
      raise ValueError('Length of tensors in x and y is mismatched. All '
                       'elements in x and y must have the same length.\n'
                       'Shapes in x: {}\n'
                       'Shapes in y: {}\n'.format(
                           {key: shapes[key] for key in feature_keys},
                           None if y is None else of_y(shapes)))
    batch = _batches(data, batch_size, num_epochs, shuffle, queue_capacity,
                     num_threads)
    features = (batch[feature_keys[0]] if isinstance(x, np.ndarray) else
                {key: batch[key] for key in feature_keys})
    if y is None:
      return features
    return features, of_y(batch)

  return input_fn


def pandas_input_fn(x,
                    y=None,
                    batch_size=128,
                    num_epochs=1,
                    shuffle=None,
                    queue_capacity=1000,
                    num_threads=1,
                    target_column='target'):
  """An input_fn giving batches of a pandas DataFrame's rows (TF 2.15's):
  `numpy_input_fn`'s reading of its columns; `y` (a Series or DataFrame whose
  index matches x's) is the target, named `target_column` in x's rows; a
  `queue_capacity` of None is x's length (4 times it when shuffling)."""
  try:
    import pandas as pd  # pylint: disable=g-import-not-at-top
  except ImportError:
    raise TypeError('pandas_input_fn should not be called without pandas '
                    'installed') from None
  _check_shuffle(shuffle)
  if not isinstance(target_column, str):
    raise TypeError('target_column must be a string type')
  x = x.copy()
  if y is not None:
    if target_column in x:
      raise ValueError(
          'Cannot use name %s for target column: DataFrame already has a '
          'column with that name: %s' % (target_column, x.columns))
    if not np.array_equal(x.index, y.index):
      raise ValueError('Index for x and y are mismatched.\nIndex for x: %s\n'
                       'Index for y: %s\n' % (x.index, y.index))
    if isinstance(y, pd.DataFrame):
      # each made unique among x's columns, as TF makes it
      y_columns = [(column, '{}_{}'.format(column, uuid.uuid4())
                    if column in x else column) for column in list(y)]
      target_column = [name for _, name in y_columns]
    x[target_column] = y
  if queue_capacity is None:
    queue_capacity = 4 * len(x) if shuffle else len(x)

  def input_fn():
    data = collections.OrderedDict(
        (column, x[column].values) for column in x.columns)
    features = dict(_batches(data, batch_size, num_epochs, shuffle,
                             queue_capacity, num_threads))
    if y is None:
      return features
    if isinstance(target_column, list):
      return features, {key: features.pop(name) for key, name in y_columns}
    return features, features.pop(target_column)

  return input_fn
