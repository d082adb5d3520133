"""The spec's runtime options: pipeline_execution_with_tensor_core,
profile_data_directory, experimental_gradient_multiplier_fn.

Tables are compared with the reference's within its float32 error bound
(`oracle.ReferenceSteps`).
"""
import copy
import json

import numpy as np

import tpu_fc
from tpu_fc import reference
from tpu_fc._tf import tf
from tpu_fc.lookup.backends import EmbeddingCoreBackend

from harness import estimators
from harness import inputs
from harness import models
from harness import oracle

fc = tf.feature_column
D, NS = inputs.DIM, estimators.NUM_SHARDS
TABLE = np.arange(18, dtype=np.float32).reshape(6, 3) / 10
IDS = np.array([[1, 4], [4, 2]])
C = np.array([[1., -2., 0.5], [0.3, 0.2, -1.]], np.float32)


def _spec(pipelined):
  column = tpu_fc.embedding_column(
      fc.categorical_column_with_identity('a', 6), 3, combiner='sum',
      initializer=tf.compat.v1.constant_initializer(TABLE))
  return tpu_fc.EmbeddingConfigSpec(
      feature_columns=[column],
      optimization_parameters=tpu_fc.AdagradParameters(0.1),
      pipeline_execution_with_tensor_core=pipelined)


def _run_engine(pipelined, steps):
  """Activations seen and table after each step, plus the table after a flush."""
  spec = _spec(pipelined)
  with tf.Graph().as_default():
    engine = EmbeddingCoreBackend(spec, spec.embedding_layout(),
                                  named_by_columns=False)
    engine.create_variables(training=True)
    ids = tf.sparse.from_dense(tf.constant(IDS, tf.int64))
    step, shards = engine.lookup({'a': ids})
    activation = shards[0]['a']
    loss = tf.reduce_sum(activation * C)
    train = tf.compat.v1.train.GradientDescentOptimizer(1.).minimize(loss)
    update = engine.apply_gradients(step)
    flush = engine.engine.flush_op()
    seen, tables = [], []
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      for _ in range(steps):
        seen.append(session.run([activation, train, update])[0])
        tables.append(session.run(engine.tables['tbl_a']))
      session.run(flush)
      return seen, tables, session.run(engine.tables['tbl_a'])


def _reference_steps(steps):
  """The reference after each step without pipelining (the loss is linear:
  d/dact = C, passed on exactly by the sum combiner), on one core.
  """
  params = _spec(False).optimization_parameters
  want = oracle.ReferenceSteps(params, TABLE,
                                reference.init_slots(params, TABLE.shape))
  flat_ids = IDS.reshape(-1)
  grads = np.repeat(C, IDS.shape[1], axis=0)
  return [copy.copy(want.step(flat_ids, grads, 0.1,
                              cores=np.zeros_like(flat_ids), num_cores=1))
          for _ in range(steps)]


def test_next_lookup_misses_the_previous_update():
  seen, tables, flushed = _run_engine(pipelined=True, steps=3)
  expected = _reference_steps(3)
  np.testing.assert_array_equal(tables[0], TABLE)  # step 1's update parked
  np.testing.assert_allclose(seen[1], seen[0])  # step 2 looked up before it
  expected[0].assert_matches(tables[1])
  expected[1].assert_matches(tables[2])
  expected[2].assert_matches(flushed)


def test_without_pipelining_each_lookup_sees_the_previous_update():
  seen, tables, flushed = _run_engine(pipelined=False, steps=2)
  expected = _reference_steps(2)
  expected[0].assert_matches(tables[0])
  assert not np.allclose(seen[1], seen[0])
  expected[1].assert_matches(flushed)


def test_checkpoints_hold_every_parked_update(tmp_path):
  """Two steps of two shards, each step's update parked for the next lookup:
  the checkpoint holds both (the harness's loss is linear, so its gradients do
  not depend on what a lookup missed)."""
  estimator = estimators.contract_estimator(tmp_path, 'embedding_core', 'adagrad',
                                pipelined=True)
  estimator.train(inputs.contract_input_fn('sparse'), steps=2)
  oracle.expected_step('embedding_core', 'adagrad', steps=2).assert_matches(
      estimator.get_variable_value(models.TABLE))


def test_profile_data_directory_gets_lookup_statistics(tmp_path):
  """The spec's profile_data_directory receives per-table JSON statistics."""
  estimator = estimators.contract_estimator(
      tmp_path / 'model', 'embedding_core', 'sgd',
      profile_data_directory=str(tmp_path / 'profile'))
  estimator.train(inputs.contract_input_fn('sparse'), steps=2)
  stats = json.loads((tmp_path / 'profile' / 'tbl_ids.json').read_text())
  ids = [i for row in inputs.IDS for i in row]
  assert stats['ids_per_example'] == len(ids) / len(inputs.IDS)
  assert stats['unique_ids_per_batch'] == len(set(ids))
  assert stats['hot_ids'][0] == [4, 2 * stats['steps_profiled']]
  assert stats['num_hosts'] == estimators.NUM_SHARDS


def test_gradient_multiplier_fn_scales_every_embedding_gradient(tmp_path):
  feat = inputs.Feature('a', inputs.A_SP, combiner='mean')
  init = models.init_table(5)
  params = tpu_fc.AdagradParameters(0.1, initial_accumulator=0.1)

  column_fn, spec = estimators.one_column(
      feat, init, params, experimental_gradient_multiplier_fn=(
          lambda step: 2.0 + tf.cast(step, tf.float32)))
  c = inputs.coefficients(5, D)
  one, estimator = estimators.train_1_and_3(
      tmp_path, models.user_model_fn(column_fn), spec,
                                            inputs.input_fn([feat], c))
  table = oracle.Table('dense_features/a_embedding/embedding_weights', init,
                       params, [feat])
  table.step({'a': c / NS}, 0.1, multiplier=2.0)
  table.check(one, 1)
  table.step({'a': c / NS}, 0.1, multiplier=3.0)
  table.step({'a': c / NS}, 0.1, multiplier=4.0)
  table.check(estimator, 3)
  # the model's gradients are unscaled
  oracle.check_bias(estimator, c, 3, 1.0 / NS)
