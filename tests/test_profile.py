"""tpu_fc.lookup.profile.LookupProfileHook against numpy-derived statistics, both lanes.

Known ids are fed to a real `EmbeddingCoreBackend` graph through sparse
placeholders and a `SingularMonitoredSession` runs the hook; every expected
number is recomputed here from the fed ids (padding -1 dropped): ids per example,
unique ids per batch, hottest ids (ties to the smaller id) and, for the 'div'
host shares, explicit row ranges checked against TF's own partitioner and
`embedding_lookup(partition_strategy='div')`.
"""
import collections
import json
import os

import numpy as np
import pytest

import tpu_fc
from tpu_fc.lookup.backends import EmbeddingCoreBackend
from tpu_fc.lookup.profile import LookupProfileHook
from tpu_fc.lookup.profile import div_hosts
import tensorflow as tf  # pylint: disable=g-bad-import-order  (after tpu_fc)

fc = tf.feature_column
VOCAB, DIM, BATCH, WIDTH = 11, 2, 4, 3
# Row ranges of an 11-row table under 'div': the first 11 % n hosts get one more.
HOST_BOUNDS = {2: [0, 6, 11], 3: [0, 4, 8, 11]}


def random_rows(rng):
  """BATCH id lists (skewed towards small ids, some -1 padding, some empty)."""
  weights = 1.0 / np.arange(1, VOCAB + 1)
  rows = []
  for _ in range(BATCH):
    ids = rng.choice(VOCAB, size=rng.randint(0, WIDTH + 1), p=weights / weights.sum())
    rows.append([-1 if rng.rand() < 0.15 else int(i) for i in ids])
  return rows


def sparse_value(rows):
  indices = [[b, j] for b, row in enumerate(rows) for j in range(len(row))]
  values = [i for row in rows for i in row]
  return tf.compat.v1.SparseTensorValue(
      np.array(indices, np.int64).reshape([-1, 2]), np.array(values, np.int64),
      np.array([BATCH, WIDTH], np.int64))


def expected_profile(steps, num_hosts, top_k):
  """The statistics of the profiled steps, each a list of BATCH id lists per feature."""
  per_step = [[i for rows in features for row in rows for i in row if i >= 0]
              for features in steps]
  ids = [i for step in per_step for i in step]
  counts = collections.Counter(ids)
  hot = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:top_k]
  bounds = HOST_BOUNDS[num_hosts]
  host_ids = [sum(bounds[p] <= i < bounds[p + 1] for i in ids)
              for p in range(num_hosts)]
  return {
      'steps_profiled': len(steps),
      'examples': BATCH * len(steps),
      'ids': len(ids),
      'unique_ids': sum(len(set(step)) for step in per_step),
      'ids_per_example': len(ids) / (BATCH * len(steps)),
      'unique_ids_per_batch': np.mean([len(set(step)) for step in per_step]),
      'hot_ids': [list(kv) for kv in hot],
      'num_hosts': num_hosts,
      'host_ids': host_ids,
      'host_shares': [c / len(ids) for c in host_ids],
  }


def check_profile(path, expected, features):
  with open(path) as f:
    got = json.load(f)
  assert got['features'] == features
  assert got['vocabulary_size'] == VOCAB
  assert got['partition_strategy'] == 'div'
  for key in ('steps_profiled', 'examples', 'ids', 'unique_ids', 'hot_ids',
              'num_hosts', 'host_ids'):
    assert got[key] == expected[key], key
  for key in ('ids_per_example', 'unique_ids_per_batch', 'host_shares'):
    np.testing.assert_allclose(got[key], expected[key], rtol=1e-12, err_msg=key)


def run_profiled(columns, feature_names, steps, directory, after_first_step=None,
                 **hook_kwargs):
  """Feeds `steps` (per step, per feature, BATCH id lists) with the hook attached."""
  with tf.Graph().as_default():
    params = tpu_fc.AdagradParameters(0.1)
    spec = tpu_fc.EmbeddingConfigSpec(feature_columns=columns,
                                      optimization_parameters=params)
    layout = spec.embedding_layout()
    engine = EmbeddingCoreBackend(spec, spec.embedding_layout(),
                                  named_by_columns=False)
    engine.create_variables(training=False)
    placeholders = {name: tf.compat.v1.sparse_placeholder(tf.int64, [None, None])
                    for name in feature_names}
    step, shards = engine.lookup(placeholders, num_shards=1)
    activations = shards[0]
    hook = LookupProfileHook(step.lookup_step.statistics(), layout, directory,
                             **hook_kwargs)
    with tf.compat.v1.train.SingularMonitoredSession(hooks=[hook]) as sess:
      for index, features in enumerate(steps):
        sess.run(activations, feed_dict={
            placeholders[name]: sparse_value(rows)
            for name, rows in zip(feature_names, features)})
        if index == 0 and after_first_step is not None:
          after_first_step()
  return hook


@pytest.mark.parametrize('num_hosts', [2, 3])
def test_single_table_profile(tmp_path, num_hosts):
  rng = np.random.RandomState(num_hosts)
  steps = [[random_rows(rng)] for _ in range(5)]
  directory = str(tmp_path / 'profile' / 'nested')
  path = os.path.join(directory, 'tbl_a.json')

  def written_before_end():
    # A killed run still leaves the first profiled step behind.
    check_profile(path, expected_profile(steps[:1], num_hosts, 4), ['a'])

  run_profiled([tpu_fc.embedding_column(
      fc.categorical_column_with_identity('a', VOCAB), DIM)], ['a'], steps,
               directory, after_first_step=written_before_end,
               num_hosts=num_hosts, every_n_steps=2, top_k=4)
  check_profile(path, expected_profile(steps[::2], num_hosts, 4), ['a'])
  assert os.listdir(directory) == ['tbl_a.json']  # No temporary files left.


def test_shared_table_counts_both_features(tmp_path):
  rng = np.random.RandomState(7)
  steps = [[random_rows(rng) for _ in range(3)] for _ in range(3)]
  columns = [tpu_fc.embedding_column(
      fc.categorical_column_with_identity('a', VOCAB), DIM)]
  columns += tpu_fc.shared_embedding_columns(
      [fc.categorical_column_with_identity('b', VOCAB),
       fc.categorical_column_with_identity('c', VOCAB)], DIM)
  run_profiled(columns, ['a', 'b', 'c'], steps, str(tmp_path), num_hosts=3,
               every_n_steps=1, top_k=VOCAB)
  assert sorted(os.listdir(tmp_path)) == ['tbl_a.json',
                                          'tbl_b_c_shared_embedding.json']
  check_profile(str(tmp_path / 'tbl_a.json'),
                expected_profile([s[:1] for s in steps], 3, VOCAB), ['a'])
  check_profile(str(tmp_path / 'tbl_b_c_shared_embedding.json'),
                expected_profile([s[1:] for s in steps], 3, VOCAB), ['b', 'c'])


def test_hot_ids_stay_bounded(tmp_path):
  """Cold ids churn through a 3-entry counter; the two hot ids keep exact counts."""
  steps = [[[[0, 1, 2 + step], [1, 0, 9 - step], [0], [1]]] for step in range(4)]
  hook = run_profiled([tpu_fc.embedding_column(
      fc.categorical_column_with_identity('a', VOCAB), DIM)], ['a'], steps,
                      str(tmp_path), num_hosts=2, every_n_steps=1, top_k=2,
                      max_tracked_ids=3)
  check_profile(str(tmp_path / 'tbl_a.json'), expected_profile(steps, 2, 2), ['a'])
  assert hook._profiles['tbl_a'].hot_ids.size <= 3  # pylint: disable=protected-access


@pytest.mark.parametrize('vocabulary_size,num_hosts',
                         [(11, 2), (11, 3), (10, 4), (7, 7), (5, 1)])
def test_div_hosts_matches_tf_partitioning(vocabulary_size, num_hosts):
  """Row ranges from `fixed_size_partitioner`, assignment from TF's 'div' lookup."""
  with tf.Graph().as_default():
    partitioned = tf.compat.v1.get_variable(
        'table', [vocabulary_size, 1],
        partitioner=tf.compat.v1.fixed_size_partitioner(num_hosts))
    sizes = [int(v.shape[0]) for v in partitioned]
    params = [tf.fill([size, 1], p) for p, size in enumerate(sizes)]
    hosts = tf.compat.v1.nn.embedding_lookup(
        params, tf.range(vocabulary_size, dtype=tf.int64),
        partition_strategy='div')
    with tf.compat.v1.Session() as sess:
      tf_hosts = sess.run(hosts)[:, 0]
  np.testing.assert_array_equal(tf_hosts, np.repeat(np.arange(num_hosts), sizes))
  np.testing.assert_array_equal(
      div_hosts(np.arange(vocabulary_size), vocabulary_size, num_hosts), tf_hosts)


def test_div_hosts_pads_small_vocabularies():
  # The legacy engine pads a table to max(vocabulary, num_hosts) rows: one row each.
  np.testing.assert_array_equal(div_hosts(np.arange(2), 2, 3), [0, 1])


@pytest.mark.parametrize('kwargs', [
    {'num_hosts': 0}, {'every_n_steps': 0}, {'top_k': -1},
    {'top_k': 5, 'max_tracked_ids': 4}])
def test_invalid_arguments(tmp_path, kwargs):
  with pytest.raises(ValueError, match='LookupProfileHook needs'):
    LookupProfileHook({}, None, str(tmp_path), **kwargs)
