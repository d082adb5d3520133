"""`tpu_tensor_core`: ids densified to `tensor_core_shape` for a gather in the model graph.

As the legacy TPU input pipeline does: each tensor-core feature's ids (checked as the
embedding core checks them: integer, rank 2, below the vocabulary size; negative ids
are padding and dropped) are sliced to
`[batch, width]` (entries at column >= width are dropped), cast to int32 and
scattered into zeros (pad id 0), with a 0/1 mask of the real entries (weights are
ignored).  The column itself then gathers from its ordinary, model-trained variable
and combines with `sum` or `mean` (TF's `sparse_embedding_aggregate_slice`).
"""
from tpu_fc import _tf_internals as internals
from tpu_fc import columns as columns_lib
from tpu_fc._tf import tf
from tpu_fc.lookup import inputs


def densify(features, layout, batch_size=None):
  """`features` with every feature of `layout` (the tensor core's) replaced by
  its padded ids and mask.

  With `batch_size`, ids and mask have TF 2.15's static `[batch_size, width]`.
  """
  result = dict(features)
  for feature in layout.features:
    key, column = feature.name, feature.column
    mask_key = key + columns_lib.TENSOR_CORE_MASK_KEY_SUFFIX
    if mask_key in features:
      raise ValueError(
          'Mask key {} for Tensor Core embedding is already in use.'.format(
              mask_key))
    if key not in features:
      raise KeyError('Feature {} (tensor-core column {}) is missing from the '
                     'features; got {}.'.format(key, column.name,
                                                sorted(features)))
    ids = inputs.as_sparse(key, features[key], keep_zero_ids=False)
    inputs.check_static_batch(
        key, tf.compat.dimension_value(ids.shape[0]), batch_size)
    if not ids.dtype.is_integer:
      raise ValueError(inputs.STRING_IDS_ERROR.format(key))
    ids = tf.sparse.retain(ids, ids.values >= 0)
    ids = tf.SparseTensor(ids.indices, inputs.check_ids(
        key, column.name, ids.values, column.categorical_column.num_buckets,
        feature.ids_column), ids.dense_shape)
    width = columns_lib.tensor_core_shape(column)[1]
    checks = [] if batch_size is None else [
        inputs.check_batch_size(key, ids.dense_shape[0], batch_size)]
    with tf.control_dependencies(checks):
      padded = [tf.identity(t) for t in
                internals.pad_sparse_embedding_lookup_indices(ids, width)]
    for tensor in padded:
      tensor.set_shape([batch_size, width])
    result[key], result[mask_key] = padded
  return result
