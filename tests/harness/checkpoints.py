"""A legacy checkpoint's model: its spec (a plain, a weighted and a shared
pair of embedding columns), model_fn, input_fn and training by tpu_fc's
TPUEstimator; a checkpoint's values by name, one converted back compared with
its original, and a mid-level one read into TF's own `TPUEmbedding`."""
import contextlib

import numpy as np

import tpu_fc
from tpu_fc import naming
from tpu_fc._tf import tf

fc = tf.feature_column
BATCH = 4
A_TABLE = 'dense_features/a_embedding/embedding_weights'
SHARED_TABLE = 'b_c_shared_embedding'
OPTIMIZERS = {
    'sgd': tpu_fc.StochasticGradientDescentParameters(0.1),
    'adagrad': tpu_fc.AdagradParameters(0.1, initial_accumulator=0.2),
    'adam': tpu_fc.AdamParameters(0.1),
    'ftrl': tpu_fc.FtrlParameters(0.1, initial_accumulator_value=0.3),
}


def make_spec(optimizer=OPTIMIZERS['adagrad'], a_vocabulary=10):
  """A plain, a weighted and a shared pair of embedding columns."""
  a = tpu_fc.embedding_column(
      fc.categorical_column_with_identity('a', a_vocabulary), 4)
  w = tpu_fc.embedding_column(fc.weighted_categorical_column(
      fc.categorical_column_with_identity('w', 5), 'w_weight'), 2)
  b, c = tpu_fc.shared_embedding_columns(
      [fc.categorical_column_with_identity('b', 7),
       fc.categorical_column_with_identity('c', 7)], 3)
  return tpu_fc.EmbeddingConfigSpec(feature_columns=[a, w, b, c],
                                    optimization_parameters=optimizer)


def model_fn(features, labels, mode, params):
  if params.get('activations'):  # a dict-configured spec's
    net = tf.concat([features[name] for name in params['activations']], 1)
  else:
    net = tf.keras.layers.DenseFeatures(params['columns'])(features)
  if params.get('partitioned'):
    with tf.compat.v1.variable_scope(
        'input', partitioner=tf.compat.v1.fixed_size_partitioner(2)):
      net = tf.compat.v1.feature_column.input_layer(
          features, params['columns'][:1])
  with (tf.compat.v1.variable_scope(params['head_scope']) if 'head_scope' in params
        else contextlib.nullcontext()):
    logits = tf.compat.v1.layers.dense(net, 1)
  loss = tf.reduce_mean(tf.square(logits - labels))
  optimizer = params.get('model_optimizer', tf.compat.v1.train.AdagradOptimizer)(0.1)
  if params['use_tpu']:
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
  spec_class = params.get('spec_class', tpu_fc.TPUEstimatorSpec)
  return spec_class(mode, loss=loss, train_op=optimizer.minimize(
      loss, tf.compat.v1.train.get_global_step()))


def _sparse(values):
  """Every entry of a [batch, n] array as a SparseTensor value (zeros kept)."""
  indices = np.array([(row, col) for row in range(values.shape[0])
                      for col in range(values.shape[1])], np.int64)
  return tf.SparseTensor(indices, tf.constant(values.reshape(-1)),
                         values.shape)


def input_fn(params):
  batch = params['batch_size']
  rng = np.random.RandomState(0)
  features = {key: _sparse(rng.randint(0, size, (batch, 2)).astype(np.int64))
              for key, size in (('a', 10), ('w', 5), ('b', 7), ('c', 7))}
  features['w_weight'] = _sparse(
      rng.uniform(0.5, 2, (batch, 2)).astype(np.float32))
  labels = tf.constant(rng.uniform(size=(batch, 1)), tf.float32)
  return tf.data.Dataset.from_tensors((features, labels)).repeat()


def train(model_dir, spec, use_tpu=True, steps=2, **params):
  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn, model_dir=str(model_dir), use_tpu=use_tpu,
      train_batch_size=BATCH,
      params=dict({'columns': spec.feature_columns}, **params),
      embedding_config_spec=spec if use_tpu else None,
      config=tpu_fc.RunConfig(tf_random_seed=1))
  estimator.train(input_fn, steps=steps)
  return estimator


def trained_once(tmp_path_factory):
  """trained_with(optimizer) -> (spec, model_dir) of the legacy model of an
  `OPTIMIZERS` name trained 2 steps, trained on first use only: for a
  module fixture whose tests only read the model_dir."""
  trained_dirs = {}

  def trained_with(optimizer):
    if optimizer not in trained_dirs:
      spec = make_spec(OPTIMIZERS[optimizer])
      model_dir = tmp_path_factory.mktemp('legacy_' + optimizer)
      train(model_dir, spec)
      trained_dirs[optimizer] = spec, model_dir
    return trained_dirs[optimizer]

  return trained_with


def checkpoint_values(path):
  reader = tf.train.load_checkpoint(str(path))
  return {name: reader.get_tensor(name)
          for name in reader.get_variable_to_shape_map()}


def assert_converted_back(path, legacy):
  """The checkpoint at `path`, converted back to legacy, holds the `legacy`
  checkpoint's values (its gradient-tie dummies aside) bit for bit."""
  converted = checkpoint_values(path)
  original = {name: value for name, value in legacy.items()
              if not name.startswith(naming.DUMMY_VARIABLE_PREFIX)}
  assert sorted(converted) == sorted(original)
  for name, value in original.items():
    np.testing.assert_array_equal(converted[name], value, err_msg=name)


def tpu_embedding_variables(spec, checkpoint):
  """The variables, {table: {'parameters' or slot: variable}}, of TF's own
  `TPUEmbedding` of `spec.to_mid_level()` read from the mid-level
  `checkpoint` (every object in it matched) and built."""
  config = spec.to_mid_level()
  embedding = tf.tpu.experimental.embedding.TPUEmbedding(
      config.feature_config, config.optimizer)
  status = tf.train.Checkpoint(embedding=embedding).read(checkpoint)
  embedding.build()
  status.assert_existing_objects_matched()
  return embedding._variables  # pylint: disable=protected-access
