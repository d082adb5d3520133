"""The embedding core on a real TPU: the mid-level `TPUEmbedding`, built from the spec.

What a TPU step needs from the legacy configuration: the `enqueue` inputs and
weights (the ids as the legacy engine read them), the features model_fn sees
(activations in place of ids, `<key>_seq_length_` for sequence features, as
TPUEstimator gave them), and the activation gradients in `apply_gradients`'
structure.  These mappings run on any device and are tested on the CPU against
`serving_embedding_lookup` and the host emulation; `enqueue`, `dequeue` and
`apply_gradients` themselves need a `TPUStrategy` and were never run here.
"""
from tpu_fc._tf import tf
from tpu_fc.lookup.embedding_core import SEQUENCE_LENGTH_SUFFIX
from tpu_fc.lookup.embedding_core import as_sparse
from tpu_fc.lookup.embedding_core import sequence_lengths


def tpu_cluster_resolver(cluster=None):
  """The TPU to run on, or None when this process sees no TPU.

  A `TPUClusterResolver` given as `RunConfig(cluster=...)` (TPUEstimator's way)
  wins; else the TPU cores attached to this host (a TPU VM).  No network probe
  is made: on a machine without TPU this returns None at once.
  """
  resolver_type = tf.distribute.cluster_resolver.TPUClusterResolver
  if isinstance(cluster, resolver_type):
    return cluster
  if tf.config.list_logical_devices('TPU'):
    return resolver_type(tpu='local')
  return None


class TPUEmbeddingEngine:
  """A `TPUEmbedding` of the spec's embedding-core features, legacy-facing.

  Create it under the `TPUStrategy`'s scope (on a CPU it builds plain variables,
  which is how its mappings are tested).
  """

  def __init__(self, spec, global_step=None):
    self.layout = spec.embedding_layout()
    self.mid_level = spec.to_mid_level(global_step)
    self.embedding = tf.tpu.experimental.embedding.TPUEmbedding(
        self.mid_level.feature_config, self.mid_level.optimizer)

  def host_features(self, features):
    """Adds `<key>_seq_length_` for sequence features, computed from their ids."""
    result = dict(features)
    for feature in self.layout.features:
      if feature.is_sequence:
        keep_zero_ids = self.layout.table(feature.table).combiner is None
        ids = as_sparse(feature.name, features[feature.name], keep_zero_ids)
        result[feature.name + SEQUENCE_LENGTH_SUFFIX] = sequence_lengths(
            ids, feature.max_sequence_length)
    return result

  def enqueue_inputs(self, features):
    """(inputs, weights) for `enqueue`, structured like the feature config."""
    missing = [f.name for f in self.layout.features if f.name not in features]
    if missing:
      raise KeyError('Features {} are missing from the features given to the '
                     'TPU embedding; got {}.'.format(missing, sorted(features)))
    return self.mid_level.split_features(features)

  def enqueue(self, features, training=True):
    inputs, weights = self.enqueue_inputs(features)
    self.embedding.enqueue(inputs, weights, training=training)

  def model_features(self, features, activations):
    """Features as model_fn sees them on a TPU: activations in place of the ids."""
    result = dict(features)
    for feature in self.layout.features:
      result[feature.name] = activations[feature.name]
    return result

  def gradients(self, activation_gradients):
    """Gradients in the feature config's structure; a missing one is an error."""
    missing = [name for name in self.mid_level.feature_config
               if activation_gradients.get(name) is None]
    if missing:
      raise ValueError(
          'No gradient for the TPU embedding activations of {}: is the loss '
          'computed from every embedding column model_fn was given?'.format(
              missing))
    return {name: activation_gradients[name]
            for name in self.mid_level.feature_config}

  def apply_gradients(self, activation_gradients):
    self.embedding.apply_gradients(self.mid_level.scale_gradients(
        self.gradients(activation_gradients)))
