"""What tpu_fc says of a real TPU: it finds none here (and warns that one it
finds is not used), and a legacy model_fn's graph trains in strategy replicas,
so the strategy is no obstacle to driving one (docs/scaling.md, "TPU")."""
import pytest

import tpu_fc
from tpu_fc.lookup import backends
import tensorflow as tf  # pylint: disable=g-bad-import-order  (after tpu_fc)


def test_no_tpu_is_found_here(tf_log):
  assert backends.tpu_cluster_resolver() is None
  resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
      tf.train.ClusterSpec({'worker': ['localhost:1']}))
  assert backends.tpu_cluster_resolver(resolver) is None
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
