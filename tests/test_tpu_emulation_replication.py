"""use_tpu=True without a TPU: the model_fn on emulated shards behaves as TPU
replicas (TF 2.15's own TPUEstimator on the legacy lane where it runs the
same model)."""
import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf

from harness import estimators
from harness import inputs
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
