"""input_fns, and the features of each input kind.

The contract model's input (`IDS`, `contract_ids`, `contract_input_fn`): one
batch of ids, the same every step, as a SparseTensor, a RaggedTensor, a
dense Tensor or the tensors of an iterator's `get_next()`.
"""
import dataclasses
from typing import Any, Callable, Optional

import numpy as np

import tpu_fc
from tpu_fc._tf import tf

INPUT_KINDS = ('sparse', 'ragged', 'dense', 'iterator_tensors')
IDS = [[1], [2, 4], [3], [4, 5]]  # no id 0: dense ids drop it on the TPU


def contract_ids(kind):
  """IDS as `kind` ('dense': padded with -1, the padding every path drops)."""
  ragged = tf.ragged.constant(IDS, tf.int64)
  if kind == 'ragged':
    return ragged
  if kind == 'dense':
    return ragged.to_tensor(default_value=-1)
  return ragged.to_sparse()


def contract_input_fn(kind):
  """input_fn giving IDS as `kind`, every step (iterator_tensors: sparse ids
  as the tensors of an iterator's `get_next()`)."""

  def input_fn(params):
    del params
    features = {'ids': contract_ids(
        'sparse' if kind == 'iterator_tensors' else kind)}
    dataset = tf.data.Dataset.from_tensors((features, tf.zeros([len(IDS), 1])))
    dataset = dataset.repeat()
    if kind == 'iterator_tensors':
      return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    return dataset

  return input_fn





# The core Estimator's input: one batch of 2 examples, x = [1, 1], label 1.
ONES = np.ones([2, 2], np.float32)


def ones_x():
  """`ONES` as features['x'] and its first column as the label: a Dataset of
  one batch (a core Estimator's input_fn, without params)."""
  return tf.data.Dataset.from_tensor_slices(
      ({'x': ONES}, ONES[:, :1])).batch(2)


def contract_tensors(params):
  """The contract batch (sparse ids) as tensors, not a Dataset: one step per
  session.run."""
  del params
  return {'ids': contract_ids('sparse')}, tf.zeros([len(IDS), 1])

# Dense features: N examples of two numbers and a label (`linear`: features
# as one Tensor, in batches; `linear_batch`: the first batch as tensors, every
# step, so the emulated TPU runs one step per session.run).
N = 16
X = np.linspace(-1, 1, N * 2).astype(np.float32).reshape(N, 2)
Y = (X[:, :1] > 0).astype(np.float32)


def linear(params):
  return tf.data.Dataset.from_tensor_slices((X, Y)).repeat().batch(
      params['batch_size'], drop_remainder=True)


def linear_batch(params):
  return (tf.constant(X[:params['batch_size']]),
          tf.constant(Y[:params['batch_size']]))


def dense_x(params):
  """4 examples of features['x'], each labeled twice the sum of its x."""
  x = np.arange(8, dtype=np.float32).reshape(4, 2) / 8
  dataset = tf.data.Dataset.from_tensor_slices(
      ({'x': x}, 2 * x.sum(1, keepdims=True)))
  return dataset.repeat().batch(params['batch_size'], drop_remainder=True)


def weighted_ids(params):
  """Features 'ids1' and 'ids2' (the same ids of vocabulary 5) weighted by
  'values', 2 examples."""
  indices = ((0, 0), (0, 2), (1, 0), (1, 1))
  ids = tf.SparseTensor(indices, tf.constant((2, 1, 1, 0), tf.int64), (2, 5))
  weights = tf.SparseTensor(indices, (0.5, 1.0, 0.2, 0.0), (2, 5))
  features = {'ids1': ids, 'ids2': ids, 'values': weights}
  dataset = tf.data.Dataset.from_tensor_slices((features, np.zeros((2, 1))))
  return dataset.repeat().batch(params['batch_size'], drop_remainder=True)

# Two batches of an id and a number per example, a label each (an evaluation
# with steps=None ends after them); `ids_and_x_repeated` forever.
IDS_AND_X_EXAMPLES, IDS_AND_X_VOCABULARY = 8, 6


def ids_and_x(params):
  index = np.arange(IDS_AND_X_EXAMPLES)
  features = {
      'ids': ((index * 5 + 1) % IDS_AND_X_VOCABULARY)[:, None].astype(np.int64),
      'x': np.sin(index).astype(np.float32)[:, None]}
  labels = np.cos(index * 0.7).astype(np.float32)[:, None]
  dataset = tf.data.Dataset.from_tensor_slices((features, labels))
  return dataset.batch(params['batch_size'], drop_remainder=True)


def ids_and_x_repeated(params):
  return ids_and_x(params).repeat()


# The emulated TPU's user model (`models.user_model_fn`): features a user
# feeds, the entries each lookup sees, and their activations and gradients
# by hand.
VOCAB, DIM, BATCH, MAX_LENGTH = 6, 2, 4, 2  # MAX_LENGTH: max_sequence_length


@dataclasses.dataclass
class Feature:
  """One id feature.

  `raw`: [(example, position, id)] for sparse input, or a [BATCH, k] id list for
  dense input. `weights` (sparse only) makes it a weighted column.
  """
  key: str
  raw: Any
  dense: bool = False
  weights: Optional[list] = None
  combiner: str = 'mean'
  seq_len: int = 0
  width: int = 3

  @property
  def weight_key(self):
    return self.key + '_w' if self.weights else None

  @property
  def column_name(self):
    if self.weights:
      return '{0}_weighted_by_{0}_w_embedding'.format(self.key)
    return self.key + '_embedding'

  def categorical(self):
    if self.seq_len:
      return tf.feature_column.sequence_categorical_column_with_identity(self.key, VOCAB)
    column = tf.feature_column.categorical_column_with_identity(self.key, VOCAB)
    if self.weights:
      column = tf.feature_column.weighted_categorical_column(column, self.weight_key)
    return column

  def column(self, init, **kwargs):
    return tpu_fc.embedding_column(
        self.categorical(), DIM, combiner=self.combiner,
        initializer=tf.compat.v1.constant_initializer(init), max_sequence_length=self.seq_len,
        **kwargs)

  def entries(self, tpu=True):
    """[(example, position, id, weight)] that are looked up."""
    if self.dense:
      # TPU: dense ids are enqueued through tf.where(x) -> id 0 is dropped;
      # CPU: the identity column drops -1 only.
      return [(b, j, i, 1.0) for b, row in enumerate(self.raw)
              for j, i in enumerate(row) if (i != 0 if tpu else i >= 0)]
    weights = self.weights or [1.0] * len(self.raw)
    return [(b, j, i, w) for (b, j, i), w in zip(self.raw, weights)]

  def tensors(self):
    if self.dense:
      return {self.key: tf.constant(np.array(self.raw, np.int64))}
    indices = [[b, j] for b, j, _ in self.raw]
    out = {self.key: tf.SparseTensor(
        indices, tf.constant([i for _, _, i in self.raw], tf.int64),
        [BATCH, self.width])}
    if self.weights:
      out[self.weight_key] = tf.SparseTensor(
          indices, tf.constant(self.weights, tf.float32), [BATCH, self.width])
    return out

  def _norms(self, entries):
    norms = np.ones(BATCH, np.float32)
    for b in range(BATCH):
      w = np.array([e[3] for e in entries if e[0] == b], np.float32)
      if self.combiner == 'mean' and w.size:
        norms[b] = w.sum()
      elif self.combiner == 'sqrtn' and w.size:
        norms[b] = np.sqrt((w * w).sum())
    return norms

  def activation(self, table, tpu=True):
    """[BATCH, DIM] (or [BATCH, MAX_LENGTH, DIM] for a sequence feature) by hand."""
    entries = self.entries(tpu)
    if self.seq_len:
      out = np.zeros((BATCH, self.seq_len, DIM), np.float32)
      for b, j, i, _ in entries:
        if j < self.seq_len:
          out[b, j] = table[i]
      return out
    out = np.zeros((BATCH, DIM), np.float32)
    norms = self._norms(entries)
    for b, _, i, w in entries:
      out[b] += w * table[i] / norms[b]
    return out

  def row_grads(self, dact, tpu=True):
    """(ids, examples, grads) of every looked-up entry; grads by the chain rule."""
    entries = self.entries(tpu)
    ids, examples, grads = [], [], []
    if self.seq_len:
      for b, j, i, _ in entries:
        if j < self.seq_len:
          ids.append(i)
          examples.append(b)
          grads.append(dact[b, j])
    else:
      norms = self._norms(entries)
      for b, _, i, w in entries:
        ids.append(i)
        examples.append(b)
        grads.append(dact[b] * w / norms[b])
    return ids, examples, np.array(grads, np.float32).reshape(-1, DIM)


# Fixed data: duplicates inside and across examples, an empty example (2), id 0
# (a real id when sparse, dropped when dense on the TPU), gaps in positions.
A_SP = [(0, 0, 1), (0, 1, 3), (0, 2, 1), (1, 0, 5), (1, 2, 0), (3, 0, 3),
        (3, 1, 4)]
A_W = [0.5, 2.0, 1.5, 1.0, 3.0, 0.25, 2.0]
B_SP = [(0, 0, 2), (1, 0, 3), (1, 1, 3), (2, 0, 1), (3, 0, 5)]
D_DENSE = [[2, 0, 2], [0, 0, 0], [5, 1, 0], [3, 4, 0]]
# Sequence ids: id 1 only at position 2 >= MAX_LENGTH (truncated, never looked up).
S_SP = [(0, 0, 2), (0, 1, 5), (0, 2, 1), (1, 0, 4), (3, 0, 0), (3, 1, 3)]


def coefficients(seed, *shape):
  """The fixed d(loss)/d(out) per example: distinct, signed, non-trivial."""
  rng = np.random.RandomState(seed)
  return rng.uniform(-2.0, 2.0, (BATCH,) + shape).round(2).astype(np.float32)


def input_fn(feats, c=None, cs=None, repeat=None):
  """The same fixed global batch, `repeat` times (None: forever)."""

  def input_fn(params):
    del params
    features = {}
    for feat in feats:
      features.update(feat.tensors())
    if c is not None:
      features['c'] = tf.constant(c)
    if cs is not None:
      features['cs'] = tf.constant(cs)
    dataset = tf.data.Dataset.from_tensors((features, tf.zeros([BATCH, 1])))
    return dataset.repeat(repeat)

  return input_fn

# The engine's features (tests of `lookup.host_engine` and `mid_level`): a
# feature's ids of one input kind (`Ids`) and the feature with its column
# (`Feat`); `oracle.np_activation` looks them up by hand.
ENGINE_VOCAB, ENGINE_DIM, ENGINE_BATCH = 7, 3, 4


@dataclasses.dataclass
class Ids:
  """One feature's ids of one input kind (and optional weights).

  `kind`: 'sparse' (`raw` = [(example, position, id)], with `width`), 'ragged'
  (`raw` = list of id lists) or 'dense' (`raw` = [batch, k] ids, 0 =
  padding).
  `weights`: aligned with `raw` (a flat list for sparse, lists for ragged).
  """
  kind: str
  raw: Any
  weights: Any = None
  width: int = 4

  def entries(self):
    """[(example, position, id, weight)]: what the TPU looks up.

    Negative ids are padding, dropped with their weights (the engine's rule,
    as in TF's safe embedding lookups).
    """
    return [e for e in self._all_entries() if e[2] >= 0]

  def _all_entries(self):
    if self.kind == 'sparse':
      weights = self.weights or [1.0] * len(self.raw)
      return [(b, j, i, w) for (b, j, i), w in zip(self.raw, weights)]
    if self.kind == 'ragged':
      weights = self.weights or [[1.0] * len(row) for row in self.raw]
      return [(b, j, i, w) for b, (row, row_w) in enumerate(zip(self.raw, weights))
              for j, (i, w) in enumerate(zip(row, row_w))]
    assert self.weights is None
    return [(b, j, i, 1.0) for b, row in enumerate(self.raw)
            for j, i in enumerate(row) if i != 0]  # tf.where(x): id 0 dropped

  def ids_tensor(self, dtype=tf.int64):
    if self.kind == 'sparse':
      return tf.SparseTensor([[b, j] for b, j, _ in self.raw],
                             tf.constant([i for _, _, i in self.raw], dtype),
                             [ENGINE_BATCH, self.width])
    if self.kind == 'ragged':
      return tf.RaggedTensor.from_row_lengths(
          tf.constant([i for row in self.raw for i in row], dtype),
          [len(row) for row in self.raw])
    return tf.constant(np.array(self.raw), dtype)

  def weights_tensor(self):
    if self.kind == 'sparse':
      return tf.SparseTensor([[b, j] for b, j, _ in self.raw],
                             tf.constant(self.weights, tf.float32),
                             [ENGINE_BATCH, self.width])
    assert self.kind == 'ragged'
    return tf.RaggedTensor.from_row_lengths(
        tf.constant([w for row in self.weights for w in row], tf.float32),
        [len(row) for row in self.weights])


# Duplicates inside and across examples, empty examples, id 0 (kept when sparse
# or ragged, dropped when dense), a gap in the sparse positions.
SPARSE = Ids('sparse', [(0, 0, 3), (0, 2, 0), (1, 0, 5), (1, 1, 1), (1, 2, 5),
                        (3, 1, 2), (3, 2, 3)],
             weights=[0.5, 2.0, 1.0, -0.5, 1.5, 3.0, 0.25])
RAGGED = Ids('ragged', [[1, 1, 4], [], [0, 6], [6, 2]],
             weights=[[0.5, 1.5, 2.0], [], [1.0, -2.0], [0.25, 4.0]])
DENSE = Ids('dense', [[3, 0, 3], [0, 0, 0], [5, 1, 0], [2, 6, 4]])
# One id per example, in example order (the engine's shortcut: no pooling);
# id 3 twice, id 0 kept.
ONE_HOT = Ids('sparse', [(0, 0, 3), (1, 0, 5), (2, 0, 3), (3, 0, 0)], width=1)
INPUTS = {'sparse': SPARSE, 'ragged': RAGGED, 'dense': DENSE,
          'one_hot': ONE_HOT}

# L = 2: example 0 is truncated (ids 5 and 6 only at positions >= 2), example 1
# has a hole at position 0, example 2 is empty, example 3 has length 1.
SEQUENCE_SPARSE = Ids('sparse', [(0, 0, 3), (0, 1, 1), (0, 2, 5), (0, 3, 6),
                                 (1, 1, 2), (3, 0, 4)], width=4)
SEQUENCE_RAGGED = Ids('ragged', [[2], [4, 4, 1], [], [3, 2]])


def unweighted(ids):
  return dataclasses.replace(ids, weights=None)


@dataclasses.dataclass
class Feat:
  """The numpy model of one feature (and how to build its column)."""
  name: str
  ids: Ids
  combiner: str = 'mean'
  seq_len: int = 0
  weighted: bool = False
  dim: int = ENGINE_DIM
  seed: int = 0
  learning_rate_fn: Optional[Callable] = None

  @property
  def weight_key(self):
    return self.name + '_w' if self.weighted else None

  def init(self):
    return np.random.RandomState(100 + self.seed).uniform(
        -1, 1, (ENGINE_VOCAB, self.dim)).astype(np.float32)

  def dy(self):
    shape = ((ENGINE_BATCH, self.seq_len, self.dim) if self.seq_len else
             (ENGINE_BATCH, self.dim))
    return np.random.RandomState(200 + self.seed).standard_normal(
        shape).astype(np.float32)

  def column(self):
    if self.seq_len:
      categorical = tf.feature_column.sequence_categorical_column_with_identity(self.name, ENGINE_VOCAB)
    else:
      categorical = tf.feature_column.categorical_column_with_identity(self.name, ENGINE_VOCAB)
    if self.weighted:
      categorical = tf.feature_column.weighted_categorical_column(categorical, self.weight_key)
    return tpu_fc.embedding_column(
        categorical, self.dim, combiner=self.combiner,
        initializer=tf.compat.v1.constant_initializer(self.init()),
        max_sequence_length=self.seq_len,
        learning_rate_fn=self.learning_rate_fn)

  def inputs(self):
    values = {self.name: self.ids.ids_tensor()}
    if self.weighted:
      values[self.weight_key] = self.ids.weights_tensor()
    return values

  def entries(self):
    entries = self.ids.entries()
    if not self.weighted:
      entries = [(b, j, i, 1.0) for b, j, i, _ in entries]
    return entries
