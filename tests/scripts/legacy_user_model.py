"""A ranking model written as TPUEstimator users wrote them, in TF1 style.

A legacy script: TF 2.15 runs it with its own TPUEstimator; `python -m tpu_fc
run` runs it unchanged on tpu_fc (tests/test_legacy_scripts.py, in a process
of its own: TF1 behaviour is global).

  legacy_user_model.py RESULT_JSON MODEL_DIR [--v1]
      [--run NAME:cpu|tpu:NUM_SHARDS:ITERATIONS_PER_LOOP[:dynamic_batch]
             [:host_call_every_N][:train_only] ...]

Each run trains, evaluates, predicts and exports the model in MODEL_DIR/NAME
(with train_only, only trains: what training options change ends there) and
records what came out in RESULT_JSON (or the ValueError it raised).  The style:
`disable_v2_behavior()`, `model_fn(features, mode, params)` with the labels
among the features, Keras `Input(tensor=...)`, a `combiner=None` column, a
tensor-core column, multivalent sequence ids, a two-class softmax built with
`tf.zeros(logits.shape)`, `recall_at_k` in metric_fn, a `host_call` writing
summaries and a `ProfilerHook`.
"""
import argparse
import json
import os

import numpy as np
import tensorflow as tf

BATCH = 8
EXAMPLES = 32
VOCABULARY = 20
TRAIN_STEPS = 6
EVAL_STEPS = 2
fc = tf.compat.v1.feature_column


def _examples():
  """Users, multivalent histories ([example, position, ids]), prices, clicks."""
  rng = np.random.RandomState(7)
  users = rng.randint(0, VOCABULARY, EXAMPLES).astype(np.int64)
  histories = []
  for example in range(EXAMPLES):
    positions = 1 + example % 4  # up to 4 positions: the 4th is cut (max 3)
    histories.append([list(rng.randint(0, VOCABULARY, 1 + (example + p) % 2))
                      for p in range(positions)])
  prices = rng.uniform(-1, 1, (EXAMPLES, 1)).astype(np.float32)
  clicks = (rng.uniform(size=EXAMPLES) < 0.5).astype(np.int64)
  categories = rng.randint(0, 10, (EXAMPLES, 2)).astype(np.int64)
  return users, histories, prices, clicks, categories


def _history_ids(histories):
  """Rank-3 sparse ids of `histories` ([example, position, k] -> id), as numpy
  (indices, values, dense shape)."""
  indices, values = [], []
  for example, positions in enumerate(histories):
    for position, ids in enumerate(positions):
      for k, value in enumerate(ids):
        indices.append([example, position, k])
        values.append(value)
  return (np.array(indices, np.int64), np.array(values, np.int64),
          np.array([len(histories), 4, 2], np.int64))


def input_fn(params, dynamic_batch=False, repeat=True):
  users, histories, prices, clicks, categories = _examples()
  dataset = tf.data.Dataset.from_tensor_slices({
      'user': users, 'history': tf.SparseTensor(*_history_ids(histories)),
      'price': prices, 'category': tf.sparse.from_dense(categories),
      'click': clicks})
  if repeat:
    dataset = dataset.repeat()
  return dataset.batch(params['batch_size'], drop_remainder=not dynamic_batch)


user_column = tf.compat.v1.tpu.experimental.embedding_column(
    fc.categorical_column_with_identity('user', VOCABULARY), 4, combiner=None,
    initializer=tf.compat.v1.truncated_normal_initializer(seed=1))
def history_learning_rate(global_step):
  """A TF1 schedule, read every step of a TPU loop (its table's rate)."""
  return tf.compat.v1.train.exponential_decay(0.2, global_step, 2, 0.5)


history_column = tf.compat.v1.tpu.experimental.embedding_column(
    fc.sequence_categorical_column_with_identity('history', VOCABULARY), 4,
    max_sequence_length=3, learning_rate_fn=history_learning_rate,
    initializer=tf.compat.v1.truncated_normal_initializer(seed=2))
category_column = tf.compat.v1.tpu.experimental.embedding_column(
    fc.categorical_column_with_identity('category', 10), 2,
    embedding_lookup_device='tpu_tensor_core', tensor_core_shape=[None, 2],
    initializer=tf.compat.v1.truncated_normal_initializer(seed=5))


def model_fn(features, mode, params):
  clicks = features.pop('click', None)
  user = tf.compat.v1.keras.layers.DenseFeatures(
      [user_column, category_column])(features)
  history, lengths = tf.keras.experimental.SequenceFeatures([history_column])(
      features)
  mean_history = tf.reduce_sum(history, 1) / tf.maximum(
      tf.cast(lengths, tf.float32)[:, None], 1.)
  inputs = tf.keras.layers.Input(
      tensor=tf.concat([user, mean_history, features['price']], 1))
  hidden = tf.keras.layers.Dense(
      8, activation='relu',
      kernel_initializer=tf.keras.initializers.GlorotUniform(seed=3))(inputs)
  logits = tf.keras.layers.Dense(
      1, kernel_initializer=tf.keras.initializers.GlorotUniform(seed=4))(hidden)
  two_class = tf.concat([tf.zeros(logits.shape), logits], axis=1)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(mode, predictions={
        'probability': tf.nn.softmax(two_class)[:, 1]})
  loss = tf.compat.v1.losses.sparse_softmax_cross_entropy(clicks, two_class)
  if mode == tf.estimator.ModeKeys.EVAL:

    def metric_fn(clicks, two_class):
      return {
          'recall_at_1': tf.compat.v1.metrics.recall_at_k(
              clicks[:, None], two_class, k=1),
          'accuracy': tf.compat.v1.metrics.accuracy(
              clicks, tf.argmax(two_class, 1)),
      }

    return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
        mode, loss=loss, eval_metrics=(metric_fn, [clicks, two_class]))
  optimizer = tf.compat.v1.train.AdamOptimizer(0.01)
  if params['use_tpu']:
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
  train_op = optimizer.minimize(loss, tf.compat.v1.train.get_global_step())
  profiler = tf.compat.v1.train.ProfilerHook(
      save_steps=3, output_dir=params['profile_dir'])

  def host_call_fn(global_step, loss):
    with tf.compat.v2.summary.create_file_writer(
        params['summary_dir']).as_default():
      with tf.compat.v2.summary.record_if(True):
        tf.compat.v2.summary.scalar('loss', loss[0], step=global_step[0])
        return tf.compat.v1.summary.all_v2_summary_ops()

  global_step = tf.compat.v1.train.get_global_step()
  return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
      mode, loss=loss, train_op=train_op, training_hooks=[profiler],
      host_call=(host_call_fn, [tf.reshape(global_step, [1]),
                                tf.reshape(loss, [1])]))


def serving_input_fn():
  """Requests of BATCH examples: the model needs a static batch, as on a TPU."""
  features = {
      'user': tf.compat.v1.placeholder(tf.int64, [BATCH], name='user'),
      'history': tf.compat.v1.sparse_placeholder(
          tf.int64, [BATCH, None, None], name='history'),
      'price': tf.compat.v1.placeholder(tf.float32, [BATCH, 1], name='price'),
      'category': tf.compat.v1.sparse_placeholder(
          tf.int64, [BATCH, 2], name='category'),
  }
  return tf.estimator.export.ServingInputReceiver(features, features)


class RunCounter(tf.compat.v1.train.SessionRunHook):
  """How many session.run calls training took (a TPU loop is one run)."""

  def __init__(self):
    self.runs = 0

  def after_run(self, run_context, run_values):
    self.runs += 1


def run(model_dir, use_tpu, num_shards, iterations, dynamic_batch,
        host_call_every_n_steps, train_only):
  """Trains, evaluates, predicts and exports (`train_only`: trains); returns
  what came out."""
  profile_dir = os.path.join(model_dir, 'profile')
  estimator = tf.compat.v1.estimator.tpu.TPUEstimator(
      model_fn=model_fn, use_tpu=use_tpu, train_batch_size=BATCH,
      eval_batch_size=BATCH, predict_batch_size=BATCH,
      export_to_tpu=False,  # served on CPUs
      params={'profile_dir': profile_dir,
              'summary_dir': os.path.join(model_dir, 'host_call')},
      config=tf.compat.v1.estimator.tpu.RunConfig(
          model_dir=model_dir, tf_random_seed=11,
          tpu_config=tf.compat.v1.estimator.tpu.TPUConfig(
              iterations_per_loop=iterations, num_shards=num_shards,
              experimental_host_call_every_n_steps=host_call_every_n_steps)),
      embedding_config_spec=(
          tf.compat.v1.estimator.tpu.experimental.EmbeddingConfigSpec(
              feature_columns=[user_column, history_column, category_column],
              optimization_parameters=(
                  tf.compat.v1.tpu.experimental.AdagradParameters(0.1)))))
  counter = RunCounter()
  estimator.train(lambda params: input_fn(params, dynamic_batch),
                  max_steps=TRAIN_STEPS, hooks=[counter])
  trained = {
      'variables': {name: estimator.get_variable_value(name).tolist()
                    for name in estimator.get_variable_names()},
      'training_runs': counter.runs,
      'summaries': _summaries(os.path.join(model_dir, 'host_call')),
      'profiles': len(os.listdir(profile_dir)),
  }
  if train_only:
    return trained
  metrics = estimator.evaluate(input_fn, steps=EVAL_STEPS)
  predictions = [p['probability'] for p in estimator.predict(
      lambda params: input_fn(params, repeat=False))]
  export_dir = estimator.export_saved_model(
      os.path.join(model_dir, 'export'), serving_input_fn)
  return dict(
      trained,
      metrics={name: float(value) for name, value in metrics.items()},
      predictions=np.array(predictions, np.float64).tolist(),
      served=_served(export_dir))


def _summaries(directory):
  """[tag, step] of every summary value the host_call wrote."""
  found = []
  for path in sorted(tf.io.gfile.glob(os.path.join(directory, 'events*'))):
    for event in tf.compat.v1.train.summary_iterator(path):
      found.extend([value.tag, event.step] for value in event.summary.value)
  return sorted(found)


def _served(export_dir):
  """The exported model's probabilities for the first batch of examples."""
  users, histories, prices, _, categories = _examples()
  ids = _history_ids(histories[:BATCH])
  with tf.Graph().as_default(), tf.compat.v1.Session() as session:
    loaded = tf.compat.v1.saved_model.load(session, ['serve'], export_dir)
    signature = loaded.signature_def['serving_default']
    feed = {}
    for key, value in (('user', users[:BATCH]), ('price', prices[:BATCH])):
      feed[signature.inputs[key].name] = value
    category_ids = (np.argwhere(categories[:BATCH] != 0),
                    categories[:BATCH][categories[:BATCH] != 0], [BATCH, 2])
    for key, value in (('history', ids), ('category', category_ids)):
      sparse = signature.inputs[key].coo_sparse
      for name, part in zip((sparse.indices_tensor_name,
                             sparse.values_tensor_name,
                             sparse.dense_shape_tensor_name), value):
        feed[name] = part
    output = signature.outputs['probability'].name
    return np.asarray(session.run(output, feed), np.float64).tolist()


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument('result')
  parser.add_argument('model_dir')
  parser.add_argument('--v1', action='store_true')
  parser.add_argument('--run', action='append', default=[])
  args = parser.parse_args()
  if args.v1:
    tf.compat.v1.disable_v2_behavior()
  results = {}
  for spec in args.run:
    name, use_tpu, num_shards, iterations, *options = spec.split(':')
    every_n = [int(option[len('host_call_every_'):]) for option in options
               if option.startswith('host_call_every_')]
    try:
      results[name] = run(os.path.join(args.model_dir, name),
                          use_tpu == 'tpu', int(num_shards) or None,
                          int(iterations), 'dynamic_batch' in options,
                          every_n[0] if every_n else 1,
                          'train_only' in options)
    except ValueError as error:
      results[name] = {'error': str(error)}
  with open(args.result, 'w') as f:
    json.dump(results, f)


if __name__ == '__main__':
  main()
