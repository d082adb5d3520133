"""The migration guide's TF2 program on tensorflow-recommenders' layer: its
data and model (tests/test_tfrs.py, and the multi-worker script that trains it
on two machines, tests/scripts/multi_worker_tfrs.py).  Latest lane only."""
import numpy as np
import tensorflow_recommenders as tfrs

from tpu_fc._tf import tf

embedding = tf.tpu.experimental.embedding

# The guide's data, two examples: dense features, ids (mean-combined), labels.
DENSE_X = np.array([[1.0, 1.5], [0.5, -1.0]])
IDS = ([1, 4], [4])
LABELS = np.array([[0.3], [-0.2]])
VOCAB, DIM = 6, 2
START = (np.arange(VOCAB * DIM).reshape(VOCAB, DIM) - 5.0) / 8
KERNEL = np.array([[0.5], [-0.25], [1.0], [-0.5]])  # Dense(1): 2 dense + 2 emb
MODEL_LR = 0.05  # the model's Keras Adagrad, as in the guide
ADAGRAD_START, KERAS_EPSILON = 0.1, 1e-7  # its defaults

# The embedding optimizers (TF's mid-level) and their TPU rules by hand: one
# row's (w, slots, summed gradient g) -> (w, slots); slots start as given.
FTRL = dict(learning_rate=0.1, learning_rate_power=-0.5,
            initial_accumulator_value=0.1, l1_regularization_strength=0.01,
            l2_regularization_strength=0.05, beta=0.2)
ADAM = dict(learning_rate=0.1, beta_1=0.9, beta_2=0.99, epsilon=1e-3)
OPTIMIZER_ARGS = {
    'sgd': (embedding.SGD, dict(learning_rate=0.1)),
    'adagrad': (embedding.Adagrad, dict(learning_rate=0.1,
                                        initial_accumulator_value=0.2)),
    'adam': (embedding.Adam, ADAM),
    'ftrl': (embedding.FTRL, FTRL),
}


def sparse_ids(examples, dtype=tf.int32):
  return tf.SparseTensor(
      [[b, j] for b, ids in enumerate(examples) for j in range(len(ids))],
      tf.constant([i for ids in examples for i in ids], dtype),
      [len(examples), max(len(ids) for ids in examples)])


def guide_data():
  features = {'dense_feature': tf.constant(DENSE_X, tf.float32),
              'sparse_feature': sparse_ids(IDS)}
  return features, tf.constant(LABELS, tf.float32)


def guide_model(embedding_optimizer, layer_class=None, model_optimizer=None,
                batch_size=len(IDS)):
  """The migration guide's TF2 program (TF's `tpu_embedding` guide), with its
  embedding optimizer apart from the model's Adagrad (or `model_optimizer`),
  its inputs of `batch_size` (None: a replica's share); (model, layer)."""
  layer_class = layer_class or tfrs.layers.embedding.TPUEmbedding
  dense_input = tf.keras.Input(shape=(2,), dtype=tf.float32,
                               batch_size=batch_size)
  sparse_input = tf.keras.Input(shape=(), dtype=tf.int32,
                                batch_size=batch_size)
  layer = layer_class(
      feature_config=embedding.FeatureConfig(
          table=embedding.TableConfig(
              vocabulary_size=VOCAB, dim=DIM, name='table',
              initializer=tf.constant_initializer(START)),
          name='sparse_input'),
      optimizer=embedding_optimizer)
  inputs = tf.keras.layers.Concatenate(axis=1)([dense_input, layer(sparse_input)])
  result = tf.keras.layers.Dense(
      1, kernel_initializer=tf.constant_initializer(KERNEL))(inputs)
  model = tf.keras.Model(inputs={'dense_feature': dense_input,
                                 'sparse_feature': sparse_input},
                         outputs=result)
  model.compile(model_optimizer or
                tf.keras.optimizers.legacy.Adagrad(learning_rate=MODEL_LR),
                'mse', steps_per_execution=2)
  return model, layer
