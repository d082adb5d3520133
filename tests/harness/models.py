"""model_fns, and what they are built of.

The contract model (`contract_column`, `contract_model_fn`): `loss =
sum(activation * COEF)` over the batch, an embedding column with the mean
combiner on `inputs.IDS`, so d(loss)/d(activation) = COEF for every example
and each id of example e gets COEF / |IDS[e]| (scaled by 1/num_shards on the
emulated TPU: `CrossShardOptimizer` averages over the shards, as on a TPU).
`oracle.expected_step` derives its tables.
"""
import numpy as np

import tpu_fc
from tpu_fc._tf import tf

from harness import inputs

# The contract model's lookup paths (mid_level: migrated to TF2,
# `harness.mid_level`), column and loss.
PATHS = ('cpu', 'embedding_core', 'tensor_core', 'mid_level')
VOCAB, DIM = 6, 2
LR = 0.2  # of every optimizer of the model's table or loss
COEF = np.array([1.0, -2.0], np.float32)
START = (np.arange(VOCAB * DIM, dtype=np.float32).reshape(VOCAB, DIM) - 4) / 8
TABLE = 'dense_features/ids_embedding/embedding_weights'


def contract_column(path):
  device = {'tensor_core': dict(embedding_lookup_device='tpu_tensor_core',
                                tensor_core_shape=[None, 2])}.get(path, {})
  return tpu_fc.embedding_column(
      tf.feature_column.categorical_column_with_identity('ids', VOCAB), DIM,
      combiner='mean', initializer=tf.compat.v1.constant_initializer(START),
      **device)


def contract_loss(activation, squared=False):
  """The model's loss: sum(activation * COEF), whose gradient is known; or
  sum(activation² * COEF) / 2, whose gradient is the activation's (it sees
  which rows a lookup read: pipelined execution)."""
  if squared:
    return tf.reduce_sum(activation * activation * COEF) / 2
  return tf.reduce_sum(activation * COEF)


def contract_model_fn(model_optimizer, driver=tpu_fc, squared=False,
                      cross_shard_optimizer=None):
  """`cross_shard_optimizer`: the class wrapping the optimizer on a TPU
  (`tf.compat.v1.tpu.CrossShardOptimizer` as named while the model_fn runs)."""
  def model_fn(features, labels, mode, params):
    del labels
    if params.get('column') is None:  # dict configs: the engine's activation
      net = features['ids']
    else:
      net = tf.compat.v1.keras.layers.DenseFeatures([params['column']])(
          features)
    loss = contract_loss(net, squared)
    optimizer = model_optimizer()
    if params['use_tpu']:
      optimizer = (cross_shard_optimizer or
                   tf.compat.v1.tpu.CrossShardOptimizer)(optimizer)
    return driver.TPUEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(
        loss, tf.compat.v1.train.get_global_step()))
  return model_fn




# The emulated TPU's user model: a legacy model_fn whose loss is linear in the
# activations of `inputs.Feature`s, plus a bias trained by the model's SGD.
def rate_fn(step):
  """A `learning_rate_fn` of the global step."""
  return 0.5 / (1.0 + tf.cast(step, tf.float32))


def spec_columns(tensor_core=True):
  """A spec's worth of columns: plain (with `rate_fn`), weighted, shared,
  sequence and, with `tensor_core`, a tensor-core one."""
  fc = tf.feature_column
  plain = tpu_fc.embedding_column(
      fc.categorical_column_with_identity('a', 10), 4, combiner='sum',
      learning_rate_fn=rate_fn)
  weighted = tpu_fc.embedding_column(
      fc.weighted_categorical_column(
          fc.categorical_column_with_identity('d', 7), 'd_weight'), 3,
      combiner='sqrtn')
  shared = tpu_fc.shared_embedding_columns(
      [fc.categorical_column_with_identity('c', 6),
       fc.categorical_column_with_identity('b', 6)], 2)
  sequence = tpu_fc.embedding_column(
      fc.sequence_categorical_column_with_identity('s', 5), 2,
      max_sequence_length=3)
  columns = [plain, weighted, sequence] + shared
  if tensor_core:
    columns.append(tpu_fc.embedding_column(
        fc.categorical_column_with_identity('t', 8), 2,
        embedding_lookup_device='tpu_tensor_core', tensor_core_shape=[None, 3]))
  return columns


MODEL_LR = 0.5  # the model_fn's own optimizer (bias, tensor core)
BIAS0 = 0.25


def init_table(seed):
  """A distinct constant table per seed, [VOCAB, DIM] float32."""
  return (np.linspace(-1.0, 1.0, VOCAB * DIM).reshape(VOCAB, DIM) * (1 + 0.1 * seed) +
          0.05 * seed).astype(np.float32)


def const_init(array):
  return tf.compat.v1.constant_initializer(array)


def user_model_fn(column_fn, layer='dense_features', reduction='sum',
                  model_optimizer=None, seen_batch_sizes=None):
  """A legacy TPUEstimator model_fn whose loss is linear in the activations.

  `column_fn() -> (dense columns, sequence columns)`.  Per example
  `sum((net + bias) * c) + sum(seq[:, :inputs.MAX_LENGTH] * cs)`; loss is their sum or mean.
  """

  def model_fn(features, labels, mode, params):
    del labels
    if seen_batch_sizes is not None:
      seen_batch_sizes.append(params['batch_size'])
    dense_columns, sequence_columns = column_fn()
    per_example, predictions = [], {}
    if dense_columns:
      if layer == 'dense_features':
        net = tf.keras.layers.DenseFeatures(dense_columns)(features)
      else:
        net = tf.compat.v1.feature_column.input_layer(features, dense_columns)
      bias = tf.compat.v1.get_variable(
          'bias', [net.shape[-1]], initializer=const_init(BIAS0))
      predictions['out'] = net + bias
      per_example.append(tf.reduce_sum(predictions['out'] * features['c'], 1))
    if sequence_columns:
      sequence, length = tf.keras.experimental.SequenceFeatures(
          sequence_columns)(features)
      predictions['seq'] = sequence[:, :inputs.MAX_LENGTH]
      predictions['seq_length'] = length
      per_example.append(
          tf.reduce_sum(predictions['seq'] * features['cs'], [1, 2]))
    per_example = tf.add_n(per_example)
    if mode == tpu_fc.ModeKeys.PREDICT:
      return tpu_fc.TPUEstimatorSpec(mode, predictions=predictions)
    loss = (tf.reduce_sum(per_example) if reduction == 'sum' else
            tf.reduce_mean(per_example))

    def metric_fn(per_example):
      return {'mean_per_example': tf.compat.v1.metrics.mean(per_example)}

    train_op = None
    if mode == tpu_fc.ModeKeys.TRAIN:
      optimizer = (model_optimizer() if model_optimizer else
                   tf.compat.v1.train.GradientDescentOptimizer(MODEL_LR))
      if params['use_tpu']:
        optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
      train_op = optimizer.minimize(
          loss, global_step=tf.compat.v1.train.get_global_step())
    return tpu_fc.TPUEstimatorSpec(mode, loss=loss, train_op=train_op,
                                   eval_metrics=(metric_fn, [per_example]))

  return model_fn


def option_model_fn(features, labels, mode, params):
  """The contract model on the embedding core, trained by the model's SGD,
  its spec carrying `params['option']`: a plain EstimatorSpec with a chief
  hook or a Saver, a scaffold_fn's Saver, a v1 summary in a host_call, an
  evaluation hook on the loss (None: a plain TPUEstimatorSpec)."""
  del labels
  net = tf.compat.v1.keras.layers.DenseFeatures([params['column']])(features)
  loss = contract_loss(net)
  train_op = (_sgd_step(loss, LR, cross_shard=True)
              if mode == tpu_fc.ModeKeys.TRAIN else None)
  option = params['option']
  if option == 'plain_spec_chief_hook':
    return tpu_fc.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                training_chief_hooks=[
                                    tf.compat.v1.train.StepCounterHook()])
  if option == 'plain_spec_saver':
    return tpu_fc.EstimatorSpec(
        mode, loss=loss, train_op=train_op,
        scaffold=tf.compat.v1.train.Scaffold(saver=tf.compat.v1.train.Saver()))
  kwargs = {}
  if option == 'scaffold_saver':
    kwargs['scaffold_fn'] = lambda: tf.compat.v1.train.Scaffold(
        saver=tf.compat.v1.train.Saver(max_to_keep=1))
  if option == 'v1_summary_in_host_call':
    kwargs['host_call'] = (lambda loss: [tf.compat.v1.summary.scalar(
        'host_loss', loss[0])], [tf.reshape(loss, [1])])
  if option == 'eval_hook_on_loss':
    kwargs['evaluation_hooks'] = [tf.compat.v1.train.LoggingTensorHook(
        {'loss': loss}, every_n_iter=1)]
  return tpu_fc.TPUEstimatorSpec(mode, loss=loss, train_op=train_op, **kwargs)

# Parts of model_fns.


def _sgd_step(loss, rate=0.1, cross_shard=True, update_ops=()):
  """SGD on `loss` (summed over the shards by CrossShardOptimizer, as on a
  TPU), after `update_ops` (TF1's batch norm pattern)."""
  optimizer = tf.compat.v1.train.GradientDescentOptimizer(rate)
  if cross_shard:
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
  with tf.control_dependencies(update_ops):
    return optimizer.minimize(loss, tf.compat.v1.train.get_global_step())


def tpu_spec(mode, loss, rate=0.1, cross_shard=True, update_ops=(),
             driver=tpu_fc, **kwargs):
  """`driver`'s TPUEstimatorSpec of `loss`, trained by `train_op` in TRAIN."""
  if mode == tpu_fc.ModeKeys.TRAIN:
    kwargs['train_op'] = _sgd_step(loss, rate, cross_shard, update_ops)
  return driver.TPUEstimatorSpec(mode, loss=loss, **kwargs)


def weighted_columns():
  """Two shared columns, 'ids1' and 'ids2' weighted by one feature, 'values'
  (`inputs.weighted_ids`)."""
  fc = tf.feature_column
  return tpu_fc.shared_embedding_columns(
      [fc.weighted_categorical_column(
          fc.categorical_column_with_identity(key, 5), 'values')
       for key in ('ids1', 'ids2')], 4)


def embedding_model_fn(columns, loss_fn,
                       layer=tf.compat.v1.keras.layers.DenseFeatures,
                       **spec_args):
  """`layer(columns)`'s activation `net` and the loss `loss_fn(net,
  features, labels)`, trained by SGD (`tpu_spec`'s `spec_args`: rate,
  cross_shard)."""
  def model_fn(features, labels, mode, params):
    del params
    net = layer(columns)(features)
    return tpu_spec(mode, loss_fn(net, features, labels), **spec_args)
  return model_fn


# Models of dense features.


def columns_model_fn(columns):
  """DenseFeatures(`columns`), a dense layer, the mean squared error, SGD."""
  def model_fn(features, labels, mode, params):
    del params
    net = tf.compat.v1.keras.layers.DenseFeatures(columns)(features)
    loss = tf.compat.v1.losses.mean_squared_error(
        labels, tf.compat.v1.layers.dense(net, 1))
    return tpu_spec(mode, loss, cross_shard=False)
  return model_fn


def dense_x_model_fn(driver=tpu_fc, cross_shard=True):
  """features['x'] through a dense layer of ones: the mean squared error,
  SGD (by CrossShardOptimizer if `cross_shard`), `driver`'s spec."""
  def model_fn(features, labels, mode, params):
    del params
    logits = tf.compat.v1.layers.dense(
        features['x'], 1, kernel_initializer=tf.compat.v1.ones_initializer())
    loss = tf.compat.v1.losses.mean_squared_error(labels, logits)
    return tpu_spec(mode, loss, cross_shard=cross_shard, driver=driver)
  return model_fn


def core_model_fn(driver, record_config=None):
  """One dense unit, squared error, gradient descent: `driver`'s
  EstimatorSpec (a core Estimator's model_fn); `record_config` gets the
  config the model_fn receives."""

  def model_fn(features, labels, mode, config):
    if record_config is not None:
      record_config(config)
    logits = tf.compat.v1.layers.dense(features['x'], 1)
    if mode == 'infer':
      return driver.EstimatorSpec(mode, predictions={'logit': logits})
    loss = tf.compat.v1.losses.mean_squared_error(labels, logits)
    return driver.EstimatorSpec(
        mode, loss=loss, train_op=tf.compat.v1.train.GradientDescentOptimizer(
            0.1).minimize(loss, tf.compat.v1.train.get_global_step()))

  return model_fn


def mean_logit(labels, logits):
  del labels
  return {'mean_logit': tf.compat.v1.metrics.mean(logits)}


def linear_model_fn(features, labels, mode, params):
  """A logistic regression on features as one Tensor (not a dict), as in TF's
  MNIST/ResNet TPU models.  `params` may give the spec class ('spec'), eval
  metrics ('metric_fn'), a hook on the loss ('hook_on_loss': 'logging' or
  'nan'), the optimizer unwrapped on a TPU ('plain_optimizer'), a host_call
  writing the loss to 'summary_dir', and a function of the params ('record')."""
  params.get('record', lambda params: None)(params)
  spec = params.get('spec', tpu_fc.TPUEstimatorSpec)
  logits = tf.compat.v1.layers.dense(
      features, 1, kernel_initializer=tf.compat.v1.constant_initializer(0.3))
  if mode == tpu_fc.ModeKeys.PREDICT:
    return spec(mode, predictions={'logit': logits})
  loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
  if mode == tpu_fc.ModeKeys.EVAL:
    return spec(mode, loss=loss, predictions={'logit': logits},
                eval_metrics=(params.get('metric_fn', mean_logit),
                              [labels, logits]))
  optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
  if params['use_tpu'] and not params.get('plain_optimizer'):
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
  hooks = {
      None: [],
      'logging': [tf.compat.v1.train.LoggingTensorHook({'loss': loss},
                                                       every_n_iter=1)],
      'nan': [tf.compat.v1.train.NanTensorHook(loss)],
  }[params.get('hook_on_loss')]
  global_step = tf.compat.v1.train.get_global_step()
  host_call = None
  if 'summary_dir' in params:  # the loss, as users wrote it (TF2 summaries)

    def host_call_fn(global_step, loss):
      with tf.compat.v2.summary.create_file_writer(
          params['summary_dir']).as_default():
        with tf.compat.v2.summary.record_if(True):
          tf.compat.v2.summary.scalar('loss', loss[0], step=global_step[0])
          return tf.compat.v1.summary.all_v2_summary_ops()

    host_call = (host_call_fn, [tf.reshape(global_step, [1]),
                                tf.reshape(loss, [1])])
  return spec(mode, loss=loss, training_hooks=hooks, host_call=host_call,
              train_op=optimizer.minimize(loss, global_step))

# A linear model of `inputs.ids_and_x`, by TF's names (a legacy script's; on
# the latest lane tpu_fc installs them).


def ids_and_x_columns(dimension):
  ids = tf.feature_column.categorical_column_with_identity(
      'ids', inputs.IDS_AND_X_VOCABULARY)
  return [tf.feature_column.embedding_column(ids, dimension),
          tf.feature_column.numeric_column('x')]


def ids_and_x_model_fn(metric_fn, dimension=3, learning_rate=0.5):
  """The model, evaluated by `metric_fn(labels, predictions)`."""

  def model_fn(features, labels, mode, params):
    del params
    net = tf.compat.v1.feature_column.input_layer(
        features, ids_and_x_columns(dimension))
    predictions = tf.compat.v1.layers.dense(  # (Keras' default ignores the seed)
        net, 1, kernel_initializer=tf.compat.v1.glorot_uniform_initializer())
    if mode == 'infer':
      return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
          mode, predictions={'prediction': predictions})
    loss = tf.compat.v1.losses.mean_squared_error(labels, predictions)
    train_op = tf.compat.v1.train.AdagradOptimizer(learning_rate).minimize(
        loss, tf.compat.v1.train.get_global_step())
    return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
        mode, loss=loss, train_op=train_op,
        eval_metrics=(metric_fn, [labels, predictions]))

  return model_fn


BEST_STEP = 4


def distance_to_the_best_step(labels, predictions):
  """An eval metric that follows from the schedule alone: (global step - 4)²."""
  del predictions
  step = tf.cast(tf.compat.v1.train.get_global_step(), tf.float32)
  return {'distance': tf.compat.v1.metrics.mean(
      tf.square(step - BEST_STEP) + 0 * tf.reduce_sum(labels))}


def distance_model_fn():
  """The model evaluated by `distance_to_the_best_step`."""
  return ids_and_x_model_fn(distance_to_the_best_step, dimension=2,
                            learning_rate=0.1)
