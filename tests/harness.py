"""The shared test harness: one model with known gradients, per lookup path,
input kind and optimizer, and the reference oracle of its first step.

The model: `loss = sum(activation * COEF)` over the batch, an embedding column
with the mean combiner on IDS, so d(loss)/d(activation) = COEF for every
example and each id of example e gets COEF / |IDS[e]| (scaled by 1/num_shards
on the emulated TPU: `CrossShardOptimizer` averages over the shards, as on a
TPU).  `expected_step` derives the tables from `tpu_fc.reference` with the
float32 error bound of `helpers.ReferenceSteps`.
"""
import tempfile

import numpy as np

import helpers
import tpu_fc
from tpu_fc import optimizers
from tpu_fc import reference
from tpu_fc._tf import tf

PATHS = ('cpu', 'embedding_core', 'tensor_core')
INPUT_KINDS = ('sparse', 'ragged', 'dense', 'iterator_tensors')
VOCAB, DIM, NUM_SHARDS, LR = 6, 2, 2, 0.2
IDS = [[1], [2, 4], [3], [4, 5]]  # no id 0: dense ids drop it on the TPU
COEF = np.array([1.0, -2.0], np.float32)
START = (np.arange(VOCAB * DIM, dtype=np.float32).reshape(VOCAB, DIM) - 4) / 8
TABLE = 'dense_features/ids_embedding/embedding_weights'

# The spec's optimizers (embedding core); the table of the other paths is a
# model variable, trained by the model's optimizer (`MODEL_OPTIMIZERS`).
EMBEDDING_OPTIMIZERS = {
    'sgd': tpu_fc.StochasticGradientDescentParameters(LR),
    'adagrad': tpu_fc.AdagradParameters(LR, initial_accumulator=0.1),
    'adam': tpu_fc.AdamParameters(LR, beta1=0.8, beta2=0.9, epsilon=0.1),
    'adam_non_lazy': tpu_fc.AdamParameters(LR, lazy_adam=False),
    # Without gradient accumulation: the cores' sums applied in turn.
    'adam_per_core': tpu_fc.AdamParameters(LR, beta1=0.8, beta2=0.9,
                                           epsilon=0.1,
                                           use_gradient_accumulation=False),
    'ftrl': tpu_fc.FtrlParameters(LR, l1_regularization_strength=0.01,
                                  l2_regularization_strength=0.02),
    'proximal_adagrad': tpu_fc.ProximalAdagradParameters(
        LR, l1_regularization_strength=0.01, l2_regularization_strength=0.1),
    'momentum': tpu_fc.MomentumParameters(LR, momentum=0.9),
    'rms_prop': tpu_fc.RMSPropParameters(LR, rho=0.9, momentum=0.5,
                                         epsilon=0.1),
    # (the hyperparameters of TF's TPU test of the mid-level AdagradMomentum)
    'adagrad_momentum': tpu_fc.AdagradMomentumParameters(
        LR, momentum=0.9, use_nesterov=True, exponent=3.0, beta2=0.9,
        epsilon=0.1),
}
# Those TF 2.15's spec takes with feature columns (`estimator` makes such a
# spec); its engine takes the others from dict configs only.
COLUMN_OPTIMIZERS = tuple(
    name for name, params in EMBEDDING_OPTIMIZERS.items()
    if isinstance(params, optimizers.SUPPORTED_OPTIMIZERS))
# TF1 optimizer -> the reference rule its sparse update is.
MODEL_OPTIMIZERS = {
    'sgd': (lambda: tf.compat.v1.train.GradientDescentOptimizer(LR),
            EMBEDDING_OPTIMIZERS['sgd']),
    'adagrad': (lambda: tf.compat.v1.train.AdagradOptimizer(
        LR, initial_accumulator_value=0.1), EMBEDDING_OPTIMIZERS['adagrad']),
}


def column(path):
  device = {'tensor_core': dict(embedding_lookup_device='tpu_tensor_core',
                                tensor_core_shape=[None, 2])}.get(path, {})
  return tpu_fc.embedding_column(
      tf.feature_column.categorical_column_with_identity('ids', VOCAB), DIM,
      combiner='mean', initializer=tf.compat.v1.constant_initializer(START),
      **device)


def ids_feature(kind):
  """IDS as `kind` ('dense': padded with -1, the padding every path drops)."""
  ragged = tf.ragged.constant(IDS, tf.int64)
  if kind == 'ragged':
    return ragged
  if kind == 'dense':
    return ragged.to_tensor(default_value=-1)
  return ragged.to_sparse()


def input_fn_of(kind):
  """input_fn giving IDS as `kind`, every step (iterator_tensors: sparse ids
  as the tensors of an iterator's `get_next()`)."""

  def input_fn(params):
    del params
    features = {'ids': ids_feature(
        'sparse' if kind == 'iterator_tensors' else kind)}
    dataset = tf.data.Dataset.from_tensors((features, tf.zeros([len(IDS), 1])))
    dataset = dataset.repeat()
    if kind == 'iterator_tensors':
      return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    return dataset

  return input_fn


def loss_of(activation, squared=False):
  """The model's loss: sum(activation * COEF), whose gradient is known; or
  sum(activation² * COEF) / 2, whose gradient is the activation's (it sees
  which rows a lookup read: pipelined execution)."""
  if squared:
    return tf.reduce_sum(activation * activation * COEF) / 2
  return tf.reduce_sum(activation * COEF)


def model_fn_of(model_optimizer, driver=tpu_fc, squared=False):
  def model_fn(features, labels, mode, params):
    del labels
    if params.get('column') is None:  # dict configs: the engine's activation
      net = features['ids']
    else:
      net = tf.compat.v1.keras.layers.DenseFeatures([params['column']])(
          features)
    loss = loss_of(net, squared)
    optimizer = model_optimizer()
    if params['use_tpu']:
      optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
    return driver.TPUEstimatorSpec(mode, loss=loss, train_op=optimizer.minimize(
        loss, tf.compat.v1.train.get_global_step()))
  return model_fn


# The ops that update a TF1 optimizer's variable: whole-table, or by rows.
DENSE_UPDATES = {'ResourceApplyGradientDescent', 'ResourceApplyAdagrad'}
ROW_UPDATES = {'ResourceScatterAdd', 'ResourceSparseApplyAdagrad'}


def op_types(model_dir):
  """The op types of the training graph written to `model_dir` (with its
  functions': a loop's body is one)."""
  meta = tf.compat.v1.MetaGraphDef()
  with open(tf.train.latest_checkpoint(str(model_dir)) + '.meta', 'rb') as f:
    meta.ParseFromString(f.read())
  graph = meta.graph_def
  return {node.op for node in graph.node} | {
      node.op for function in graph.library.function
      for node in function.node_def}


def tf_estimator(model_dir, optimizer_name):
  """TF 2.15's own TPUEstimator(use_tpu=False), with TF's own column (legacy
  lane): what the cpu path must equal."""
  tpu = tf.compat.v1.estimator.tpu
  col = tf.compat.v1.tpu.experimental.embedding_column(
      tf.feature_column.categorical_column_with_identity('ids', VOCAB), DIM,
      combiner='mean', initializer=tf.compat.v1.constant_initializer(START))
  return tpu.TPUEstimator(
      model_fn=model_fn_of(MODEL_OPTIMIZERS[optimizer_name][0], tpu),
      use_tpu=False, train_batch_size=len(IDS), params={'column': col},
      config=tpu.RunConfig(model_dir=str(model_dir), tpu_config=tpu.TPUConfig(
          num_shards=NUM_SHARDS, iterations_per_loop=2)))


def in_dicts(path, optimizer_name):
  """Whether `estimator` declares the table in dict configs: the embedding
  core's table of an optimizer the column spec refuses."""
  return path == 'embedding_core' and optimizer_name not in COLUMN_OPTIMIZERS


def table_variable(path, optimizer_name):
  """The checkpoint name of `estimator`'s table: the column's (TABLE), or
  its key in the dict configs."""
  return 'ids' if in_dicts(path, optimizer_name) else TABLE


def estimator(model_dir, path, optimizer_name, num_shards=NUM_SHARDS,
              pipelined=False, squared=False, profile_data_directory=None):
  """The estimator of `path`, its table trained by `optimizer_name`'s rule
  (`pipelined`, `profile_data_directory`: the spec's options)."""
  col = column(path)
  model_optimizer = MODEL_OPTIMIZERS.get(
      optimizer_name, MODEL_OPTIMIZERS['sgd'])[0]
  spec = None
  options = dict(pipeline_execution_with_tensor_core=pipelined,
                 profile_data_directory=profile_data_directory)
  if in_dicts(path, optimizer_name):
    col = None
    spec = tpu_fc.EmbeddingConfigSpec(
        feature_to_config_dict={'ids': tpu_fc.FeatureConfig('ids')},
        table_to_config_dict={'ids': tpu_fc.TableConfig(
            VOCAB, DIM, combiner='mean',
            initializer=tf.compat.v1.constant_initializer(START))},
        optimization_parameters=EMBEDDING_OPTIMIZERS[optimizer_name],
        **options)
  elif path != 'cpu':
    spec = tpu_fc.EmbeddingConfigSpec(
        feature_columns=[col], optimization_parameters=EMBEDDING_OPTIMIZERS[
            optimizer_name if path == 'embedding_core' else 'sgd'],
        **options)
  return tpu_fc.TPUEstimator(
      model_fn=model_fn_of(model_optimizer, squared=squared),
      use_tpu=path != 'cpu',
      train_batch_size=len(IDS), params={'column': col},
      config=tpu_fc.RunConfig(model_dir=str(model_dir), tpu_config=(
          # (one core is num_shards=None: TF refuses 1 with embedding tables)
          tpu_fc.TPUConfig(num_shards=num_shards if num_shards > 1 else None,
                           iterations_per_loop=2))),
      embedding_config_spec=spec)


# The spec's optimizers that have a `tf.tpu.experimental.embedding` twin.
MID_LEVEL_OPTIMIZERS = ('adagrad', 'adagrad_momentum', 'adam', 'adam_non_lazy',
                        'adam_per_core', 'ftrl', 'sgd')


def mid_level_embedding(optimizer_name, num_cores, pipelined=False):
  """`tpu_fc.mid_level.TPUEmbedding` of the migrated model: one table 'ids'
  (the column's), trained by `optimizer_name`'s mid-level twin."""
  table = tf.tpu.experimental.embedding.TableConfig(
      vocabulary_size=VOCAB, dim=DIM, combiner='mean', name='ids',
      initializer=tf.constant_initializer(START))
  return tpu_fc.mid_level.TPUEmbedding(
      {'ids': tf.tpu.experimental.embedding.FeatureConfig(table=table)},
      EMBEDDING_OPTIMIZERS[optimizer_name].to_mid_level(),
      pipeline_execution_with_tensor_core=pipelined, num_cores=num_cores)


def mid_level_step(embedding, kind, num_cores, squared=False,
                   scale_gradients=None):
  """One step of the migrated loop (untraced): the model's loss on IDS as
  `kind`, its gradient scaled as `CrossShardOptimizer` scales each core's
  (then by `scale_gradients`, e.g. `MidLevelConfig.scale_gradients`)."""

  def step():
    embedding.enqueue({'ids': ids_feature(kind)})
    with tf.GradientTape() as tape:
      activations = embedding.dequeue()
      tape.watch(activations)
      loss = loss_of(activations['ids'], squared) / num_cores
    gradients = tape.gradient(loss, activations)
    embedding.apply_gradients(scale_gradients(gradients) if scale_gradients
                              else gradients)

  return step


def mid_level_train(embedding, kind, steps, num_cores, function=True,
                    squared=False):
  """The migrated training loop: `steps` steps of `mid_level_step`."""
  step = mid_level_step(embedding, kind, num_cores, squared)
  step = tf.function(step) if function else step
  for _ in range(steps):
    step()
  with tempfile.TemporaryDirectory() as directory:
    # As a checkpoint holds them (a saved checkpoint gets the update a
    # pipelined step parked for the next lookup).
    tf.train.Checkpoint(embedding=embedding).save(directory + '/ckpt')
  table = embedding.embedding_tables
  variables = embedding._variables['ids']  # pylint: disable=protected-access
  return (next(iter(table.values())).numpy(),
          {slot: variables[slot].numpy() for slot in variables
           if slot != 'parameters'})


def occurrences(num_shards):
  """(ids, cores, d(loss)/d(row)) of every looked-up id."""
  per_core = len(IDS) // num_shards
  ids, cores, grads = [], [], []
  for example, row_ids in enumerate(IDS):
    for row in row_ids:
      ids.append(row)
      cores.append(example // per_core)
      grads.append(COEF / len(row_ids) / num_shards)
  return np.array(ids), np.array(cores), np.array(grads, np.float32)


def expected_step(path, optimizer_name, steps=1, num_shards=NUM_SHARDS):
  """`helpers.ReferenceSteps` after `steps` steps of `path` ('mid_level': the
  migrated model on `num_shards` emulated cores)."""
  if path in ('embedding_core', 'mid_level'):
    params = EMBEDDING_OPTIMIZERS[optimizer_name]
  else:
    params = MODEL_OPTIMIZERS[optimizer_name][1]
  num_shards = 1 if path == 'cpu' else num_shards
  ids, cores, grads = occurrences(num_shards)
  want = helpers.ReferenceSteps(params, START,
                                reference.init_slots(params, (VOCAB, DIM)),
                                gradient_roundings=2)
  for _ in range(steps):
    if path != 'cpu' and path != 'tensor_core':  # as the optimizer's
      # use_gradient_accumulation says: one update, or each core's in turn
      want.step(ids, grads, LR, cores=cores, num_cores=num_shards)
    else:  # a model variable: the shards' gradients averaged, one update
      want.step(ids, grads, LR)
  return want
