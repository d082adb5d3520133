"""The measured training paths: one model, one data set, several stacks.

Every path trains the same model on the same batches: 26 embedding tables
(combiner mean, truncated-normal init with stddev 1/sqrt(dim)), 13 dense features,
an MLP 256-128-1 (or, for the `*_no_mlp` paths, logits = sum of the embeddings +
a linear layer on the dense features), sigmoid cross-entropy, Adagrad (initial
accumulator 0.1) on every variable.
"""
import importlib
import shutil
import tempfile

import numpy as np

from tpu_fc._tf import tf  # noqa: I100  (sets up tf-keras on TF >= 2.16)
from benchmarks import workload as workload_lib

MLP_UNITS = (256, 128)


def _dataset(workload, data):
  """The cycled batches as a tf.data pipeline: ({feature: SparseTensor, 'dense'}, labels)."""
  ids, dense, labels = data
  features = {name: tf.SparseTensor(s.indices, s.values, s.dense_shape)
              for name, s in ids.items()}
  features['dense'] = dense
  dataset = tf.data.Dataset.from_tensor_slices((features, labels))
  return dataset.repeat().prefetch(2)


def _initializer(dim):
  return tf.compat.v1.truncated_normal_initializer(stddev=1 / np.sqrt(dim))


def _logits(embedded, dense, mlp):
  """The model on top of the embeddings: MLP, or a sum plus a linear term."""
  if not mlp:
    return (tf.reduce_sum(embedded, axis=1, keepdims=True) +
            tf.keras.layers.Dense(1)(dense))
  net = tf.concat([embedded, dense], axis=1)
  for units in MLP_UNITS:
    net = tf.keras.layers.Dense(units, activation=tf.nn.relu)(net)
  return tf.keras.layers.Dense(1)(net)


def _loss(labels, logits):
  return tf.reduce_mean(
      tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))


# --------------------------------------------------------------------------
# Estimator paths: TF 2.15's TPUEstimator and tpu_fc's.


class _EstimatorApi(object):
  """The names one estimator stack provides (TF 2.15's own, or tpu_fc's)."""

  def __init__(self, legacy):
    if legacy:
      tpu = tf.compat.v1.estimator.tpu
      self.estimator_cls = tpu.TPUEstimator
      self.run_config_cls = tpu.RunConfig
      self.tpu_config_cls = tpu.TPUConfig
      self.estimator_spec_cls = tpu.TPUEstimatorSpec
      experimental = tf.compat.v1.tpu.experimental
      self.embedding_column = experimental.embedding_column
      self.config_spec_cls = tpu.experimental.EmbeddingConfigSpec
      self.adagrad_cls = experimental.AdagradParameters
      self.parsing_receiver_fn = (
          tf.estimator.export.build_parsing_serving_input_receiver_fn)
    else:
      tpu_fc = importlib.import_module('tpu_fc')
      self.estimator_cls = tpu_fc.TPUEstimator
      self.run_config_cls = tpu_fc.RunConfig
      self.tpu_config_cls = tpu_fc.TPUConfig
      self.estimator_spec_cls = tpu_fc.TPUEstimatorSpec
      self.embedding_column = tpu_fc.embedding_column
      self.config_spec_cls = tpu_fc.EmbeddingConfigSpec
      self.adagrad_cls = tpu_fc.AdagradParameters
      self.parsing_receiver_fn = (
          tpu_fc.export.build_parsing_serving_input_receiver_fn)


def _columns(api, workload, device):
  fc = tf.feature_column
  extra = {}
  if device == 'tpu_tensor_core':
    extra = dict(embedding_lookup_device=device,
                 tensor_core_shape=[None, workload.max_ids_per_example])
  return [
      api.embedding_column(
          fc.categorical_column_with_identity(name, size), workload.dim,
          combiner='mean', initializer=_initializer(workload.dim), **extra)
      for name, size in zip(workload.feature_names, workload.table_sizes)
  ]


def _model_fn(api, workload, device, mlp, learning_rate):
  """A legacy TPUEstimator model_fn, the same for every estimator path."""

  def model_fn(features, labels, mode, params):
    columns = _columns(api, workload, device)
    embedded = tf.keras.layers.DenseFeatures(columns)(features)
    logits = _logits(embedded, features['dense'], mlp)
    if mode == 'infer':  # ModeKeys.PREDICT (tf.estimator is gone on TF >= 2.16)
      return api.estimator_spec_cls(
          mode, predictions={'probability': tf.sigmoid(logits)})
    loss = _loss(labels, logits)
    optimizer = tf.compat.v1.train.AdagradOptimizer(learning_rate)
    if params['use_tpu']:
      optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
    train_op = optimizer.minimize(
        loss, global_step=tf.compat.v1.train.get_global_step())
    return api.estimator_spec_cls(mode, loss=loss, train_op=train_op)

  return model_fn


def session_config(threads):
  """Estimator's default session config with the benchmark's thread counts."""
  config = tf.compat.v1.ConfigProto(
      allow_soft_placement=True, intra_op_parallelism_threads=threads,
      inter_op_parallelism_threads=threads)
  rewrite_options = config.graph_options.rewrite_options
  rewrite_options.meta_optimizer_iterations = rewrite_options.ONE
  return config


class _TimingHook(tf.compat.v1.train.SessionRunHook):
  """Hands each session.run to the controller with the steps it trained.

  The steps are the global step's advance since the previous run (the first
  run counts as `steps_per_run`), so an in-graph loop is counted as what it did.
  """

  def __init__(self, controller, steps_per_run):
    self._controller = controller
    self._steps_per_run = steps_per_run
    self._previous = None

  def begin(self):
    self._global_step = tf.compat.v1.train.get_global_step()

  def before_run(self, run_context):
    return tf.compat.v1.train.SessionRunArgs(self._global_step)

  def after_run(self, run_context, run_values):
    step = int(run_values.results)
    steps = (self._steps_per_run if self._previous is None else
             step - self._previous)
    self._previous = step
    if self._controller.after_run(steps):
      run_context.request_stop()


def _run_estimator(job, workload, controller, legacy, use_tpu, device, mlp):
  api = _EstimatorApi(legacy)
  export_base = job.get('export_dir')
  iterations = job['iterations_per_loop']
  config = api.run_config_cls(
      model_dir=tempfile.mkdtemp(prefix='tpu_fc_bench_'),
      tf_random_seed=workload.seed,
      save_checkpoints_steps=10**9 if export_base else None,
      save_checkpoints_secs=None, save_summary_steps=0,
      log_step_count_steps=None, checkpoint_save_graph_def=False,
      session_config=session_config(job['threads']),
      tpu_config=api.tpu_config_cls(
          iterations_per_loop=iterations,
          # (1 is None: TPUConfig refuses num_shards=1 with embedding tables)
          num_shards=job.get('num_shards', 1) if use_tpu and not legacy and
          job.get('num_shards', 1) > 1 else None))
  spec = api.config_spec_cls(
      feature_columns=_columns(api, workload, device),
      optimization_parameters=api.adagrad_cls(job['learning_rate']))
  estimator = api.estimator_cls(
      model_fn=_model_fn(api, workload, device, mlp, job['learning_rate']),
      config=config, use_tpu=use_tpu, train_batch_size=workload.batch_size,
      predict_batch_size=workload.batch_size, export_to_tpu=False,
      embedding_config_spec=spec)
  data = workload_lib.make_data(workload)
  estimator.train(lambda params: _dataset(workload, data), steps=10**9,
                  hooks=[_TimingHook(controller, iterations if use_tpu else 1)])
  try:
    return _export(api, workload, estimator, export_base)
  finally:
    shutil.rmtree(config.model_dir, ignore_errors=True)


def _export(api, workload, estimator, export_base):
  """{'export_dir': ...} of a SavedModel with a tf.Example receiver, or {}."""
  if not export_base:
    return {}
  parse_spec = tf.feature_column.make_parse_example_spec(
      _columns(api, workload, 'tpu_embedding_core'))
  parse_spec['dense'] = tf.io.FixedLenFeature([workload_lib.NUM_DENSE],
                                              tf.float32)
  export_dir = estimator.export_saved_model(
      export_base, api.parsing_receiver_fn(parse_spec))
  if isinstance(export_dir, bytes):
    export_dir = export_dir.decode()
  return {'export_dir': export_dir}


# --------------------------------------------------------------------------
# TF2 paths: the mid-level API by hand, and raw TF ops.


def _loop_function(step_fn, iterations):
  """A tf.function that runs `iterations` steps of `step_fn` in an in-graph loop."""

  @tf.function
  def loop(iterator):
    for _ in tf.range(iterations):
      step_fn(*next(iterator))

  return loop


def _run_loop(job, workload, controller, step_fn):
  iterator = iter(_dataset(workload, workload_lib.make_data(workload)))
  iterations = job['iterations_per_loop']
  loop = _loop_function(step_fn, iterations)
  loop(iterator)
  while not controller.after_run(iterations):
    loop(iterator)


def _run_mid_level(job, workload, controller, mlp):
  """The model hand-migrated to the mid-level API's CPU lookup.

  `TPUEmbeddingForServing` owns the tables, `serving_embedding_lookup` looks them
  up, a GradientTape differentiates, and TF's Adagrad applies the tables'
  IndexedSlices gradients (what a TF2 user without a TPU writes).
  """
  embedding = tf.tpu.experimental.embedding
  feature_config = _mid_level_features(workload)
  # The serving object never trains: SGD keeps it from creating slot variables
  # that TF's Adagrad below (which keeps its own accumulators) would not use.
  mid_level = embedding.TPUEmbeddingForServing(
      feature_config, embedding.SGD(learning_rate=job['learning_rate']))
  mid_level.build()
  tables = mid_level.embedding_tables
  head = _Head(mlp)
  optimizer = tf.compat.v1.train.AdagradOptimizer(job['learning_rate'])
  names = workload.feature_names

  def step(features, labels):
    with tf.GradientTape() as tape:
      activations = embedding.serving_embedding_lookup(
          {name: features[name] for name in names}, None, tables,
          feature_config)
      embedded = tf.concat([activations[name] for name in names], axis=1)
      loss = _loss(labels, head(embedded, features['dense']))
    variables = list(tables.values()) + head.trainable_variables
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

  _run_loop(job, workload, controller, step)


def _mid_level_features(workload):
  """The workload's mid-level feature config: one table per feature."""
  embedding = tf.tpu.experimental.embedding
  return {
      name: embedding.FeatureConfig(
          table=embedding.TableConfig(
              vocabulary_size=size, dim=workload.dim, combiner='mean',
              initializer=tf.initializers.TruncatedNormal(
                  stddev=1 / np.sqrt(workload.dim), seed=workload.seed),
              name='table_' + name),
          name=name)
      for name, size in zip(workload.feature_names, workload.table_sizes)}


def _run_tpu_fc_mid_level(job, workload, controller, mlp):
  """The model migrated to the mid-level API, trained by tpu_fc's host
  `TPUEmbedding` (enqueue, dequeue, apply_gradients), the head by TF1 Adagrad;
  Grappler's arithmetic optimizer off, as in tpu_fc's estimator sessions."""
  tpu_fc = importlib.import_module('tpu_fc')
  tf.config.optimizer.set_experimental_options(
      {'arithmetic_optimization': False})
  embedding = tpu_fc.mid_level.TPUEmbedding(
      _mid_level_features(workload),
      tf.tpu.experimental.embedding.Adagrad(
          job['learning_rate'], initial_accumulator_value=0.1),
      num_cores=job.get('num_shards', 1))
  head = _Head(mlp)
  optimizer = tf.compat.v1.train.AdagradOptimizer(job['learning_rate'])
  names = workload.feature_names

  def step(features, labels):
    embedding.enqueue({name: features[name] for name in names})
    with tf.GradientTape() as tape:
      activations = embedding.dequeue()
      tape.watch(activations)
      embedded = tf.concat([activations[name] for name in names], axis=1)
      loss = _loss(labels, head(embedded, features['dense']))
    variables = head.trainable_variables
    head_gradients, activation_gradients = tape.gradient(
        loss, (variables, activations))
    optimizer.apply_gradients(zip(head_gradients, variables))
    embedding.apply_gradients(activation_gradients)

  _run_loop(job, workload, controller, step)


class _Head(tf.Module):
  """`_logits` as a module, so its variables are created once."""

  def __init__(self, mlp):
    super().__init__()
    self._mlp = mlp
    units = MLP_UNITS + (1,) if mlp else (1,)
    self._layers = [
        tf.keras.layers.Dense(n, activation=tf.nn.relu if i < len(units) - 1
                              else None) for i, n in enumerate(units)]

  def __call__(self, embedded, dense):
    if not self._mlp:
      return (tf.reduce_sum(embedded, axis=1, keepdims=True) +
              self._layers[0](dense))
    net = tf.concat([embedded, dense], axis=1)
    for layer in self._layers:
      net = layer(net)
    return net

  @property
  def trainable_variables(self):
    return [v for layer in self._layers for v in layer.trainable_variables]


def _run_raw(job, workload, controller, mlp):
  """The lower bound: per table unique -> gather -> segment mean -> sparse Adagrad.

  Ids are de-duplicated once per table and step and the same unique ids index
  the update, so the sparse apply gets duplicate-free rows.  Grappler's
  arithmetic optimizer is off: its embedding-lookup rewrite would read whole
  tables (see PERFORMANCE_NOTES), and a hand-written graph gets no handicap.
  """
  tf.config.optimizer.set_experimental_options(
      {'arithmetic_optimization': False})
  learning_rate = job['learning_rate']
  initializer = tf.initializers.TruncatedNormal(
      stddev=1 / np.sqrt(workload.dim), seed=workload.seed)
  tables = [tf.Variable(initializer([size, workload.dim]), trainable=False)
            for size in workload.table_sizes]
  table_accumulators = [tf.Variable(tf.fill(t.shape, 0.1)) for t in tables]
  head = _Head(mlp)
  head_accumulators = {}
  names = workload.feature_names

  def step(features, labels):
    unique_ids, rows, activations = [], [], []
    with tf.GradientTape() as tape:
      for name, table in zip(names, tables):
        ids = features[name]
        unique, index = tf.unique(ids.values)
        gathered = tf.gather(table, unique)
        tape.watch(gathered)
        unique_ids.append(unique)
        rows.append(gathered)
        activations.append(tf.sparse.segment_mean(
            gathered, index, ids.indices[:, 0],
            num_segments=workload.batch_size))
      loss = _loss(labels, head(tf.concat(activations, axis=1),
                                features['dense']))
    head_variables = head.trainable_variables
    gradients = tape.gradient(loss, rows + head_variables)
    for table, accumulator, unique, gradient in zip(
        tables, table_accumulators, unique_ids, gradients):
      tf.raw_ops.ResourceSparseApplyAdagrad(
          var=table.handle, accum=accumulator.handle, lr=learning_rate,
          grad=gradient, indices=unique)
    for variable, gradient in zip(head_variables, gradients[len(rows):]):
      tf.raw_ops.ResourceApplyAdagrad(
          var=variable.handle, accum=head_accumulators[variable.ref()].handle,
          lr=learning_rate, grad=gradient)

  # The head's variables exist after one call; then their accumulators.
  head(tf.zeros([1, workload.dim * len(names)]),
       tf.zeros([1, workload_lib.NUM_DENSE]))
  for variable in head.trainable_variables:
    head_accumulators[variable.ref()] = tf.Variable(tf.fill(variable.shape, 0.1))
  _run_loop(job, workload, controller, step)


def _threads(job):
  tf.config.threading.set_intra_op_parallelism_threads(job['threads'])
  tf.config.threading.set_inter_op_parallelism_threads(job['threads'])


# name -> runner(job, workload, controller); described in run.TRAINING_PATHS.
PATHS = {
    'legacy_cpu': lambda j, w, c: _run_estimator(
        j, w, c, legacy=True, use_tpu=False, device='tpu_embedding_core',
        mlp=True),
    'tpu_fc_cpu': lambda j, w, c: _run_estimator(
        j, w, c, legacy=False, use_tpu=False, device='tpu_embedding_core',
        mlp=True),
    'tpu_fc_embedding_core': lambda j, w, c: _run_estimator(
        j, w, c, legacy=False, use_tpu=True, device='tpu_embedding_core',
        mlp=True),
    'tpu_fc_embedding_core_8_shards': lambda j, w, c: _run_estimator(
        dict(j, num_shards=8), w, c, legacy=False, use_tpu=True,
        device='tpu_embedding_core', mlp=True),
    'tpu_fc_tensor_core': lambda j, w, c: _run_estimator(
        j, w, c, legacy=False, use_tpu=True, device='tpu_tensor_core',
        mlp=True),
    'tpu_fc_embedding_core_no_mlp': lambda j, w, c: _run_estimator(
        j, w, c, legacy=False, use_tpu=True, device='tpu_embedding_core',
        mlp=False),
    'mid_level': lambda j, w, c: _run_mid_level(j, w, c, mlp=True),
    'tpu_fc_mid_level': lambda j, w, c: _run_tpu_fc_mid_level(j, w, c,
                                                              mlp=True),
    'raw': lambda j, w, c: _run_raw(j, w, c, mlp=True),
    'raw_no_mlp': lambda j, w, c: _run_raw(j, w, c, mlp=False),
}


def run(job, workload, controller):
  _threads(job)
  tf.compat.v1.logging.set_verbosity(tf.compat.v1.logging.ERROR)
  return PATHS[job['path']](job, workload, controller)
