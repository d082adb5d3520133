"""Embedding lookup statistics for `EmbeddingConfigSpec.profile_data_directory`.

On a TPU the engine profiles a small fraction of its inputs and saves per-table
statistics that TPU initialization reads to partition the tables over hosts.
Here `LookupProfileHook` measures the same inputs on the host, every
`every_n_steps` steps, and writes them as `<directory>/<table>.json`:

* ids per example and unique ids per batch: the lookup and gather volume of a
  table, i.e. what a step costs it and how much de-duplication saves;
* the hottest ids: rows worth replicating rather than sharding;
* the share of the looked-up ids that each of `num_hosts` hosts would serve if
  the table's rows were split over them with TF's 'div' rule: the load
  imbalance that rows-in-order partitioning would cause.

The numbers inform table partitioning and load-balance decisions; nothing in
tpu_fc reads them back.
"""
import json
import os
import uuid

import numpy as np

from tpu_fc._tf import tf


def div_hosts(ids, vocabulary_size, num_hosts):
  """The host of each id when `vocabulary_size` rows are split the 'div' way.

  TF's rule (`tf.compat.v1.nn.embedding_lookup`, partition_strategy='div'):
  contiguous row ranges, the first `rows % num_hosts` one row longer.  The
  vocabulary is padded to `num_hosts` rows, as the legacy engine pads it.
  """
  per_host, extras = divmod(max(vocabulary_size, num_hosts), num_hosts)
  return np.maximum(ids // (per_host + 1), (ids - extras) // per_host)


class _TableProfile:
  """Running statistics of one table, in numpy.

  Hot-id counts are kept for at most `max_tracked_ids` ids (the most frequent
  after every merge), so memory stays bounded; an id evicted and seen again
  restarts from zero, which only matters for ids outside the hottest few thousand.
  """

  def __init__(self, table, feature_names, num_hosts, max_tracked_ids):
    self.table = table
    self.feature_names = feature_names
    self.num_hosts = num_hosts
    self.max_tracked_ids = max_tracked_ids
    self.steps = 0
    self.examples = 0
    self.ids = 0
    self.unique_ids = 0
    self.hot_ids = np.zeros([0], np.int64)
    self.hot_counts = np.zeros([0], np.int64)
    self.host_ids = np.zeros([num_hosts], np.int64)

  def add(self, ids, examples):
    ids = np.asarray(ids, np.int64).reshape([-1])
    unique, counts = np.unique(ids, return_counts=True)
    self.steps += 1
    self.examples += int(examples)
    self.ids += ids.size
    self.unique_ids += unique.size
    self.host_ids += np.bincount(
        div_hosts(ids, self.table.vocabulary_size, self.num_hosts),
        minlength=self.num_hosts)
    merged, inverse = np.unique(np.concatenate([self.hot_ids, unique]),
                                return_inverse=True)
    totals = np.bincount(inverse.reshape([-1]),
                         weights=np.concatenate([self.hot_counts, counts]))
    keep = _hottest(merged, totals, self.max_tracked_ids)
    self.hot_ids, self.hot_counts = merged[keep], totals[keep].astype(np.int64)

  def as_json(self, top_k):
    top = _hottest(self.hot_ids, self.hot_counts, top_k)
    return {
        'table': self.table.name,
        'features': list(self.feature_names),
        'vocabulary_size': self.table.vocabulary_size,
        'steps_profiled': self.steps,
        'examples': self.examples,
        'ids': self.ids,
        'unique_ids': self.unique_ids,
        'ids_per_example': self.ids / self.examples if self.examples else 0.0,
        'unique_ids_per_batch': self.unique_ids / self.steps if self.steps else 0.0,
        'hot_ids': [[int(i), int(c)] for i, c in
                    zip(self.hot_ids[top], self.hot_counts[top])],
        'partition_strategy': 'div',
        'num_hosts': self.num_hosts,
        'host_ids': [int(c) for c in self.host_ids],
        'host_shares': [float(c) / self.ids if self.ids else 0.0
                        for c in self.host_ids],
    }


def _hottest(ids, counts, k):
  """Indices of the `k` largest counts; ties go to the smaller id."""
  return np.lexsort((ids, -counts))[:k]


def _write_json(directory, name, payload):
  """Writes `<directory>/<name>.json` atomically (temp file, then rename)."""
  path = os.path.join(directory, name + '.json')
  temporary = '{}.tmp-{}'.format(path, uuid.uuid4().hex)
  with tf.io.gfile.GFile(temporary, 'w') as f:
    f.write(json.dumps(payload, indent=2, sort_keys=True))
  tf.io.gfile.rename(temporary, path, overwrite=True)


class LookupProfileHook(tf.compat.v1.train.SessionRunHook):
  """Profiles the engine's lookups every `every_n_steps` runs into `directory`.

  `statistics` is `LookupStep.statistics()` of the graph the
  session runs; the ids are fetched with the step's own run (no extra input is
  consumed).  The files are rewritten after every profiled step, so a killed run
  still leaves them, and at `end()`.
  """

  def __init__(self, statistics, layout, directory, num_hosts=1,
               every_n_steps=100, top_k=10, max_tracked_ids=4096):
    if num_hosts < 1 or every_n_steps < 1 or top_k < 0 or max_tracked_ids < top_k:
      raise ValueError(
          'LookupProfileHook needs num_hosts >= 1, every_n_steps >= 1 and '
          '0 <= top_k <= max_tracked_ids; got num_hosts={}, every_n_steps={}, '
          'top_k={}, max_tracked_ids={}.'.format(num_hosts, every_n_steps, top_k,
                                                 max_tracked_ids))
    self._fetches = statistics
    self._profiles = {
        name: _TableProfile(layout.table(name),
                            [f.name for f in layout.features_of(name)],
                            num_hosts, max_tracked_ids)
        for name in statistics}
    self._directory = directory
    self._every_n_steps = every_n_steps
    self._top_k = top_k
    self._runs = 0

  def begin(self):
    tf.io.gfile.makedirs(self._directory)

  def before_run(self, run_context):
    del run_context  # Unused.
    profile = self._runs % self._every_n_steps == 0
    self._runs += 1
    return tf.compat.v1.train.SessionRunArgs(self._fetches) if profile else None

  def after_run(self, run_context, run_values):
    del run_context  # Unused.
    if run_values.results is None:
      return
    for name, values in run_values.results.items():
      self._profiles[name].add(values['ids'], values['examples'])
    self._write()

  def end(self, session):
    del session  # Unused.
    self._write()

  def _write(self):
    for name, profile in self._profiles.items():
      if profile.steps:
        _write_json(self._directory, name, profile.as_json(self._top_k))
