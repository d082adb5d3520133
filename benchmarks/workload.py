"""The synthetic Criteo-like workload: sizes, ids, dense features, labels (numpy only).

Every worker process rebuilds the same batches from the same `Workload` (the seed
is part of it), so all paths of one run train on identical data.
"""
import dataclasses

import numpy as np

# Criteo Terabyte (MLPerf DLRM) cardinalities of the 26 categorical features.
CRITEO_VOCABULARIES = (
    39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951,
    2953546, 403346, 10, 2208, 11938, 155, 4, 976, 14, 39979771, 25641295,
    39664984, 585935, 12972, 108, 36)
NUM_DENSE = 13
FLOAT_BYTES = 4
ID_BYTES = 8
_SCATTER_PRIME = 2654435761  # ranks -> ids: hot ids spread over the table


@dataclasses.dataclass(frozen=True)
class Workload:
  """One training workload; `vocabularies` overrides the capped Criteo sizes."""
  dim: int = 16
  distribution: str = 'zipf'      # 'zipf' or 'uniform'
  ids_per_feature: int = 1        # 1: one-hot; k > 1: multi-hot, 1..2k-1 ids
  vocabulary_cap: int = 1_000_000
  batch_size: int = 4096
  num_batches: int = 16           # distinct batches, cycled
  zipf_alpha: float = 1.05
  seed: int = 0
  vocabularies: tuple = ()

  @property
  def name(self):
    hot = ('one-hot' if self.ids_per_feature == 1 else
           'multi-hot{}'.format(self.ids_per_feature))
    return '{}/{}/dim{}'.format(self.distribution, hot, self.dim)

  @property
  def table_sizes(self):
    if self.vocabularies:
      return tuple(self.vocabularies)
    return tuple(min(v, self.vocabulary_cap) for v in CRITEO_VOCABULARIES)

  @property
  def feature_names(self):
    return tuple('cat_{:02d}'.format(i) for i in range(len(self.table_sizes)))

  @property
  def table_bytes(self):
    return sum(self.table_sizes) * self.dim * FLOAT_BYTES

  @property
  def max_ids_per_example(self):
    return 2 * self.ids_per_feature - 1


def _zipf_ranks(rng, vocabulary, alpha, size):
  """Ranks 0..vocabulary-1 drawn from a Zipf(alpha) law truncated at the vocabulary."""
  weights = np.arange(1, vocabulary + 1, dtype=np.float64) ** -alpha
  cdf = np.cumsum(weights)
  cdf /= cdf[-1]
  return np.minimum(np.searchsorted(cdf, rng.uniform(size=size)),
                    vocabulary - 1)


def _draw_ids(rng, workload, vocabulary, size):
  if workload.distribution == 'uniform':
    return rng.randint(0, vocabulary, size=size).astype(np.int64)
  if workload.distribution != 'zipf':
    raise ValueError('Unknown id distribution {!r} (zipf or uniform).'.format(
        workload.distribution))
  ranks = _zipf_ranks(rng, vocabulary, workload.zipf_alpha, size)
  return (ranks.astype(np.int64) * _SCATTER_PRIME) % vocabulary


@dataclasses.dataclass
class SparseIds:
  """One feature's ids over all batches: a [num_batches, batch, max_ids] SparseTensor."""
  indices: np.ndarray   # [nnz, 3] int64
  values: np.ndarray    # [nnz] int64
  dense_shape: tuple

  def batch_values(self, batch):
    return self.values[self.indices[:, 0] == batch]


def make_data(workload):
  """(ids: {feature: SparseIds}, dense [nb, B, 13] float32, labels [nb, B, 1])."""
  rng = np.random.RandomState(workload.seed)
  nb, batch = workload.num_batches, workload.batch_size
  width = workload.max_ids_per_example
  ids = {}
  for feature, vocabulary in zip(workload.feature_names, workload.table_sizes):
    if width == 1:
      lengths = np.ones((nb, batch), np.int64)
    else:
      lengths = rng.randint(1, width + 1, size=(nb, batch))
    position = np.arange(width)[None, None, :]
    present = position < lengths[:, :, None]
    indices = np.argwhere(present).astype(np.int64)
    values = _draw_ids(rng, workload, vocabulary, len(indices))
    ids[feature] = SparseIds(indices, values, (nb, batch, width))
  dense = np.log1p(rng.lognormal(1.0, 1.5, size=(nb, batch, NUM_DENSE)))
  first_ids = np.stack(
      [s.values[s.indices[:, 2] == 0].reshape(nb, batch) for s in ids.values()],
      axis=-1)
  score = 0.3 * dense[:, :, 0] - 0.5 + 0.4 * ((first_ids[:, :, 0] % 7) == 0)
  labels = rng.uniform(size=(nb, batch)) < 1.0 / (1.0 + np.exp(-score))
  return ids, dense.astype(np.float32), labels.astype(np.float32)[:, :, None]


def traffic_per_step(workload, ids):
  """Bytes one training step must move at least, averaged over the batches.

  Per table: each unique row is read once for the lookup, and its row and
  Adagrad accumulator are read and written once by the update (5 row
  transfers); each id is read once; the [batch, dim] activation is written and
  its gradient read once.  The MLP is not counted.
  """
  nb, batch = workload.num_batches, workload.batch_size
  total = 0.0
  unique_rows = 0.0
  for sparse in ids.values():
    for b in range(nb):
      values = sparse.batch_values(b)
      unique = len(np.unique(values))
      unique_rows += unique / nb
      total += (5 * unique * workload.dim * FLOAT_BYTES +
                len(values) * ID_BYTES) / nb
    total += 2 * batch * workload.dim * FLOAT_BYTES
  return {'bytes_per_step': total, 'bytes_per_example': total / batch,
          'unique_rows_per_step': unique_rows,
          'lookups_per_step': sum(len(s.values) for s in ids.values()) / nb}
