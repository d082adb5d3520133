"""A TPUEstimator job for parameter-server cluster tests, run by every task.

`python -m tpu_fc cluster --ps 2 --workers 1 [--evaluator] -- cluster_model.py --model_dir D
[--use_tpu] [--sync] [--die_at_step K [--die_task chief]] [--slow_chief_secs S]
[--train_and_evaluate]`.  One embedding table: on the emulated
embedding core (`--use_tpu`) or a feature-column table trained by the model's
optimizer (use_tpu=False).  Every input is a function of the global step and the
task's replica index, so a replica that restarts reads what it would have read,
and a single host with batch `replicas * BATCH` reads the union of the replicas'
batches.  The chief writes the variables' devices and its losses to model_dir.
With `--train_and_evaluate` every task runs `tpu_fc.train_and_evaluate`: the
evaluator evaluates `eval_input_fn` on each new checkpoint and exports it.
"""
import argparse
import json
import os
import signal
import time

import numpy as np

import tpu_fc
from tpu_fc import cluster
import tensorflow as tf  # pylint: disable=g-bad-import-order  (after tpu_fc)

VOCABULARY, DIMENSION, BATCH, IDS_PER_EXAMPLE = 10, 2, 4, 2
LEARNING_RATE = 0.1


def row_initializer(shape, dtype=None, partition_info=None):
  """Rows by their global index, so a table split into parts starts as a whole one."""
  del dtype
  offset = partition_info.var_offset[0] if partition_info else 0
  rows = np.arange(offset, offset + shape[0], dtype=np.float32)[:, None]
  return tf.constant(np.sin(rows * 1.7 + np.arange(shape[1])) * 0.5, tf.float32)


def embedding_column():
  return tpu_fc.embedding_column(
      tf.feature_column.categorical_column_with_identity('ids', VOCABULARY),
      DIMENSION, initializer=row_initializer)


def spec():
  return tpu_fc.EmbeddingConfigSpec(
      feature_columns=[embedding_column()],
      optimization_parameters=tpu_fc.AdagradParameters(LEARNING_RATE))


def examples(first, count):
  """(features, labels) of global examples first .. first + count - 1."""
  index = tf.cast(first, tf.float32) + tf.range(count, dtype=tf.float32)
  ids = tf.cast(tf.math.floormod(
      index[:, None] * [3.0, 7.0] + [1.0, 4.0], VOCABULARY), tf.int64)
  features = {
      'ids': tf.SparseTensor(tf.where(tf.ones_like(ids, tf.bool)),
                             tf.reshape(ids, [-1]),
                             tf.shape(ids, out_type=tf.int64)),
      'x': tf.sin(index)[:, None]}
  labels = tf.cos(index * 0.3)[:, None]
  return features, labels


def input_fn(params, config):
  """This replica's slice of the step's global batch, from the global step."""
  step = tf.compat.v1.train.get_global_step().read_value()
  replicas = config.num_worker_replicas
  replica = config.global_id_in_cluster or 0
  first = (step * replicas + replica) * params['batch_size']
  return examples(first, params['batch_size'])


def eval_input_fn(params):
  """The first `batch_size` examples, whatever the task."""
  return examples(0, params['batch_size'])


def serving_input_receiver_fn():
  return tpu_fc.export.build_parsing_serving_input_receiver_fn(
      tf.feature_column.make_parse_example_spec(
          [embedding_column(), tf.feature_column.numeric_column('x')]))()


def slow_step(seconds):
  """An op that sleeps: a chief with more work per step than its workers."""
  def sleep():
    time.sleep(seconds)
    return np.int32(0)
  return tf.compat.v1.py_func(sleep, [], tf.int32, stateful=True)


def model_fn(features, labels, mode, params, config):
  activations = tf.keras.layers.DenseFeatures([embedding_column()])(features)
  inputs = tf.concat([activations, features['x']], axis=1)
  logits = tf.compat.v1.layers.dense(
      inputs, 1, kernel_initializer=tf.compat.v1.constant_initializer(
          [[0.3], [-0.2], [0.1]]))
  if mode == tpu_fc.ModeKeys.PREDICT:
    return tpu_fc.TPUEstimatorSpec(mode, predictions={'prediction': logits})
  loss = tf.compat.v1.losses.mean_squared_error(labels, logits)
  optimizer = tf.compat.v1.train.AdagradOptimizer(LEARNING_RATE)
  if params['use_tpu']:
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
  train_op = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
  if config.is_chief and params.get('slow_chief_secs'):
    with tf.control_dependencies([train_op]):  # after its gradients are sent
      train_op = tf.group(slow_step(params['slow_chief_secs']))
  return tpu_fc.TPUEstimatorSpec(mode, loss=loss, train_op=train_op)


def estimator(model_dir, use_tpu, batch_size=BATCH, sync=False,
              slow_chief_secs=0.0):
  config = tpu_fc.RunConfig(
      model_dir=model_dir, save_checkpoints_steps=2, log_step_count_steps=1,
      keep_checkpoint_max=50, sync_replicas=sync)
  return tpu_fc.TPUEstimator(
      model_fn=model_fn, use_tpu=use_tpu, train_batch_size=batch_size,
      eval_batch_size=BATCH, config=config, embedding_config_spec=spec(),
      params={'slow_chief_secs': slow_chief_secs})


class RecordHook(tf.compat.v1.train.SessionRunHook):
  """On the chief: writes the variables' devices and every step's loss."""

  def __init__(self, model_dir):
    self._model_dir = model_dir
    self._losses = []

  def begin(self):
    self._loss = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)[0]
    with open(os.path.join(self._model_dir, 'devices.json'), 'w') as f:
      json.dump({v.op.name: v.device for v in tf.compat.v1.global_variables()},
                f)

  def before_run(self, run_context):
    return tf.compat.v1.train.SessionRunArgs(self._loss)

  def after_run(self, run_context, run_values):
    self._losses.append(float(run_values.results))

  def end(self, session):
    with open(os.path.join(self._model_dir, 'losses.json'), 'w') as f:
      json.dump(self._losses, f)


class DieOnceHook(tf.compat.v1.train.SessionRunHook):
  """Kills this process (SIGKILL, as a crash) before global step `step`, once."""

  def __init__(self, step):
    self._step = step

  def begin(self):
    self._global_step = tf.compat.v1.train.get_global_step()

  def before_run(self, run_context):
    if run_context.session.run(self._global_step) >= self._step:
      os.kill(os.getpid(), signal.SIGKILL)


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('--model_dir', required=True)
  parser.add_argument('--use_tpu', action='store_true')
  parser.add_argument('--sync', action='store_true')
  parser.add_argument('--max_steps', type=int, default=6)
  parser.add_argument('--die_at_step', type=int, default=None,
                      help='kill the task at this global step, once')
  parser.add_argument('--die_task', default='worker', choices=('chief', 'worker'))
  parser.add_argument('--slow_chief_secs', type=float, default=0.0,
                      help='the chief sleeps this long after sending gradients')
  parser.add_argument('--train_and_evaluate', action='store_true',
                      help='run train_and_evaluate (an evaluator evaluates)')
  args = parser.parse_args()
  tf.get_logger().setLevel('INFO')
  job = estimator(args.model_dir, args.use_tpu, sync=args.sync,
                  slow_chief_secs=args.slow_chief_secs)
  hooks = []
  if job.config.is_chief:
    hooks.append(RecordHook(args.model_dir))
  if (job.config.task_type == args.die_task and args.die_at_step is not None and
      os.environ.get(cluster.RESTART_COUNT_ENV) == '0'):
    hooks.append(DieOnceHook(args.die_at_step))
  if args.train_and_evaluate:
    tpu_fc.train_and_evaluate(
        job, tpu_fc.TrainSpec(input_fn, max_steps=args.max_steps, hooks=hooks),
        tpu_fc.EvalSpec(eval_input_fn, steps=1, exporters=tpu_fc.LatestExporter(
            'latest', serving_input_receiver_fn), start_delay_secs=0,
                        throttle_secs=1))
  else:
    job.train(input_fn, hooks=hooks, max_steps=args.max_steps)


if __name__ == '__main__':
  main()
