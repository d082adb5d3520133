"""Step 1: the legacy script of step 0, importing the legacy names from tpu_fc.

Nothing else changed (`migration_guide/step1_import_from_tpu_fc.md` lists the
renames).  It runs as a plain script on any TensorFlow version:

    python step1_train.py --model_dir /tmp/m --train_steps 200

and the later steps import it for the model's spec, data and estimator.
"""
import argparse

import numpy as np

import tpu_fc  # before tensorflow: selects tf-keras on TF >= 2.16
import tensorflow as tf

USERS, ITEMS, TAGS = 30, 25, 12
MAX_TAGS = 3
TRAIN_BATCH, PREDICT_BATCH = 16, 8


def feature_columns():
  fc = tf.feature_column
  user = tpu_fc.embedding_column(
      fc.categorical_column_with_identity('user', USERS), dimension=4)
  item, query = tpu_fc.shared_embedding_columns(
      [fc.categorical_column_with_identity('item', ITEMS),
       fc.categorical_column_with_identity('query', ITEMS)], dimension=4)
  tag = tpu_fc.embedding_column(
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
  if mode == tpu_fc.ModeKeys.PREDICT:
    return tpu_fc.TPUEstimatorSpec(
        mode, predictions={'probability': tf.sigmoid(logits)})
  loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
  optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
  if params['use_tpu']:
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
  train_op = optimizer.minimize(
      loss, global_step=tf.compat.v1.train.get_global_step())
  return tpu_fc.TPUEstimatorSpec(
      mode, loss=loss, train_op=train_op)


def embedding_config_spec():
  return tpu_fc.EmbeddingConfigSpec(
      feature_columns=feature_columns(),
      optimization_parameters=tpu_fc.AdagradParameters(
          learning_rate=0.1))


def build_estimator(model_dir, use_tpu=True):
  config = tpu_fc.RunConfig(
      model_dir=model_dir, tf_random_seed=0,
      tpu_config=tpu_fc.TPUConfig(iterations_per_loop=50))
  return tpu_fc.TPUEstimator(
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
