"""Trains a small emulated-TPU model to a step, optionally killing itself on the way.

Run as `python tests/scripts/crash_train.py MODEL_DIR [--kill-at-step N]
[--kill-in-save STEP DELAY_MS]`; tests/test_crash_safety.py also imports `train`
for the uninterrupted reference run.  Checkpoints every SAVE_EVERY steps hold the
input position (`CheckpointInputPipelineHook`); the input is shuffled, so a restart
that lost its position would see other examples.
"""
import argparse
import os
import signal
import sys
import threading

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

import tpu_fc  # pylint: disable=g-import-not-at-top,wrong-import-position
from tpu_fc._tf import tf  # pylint: disable=g-import-not-at-top,wrong-import-position

MAX_STEPS = 12
SAVE_EVERY = 3
V, D, N, BATCH = 11, 3, 24, 4


def input_fn(params, bad_step=-1):
  """Shuffled batches; the batch of step `bad_step + 1` gets an out-of-range id."""
  rng = np.random.RandomState(0)
  ids = tf.ragged.constant([list(rng.randint(0, V, rng.randint(1, 4)))
                            for _ in range(N)], tf.int64).to_sparse()
  x = rng.normal(size=(N, 2)).astype(np.float32)
  labels = (np.arange(N) % 2).astype(np.float32).reshape(N, 1)
  dataset = tf.data.Dataset.from_tensor_slices(({'ids': ids, 'x': x}, labels))
  dataset = dataset.shuffle(8, seed=1).repeat().batch(params['batch_size'],
                                                      drop_remainder=True)

  def poison(step, batch):
    features, labels = batch
    ids = features['ids']
    values = tf.where(tf.equal(step, bad_step), tf.fill(tf.shape(ids.values),
                                                        tf.constant(V, tf.int64)),
                      ids.values)
    return dict(features, ids=tf.SparseTensor(ids.indices, values,
                                              ids.dense_shape)), labels

  return dataset.enumerate().map(poison)


def make_column():
  return tpu_fc.embedding_column(
      tf.feature_column.categorical_column_with_identity('ids', V), D,
      initializer=tf.compat.v1.constant_initializer(
          np.linspace(-1, 1, V * D).reshape(V, D)))


def model_fn(features, labels, mode, params):
  net = tf.concat([tf.keras.layers.DenseFeatures([make_column()])(features),
                   features['x']], axis=1)
  logits = tf.compat.v1.layers.dense(
      net, 1, kernel_initializer=tf.compat.v1.constant_initializer(0.1))
  loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
  optimizer = tf.compat.v1.train.AdagradOptimizer(0.1)
  if params['use_tpu']:
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
  return tpu_fc.TPUEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(
      loss, tf.compat.v1.train.get_global_step()))


def make_estimator(model_dir):
  spec = tpu_fc.EmbeddingConfigSpec(
      feature_columns=[make_column()],
      optimization_parameters=tpu_fc.AdagradParameters(0.5))
  return tpu_fc.TPUEstimator(
      model_fn=model_fn, train_batch_size=BATCH, embedding_config_spec=spec,
      config=tpu_fc.RunConfig(
          model_dir=model_dir, save_checkpoints_steps=SAVE_EVERY,
          keep_checkpoint_max=None,
          tpu_config=tpu_fc.TPUConfig(num_shards=2, iterations_per_loop=1)))


def _kill():
  os.kill(os.getpid(), signal.SIGKILL)


class KillAtStep(tf.compat.v1.train.SessionRunHook):
  """SIGKILLs the process once global step `step` has run."""

  def __init__(self, step):
    self._step = step

  def before_run(self, run_context):
    return tf.compat.v1.train.SessionRunArgs(
        tf.compat.v1.train.get_global_step())

  def after_run(self, run_context, run_values):
    if run_values.results + 1 >= self._step:
      _kill()


class KillInSave(tf.compat.v1.train.CheckpointSaverListener):
  """SIGKILLs the process `delay_ms` after the save of step `step` begins."""

  def __init__(self, step, delay_ms):
    self._step, self._delay = step, delay_ms / 1000

  def before_save(self, session, global_step_value):
    if global_step_value == int(self._step):
      threading.Timer(self._delay, _kill).start()


def train(model_dir, hooks=(), saving_listeners=(), bad_step=-1):
  """Trains to MAX_STEPS, saving the input position; returns the estimator."""
  estimator = make_estimator(model_dir)
  estimator.train(
      lambda params: input_fn(params, bad_step), max_steps=MAX_STEPS,
      saving_listeners=list(saving_listeners),
      hooks=[tpu_fc.estimator.hooks.CheckpointInputPipelineHook(estimator)] +
      list(hooks))
  return estimator


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('model_dir')
  parser.add_argument('--kill-at-step', type=int)
  parser.add_argument('--kill-in-save', type=float, nargs=2,
                      metavar=('STEP', 'DELAY_MS'))
  args = parser.parse_args()
  hooks = [KillAtStep(args.kill_at_step)] if args.kill_at_step else []
  listeners = [KillInSave(*args.kill_in_save)] if args.kill_in_save else []
  train(args.model_dir, hooks, listeners)


if __name__ == '__main__':
  main()
