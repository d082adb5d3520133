"""Does stacking tables speed up the embedding step on this CPU?  Raw TF, no MLP.

Issue 15 asked for stacked tables (one variable and one de-duplicate, gather,
update chain for all tables of a dim) as the lever for the emulated embedding
core.  This measures the lever itself, without tpu_fc: the benchmark's 26
one-hot Zipf features (1M-row caps, batch 4096, dim 16, Adagrad), one training
step of the embedding part (loss = sum(activation * coefficient)), in an
in-graph loop,

* `per_table`: per table unique -> gather -> row gradients -> sparse Adagrad
  (the `raw` path's chain);
* `stacked`: one table variable with row offsets and one such chain for all;
* `stacked_per_core`: the tables in as many stacks as the session has
  threads (`CORES`), one chain each: TF's CPU kernels of the chain run one
  thread each, so one stack leaves a core idle.

All give the same tables (checked after the loop's first run).

    PYTHONPATH=. scripts/lane.sh legacy python -m benchmarks.stacking [--reps N]

(`--vocabulary-cap`, `--batch-size`: a smaller workload, for tests.)
"""
import argparse
import time

import numpy as np

from tpu_fc._tf import tf  # noqa: I100
from benchmarks import workload as workload_lib

LEARNING_RATE, INITIAL_ACCUMULATOR, STEPS_PER_RUN = 0.1, 0.1, 10
CORES = 2  # the benchmark's threads


def _step_fn(groups, ids, coefficients, tables, accumulators, offsets):
  """One in-graph step (`i -> i + 1`) on batch `i % num_batches`: one chain
  per group of tables (`groups[g]`: table indices; `tables[g]` their rows
  stacked, `offsets[g]` each one's first row there)."""
  batch = ids.shape[1]
  dimension = coefficients.shape[1]

  def chain(table, accumulator, row_ids, coefficient):
    unique, position = tf.unique(row_ids, out_idx=tf.int64)
    activation = tf.gather(tf.gather(table, unique), position)
    gradient = tf.math.unsorted_segment_sum(
        tf.broadcast_to(coefficient, [tf.size(row_ids), dimension]), position,
        tf.size(unique))
    with tf.control_dependencies([activation]):
      return tf.raw_ops.ResourceSparseApplyAdagrad(
          var=table.handle, accum=accumulator.handle, lr=LEARNING_RATE,
          grad=gradient, indices=unique)

  def step(i):
    batch_ids = tf.gather(ids, i % ids.shape[0])  # [batch, tables]
    updates = [
        chain(table, accumulator,
              tf.reshape(tf.gather(batch_ids, group, axis=1) + offset, [-1]),
              tf.tile(tf.gather(coefficients, group), [batch, 1]))
        for group, table, accumulator, offset in zip(groups, tables,
                                                     accumulators, offsets)]
    with tf.control_dependencies(updates):
      return i + 1

  return step


def layouts(num_tables, cores):
  """Layout name -> groups of table indices, one chain (and variable) each."""
  every = list(range(num_tables))
  return {'per_table': [[t] for t in every], 'stacked': [every],
          'stacked_per_core': [every[c::cores] for c in range(cores)]}


def build(groups, workload, ids, coefficients, start):
  """(session, loop op, table values fetch) of `groups` from the tables `start`
  (all tables' rows, in table order)."""
  graph = tf.Graph()
  with graph.as_default():
    sizes = workload.table_sizes
    first_rows = np.cumsum((0,) + sizes[:-1])
    parts, offsets = [], []
    for group in groups:
      parts.append(np.concatenate(
          [start[first_rows[t]:first_rows[t] + sizes[t]] for t in group]))
      offsets.append(tf.constant(
          np.cumsum([0] + [sizes[t] for t in group[:-1]]), tf.int64))
    tables = [tf.Variable(part) for part in parts]
    accumulators = [tf.Variable(tf.fill(part.shape, INITIAL_ACCUMULATOR))
                    for part in parts]
    loop = tf.while_loop(
        lambda i: i < STEPS_PER_RUN,
        _step_fn(groups, tf.constant(ids), coefficients, tables, accumulators,
                 offsets), [tf.constant(0, tf.int64)])
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=CORES,
                                      inter_op_parallelism_threads=CORES)
    # As the benchmark's raw path: no whole-table copies by Grappler.
    config.graph_options.rewrite_options.arithmetic_optimization = 2
    session = tf.compat.v1.Session(graph=graph, config=config)
    session.run(tf.compat.v1.global_variables_initializer())
    # Every table's rows, in table order, whatever the layout.
    order = np.argsort(np.concatenate(groups))
    rows = tf.concat(tables, axis=0) if len(tables) > 1 else tables[0]
    values = [tf.split(rows, [sizes[t] for group in groups for t in group]),
              order]
  return session, loop, values


def _table_order(session, values):
  pieces, order = values
  fetched = session.run(pieces)
  return np.concatenate([fetched[position] for position in order])


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--reps', type=int, default=7)
  parser.add_argument('--vocabulary-cap', type=int, default=1_000_000)
  parser.add_argument('--batch-size', type=int, default=4096)
  args = parser.parse_args()
  tf.compat.v1.disable_eager_execution()
  workload = workload_lib.Workload(num_batches=4,
                                   vocabulary_cap=args.vocabulary_cap,
                                   batch_size=args.batch_size)
  sparse, _, _ = workload_lib.make_data(workload)
  ids = np.stack([sparse[name].values.reshape(workload.num_batches,
                                               workload.batch_size)
                  for name in workload.feature_names], axis=-1)
  rng = np.random.RandomState(0)
  coefficients = rng.randn(len(workload.table_sizes),
                           workload.dim).astype(np.float32)
  start = (rng.rand(sum(workload.table_sizes), workload.dim).astype(
      np.float32) - 0.5) * 0.02
  runs = {kind: build(groups, workload, ids, coefficients, start)
          for kind, groups in layouts(len(workload.table_sizes),
                                      CORES).items()}
  after_first = {}
  for kind, (session, loop, values) in runs.items():
    session.run(loop)
    after_first[kind] = _table_order(session, values)
  for kind, values in after_first.items():
    np.testing.assert_allclose(values, after_first['per_table'], rtol=1e-6,
                               atol=1e-7, err_msg=kind)
  seconds = {kind: [] for kind in runs}
  for _ in range(args.reps):  # interleaved: both see the same machine
    for kind, (session, loop, _) in runs.items():
      begin = time.perf_counter()
      session.run(loop)
      seconds[kind].append((time.perf_counter() - begin) / STEPS_PER_RUN)
  for kind, values in seconds.items():
    median = float(np.median(values))
    print('{:10s} {:6.2f} ms/step {:9.0f} examples/s'.format(
        kind, 1000 * median, workload.batch_size / median))
  for kind in runs:
    if kind != 'per_table':
      print('{} / per_table speed: {:.2f}'.format(
          kind, np.median(seconds['per_table']) / np.median(seconds[kind])))


if __name__ == '__main__':
  main()
