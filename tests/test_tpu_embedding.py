"""tpu_fc.lookup.tpu_embedding: the legacy-facing side of a real TPU's TPUEmbedding.

No TPU here, so `enqueue`/`dequeue`/`apply_gradients` never run; what runs on the
CPU is checked: the `enqueue` inputs, looked up by TF's own
`serving_embedding_lookup` with the engine's tables, give the activations derived
by hand (test_embedding_core's numpy model), the sequence lengths model_fn gets
are TPUEstimator's, and the detection of a TPU finds none.
"""
import dataclasses

import numpy as np
import pytest

import tpu_fc
from tpu_fc.lookup import tpu_embedding
from tpu_fc.lookup.embedding_core import SEQUENCE_LENGTH_SUFFIX
import tensorflow as tf  # pylint: disable=g-bad-import-order  (after tpu_fc)

from test_embedding_core import BATCH
from test_embedding_core import Feat
from test_embedding_core import Ids
from test_embedding_core import SEQUENCE_RAGGED
from test_embedding_core import SEQUENCE_SPARSE
from test_embedding_core import np_activation

# Positive weights only: the CPU's safe lookup prunes non-positive ones, the TPU
# does not (LEGACY_SEMANTICS §9), so they would not test the enqueue inputs.
SPARSE = Ids('sparse', [(0, 0, 3), (0, 2, 0), (1, 0, 5), (1, 1, 1), (1, 2, 5),
                        (3, 1, 2), (3, 2, 3)],
             weights=[0.5, 2.0, 1.0, 0.5, 1.5, 3.0, 0.25])
RAGGED = Ids('ragged', [[1, 1, 4], [], [0, 6], [6, 2]],
             weights=[[0.5, 1.5, 2.0], [], [1.0, 2.0], [0.25, 4.0]])
FEATS = [
    Feat('sparse_mean', dataclasses.replace(SPARSE, weights=None), 'mean', seed=1),
    Feat('ragged_sum', dataclasses.replace(RAGGED, weights=None), 'sum', seed=2),
    Feat('sparse_weighted', SPARSE, 'sqrtn', weighted=True, seed=3),
    Feat('ragged_weighted', RAGGED, 'mean', weighted=True, dim=2, seed=4),
    Feat('seq_sparse', SEQUENCE_SPARSE, seq_len=2, seed=5),
    Feat('seq_ragged', SEQUENCE_RAGGED, seq_len=2, dim=2, seed=6),
]


def _engine(columns):
  spec = tpu_fc.EmbeddingConfigSpec(
      feature_columns=columns,
      optimization_parameters=tpu_fc.AdagradParameters(0.1))
  return tpu_embedding.TPUEmbeddingEngine(spec)


def _features(feats):
  features = {}
  for feat in feats:
    features.update(feat.inputs())
  return features


def _serving_lookup(engine, features):
  inputs, weights = engine.enqueue_inputs(features)
  return tf.tpu.experimental.embedding.serving_embedding_lookup(
      inputs, weights, engine.embedding.embedding_tables,
      engine.mid_level.feature_config)


def test_enqueue_inputs_look_up_the_legacy_activations():
  engine = _engine([feat.column() for feat in FEATS])
  activations = _serving_lookup(engine, _features(FEATS))
  for feat in FEATS:
    expected, _ = np_activation(feat, feat.init())
    np.testing.assert_allclose(activations[feat.name], expected, rtol=1e-5,
                               atol=1e-6, err_msg=feat.name)


def test_shared_columns_enqueue_into_one_table():
  first, second = tpu_fc.shared_embedding_columns(
      [tf.feature_column.categorical_column_with_identity(name, 7)
       for name in ('left', 'right')], 3,
      initializer=tf.compat.v1.constant_initializer(FEATS[0].init()))
  engine = _engine([first, second])
  assert [t.name for t in engine.mid_level.tables] == [
      'tbl_left_right_shared_embedding']
  feats = [Feat('left', dataclasses.replace(SPARSE, weights=None), seed=1),
           Feat('right', dataclasses.replace(RAGGED, weights=None), seed=1)]
  activations = _serving_lookup(engine, _features(feats))
  for feat in feats:
    np.testing.assert_allclose(activations[feat.name],
                               np_activation(feat, feat.init())[0], rtol=1e-5,
                               atol=1e-6, err_msg=feat.name)


def test_model_features_hold_activations_and_sequence_lengths():
  feats = FEATS[4:] + FEATS[:1]
  engine = _engine([feat.column() for feat in feats])
  features = engine.host_features(_features(feats))
  activations = _serving_lookup(engine, features)
  model_features = engine.model_features(features, activations)
  for feat in feats:
    expected, lengths = np_activation(feat, feat.init())
    np.testing.assert_allclose(model_features[feat.name], expected, rtol=1e-5,
                               atol=1e-6, err_msg=feat.name)
    if lengths is None:
      assert feat.name + SEQUENCE_LENGTH_SUFFIX not in model_features
    else:
      np.testing.assert_array_equal(
          model_features[feat.name + SEQUENCE_LENGTH_SUFFIX], lengths)


def test_missing_feature_and_missing_gradient_name_the_feature():
  engine = _engine([feat.column() for feat in FEATS[:2]])
  with pytest.raises(KeyError, match=r"Features \['ragged_sum'\] are missing"):
    engine.enqueue_inputs(FEATS[0].inputs())
  with pytest.raises(ValueError, match=r"activations of \['sparse_mean'\]"):
    engine.gradients({'ragged_sum': tf.zeros([BATCH, 3]), 'sparse_mean': None})
  gradients = engine.gradients({'ragged_sum': tf.ones([BATCH, 3]),
                                'sparse_mean': tf.zeros([BATCH, 3])})
  assert sorted(gradients) == sorted(engine.mid_level.feature_config)


def test_no_tpu_is_found_here(tf_log):
  assert tpu_embedding.tpu_cluster_resolver() is None
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec({'worker': ['localhost:1']}))
  assert tpu_embedding.tpu_cluster_resolver(resolver) is None
  tpu_fc.TPUEstimator(model_fn=lambda features, labels, mode, params: None,
                      config=tpu_fc.RunConfig(cluster=resolver), use_tpu=True,
                      train_batch_size=4)
  assert not [m for m in tf_log if 'A TPU was found' in m]


def _graph_mode_model_fn(features, labels):
  """A legacy model_fn's core: v1 layer, loss, optimizer minimize over collections."""
  logits = tf.compat.v1.layers.dense(features, 1)
  loss = tf.compat.v1.losses.mean_squared_error(labels, logits)
  # (small enough a rate that every step lowers this loss)
  train_op = tf.compat.v1.train.AdagradOptimizer(0.01).minimize(loss)
  with tf.control_dependencies([train_op]):
    return tf.identity(loss)


_MODEL_INPUTS = (tf.TensorSpec([4, 3]), tf.TensorSpec([4, 1]))


def test_a_graph_mode_model_fn_trains_in_strategy_replicas_of_a_v1_graph():
  """What docs/scaling.md ("TPU") says of driving a TPU: the strategy is not the
  obstacle.  A legacy model_fn's graph trains in a strategy's replicas when the
  whole program is a `tf.compat.v1` graph, as TPUEstimator built it (a
  one-device MirroredStrategy here; TPUStrategy shares its distributed-variable
  and merge_call code); it fails only when a TF1 graph (`wrap_function`) is
  nested in a `tf.function` replica step.
  """
  graph = tf.Graph()
  with graph.as_default():
    strategy = tf.compat.v1.distribute.MirroredStrategy(['/cpu:0'])
    with strategy.scope():
      per_replica = strategy.run(_graph_mode_model_fn,
                                 args=(tf.ones([4, 3]), tf.zeros([4, 1])))
      loss = strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica,
                             axis=None)
    with tf.compat.v1.Session(graph=graph) as session:
      session.run(tf.compat.v1.global_variables_initializer())
      losses = [session.run(loss) for _ in range(3)]
  assert losses[0] > losses[1] > losses[2]  # it trains

  strategy = tf.distribute.MirroredStrategy(['/cpu:0'])
  with strategy.scope():

    def replica_fn(features, labels):  # a TF1 graph per replica ...
      return tf.compat.v1.wrap_function(_graph_mode_model_fn, _MODEL_INPUTS)(
          features, labels)

    @tf.function  # ... inside a tf.function
    def train_step(features, labels):
      return strategy.run(replica_fn, args=(features, labels))

    with pytest.raises(RuntimeError,
                       match='`merge_call` called while defining a new graph'):
      train_step(tf.ones([4, 3]), tf.zeros([4, 1]))
