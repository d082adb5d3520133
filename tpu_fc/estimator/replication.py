"""Builds a model_fn once per emulated TPU shard, the way TPU replicas run it.

On a TPU the model_fn is traced once and every core runs it on its slice of the
batch with its own copy of the variables, kept equal because `CrossShardOptimizer`
sums the gradients with `cross_replica_sum` before each core applies them.  Without
a TPU, `replicate()` builds the model_fn once per shard in one graph:

* all shards share one set of variables: the first shard built creates them (with
  the names a single call would give), later shards get them back in creation order
  through a variable creator, each from a fresh variable store;
* shards are built last to first, and `cross_replica_sum` is replaced by a sum over
  shards: later-built shards record their operands, shard 0 (built last) adds the
  operands of the same call of every other shard, so shard 0's train_op applies
  exactly what every TPU core applies.  Only shard 0's train_op runs; the others
  contribute their gradients (and, through the engine, their embedding gradients);
* per-replica graph collections (losses, update ops, summaries) keep shard 0's
  entries only, so e.g. `get_regularization_loss()` is not counted once per shard.

Limitation: a model_fn that reads `cross_replica_sum` results in its forward pass
(cross-replica batch norm) sees global values on shard 0 only.
"""
import contextlib

from tpu_fc import _tf_internals as internals
from tpu_fc._tf import tf
from tpu_fc.lookup import embedding_core

# Collections that keep shard 0's entries only.
_PER_REPLICA_COLLECTIONS = (
    tf.compat.v1.GraphKeys.LOSSES,
    tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES,
    tf.compat.v1.GraphKeys.UPDATE_OPS,
    tf.compat.v1.GraphKeys.SUMMARIES,
)
# Where TPU columns record their variable scopes (the checkpoint names): the first
# shard built has the names a single call gives, so its entries are kept.
_NAMING_COLLECTION = '_tpu_feature_column_scope'


class _SharedVariables:
  """Variable creator: the first shard creates, the others replay in order."""

  def __init__(self):
    self._created = []
    self._replay = None

  def creator(self, next_creator, **kwargs):
    if self._replay is None:
      variable = next_creator(**kwargs)
      self._created.append(variable)
      return variable
    if self._replay >= len(self._created):
      raise ValueError(
          'model_fn created more variables on one TPU shard than on another '
          '(variable {!r}); it must build the same model on every shard.'.format(
              kwargs.get('name')))
    variable = self._created[self._replay]
    self._replay += 1
    return variable

  def start_replay(self, shared_table_creators=()):
    """Replays from the first variable; shared columns' tables too.

    A `SharedEmbeddingColumnCreator` creates its table once per graph and
    caches it: forgotten here, so every shard asks for it in the same order.
    """
    self._replay = 0
    for creator in shared_table_creators:
      internals.forget_shared_table(creator, tf.compat.v1.get_default_graph())


class _CrossShardSums:
  """`cross_replica_sum` across shards built last to first (see module doc)."""

  def __init__(self, num_shards):
    self._operands = {shard: [] for shard in range(num_shards)}
    self.shard = None

  def __call__(self, x, group_assignment=None, name=None):
    del group_assignment, name  # one group: all shards
    x = tf.convert_to_tensor(x)
    if self.shard != 0:
      self._operands[self.shard].append(x)
      return x
    call = len(self._operands[0])
    self._operands[0].append(x)
    others = []
    for shard, operands in self._operands.items():
      if shard == 0:
        continue
      if call >= len(operands):
        raise ValueError(
            'model_fn called cross_replica_sum {} times on TPU shard {} but more '
            'on shard 0; it must build the same model on every shard.'.format(
                len(operands), shard))
      others.append(operands[call])
    return tf.add_n([x] + others)


@contextlib.contextmanager
def _replaced(owner, name, value):
  original = getattr(owner, name)
  setattr(owner, name, value)
  try:
    yield
  finally:
    setattr(owner, name, original)


@contextlib.contextmanager
def _collections_of(graph, shard, first_built):
  """Keeps shard 0's per-replica entries and the first-built shard's names."""
  before = {key: list(graph.get_collection(key))
            for key in _PER_REPLICA_COLLECTIONS}
  naming = graph.get_collection_ref(_NAMING_COLLECTION)
  names = list(naming)
  if not first_built:
    naming[:] = []  # recorded into a fresh dict, dropped below
  yield
  if not first_built:
    naming[:] = names
  if shard != 0:
    for key, items in before.items():
      graph.get_collection_ref(key)[:] = items


@contextlib.contextmanager
def _variable_store(variables, replay, shared_table_creators):
  """The first shard uses the graph's variable store; replays get a fresh one."""
  if not replay:
    yield
    return
  variables.start_replay(shared_table_creators)
  with internals.with_variable_store(internals.new_variable_store()):
    yield


@contextlib.contextmanager
def _creator_scope_on_every_graph(graph, creator):
  """`creator` on `graph` and the graphs enclosing it (a loop body's).

  Optimizers create slots under `init_scope`, in the outermost graph, whose
  creator stack is its own.
  """
  with contextlib.ExitStack() as stack:
    while graph is not None:
      stack.enter_context(internals.variable_creator_scope_of(graph, creator))
      graph = getattr(graph, 'outer_graph', None)
    yield


def _sum_over_one_replica(x, group_assignment=None, name=None):
  del group_assignment
  return tf.identity(x, name=name)


@contextlib.contextmanager
def one_replica():
  """`cross_replica_sum` as the sum over one replica while a CPU graph is built.

  TF 2.15's `CrossShardOptimizer` outside a TPU warns "Assuming 1" shard and then
  builds a `CrossReplicaSum` op, which has no CPU kernel: the step fails.  Here
  it is the identity, so a model_fn written for TPUs trains with use_tpu=False.
  """
  with _replaced(internals.tpu_ops_module, 'cross_replica_sum', _sum_over_one_replica), \
      _replaced(tf.compat.v1.tpu, 'cross_replica_sum', _sum_over_one_replica):
    yield


def replicate(build_shard, num_shards, shared_table_creators=()):
  """Calls `build_shard(shard)` for every shard; returns the results in shard order.

  `build_shard` builds one shard's model (typically calls the model_fn on that
  shard's slice of the batch).  It runs inside a TPU shard context of `num_shards`,
  so TF's TPU feature columns and `CrossShardOptimizer` behave as on a TPU.
  `shared_table_creators`: those of the shared columns the model_fn looks up
  in its graph (tensor-core ones), whose cached tables each shard asks for.
  """
  graph = tf.compat.v1.get_default_graph()
  variables = _SharedVariables()
  sums = _CrossShardSums(num_shards)
  results = {}
  with internals.tpu_shard_context(num_shards), \
      _replaced(internals.tpu_ops_module, 'cross_replica_sum', sums), \
      _replaced(tf.compat.v1.tpu, 'cross_replica_sum', sums), \
      _creator_scope_on_every_graph(graph, variables.creator):
    for position, shard in enumerate(reversed(range(num_shards))):
      sums.shard = shard
      with _collections_of(graph, shard, first_built=position == 0), \
          _variable_store(variables, position > 0, shared_table_creators):
        results[shard] = build_shard(shard)
  return [results[shard] for shard in range(num_shards)]


def _batch_size(value):
  if isinstance(value, tf.SparseTensor):
    return value.dense_shape[0]
  if isinstance(value, tf.RaggedTensor):
    return value.nrows()
  return tf.shape(value, out_type=tf.int64)[0]


def split_batch(value, num_shards, shard, name='Labels'):
  """Shard `shard`'s slice (of `num_shards` equal ones) of a batched value.

  A batch that does not divide into the shards fails the step, naming the
  feature (as a TPU refuses such a batch); nothing is silently left out.
  """
  if isinstance(value, dict):
    return {k: split_batch(v, num_shards, shard, 'Feature ' + str(k))
            for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return type(value)(split_batch(v, num_shards, shard, name) for v in value)
  if value is None:
    return None
  if not isinstance(value, (tf.SparseTensor, tf.RaggedTensor)):
    value = tf.convert_to_tensor(value)
  batch = tf.cast(_batch_size(value), tf.int64)
  check = embedding_core.check_batch_divides(name, batch, num_shards)
  with tf.control_dependencies([check]):
    size = batch // num_shards
  if isinstance(value, tf.SparseTensor):
    start = tf.concat([[size * shard],
                       tf.zeros_like(value.dense_shape[1:])], axis=0)
    return tf.sparse.slice(
        value, start, tf.concat([[size], value.dense_shape[1:]], axis=0))
  piece = value[size * shard:size * (shard + 1)]
  static_batch = tf.compat.dimension_value(value.shape[0])
  if (isinstance(piece, tf.Tensor) and static_batch is not None and
      static_batch % num_shards == 0):
    # A TPU core's infeed gives it static shapes; so does a static batch here.
    piece.set_shape([static_batch // num_shards] + value.shape[1:])
  return piece
