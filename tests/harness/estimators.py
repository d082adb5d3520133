"""Estimators and specs, and the optimizers they train with.

The contract model's estimator (`contract_estimator`) per lookup path: its
table trained by the spec's optimizer (embedding_core) or, a model variable,
by the model's (cpu, tensor_core); on the legacy lane TF 2.15's own
TPUEstimator(use_tpu=False) of the same model (`tf_contract_estimator`).
"""
import tpu_fc
from tpu_fc._tf import tf

from harness import hooks
from harness import inputs
from harness import models

NUM_SHARDS = 2

# The spec's optimizers (embedding core); the table of the other paths is a
# model variable, trained by the model's optimizer (`MODEL_OPTIMIZERS`).
_LR = models.LR
EMBEDDING_OPTIMIZERS = {
    'sgd': tpu_fc.StochasticGradientDescentParameters(_LR),
    'adagrad': tpu_fc.AdagradParameters(_LR, initial_accumulator=0.1),
    'adam': tpu_fc.AdamParameters(_LR, beta1=0.8, beta2=0.9, epsilon=0.1),
    'adam_non_lazy': tpu_fc.AdamParameters(_LR, lazy_adam=False),
    # Without gradient accumulation: the cores' sums applied in turn.
    'adam_per_core': tpu_fc.AdamParameters(_LR, beta1=0.8, beta2=0.9,
                                           epsilon=0.1,
                                           use_gradient_accumulation=False),
    'ftrl': tpu_fc.FtrlParameters(_LR, l1_regularization_strength=0.01,
                                  l2_regularization_strength=0.02),
    'proximal_adagrad': tpu_fc.ProximalAdagradParameters(
        _LR, l1_regularization_strength=0.01, l2_regularization_strength=0.1),
    'momentum': tpu_fc.MomentumParameters(_LR, momentum=0.9),
    'rms_prop': tpu_fc.RMSPropParameters(_LR, rho=0.9, momentum=0.5,
                                         epsilon=0.1),
    # (the hyperparameters of TF's TPU test of the mid-level AdagradMomentum)
    'adagrad_momentum': tpu_fc.AdagradMomentumParameters(
        _LR, momentum=0.9, use_nesterov=True, exponent=3.0, beta2=0.9,
        epsilon=0.1),
}
# Those the spec takes with feature columns (`contract_estimator` makes such a
# spec); the engine takes the others from dict configs only.
COLUMN_OPTIMIZERS = tuple(name for name, params in EMBEDDING_OPTIMIZERS.items()
                          if params.FEATURE_COLUMNS)
# TF1 optimizer -> the reference rule its sparse update is.
MODEL_OPTIMIZERS = {
    'sgd': (lambda: tf.compat.v1.train.GradientDescentOptimizer(_LR),
            EMBEDDING_OPTIMIZERS['sgd']),
    'adagrad': (lambda: tf.compat.v1.train.AdagradOptimizer(
        _LR, initial_accumulator_value=0.1), EMBEDDING_OPTIMIZERS['adagrad']),
}

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


def tf_contract_estimator(model_dir, optimizer_name):
  """TF 2.15's own TPUEstimator(use_tpu=False), with TF's own column (legacy
  lane): what the cpu path must equal."""
  tpu = tf.compat.v1.estimator.tpu
  col = tf.compat.v1.tpu.experimental.embedding_column(
      tf.feature_column.categorical_column_with_identity('ids', models.VOCAB),
      models.DIM, combiner='mean',
      initializer=tf.compat.v1.constant_initializer(models.START))
  return tpu.TPUEstimator(
      model_fn=models.contract_model_fn(MODEL_OPTIMIZERS[optimizer_name][0],
                                        tpu),
      use_tpu=False, train_batch_size=len(inputs.IDS), params={'column': col},
      config=tpu.RunConfig(model_dir=str(model_dir), tpu_config=tpu.TPUConfig(
          num_shards=NUM_SHARDS, iterations_per_loop=2)))


def in_dicts(path, optimizer_name):
  """Whether `contract_estimator` declares the table in dict configs: the
  embedding core's table of an optimizer the column spec refuses."""
  return (path == 'embedding_core' and
          not EMBEDDING_OPTIMIZERS[optimizer_name].FEATURE_COLUMNS)


def table_variable(path, optimizer_name):
  """The checkpoint name of `contract_estimator`'s table: the column's
  (TABLE), or its key in the dict configs."""
  return 'ids' if in_dicts(path, optimizer_name) else models.TABLE


def contract_estimator(model_dir, path, optimizer_name, num_shards=NUM_SHARDS,
                       pipelined=False, squared=False,
                       profile_data_directory=None, cross_shard_optimizer=None,
                       spec_optimizer=None):
  """The estimator of `path`, its table trained by `optimizer_name`'s rule
  (`pipelined`, `profile_data_directory`: the spec's options;
  `cross_shard_optimizer`: `models.contract_model_fn`'s; `spec_optimizer`:
  the spec's on cpu and tensor_core, which the model's optimizer trains
  aside of it, by default none on cpu and 'sgd' on tensor_core)."""
  col = models.contract_column(path)
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
            models.VOCAB, models.DIM, combiner='mean',
            initializer=tf.compat.v1.constant_initializer(models.START))},
        optimization_parameters=EMBEDDING_OPTIMIZERS[optimizer_name],
        **options)
  elif path != 'cpu' or spec_optimizer:
    spec = tpu_fc.EmbeddingConfigSpec(
        feature_columns=[col], optimization_parameters=EMBEDDING_OPTIMIZERS[
            optimizer_name if path == 'embedding_core'
            else spec_optimizer or 'sgd'],
        **options)
  return tpu_fc.TPUEstimator(
      model_fn=models.contract_model_fn(
          model_optimizer, squared=squared,
          cross_shard_optimizer=cross_shard_optimizer),
      use_tpu=path != 'cpu',
      train_batch_size=len(inputs.IDS), params={'column': col},
      config=tpu_fc.RunConfig(model_dir=str(model_dir), tpu_config=(
          # (one core is num_shards=None: TF refuses 1 with embedding tables)
          tpu_fc.TPUConfig(num_shards=num_shards if num_shards > 1 else None,
                           iterations_per_loop=2))),
      embedding_config_spec=spec)



def option_estimator(model_dir, option=None, iterations_per_loop=2):
  """The estimator of `models.option_model_fn` on 2 shards, saving every
  step; the table trained by the spec's Adagrad."""
  column = models.contract_column('embedding_core')
  return tpu_fc.TPUEstimator(
      model_fn=models.option_model_fn, use_tpu=True,
      train_batch_size=len(inputs.IDS), eval_batch_size=len(inputs.IDS),
      params={'column': column, 'option': option},
      config=tpu_fc.RunConfig(
          model_dir=str(model_dir), save_checkpoints_steps=1,
          tpu_config=tpu_fc.TPUConfig(
              num_shards=NUM_SHARDS,
              iterations_per_loop=iterations_per_loop)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=[column],
          optimization_parameters=EMBEDDING_OPTIMIZERS['adagrad']))

# The emulated TPU's user model (`models.user_model_fn`).


def user_estimator(model_dir, model_fn, spec, use_tpu=True,
                   num_shards=NUM_SHARDS, save_checkpoints_steps=None):
  """The user model's TPUEstimator: the same batch in every mode (a
  checkpoint every `save_checkpoints_steps`, or RunConfig's default)."""
  checkpoints = ({} if save_checkpoints_steps is None else
                 dict(save_checkpoints_steps=save_checkpoints_steps))
  return tpu_fc.TPUEstimator(
      model_fn=model_fn, model_dir=str(model_dir), use_tpu=use_tpu,
      config=tpu_fc.RunConfig(
          tf_random_seed=1, tpu_config=tpu_fc.TPUConfig(num_shards=num_shards),
          **checkpoints),
      train_batch_size=inputs.BATCH, eval_batch_size=inputs.BATCH,
      predict_batch_size=inputs.BATCH,
      embedding_config_spec=spec)


def one_column(feat, init, params, **options):
  """(column_fn, spec) of the user model with `feat`'s column alone, its table
  starting at `init` and trained by `params` (and the spec's `options`)."""
  def column_fn():
    return [feat.column(init)], []

  return column_fn, tpu_fc.EmbeddingConfigSpec(
      feature_columns=column_fn()[0], optimization_parameters=params,
      **options)


def train_1_and_3(tmp_path, model_fn, spec, input_fn):
  """Estimators trained 1 and 3 steps, each in a fresh model_dir (one train call).

  (Resuming training from a use_tpu=True checkpoint is tested on its own:
  tests/test_tpu_emulation_checkpoints.py.)
  """
  estimators = []
  for steps in (1, 3):
    estimator = user_estimator(tmp_path / 'steps{}'.format(steps), model_fn,
                               spec)
    estimator.train(input_fn, steps=steps)
    estimators.append(estimator)
  return estimators

class CheckpointVariables:
  """A checkpoint's variables, read as an estimator's."""

  def __init__(self, path):
    self._reader = tf.train.load_checkpoint(str(path))

  def get_variable_value(self, name):
    return self._reader.get_tensor(name)


def train_2_and_3(model_dir, model_fn, spec, input_fn):
  """(the variables after step 2, the estimator after step 3) of one 3-step
  training: after its first in-graph loop (two steps: TPUConfig's
  iterations_per_loop) and after its last (one step), each checkpointed."""
  estimator = user_estimator(model_dir, model_fn, spec,
                             save_checkpoints_steps=1)
  estimator.train(input_fn, steps=3)
  return CheckpointVariables(model_dir / 'model.ckpt-2'), estimator


# Early stopping: the model's evaluation at step s is (s - 4)², so where
# training stops follows from the schedule.


def early_stopping_estimator(tpu_namespace, model_dir, use_tpu,
                             iterations_per_loop=1):
  """`tpu_namespace`'s TPUEstimator (tpu_fc's or TF's), checkpointing and so
  evaluating every 2 steps."""
  return tpu_namespace.TPUEstimator(
      model_fn=models.distance_model_fn(),
      use_tpu=use_tpu, train_batch_size=4, eval_batch_size=4,
      config=tpu_namespace.RunConfig(
          model_dir=str(model_dir), tf_random_seed=1, save_checkpoints_steps=2,
          tpu_config=tpu_namespace.TPUConfig(
              iterations_per_loop=iterations_per_loop)))


def train_until_stopped(estimator_namespace, experimental, estimator):
  """(last global step, evaluated steps, stop variable saved?) of a run of
  `estimator_namespace.train_and_evaluate` (tpu_fc's or TF's) with
  `experimental.stop_if_no_decrease_hook`."""
  evaluations = hooks.SessionSteps()
  hook = experimental.stop_if_no_decrease_hook(
      estimator, 'distance', max_steps_without_decrease=4,
      run_every_secs=None, run_every_steps=1)
  estimator_namespace.train_and_evaluate(
      estimator,
      estimator_namespace.TrainSpec(inputs.ids_and_x_repeated, max_steps=30,
                                    hooks=[hook]),
      estimator_namespace.EvalSpec(inputs.ids_and_x, steps=1, throttle_secs=0,
                                   hooks=[evaluations]))
  saved = tf.train.list_variables(estimator.latest_checkpoint())
  return (int(estimator.get_variable_value('global_step')),
          [step for step, _ in evaluations.sessions],
          any(name.startswith('signal_early_stopping') for name, _ in saved))


# Dense models.


def train_dense_x(driver, model_dir, cross_shard):
  """The kernel of `models.dense_x_model_fn` after 2 steps of
  `driver.TPUEstimator(use_tpu=False)` (tpu_fc's or TF's)."""
  estimator = driver.TPUEstimator(
      model_fn=models.dense_x_model_fn(driver, cross_shard), use_tpu=False,
      train_batch_size=4, config=driver.RunConfig(model_dir=str(model_dir)))
  estimator.train(inputs.dense_x, steps=2)
  return estimator.get_variable_value('dense/kernel')


LINEAR_BATCH = 4
LINEAR_EVAL_STEPS = inputs.N // LINEAR_BATCH  # one pass over the data


def linear_eval_input_fn(params):
  """One pass over the linear model's data (`inputs.linear`)."""
  return inputs.linear(params).take(LINEAR_EVAL_STEPS)


def linear_estimator(model_dir, use_tpu, driver=tpu_fc, **params):
  """`driver`'s TPUEstimator (tpu_fc's or TF's) of `models.linear_model_fn`:
  batches of LINEAR_BATCH, 2 steps per loop on 2 shards (use_tpu) or the
  CPU."""
  return driver.TPUEstimator(
      model_fn=models.linear_model_fn, use_tpu=use_tpu,
      train_batch_size=LINEAR_BATCH, eval_batch_size=LINEAR_BATCH,
      predict_batch_size=LINEAR_BATCH,
      params=dict({'hook_on_loss': None, 'spec': driver.TPUEstimatorSpec},
                  **params),
      config=driver.RunConfig(
          model_dir=str(model_dir), tpu_config=driver.TPUConfig(
              iterations_per_loop=2, num_shards=2 if use_tpu else None)))


def train_linear(model_dir, use_tpu, hook_on_loss=None, driver=tpu_fc,
                 metric_fn=models.mean_logit,
                 eval_steps=LINEAR_EVAL_STEPS):
  """(metrics, kernel) of `linear_estimator` trained 2 steps and evaluated
  (`eval_steps`), with `driver`'s TPUEstimator (tpu_fc's or TF's)."""
  estimator = linear_estimator(model_dir, use_tpu, driver,
                               hook_on_loss=hook_on_loss, metric_fn=metric_fn)
  estimator.train(inputs.linear, max_steps=2)
  metrics = estimator.evaluate(  # TF's TPU evaluation needs steps
      lambda params: inputs.linear(params).take(eval_steps), steps=eval_steps)
  return metrics, estimator.get_variable_value('dense/kernel')


def logged(model_dir, use_tpu):
  """TPUEstimator of `models.linear_model_fn` with iterations_per_loop=5 and
  log_step_count_steps=10 (TF 2.15's TPUEstimator logged the loss every 2
  loops, and the rates)."""
  config = tpu_fc.RunConfig(
      model_dir=str(model_dir), log_step_count_steps=10,
      tpu_config=tpu_fc.TPUConfig(iterations_per_loop=5))
  return tpu_fc.TPUEstimator(models.linear_model_fn, config=config,
                             use_tpu=use_tpu, train_batch_size=LINEAR_BATCH)
