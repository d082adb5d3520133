"""Serving measurement: exported SavedModels side by side, in one worker process.

Each export is loaded in its own graph and session, as TF Serving would (TF1
loader, default Grappler, the benchmark's thread counts), and fed serialized
tf.Examples of the benchmark's data.  Repetitions alternate between exports.
"""
import time

import numpy as np

from tpu_fc._tf import tf  # noqa: I100
from benchmarks import workload as workload_lib


def _examples(workload, count):
  """`count` serialized tf.Examples: the first rows of the benchmark's data."""
  ids, dense, _ = workload_lib.make_data(workload)
  examples = []
  for row in range(count):
    batch, example = divmod(row, workload.batch_size)
    feature = {'dense': tf.train.Feature(
        float_list=tf.train.FloatList(value=dense[batch, example]))}
    for name, sparse in ids.items():
      mask = (sparse.indices[:, 0] == batch) & (sparse.indices[:, 1] == example)
      feature[name] = tf.train.Feature(
          int64_list=tf.train.Int64List(value=sparse.values[mask]))
    examples.append(tf.train.Example(
        features=tf.train.Features(feature=feature)).SerializeToString())
  return np.array(examples, dtype=object)


class _LoadedModel(object):
  """A SavedModel's serving signature as one callable on serialized examples."""

  def __init__(self, export_dir, threads):
    graph = tf.Graph()
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads,
                                      inter_op_parallelism_threads=threads)
    self._session = tf.compat.v1.Session(graph=graph, config=config)
    with graph.as_default():
      meta_graph = tf.compat.v1.saved_model.loader.load(
          self._session, ['serve'], export_dir)
    signature = meta_graph.signature_def['serving_default']
    (input_info,) = signature.inputs.values()
    outputs = [info.name for info in signature.outputs.values()]
    self._call = self._session.make_callable(
        outputs, feed_list=[graph.get_tensor_by_name(input_info.name)])

  def __call__(self, examples):
    return self._call(examples)


def measure(job, channel):
  """p50/p99 latency at batch 1 and examples/s at the large batch, per export."""
  del channel  # nothing to interleave with other processes
  workload = workload_lib.Workload(**job['workload'])
  large = job['throughput_batch']
  examples = _examples(workload, max(large, job['latency_calls']))
  models = {name: _LoadedModel(path, job['threads'])
            for name, path in sorted(job['exports'].items())}
  names = sorted(models)
  for name in names:  # warm-up: first calls optimize and allocate
    for _ in range(5):
      models[name](examples[:1])
      models[name](examples[:large])
  latencies = {name: [] for name in names}
  throughputs = {name: [] for name in names}
  for rep in range(job['reps']):
    for name in names[rep % len(names):] + names[:rep % len(names)]:
      model = models[name]
      for call in range(job['latency_calls']):
        start = time.perf_counter()
        model(examples[call:call + 1])
        latencies[name].append(time.perf_counter() - start)
      start = time.perf_counter()
      for _ in range(job['throughput_calls']):
        model(examples[:large])
      throughputs[name].append(large * job['throughput_calls'] /
                               (time.perf_counter() - start))
  return {'models': {
      name: {'p50_latency_ms': 1e3 * float(np.percentile(latencies[name], 50)),
             'p99_latency_ms': 1e3 * float(np.percentile(latencies[name], 99)),
             'throughput_examples_per_s': float(np.median(throughputs[name])),
             'throughput_reps': throughputs[name],
             'export_dir': job['exports'][name]}
      for name in names}}
