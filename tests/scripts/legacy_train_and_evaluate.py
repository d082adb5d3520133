"""A legacy TPUEstimator script driven by `tf.estimator.train_and_evaluate`: TF names only.

Run with `python -m tpu_fc run tests/scripts/legacy_train_and_evaluate.py MODEL_DIR
OUT.json`.  An embedding column on the (emulated) TPU embedding core, a
LatestExporter, evaluation on every checkpoint; writes what train_and_evaluate
returned and the global step of each evaluation to OUT.json.
"""
import json
import sys

import numpy as np
import tensorflow as tf

VOCABULARY, DIMENSION, BATCH, EXAMPLES = 10, 4, 4, 16
MAX_STEPS, CHECKPOINT_EVERY, EVAL_STEPS = 4, 2, 2


def column():
  return tf.compat.v1.tpu.experimental.embedding_column(
      tf.feature_column.categorical_column_with_identity('ids', VOCABULARY),
      DIMENSION, initializer=tf.compat.v1.constant_initializer(0.1))


def input_fn(params):
  index = np.arange(EXAMPLES)
  ids = (index[:, None] * [3, 7] + [1, 4]) % VOCABULARY
  features = {'ids': tf.SparseTensor(
      [[row, col] for row in range(EXAMPLES) for col in range(2)],
      ids.reshape(-1).astype(np.int64), [EXAMPLES, 2])}
  labels = np.cos(index * 0.3).astype(np.float32)[:, None]
  dataset = tf.data.Dataset.from_tensor_slices((features, labels))
  return dataset.repeat().batch(params['batch_size'], drop_remainder=True)


def model_fn(features, labels, mode, params):
  net = tf.compat.v1.feature_column.input_layer(features, [column()])
  predictions = tf.compat.v1.layers.dense(
      net, 1, kernel_initializer=tf.compat.v1.constant_initializer(0.2))
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
        mode, predictions={'prediction': predictions})
  loss = tf.compat.v1.losses.mean_squared_error(labels, predictions)
  optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
  if params['use_tpu']:
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
  train_op = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())

  def metric_fn(labels, predictions):
    return {'mae': tf.compat.v1.metrics.mean_absolute_error(labels, predictions)}

  return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
      mode, loss=loss, train_op=train_op,
      eval_metrics=(metric_fn, [labels, predictions]))


def serving_input_receiver_fn():
  return tf.estimator.export.build_parsing_serving_input_receiver_fn(
      tf.feature_column.make_parse_example_spec([column()]))()


def estimator(model_dir):
  config = tf.compat.v1.estimator.tpu.RunConfig(
      model_dir=model_dir, save_checkpoints_steps=CHECKPOINT_EVERY,
      tpu_config=tf.compat.v1.estimator.tpu.TPUConfig(iterations_per_loop=1))
  spec = tf.estimator.tpu.experimental.EmbeddingConfigSpec(
      feature_columns=[column()],
      optimization_parameters=tf.compat.v1.tpu.experimental.AdagradParameters(
          0.1))
  return tf.compat.v1.estimator.tpu.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=True, train_batch_size=BATCH,
      eval_batch_size=BATCH, embedding_config_spec=spec, export_to_tpu=False)


class EvaluatedSteps(tf.estimator.SessionRunHook):
  """The global step of each evaluation."""

  def __init__(self):
    self.steps = []

  def begin(self):
    self._global_step = tf.compat.v1.train.get_global_step()

  def end(self, session):
    self.steps.append(int(session.run(self._global_step)))


def main(model_dir, out):
  evaluated = EvaluatedSteps()
  exporter = tf.estimator.LatestExporter('latest', serving_input_receiver_fn,
                                         exports_to_keep=1)
  eval_result, export_results = tf.estimator.train_and_evaluate(
      estimator(model_dir),
      tf.estimator.TrainSpec(input_fn, max_steps=MAX_STEPS),
      tf.estimator.EvalSpec(input_fn, steps=EVAL_STEPS, hooks=[evaluated],
                            exporters=exporter, throttle_secs=0))
  with open(out, 'w') as f:
    json.dump({'eval_result': {k: float(v) for k, v in eval_result.items()},
               'export_results': [r.decode() for r in export_results],
               'evaluated_steps': evaluated.steps}, f)


if __name__ == '__main__':
  main(*sys.argv[1:])
