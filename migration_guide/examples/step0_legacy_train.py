"""A legacy TPUEstimator training script, written with TensorFlow's own names only.

This is the starting point of the migration guide: a ranking model with TPU
embedding columns (a plain one, a shared pair, a weighted one), `DenseFeatures`,
a small MLP, `CrossShardOptimizer` and an `EmbeddingConfigSpec` with Adagrad,
as such scripts were written for TF 1.15 - 2.15.

    # any TensorFlow version, with or without a TPU (use_tpu=True is emulated):
    python -m tpu_fc run step0_legacy_train.py --model_dir /tmp/m --train_steps 200
    # TF 2.15 with tensorflow-estimator, TF's own TPUEstimator, on a CPU:
    python step0_legacy_train.py --model_dir /tmp/m --train_steps 200 --no-use_tpu

It trains until global step `--train_steps` (0: no training), then predicts the
click probability of 16 fixed rows and prints them (`--predictions_file`: also
saves them with `numpy.save`).
"""
import argparse

import numpy as np
import tensorflow as tf

USERS, ITEMS, TAGS = 30, 25, 12
MAX_TAGS = 3
TRAIN_BATCH, PREDICT_BATCH = 16, 8


def feature_columns():
  fc = tf.feature_column
  user = tf.compat.v1.tpu.experimental.embedding_column(
      fc.categorical_column_with_identity('user', USERS), dimension=4)
  item, query = tf.compat.v1.tpu.experimental.shared_embedding_columns(
      [fc.categorical_column_with_identity('item', ITEMS),
       fc.categorical_column_with_identity('query', ITEMS)], dimension=4)
  tag = tf.compat.v1.tpu.experimental.embedding_column(
      fc.weighted_categorical_column(
          fc.categorical_column_with_identity('tag', TAGS), 'tag_weight'),
      dimension=3, combiner='sqrtn')
  return [user, item, query, tag]


def synthetic_clicks(num_examples, seed):
  """Click data with a hidden rule; -1 pads the variable-length tag lists."""
  rng = np.random.RandomState(seed)
  user = rng.randint(0, USERS, (num_examples, 1))
  item = rng.randint(0, ITEMS, (num_examples, 1))
  query = rng.randint(0, ITEMS, (num_examples, 1))
  tag = rng.randint(0, TAGS, (num_examples, MAX_TAGS))
  tag[np.arange(MAX_TAGS) >= rng.randint(1, MAX_TAGS + 1, (num_examples, 1))] = -1
  tag_weight = rng.uniform(0.5, 2.0, tag.shape).astype(np.float32)
  score = (np.random.RandomState(0).normal(size=ITEMS)[item[:, 0]] +
           np.random.RandomState(1).normal(size=USERS)[user[:, 0]])
  clicks = rng.uniform(size=num_examples) < 1 / (1 + np.exp(-2 * score))
  features = dict(user=user, item=item, query=query, tag=tag,
                  tag_weight=tag_weight)
  return features, clicks.astype(np.float32)[:, None]


TRAIN_DATA = synthetic_clicks(TRAIN_BATCH * 20, seed=1)
PREDICT_DATA = synthetic_clicks(16, seed=2)


def to_sparse_features(features):
  """Id lists as SparseTensors (padding dropped), weights at the same positions."""
  sparse = {key: tf.RaggedTensor.from_tensor(features[key], padding=-1).to_sparse()
            for key in ('user', 'item', 'query', 'tag')}
  tag = sparse['tag']
  sparse['tag_weight'] = tf.SparseTensor(
      tag.indices, tf.gather_nd(features['tag_weight'], tag.indices),
      tag.dense_shape)
  return sparse


def train_input_fn(params):
  dataset = tf.data.Dataset.from_tensor_slices(TRAIN_DATA).repeat()
  dataset = dataset.batch(params['batch_size'], drop_remainder=True)
  return dataset.map(lambda features, labels: (to_sparse_features(features), labels))


def predict_input_fn(params):
  dataset = tf.data.Dataset.from_tensor_slices(PREDICT_DATA[0])
  dataset = dataset.batch(params['batch_size'], drop_remainder=True)
  return dataset.map(to_sparse_features)


def model_fn(features, labels, mode, params):
  net = tf.keras.layers.DenseFeatures(feature_columns())(features)
  net = tf.keras.layers.Dense(8, activation=tf.nn.relu, name='hidden')(net)
  logits = tf.keras.layers.Dense(1, name='logits')(net)
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
        mode, predictions={'probability': tf.sigmoid(logits)})
  loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
  optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
  if params['use_tpu']:
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
  train_op = optimizer.minimize(
      loss, global_step=tf.compat.v1.train.get_global_step())
  return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
      mode, loss=loss, train_op=train_op)


def embedding_config_spec():
  return tf.compat.v1.estimator.tpu.experimental.EmbeddingConfigSpec(
      feature_columns=feature_columns(),
      optimization_parameters=tf.compat.v1.tpu.experimental.AdagradParameters(
          learning_rate=0.1))


def build_estimator(model_dir, use_tpu=True):
  config = tf.compat.v1.estimator.tpu.RunConfig(
      model_dir=model_dir, tf_random_seed=0,
      tpu_config=tf.compat.v1.estimator.tpu.TPUConfig(iterations_per_loop=50))
  return tf.compat.v1.estimator.tpu.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=use_tpu,
      train_batch_size=TRAIN_BATCH, predict_batch_size=PREDICT_BATCH,
      embedding_config_spec=embedding_config_spec())


def predict(estimator):
  """Click probabilities of PREDICT_DATA's rows."""
  return np.array([row['probability'][0]
                   for row in estimator.predict(predict_input_fn)])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model_dir', required=True)
  parser.add_argument('--train_steps', type=int, default=200,
                      help='train until this global step (0: only predict)')
  parser.add_argument('--use_tpu', action=argparse.BooleanOptionalAction,
                      default=True)
  parser.add_argument('--predictions_file', help='.npy file for the predictions')
  args = parser.parse_args(argv)
  estimator = build_estimator(args.model_dir, args.use_tpu)
  if args.train_steps:
    estimator.train(train_input_fn, max_steps=args.train_steps)
  predictions = predict(estimator)
  print('click probabilities:', np.round(predictions, 4))
  if args.predictions_file:
    np.save(args.predictions_file, predictions)
  return predictions


if __name__ == '__main__':
  main()
