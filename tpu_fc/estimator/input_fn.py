"""What an `input_fn` returns, as the driver reads it: a Dataset, a
`(features, labels)` pair or features alone (tensorflow-estimator's
`util.parse_input_fn_result`), and for an in-graph loop a way to take a new
batch at every step.
"""
import collections

from tpu_fc._tf import tf
from tpu_fc import _tf_internals as internals
from tpu_fc.estimator.hooks import DatasetInitializerHook


class Input(collections.namedtuple(
    'Input', ['next_batch', 'hooks', 'from_dataset', 'next_batch_per_step'])):
  """What input_fn gave: `next_batch()` -> (features, labels); its hooks;
  whether it was a Dataset; and `next_batch_per_step`, whose every call takes
  a new batch (for an in-graph loop), or None where the input cannot."""


def parse_input_fn_result(result):
  """The `Input` of a Dataset, a pair or features alone.

  A Dataset's `next_batch` takes the next element at each call.  Tensors
  straight from one iterator's `get_next()` (as TF's tests write input_fns)
  are, like a TPU's infeed, a new batch each step of a loop: its
  `next_batch_per_step` asks the iterator again.
  """
  hooks = []
  from_dataset = isinstance(result, tf.data.Dataset)
  if from_dataset:
    iterator = tf.compat.v1.data.make_initializable_iterator(result)
    hooks.append(DatasetInitializerHook(iterator))
    next_element = again = iterator.get_next
  else:
    next_element = lambda: result
    again = _get_next_again(result)

  def batch_of(next_element):
    def next_batch():
      element = next_element()
      if isinstance(element, (list, tuple)):
        if len(element) != 2:
          raise ValueError(
              'input_fn should return (features, labels) as a len 2 tuple.')
        return element[0], element[1]
      return element, None
    return next_batch

  return Input(batch_of(next_element), hooks, from_dataset,
                batch_of(again) if again else None)


def reads_dataset_or_queue(result):
  """Whether an input_fn's `result` comes from a Dataset or a queue, by TF's
  test: a Dataset, top-level feature tensors of an `IteratorGetNext`, or
  queue runners in the graph.  Without either, predict yields forever."""
  if isinstance(result, tf.data.Dataset):
    return True
  features = result[0] if isinstance(result, (list, tuple)) else result
  if any(leaf.op.type == 'IteratorGetNext'
         for leaf in tf.nest.flatten(features) if isinstance(leaf, tf.Tensor)):
    return True
  return bool(tf.compat.v1.get_collection(
      tf.compat.v1.GraphKeys.QUEUE_RUNNERS))


_GET_NEXT_OPS = ('IteratorGetNext', 'IteratorGetNextSync')


def _get_next_again(result):
  """For tensors computed from one iterator's `get_next()` by stateless ops
  (e.g. a SparseTensor's deserialization): a function building another
  `get_next()` of that iterator and those ops again, in `result`'s structure;
  else None."""
  try:
    leaves = tf.nest.flatten(result, expand_composites=True)
  except TypeError:
    # Features by int and str keys (Estimator takes them): nest cannot order
    # them, and no iterator's get_next() gives them.
    return None
  if not all(isinstance(leaf, tf.Tensor) for leaf in leaves):
    return None
  get_next_ops, between = set(), {}
  pending = [leaf.op for leaf in leaves]
  while pending:
    op = pending.pop()
    if op.type in _GET_NEXT_OPS:
      get_next_ops.add(op)
    elif op.name not in between:
      if op.control_inputs or internals.is_stateful(op):
        return None
      between[op.name] = op
      pending.extend(tensor.op for tensor in op.inputs)
  if len(get_next_ops) != 1:
    return None
  get_next_op, = get_next_ops
  graph_def = tf.compat.v1.GraphDef()
  for op in sorted(between.values(), key=internals.creation_order):
    node = graph_def.node.add()
    node.CopyFrom(op.node_def)
    if '_class' in node.attr:  # colocated with the dataset: not copied
      del node.attr['_class']

  def get_next():
    outputs = tf.raw_ops.IteratorGetNext(
        iterator=get_next_op.inputs[0],
        output_types=get_next_op.get_attr('output_types'),
        output_shapes=get_next_op.get_attr('output_shapes'))
    again = {'{}:{}'.format(get_next_op.name, i): output
             for i, output in enumerate(outputs)}
    if between:
      names = [leaf.name for leaf in leaves if leaf.op.name in between]
      used = {tensor.name for op in between.values() for tensor in op.inputs}
      again.update(zip(names, tf.compat.v1.import_graph_def(
          graph_def, name='get_next_again', return_elements=names,
          input_map={name: tensor for name, tensor in again.items()
                     if name in used})))
    return tf.nest.pack_sequence_as(
        result, [again[leaf.name] for leaf in leaves], expand_composites=True)

  return get_next
