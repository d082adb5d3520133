"""Does stacking tables speed up the embedding step on this CPU?  Raw TF, no MLP.

Issue 15 asked for stacked tables (one variable and one de-duplicate, gather,
update chain for all tables of a dim) as the lever for the emulated embedding
core.  This measures the lever itself, without tpu_fc: the benchmark's 26
one-hot Zipf features (1M-row caps, batch 4096, dim 16, Adagrad), one training
step of the embedding part (loss = sum(activation * coefficient)), in an
in-graph loop,

* `per_table`: per table unique -> gather -> row gradients -> sparse Adagrad
  (the `raw` path's chain);
* `stacked`: one table variable with row offsets and one such chain for all.

Both give the same tables (checked after the loop's first run).

    PYTHONPATH=. scripts/lane.sh legacy python -m benchmarks.stacking [--reps N]

(`--vocabulary-cap`, `--batch-size`: a smaller workload, for tests.)
"""
import argparse
import time

import numpy as np

from tpu_fc._tf import tf  # noqa: I100
from benchmarks import workload as workload_lib

LEARNING_RATE, INITIAL_ACCUMULATOR, STEPS_PER_RUN = 0.1, 0.1, 10


def _step_fn(kind, ids, coefficients, tables, accumulators, offsets):
  """One in-graph step (`i -> i + 1`) of `kind` on batch `i % num_batches`."""
  batch, num_tables = ids.shape[1], ids.shape[2]
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
    if kind == 'per_table':
      updates = [chain(tables[t], accumulators[t], batch_ids[:, t],
                       coefficients[t]) for t in range(num_tables)]
    else:
      updates = [chain(tables[0], accumulators[0],
                       tf.reshape(batch_ids + offsets, [-1]),
                       tf.tile(coefficients, [batch, 1]))]
    with tf.control_dependencies(updates):
      return i + 1

  return step


def build(kind, workload, ids, coefficients, start):
  """(session, loop op, table values fetch) of `kind` from the tables `start`."""
  graph = tf.Graph()
  with graph.as_default():
    sizes = workload.table_sizes
    offsets = np.cumsum((0,) + sizes[:-1]).astype(np.int64)
    if kind == 'per_table':
      parts = [start[o:o + s] for o, s in zip(offsets, sizes)]
    else:
      parts = [start]
    tables = [tf.Variable(part) for part in parts]
    accumulators = [tf.Variable(tf.fill(part.shape, INITIAL_ACCUMULATOR))
                    for part in parts]
    loop = tf.while_loop(
        lambda i: i < STEPS_PER_RUN,
        _step_fn(kind, tf.constant(ids), coefficients, tables, accumulators,
                 tf.constant(offsets)), [tf.constant(0, tf.int64)])
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=2,
                                      inter_op_parallelism_threads=2)
    # As the benchmark's raw path: no whole-table copies by Grappler.
    config.graph_options.rewrite_options.arithmetic_optimization = 2
    session = tf.compat.v1.Session(graph=graph, config=config)
    session.run(tf.compat.v1.global_variables_initializer())
    values = tf.concat(tables, axis=0) if len(tables) > 1 else tables[0]
  return session, loop, values


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
  runs = {kind: build(kind, workload, ids, coefficients, start)
          for kind in ('per_table', 'stacked')}
  after_first = {}
  for kind, (session, loop, values) in runs.items():
    session.run(loop)
    after_first[kind] = session.run(values)
  np.testing.assert_allclose(after_first['stacked'], after_first['per_table'],
                             rtol=1e-6, atol=1e-7)
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
  print('stacked / per_table speed: {:.2f}'.format(
      np.median(seconds['per_table']) / np.median(seconds['stacked'])))


if __name__ == '__main__':
  main()
