"""use_tpu=True without a TPU: the model_fn on emulated shards behaves as TPU
replicas (TF 2.15's own TPUEstimator on the legacy lane where it runs the
same model): CrossShardOptimizer's sum, each core's own variables and batch
slice, the context model_fn and input_fn see."""
import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf
from tpu_fc.estimator.tpu import replication
from tpu_fc.estimator.tpu import tpu_context

from harness import estimators
from harness import inputs
from harness import lanes
from harness import models
from harness import oracle
from harness import scripts

pytestmark = pytest.mark.filterwarnings('ignore::UserWarning')
fc = tf.feature_column
D, B, L = inputs.DIM, inputs.BATCH, inputs.MAX_LENGTH


def test_cross_shard_optimizer_without_tpu_is_one_replica(tmp_path):
  """Beyond TF: with use_tpu=False, CrossShardOptimizer sums over one replica,
  so it trains as the optimizer it wraps (TF 2.15 fails: no CrossReplicaSum
  kernel on a CPU)."""
  wrapped = estimators.train_dense_x(tpu_fc, tmp_path / 'cross_shard',
                                     cross_shard=True)
  plain = estimators.train_dense_x(tpu_fc, tmp_path / 'plain',
                                   cross_shard=False)
  np.testing.assert_array_equal(wrapped, plain)
  assert np.all(wrapped != 1.0)  # it trained


_TF_REFERENCE = """
import sys, types
import numpy as np
from harness import estimators
from tpu_fc._tf import tf
from tensorflow_estimator.python.estimator.tpu import tpu_config, tpu_estimator
legacy = types.SimpleNamespace(TPUEstimator=tpu_estimator.TPUEstimator,
                               TPUEstimatorSpec=tpu_estimator.TPUEstimatorSpec,
                               RunConfig=tpu_config.RunConfig)
try:
  estimators.train_dense_x(legacy, sys.argv[1] + '/cross_shard',
                           cross_shard=True)
except tf.errors.InvalidArgumentError as error:
  print('TF raised:', ' '.join(str(error).split()))
np.save(sys.argv[1] + '/plain.npy', estimators.train_dense_x(
    legacy, sys.argv[1] + '/plain', cross_shard=False))
"""


@pytest.mark.legacy_only
@pytest.mark.subprocess
def test_tf_cross_shard_optimizer_without_tpu_fails(tmp_path):
  """TF 2.15's own TPUEstimator, in a fresh process (a test suite's earlier
  bindings cannot reach it): CrossShardOptimizer fails without a TPU; without
  it TF trains as tpu_fc does."""
  result = scripts.run_python(['-c', _TF_REFERENCE, str(tmp_path)],
                              env=scripts.env(), timeout=600)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "TF raised:" in result.stdout
  assert ("No OpKernel was registered to support Op 'CrossReplicaSum'"
          in result.stdout)
  np.testing.assert_array_equal(
      estimators.train_dense_x(tpu_fc, tmp_path / 'ours', cross_shard=False),
      np.load(tmp_path / 'plain.npy'))


def test_broadcast_input_gives_every_shard_the_whole_batch(tmp_path):
  """`test_eval_batch_size_with_non_divisible_num_shards_broadcast_mode`: a
  batch of 7 on 2 shards; each shard's model_fn gets all 7 examples, and
  CrossShardOptimizer's mean over the shards trains as one batch does."""
  seen = []

  def model_fn(features, labels, mode, params):
    seen.append((params['batch_size'], features['x'].shape[0]))
    return models.dense_x_model_fn(tpu_fc, cross_shard=True)(
        features, labels, mode, params)

  def input_fn(params):
    x = np.arange(14, dtype=np.float32).reshape(7, 2) / 14
    dataset = tf.data.Dataset.from_tensors(({'x': x}, 2 * x.sum(1, keepdims=True)))
    return dataset.repeat()

  results = {}
  for name, pipeline, use_tpu in (
      ('broadcast', tpu_fc.InputPipelineConfig.BROADCAST, True),
      ('cpu', tpu_fc.InputPipelineConfig.PER_HOST_V2, False)):
    estimator = tpu_fc.TPUEstimator(
        model_fn=model_fn, use_tpu=use_tpu, train_batch_size=7,
        eval_batch_size=7,
        config=tpu_fc.RunConfig(
            model_dir=str(tmp_path / name),
            tpu_config=tpu_fc.TPUConfig(
                num_shards=2, per_host_input_for_training=pipeline)))
    estimator.train(input_fn, steps=2)
    metrics = estimator.evaluate(input_fn, steps=1)
    results[name] = (estimator.get_variable_value('dense/kernel'),
                     metrics['loss'])
  assert set(seen) == {(7, 7)}
  np.testing.assert_allclose(results['broadcast'][0], results['cpu'][0],
                             rtol=1e-6)
  np.testing.assert_allclose(results['broadcast'][1], results['cpu'][1],
                             rtol=1e-6)


def test_mean_loss_on_any_number_of_shards(tmp_path):
  """CrossShardOptimizer + mean loss: d(loss)/d(act) = c / global batch on any
  number of shards; with gradient accumulation the tables are alike too."""
  fa = inputs.Feature('a', inputs.A_SP, combiner='mean')
  fw = inputs.Feature('w', inputs.B_SP, weights=[1.0, 0.5, 2.0, 1.5, 0.75],
                      combiner='sqrtn')
  fs = inputs.Feature('s', inputs.S_SP, seq_len=L)
  inits = {'a': models.init_table(6), 'w': models.init_table(7),
           's': models.init_table(8)}
  params = tpu_fc.FtrlParameters(0.2, l2_regularization_strength=0.1)

  def column_fn():
    return ([fa.column(inits['a']), fw.column(inits['w'])],
            [fs.column(inits['s'])])

  c = inputs.coefficients(6, 2 * D)   # a_embedding, w_weighted_by_w_w_embedding
  cs = inputs.coefficients(7, L, D)
  input_fn = inputs.input_fn([fa, fw, fs], c, cs)
  dacts = {'a': c[:, :D] / B, 'w': c[:, D:] / B, 's': cs / B}
  dense = {}
  for num_shards in (None, 2, 4):
    seen = []
    spec = tpu_fc.EmbeddingConfigSpec(feature_columns=sum(column_fn(), []),
                                      optimization_parameters=params)
    estimator = estimators.user_estimator(
        tmp_path / str(num_shards),
        models.user_model_fn(column_fn, reduction='mean',
                             seen_batch_sizes=seen),
        spec, num_shards=num_shards)
    estimator.train(input_fn, steps=2)
    assert set(seen) == {B // (num_shards or 1)}, num_shards
    tables = [
        oracle.Table('dense_features/a_embedding/embedding_weights', inits['a'],
                     params, [fa]),
        oracle.Table(
            'dense_features/w_weighted_by_w_w_embedding/embedding_weights',
            inits['w'], params, [fw]),
        oracle.Table('sequence_features/s_embedding/embedding_weights',
                     inits['s'], params, [fs]),
    ]
    for table in tables:
      for _ in range(2):
        table.step(dacts, 0.2, num_shards=num_shards or 1)
      table.check(estimator, 2)
    dense[num_shards] = {
        n: estimator.get_variable_value(n)
        for n in estimator.get_variable_names()
        if not any(n.startswith(table.name) for table in tables)}
    oracle.check_bias(estimator, c, 2, 1.0 / B)
  for num_shards in (2, 4):
    assert sorted(dense[num_shards]) == sorted(dense[None])
    for name, value in dense[None].items():
      np.testing.assert_allclose(dense[num_shards][name], value, rtol=1e-6,
                                 atol=1e-6, err_msg=name)


# A two-layer model of 3 dense features (16 rows, batches of 8).
N, BATCH = 16, 8
X = np.linspace(-1, 1, 3 * N).astype(np.float32).reshape(N, 3)
Y = (X[:, :1] * 2 - X[:, 1:2] > 0).astype(np.float32)


def xy_input_fn(params):
  dataset = tf.data.Dataset.from_tensor_slices(({'x': X}, Y))
  return dataset.repeat().batch(params['batch_size'], drop_remainder=True)


def make_model_fn(seen_batch_sizes, reduction):
  def model_fn(features, labels, mode, params):
    seen_batch_sizes.append(params['batch_size'])
    hidden = tf.compat.v1.layers.dense(
        features['x'], 4, activation=tf.nn.tanh,
        kernel_initializer=tf.compat.v1.constant_initializer(
            np.linspace(-0.5, 0.5, 12).reshape(3, 4)))
    logits = tf.compat.v1.layers.dense(
        hidden, 1, kernel_initializer=tf.compat.v1.ones_initializer())
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(
        labels, logits, reduction=reduction)
    return models.tpu_spec(mode, loss, rate=0.5, cross_shard=params['use_tpu'])
  return model_fn


def _train(tmp_path, use_tpu, num_shards, reduction, steps=3):
  seen = []
  estimator = tpu_fc.TPUEstimator(
      model_fn=make_model_fn(seen, reduction), use_tpu=use_tpu,
      train_batch_size=BATCH,
      config=tpu_fc.RunConfig(
          model_dir=str(tmp_path / '{}_{}'.format(use_tpu, num_shards)),
          tpu_config=tpu_fc.TPUConfig(num_shards=num_shards)))
  estimator.train(xy_input_fn, max_steps=steps)
  return {name: estimator.get_variable_value(name)
          for name in estimator.get_variable_names()}, seen


@pytest.mark.parametrize('num_shards', [2, 4])
def test_cross_shard_optimizer_averages_like_one_global_batch(tmp_path,
                                                              num_shards):
  """Mean losses: the average of shard gradients is the global-batch gradient."""
  mean = tf.compat.v1.losses.Reduction.MEAN
  emulated, seen = _train(tmp_path, True, num_shards, mean)
  reference, _ = _train(tmp_path, False, None, mean)
  assert set(seen) == {BATCH // num_shards}
  assert sorted(emulated) == sorted(reference)  # one set of variables
  for name, value in reference.items():
    np.testing.assert_allclose(emulated[name], value, rtol=1e-5, atol=1e-6,
                               err_msg=name)


def test_sum_losses_scale_as_on_tpu(tmp_path):
  """Sum losses: each shard's gradient is divided by num_shards, then summed."""
  emulated, _ = _train(tmp_path, True, 2, tf.compat.v1.losses.Reduction.SUM,
                       steps=1)
  reference, _ = _train(tmp_path, False, None,
                        tf.compat.v1.losses.Reduction.SUM, steps=1)
  start = np.linspace(-0.5, 0.5, 12).reshape(3, 4)
  # One step from the same start: the emulated update is half the global one.
  np.testing.assert_allclose(emulated['dense/kernel'] - start,
                             (reference['dense/kernel'] - start) / 2,
                             rtol=1e-5, atol=1e-7)


def test_batch_not_divisible_by_shards_is_a_clear_error(tmp_path):
  estimator = tpu_fc.TPUEstimator(
      model_fn=make_model_fn([], tf.compat.v1.losses.Reduction.MEAN),
      use_tpu=True, train_batch_size=6,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path),
                              tpu_config=tpu_fc.TPUConfig(num_shards=4)))
  with pytest.raises(ValueError, match='train batch size 6 must be divisible '
                     'by number of replicas 4'):
    estimator.train(xy_input_fn, max_steps=1)


def test_host_call_sees_tensors_of_all_shards(tmp_path):
  """As on a TPU, host_call tensors arrive concatenated over the shards."""
  seen = {}

  def host_fn(step, loss):
    seen['shapes'] = (step.shape.as_list(), loss.shape.as_list())
    return [tf.compat.v1.assign_add(
        tf.compat.v1.get_variable('host_calls', [], tf.int64,
                                  tf.compat.v1.zeros_initializer(),
                                  trainable=False), 1)]

  def model_fn(features, labels, mode, params):
    spec = make_model_fn([], tf.compat.v1.losses.Reduction.MEAN)(
        features, labels, mode, params)
    step = tf.compat.v1.train.get_global_step()
    return spec._replace(host_call=(host_fn, [
        tf.reshape(step, [1]), tf.reshape(spec.loss, [1])]))

  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn, use_tpu=True, train_batch_size=BATCH,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path),
                              tpu_config=tpu_fc.TPUConfig(num_shards=2)))
  estimator.train(xy_input_fn, max_steps=3)
  assert seen['shapes'] == ([2], [2])
  assert estimator.get_variable_value('host_calls') == 3


def test_params_context_describes_the_emulated_system(tmp_path):
  """As TF 2.15's TPUContext (`tpu_context.py`): the device assignment is
  None without model parallelism, and model_fn's only."""
  seen = {}

  def sharded_input_fn(params):
    context = params['context']
    seen['input'] = (context.current_input_fn_deployment(),
                     context.num_hosts, context.current_host,
                     context.num_of_replicas_per_host,
                     [context.device_for_replica(r) for r in range(4)],
                     context.tpu_host_placement_function(host_id=0))
    with pytest.raises(RuntimeError, match='must not be called from input_fn'):
      context.device_assignment  # pylint: disable=pointless-statement
    return xy_input_fn(params)

  def model_fn(features, labels, mode, params):
    seen['model'] = (params['context'].num_replicas,
                     params['context'].device_assignment)
    with pytest.raises(RuntimeError, match='must not be called from model_fn'):
      params['context'].current_host  # pylint: disable=pointless-statement
    return make_model_fn([], tf.compat.v1.losses.Reduction.MEAN)(
        features, labels, mode, params)

  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn, use_tpu=True, train_batch_size=BATCH,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path),
                              tpu_config=tpu_fc.TPUConfig(num_shards=4)))
  estimator.train(sharded_input_fn, max_steps=1)
  # A local master has no job (TF's `master_job`): the host is this process's
  # (`tpu_host_placement_function`, `device_for_replica`: `tpu_context.py`
  # 630-652, 800-830; replica r is the host's core r).
  host = '/replica:0/task:0/device:CPU:0'
  assert seen == {
      'input': ((host, 0, 1, 4), 1, 0, 4,
                [('/task:0/device:CPU:0', r) for r in range(4)], host),
      'model': (4, None)}
  # Model parallelism, whose device assignment TF gave, is not emulated.
  with pytest.raises(NotImplementedError, match='num_cores_per_replica=2'):
    tpu_context.TPUContext(  # pylint: disable=expression-not-assigned
        tpu_context.EmulatedSystem(tpu_fc.RunConfig(
            tpu_config=tpu_fc.TPUConfig(num_shards=4,
                                        num_cores_per_replica=2)))
    ).device_assignment


def _cluster_session_config(*jobs):
  cluster = tf.compat.v1.train.ClusterSpec(
      {job: ['10.2.3.4:8470'] for job in jobs}).as_cluster_def()
  return tf.compat.v1.ConfigProto(cluster_def=cluster)


# RunConfig arguments -> (train's, evaluate's) master job, or the error.
MASTER_JOBS = {
    'local': (dict(), (None, None)),
    'remote': (dict(master='grpc://10.4.5.7:8470'),
               ('tpu_worker', 'tpu_worker')),
    'remote_train_local_eval': (
        dict(master='grpc://10.4.5.7:8470', evaluation_master=''),
        ('tpu_worker', None)),
    'cluster': (dict(master='grpc://10.2.3.4:8470',
                     session_config=_cluster_session_config('worker')),
                ('worker', 'worker')),
    'cluster_with_coordinator': (
        dict(master='grpc://10.2.3.4:8470', session_config=(
            _cluster_session_config('worker', 'coordinator'))),
        ('worker', 'worker')),
    'ambiguous_cluster': (
        dict(master='grpc://10.2.3.4:8470', session_config=(
            _cluster_session_config('worker', 'other_worker'))),
        'Could not infer TPU job name. Please specify a tpu_job_name as part '
        'of your TPUConfig.'),
    'named': (dict(tpu_job_name='my_job'), ('my_job', 'my_job')),
}


@pytest.mark.parametrize('driver', lanes.DRIVERS)
@pytest.mark.parametrize('case', sorted(MASTER_JOBS))
def test_the_context_names_the_master_job_as_tf_2_15s(driver, case):
  """`TPUEstimator._ctx.with_mode(mode).master_job`, which TF's TPU tests
  read: the job of the mode's master, from the session config's cluster
  (`tpu_context.py` 598-628), the same with TF 2.15's own TPUEstimator."""
  namespace = lanes.driver(driver)
  arguments, want = MASTER_JOBS[case]
  arguments = dict(arguments)
  tpu_config = namespace.TPUConfig(
      tpu_job_name=arguments.pop('tpu_job_name', None))
  estimator = namespace.TPUEstimator(
      model_fn=models.dense_x_model_fn(), use_tpu=False, train_batch_size=4,
      config=namespace.RunConfig(tpu_config=tpu_config, **arguments))
  jobs = []
  for mode in (tpu_fc.ModeKeys.TRAIN, tpu_fc.ModeKeys.EVAL):
    with estimator._ctx.with_mode(mode) as context:  # pylint: disable=protected-access
      try:
        jobs.append(context.master_job)
      except ValueError as e:
        jobs = str(e)
        break
  assert jobs == (list(want) if isinstance(want, tuple) else want)


# Each TPU core runs the whole model_fn with its own copy of the variables.
# Shard 0's features are x = 1, shard 1's x = 3 (2 shards, batch 8).
CORE_X = np.array([[1.0]] * 4 + [[3.0]] * 4, np.float32)


def core_input_fn(params):
  dataset = tf.data.Dataset.from_tensor_slices(({'x': CORE_X},
                                                np.ones((8, 1), np.float32)))
  return dataset.repeat().batch(params['batch_size'], drop_remainder=True)


def _replicated(tmp_path, model_fn, steps=1):
  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn, use_tpu=True, train_batch_size=8, eval_batch_size=8,
      predict_batch_size=8, config=tpu_fc.RunConfig(
          model_dir=str(tmp_path), tpu_config=tpu_fc.TPUConfig(
              iterations_per_loop=1, num_shards=2)))
  estimator.train(core_input_fn, max_steps=steps)
  return estimator


def test_every_shard_has_its_layers_regularization_loss(tmp_path):
  """l2(1.0) on a kernel of ones: each core's gradient is 2, their mean 2, so
  one SGD(0.1) step leaves 0.8 (not 0.9: the penalty of one shard only)."""
  def model_fn(features, labels, mode, params):
    del labels, params
    tf.compat.v1.layers.dense(
        features['x'], 1, use_bias=False,
        kernel_initializer=tf.compat.v1.ones_initializer(),
        kernel_regularizer=tf.keras.regularizers.l2(1.0))
    return models.tpu_spec(mode,
                           tf.compat.v1.losses.get_regularization_loss())

  estimator = _replicated(tmp_path, model_fn)
  np.testing.assert_allclose(estimator.get_variable_value('dense/kernel'),
                             [[0.8]], rtol=1e-6)
  assert estimator.evaluate(core_input_fn, steps=1)['loss'] == pytest.approx(
      0.8 ** 2)  # shard 0's loss holds the penalty too


def test_batch_norm_statistics_are_core_0s(tmp_path):
  """Each core updates its own moving mean from its batch (momentum 0.9, from
  0): core 0's, 0.1 * 1, is what the checkpoint holds (core 1's would be 0.3,
  both applied to one variable 0.4)."""
  def model_fn(features, labels, mode, params):
    del labels, params
    normalized = tf.compat.v1.layers.batch_normalization(
        features['x'], momentum=0.9, training=mode == tpu_fc.ModeKeys.TRAIN,
        name='bn')
    return models.tpu_spec(mode, tf.reduce_mean(normalized), update_ops=(
        tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)))

  estimator = _replicated(tmp_path, model_fn)
  np.testing.assert_allclose(estimator.get_variable_value('bn/moving_mean'),
                             [0.1], rtol=1e-6)
  assert not any('core_copy' in name
                 for name in estimator.get_variable_names())


def test_partitioned_variables_are_whole_as_on_a_tpu(tmp_path, tf_log):
  """TF's TPU replication drops a partitioner (with its warning): the
  checkpoint holds whole variables, which predict's CPU graph, partitioned
  again, restores."""
  def model_fn(features, labels, mode, params):
    del labels, params
    with tf.compat.v1.variable_scope(
        'dnn', partitioner=tf.compat.v1.fixed_size_partitioner(2)):
      out = tf.compat.v1.layers.dense(
          features['x'], 2, kernel_initializer=tf.compat.v1.ones_initializer())
    return models.tpu_spec(mode, tf.reduce_mean(out),
                           predictions={'out': out})

  estimator = _replicated(tmp_path, model_fn)
  saved = dict(tf.train.list_variables(estimator.latest_checkpoint()))
  assert saved['dnn/dense/kernel'] == [1, 2] and not any(
      'part_' in name for name in saved)
  assert any(line.startswith('Partitioned variables are not supported on TPU')
             for line in tf_log)
  kernel = estimator.get_variable_value('dnn/dense/kernel')
  bias = estimator.get_variable_value('dnn/dense/bias')
  predicted = [p['out'] for p in estimator.predict(
      lambda params: core_input_fn(params).take(1))]
  np.testing.assert_allclose(predicted, CORE_X @ kernel + bias, rtol=1e-6)


def test_a_plain_optimizer_on_two_shards_learns_from_core_0s_slice_and_says_so(
    tmp_path, tf_log, monkeypatch):
  """No CrossShardOptimizer: as on a TPU, the dense variables get core 0's
  update only, i.e. learn from the first half of every batch; a warning says
  so once per process, naming CrossShardOptimizer."""
  monkeypatch.setattr(replication, '_warned_core_0_trains_alone', [])

  estimators.linear_estimator(tmp_path / 'cross_shard', use_tpu=True).train(
      inputs.linear, max_steps=1)
  assert not [m for m in tf_log if 'no cross-replica sum' in m]
  plain = estimators.linear_estimator(tmp_path / 'plain', use_tpu=True,
                                      plain_optimizer=True)
  plain.train(inputs.linear, max_steps=2)
  plain.train(inputs.linear, max_steps=4)
  assert [m for m in tf_log if 'no cross-replica sum' in m] == [
      "TPUConfig.num_shards=2, and the train_op updates trainable variables "
      "(dense/bias, dense/kernel) with no cross-replica sum: as on a TPU, only "
      "core 0's update is applied, so they learn from 1/2 of every batch (core "
      "0's slice). Wrap the optimizer in tf.compat.v1.tpu.CrossShardOptimizer "
      "to train them on the whole batch."]
  # Each train() read the first 2 batches; core 0 had their first halves.
  half, batch = estimators.LINEAR_BATCH // 2, estimators.LINEAR_BATCH
  core_0 = np.concatenate([inputs.X[:half], inputs.X[batch:batch + half]] * 2)
  core_0_labels = np.concatenate([inputs.Y[:half],
                                  inputs.Y[batch:batch + half]] * 2)
  on_core_0_slices = estimators.linear_estimator(tmp_path / 'core_0',
                                                 use_tpu=False)
  on_core_0_slices.train(lambda params: tf.data.Dataset.from_tensor_slices(
      (core_0, core_0_labels)).batch(half), max_steps=4)
  for name in ('dense/kernel', 'dense/bias'):
    np.testing.assert_allclose(plain.get_variable_value(name),
                               on_core_0_slices.get_variable_value(name),
                               rtol=1e-6, err_msg=name)
