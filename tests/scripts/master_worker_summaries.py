"""The tasks of a cluster with a `master` job train in turn, for
tests/test_core_estimator.py (run in a network namespace of its own: the
servers listen on every interface).

`master_worker_summaries.py tpu_fc|tf MODEL_DIR`: in this process a ps task's
server, then the master, worker 0 and worker 1 (TF_CONFIG set for each) each
train 5 steps of the core Estimator (tpu_fc's or TF 2.15's); prints, as JSON,
the summary tags each task's training wrote to MODEL_DIR.
"""
import collections
import glob
import json
import os
import sys

from harness import inputs
from harness import lanes
from harness import models
from tpu_fc import cluster
from tpu_fc._tf import tf


def _summary_tags(model_dir):
  """How many summary values of each tag `model_dir`'s event files hold
  (the writers TF keeps open closed first, so that all is written)."""
  tf.compat.v1.summary.FileWriterCache.clear()
  tags = collections.Counter()
  for path in glob.glob(os.path.join(model_dir, 'events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      tags.update(value.tag for value in event.summary.value)
  return tags


def main(name, model_dir):
  driver = lanes.core_driver(name)
  spec = cluster.cluster_spec(num_ps=1, num_workers=2)
  spec['master'] = spec.pop('chief')
  servers = [tf.distribute.Server(tf.train.ClusterSpec(spec), job_name='ps',
                                  task_index=0)]
  written = {}
  for task_type, task_id in (('master', 0), ('worker', 0), ('worker', 1)):
    os.environ['TF_CONFIG'] = json.dumps(
        {'cluster': spec, 'task': {'type': task_type, 'index': task_id}})
    config = driver.RunConfig(model_dir=model_dir, save_summary_steps=1,
                              log_step_count_steps=1)
    if name == 'tf':  # (TF's train_and_evaluate would start it; tpu_fc's
      # Estimator starts it for the task's session)
      servers.append(tf.distribute.Server(
          config.cluster_spec, job_name=task_type, task_index=task_id))
    before = _summary_tags(model_dir)
    driver.Estimator(models.core_model_fn(driver), config=config).train(
        lambda: inputs.ones_x().repeat(), steps=5)
    written['%s %d' % (task_type, task_id)] = sorted(
        _summary_tags(model_dir) - before)
  print(json.dumps(written), flush=True)
  os._exit(0)  # (TF's servers cannot be stopped)  # pylint: disable=protected-access


if __name__ == '__main__':
  main(*sys.argv[1:])
