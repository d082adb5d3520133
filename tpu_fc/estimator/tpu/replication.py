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
  entries only, so e.g. `get_regularization_loss()` is not counted once per shard;
  while a shard is built they hold its own, as each core's model_fn has them
  (`tf.compat.v1.layers` regularize every shard's weights);
* an ON_READ variable (batch norm's moving statistics) is each core's own: the
  other shards update local copies, the checkpoint holds shard 0's;
* a partitioner is dropped, with TF's warning, as TF's TPU replication does;
* a table's row gradients (`tpu_tensor_core` columns' gathers) stay rows through
  `CrossShardOptimizer` when its optimizer leaves a row without gradient as it is
  (SGD, Adagrad): the TPU's dense sum updates such a table to the same values
  by reading and writing all of it every step.

A train_op that updates trainable variables without any `cross_replica_sum` (a plain
optimizer, no `CrossShardOptimizer`) applies core 0's update only, as on a TPU, where
the other cores' dense updates are pruned: those variables learn from core 0's slice of
every batch.  TF never said so; tpu_fc warns, once per process.

Limitation: a model_fn that reads `cross_replica_sum` results in its forward pass
(cross-replica batch norm) sees global values on shard 0 only.
"""
import contextlib
import functools

from tpu_fc import _tf_internals as internals
from tpu_fc import naming
from tpu_fc._tf import tf
from tpu_fc.lookup import inputs

# Collections that keep shard 0's entries only.
_PER_REPLICA_COLLECTIONS = (
    tf.compat.v1.GraphKeys.LOSSES,
    tf.compat.v1.GraphKeys.REGULARIZATION_LOSSES,
    tf.compat.v1.GraphKeys.UPDATE_OPS,
    tf.compat.v1.GraphKeys.SUMMARIES,
)
# TF's class, as imported: the builds name a subclass of it in its place.
_TF_CROSS_SHARD_OPTIMIZER = tf.compat.v1.tpu.CrossShardOptimizer


class _SharedVariables:
  """Variable creator: the first shard creates, the others replay in order."""

  def __init__(self):
    self.created = []
    self._replay = None
    self.shard = 0  # the shard being built

  def creator(self, next_creator, **kwargs):
    if self._replay is None:
      variable = next_creator(**kwargs)
      self.created.append(variable)
    elif self._replay >= len(self.created):
      raise ValueError(
          'model_fn created more variables on one TPU shard than on another '
          '(variable {!r}); it must build the same model on every shard.'.format(
              kwargs.get('name')))
    else:
      variable = self.created[self._replay]
      self._replay += 1
    if (self.shard != 0 and
        kwargs.get('synchronization') == tf.VariableSynchronization.ON_READ):
      return _core_copy(next_creator, variable, kwargs)
    return variable

  def start_replay(self, shared_table_creators=()):
    """Replays from the first variable; shared columns' tables too.

    A `SharedEmbeddingColumnCreator` creates its table once per graph and
    caches it: forgotten here, so every shard asks for it in the same order.
    """
    self._replay = 0
    for creator in shared_table_creators:
      internals.forget_shared_table(creator, tf.compat.v1.get_default_graph())


def _core_copy(next_creator, variable, kwargs):
  """A core's own copy of an ON_READ `variable` (batch norm's moving statistics).

  On a TPU each core updates its copy of such a variable with its own batch
  (its update ops run with its step) and the checkpoint holds core 0's: the
  shard-0 variable.  Another shard's copy is a local variable, set to the
  variable's value whenever a session starts (after a restore), so that
  shard's updates never reach what core 0 holds.  A local variable (a
  metric's accumulator) is not restored: its copy starts from its initial
  value, since the two are initialized together.
  """
  local = tf.compat.v1.GraphKeys.LOCAL_VARIABLES in (kwargs.get('collections')
                                                     or ())
  with tf.init_scope():
    return next_creator(**dict(
        kwargs, trainable=False,
        initial_value=variable.initial_value if local else variable.read_value,
        collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES],
        name=variable.op.name + '_core_copy'))


class _CrossShardSums:
  """`cross_replica_sum` across shards built last to first (see module doc)."""

  def __init__(self, num_shards):
    self._operands = {shard: [] for shard in range(num_shards)}
    self._rows_kept = False
    self.shard = None

  @property
  def summed(self):
    """Whether any shard built a `cross_replica_sum`."""
    return any(self._operands.values())

  @contextlib.contextmanager
  def keeping_rows(self, keep):
    """Inside, with `keep`, row gradients (`IndexedSlices`) sum as rows."""
    outer, self._rows_kept = self._rows_kept, keep
    try:
      yield
    finally:
      self._rows_kept = outer

  def __call__(self, x, group_assignment=None, name=None):
    del group_assignment, name  # one group: all shards
    if self._rows_kept and isinstance(x, tf.IndexedSlices):
      return self._sum(x, _concatenated_rows)
    return self._sum(tf.convert_to_tensor(x), tf.add_n)

  def _sum(self, x, add):
    """`add` of this call's operands of every shard, on shard 0."""
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
    return add([x] + others)


def _concatenated_rows(parts):
  """`IndexedSlices` summed without densifying (a sparse apply adds
  duplicate rows up)."""
  if len(parts) == 1:
    return parts[0]
  return tf.IndexedSlices(tf.concat([part.values for part in parts], axis=0),
                          tf.concat([part.indices for part in parts], axis=0),
                          parts[0].dense_shape)


# TF1 optimizers that leave a row with zero gradient as it is: for them a sparse
# apply of the summed rows updates a table exactly as the TPU's dense sum does.
_ROW_EXACT_OPTIMIZERS = (tf.compat.v1.train.GradientDescentOptimizer,
                         tf.compat.v1.train.AdagradOptimizer)


def _cross_shard_optimizer_keeping_rows(sums):
  """`tf.compat.v1.tpu.CrossShardOptimizer` while shards are built: TF's class,
  whose `cross_replica_sum` (`sums`) keeps a table's row gradients (a gather's
  `IndexedSlices`, `tpu_tensor_core` tables) rows when the wrapped optimizer is
  in `_ROW_EXACT_OPTIMIZERS`: TF's sum makes them dense, and the update then
  reads and writes the whole table every step, to the same result.  (An
  optimizer made from TF's class itself, named before the build, sums densely:
  the same values, slower.)"""
  class CrossShardOptimizer(_TF_CROSS_SHARD_OPTIMIZER):
    __doc__ = _TF_CROSS_SHARD_OPTIMIZER.__doc__

    def apply_gradients(self, grads_and_vars, global_step=None, name=None):
      with sums.keeping_rows(type(self._opt) in _ROW_EXACT_OPTIMIZERS):
        return super().apply_gradients(grads_and_vars, global_step, name)

  return CrossShardOptimizer


@contextlib.contextmanager
def per_replica_entries_dropped(graph, keep_summaries=False):
  """What is added to the per-replica collections inside is dropped after: a
  shard's other than 0 (see module doc), or an in-graph loop body's (but its
  summaries with `keep_summaries`)."""
  before = {key: list(graph.get_collection(key))
            for key in _PER_REPLICA_COLLECTIONS
            if not (keep_summaries and
                    key == tf.compat.v1.GraphKeys.SUMMARIES)}
  yield
  for key, items in before.items():
    graph.get_collection_ref(key)[:] = items


@contextlib.contextmanager
def _collections_of(graph, shard, first_built):
  """Keeps shard 0's per-replica entries and the first-built shard's names."""
  # The columns' record of their tables' names: the first shard built has the
  # names a single call gives, so its entries are kept.
  recorded = graph.get_collection_ref(naming.COLUMN_SCOPES)
  names = list(recorded)
  if not first_built:
    recorded[:] = []  # recorded into a fresh dict, dropped below
  with (per_replica_entries_dropped(graph) if shard != 0 else
        contextlib.nullcontext()):
    yield
  if not first_built:
    recorded[:] = names


@contextlib.contextmanager
def _variable_store(variables, replay, shared_table_creators):
  """The first shard uses the graph's variable store; replays get a fresh one.

  While a shard replays, the variables it gets back are out of the graph's
  global variables: `tf.compat.v1.layers` add a weight's regularization loss
  only for a variable new to them, and on a TPU every core's loss has it.
  """
  if not replay:
    yield
    return
  variables.start_replay(shared_table_creators)
  global_variables = tf.compat.v1.get_default_graph().get_collection_ref(
      tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
  listed = list(global_variables)
  replayed = {id(variable) for variable in variables.created}
  global_variables[:] = [v for v in listed if id(v) not in replayed]
  try:
    with internals.with_variable_store(internals.new_variable_store()):
      yield
  finally:
    known = {id(variable) for variable in listed}
    global_variables[:] = listed + [v for v in global_variables
                                    if id(v) not in known]


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


@contextlib.contextmanager
def _unpartitioned_variables():
  """As TF's TPU replication (`tpu.split_compile_and_replicate`): a variable
  asked for with a partitioner is made whole, with TF's warning."""
  scope = tf.compat.v1.get_variable_scope()
  outer_getter = scope.custom_getter

  def unpartitioned(getter, name, *args, **kwargs):
    if kwargs.get('partitioner') is not None:
      tf.compat.v1.logging.warning(
          'Partitioned variables are not supported on TPU. Got '
          '`partitioner` that is %s for variable %s. '
          'Setting `partitioner` to `None`.', kwargs['partitioner'], name)
      kwargs['partitioner'] = None
    if outer_getter is None:
      return getter(name, *args, **kwargs)
    return outer_getter(getter, name, *args, **kwargs)

  scope.set_custom_getter(unpartitioned)
  try:
    yield
  finally:
    scope.set_custom_getter(outer_getter)


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
  with internals.replaced(internals.tpu_ops_module, 'cross_replica_sum', _sum_over_one_replica), \
      internals.replaced(tf.compat.v1.tpu, 'cross_replica_sum', _sum_over_one_replica):
    yield


def replicate(build_shard, num_shards, shared_table_creators=(),
              training=False, sliced=True, in_tpu_context=True):
  """Calls `build_shard(shard)` for every shard; returns the results in shard order.

  `build_shard` builds one shard's model (typically calls the model_fn on that
  shard's slice of the batch).  It runs inside a TPU shard context of
  `num_shards`, so TF's TPU feature columns and `CrossShardOptimizer` behave as
  on a TPU; not `in_tpu_context` (prediction, which looks up on the CPU), the
  columns look up as on the CPU.
  `shared_table_creators`: those of the shared columns the model_fn looks up
  in its graph (tensor-core ones), whose cached tables each shard asks for.
  `training`: the shards train; no `cross_replica_sum` in them is refused as
  TF 2.15 refuses a TF1 control-flow training graph without a
  `CrossReplicaSum` op (`tpu_estimator.py`, `_validate_tpu_training_graph`,
  3775-3796; TF skips the check under control flow v2), else, with each
  shard on its `sliced` batch, a train_op updating trainable variables is
  warned of (see module).
  """
  graph = tf.compat.v1.get_default_graph()
  variables = _SharedVariables()
  sums = _CrossShardSums(num_shards)
  results = {}
  with (internals.tpu_shard_context(num_shards) if in_tpu_context else
        contextlib.nullcontext()), \
      internals.replaced(internals.tpu_ops_module, 'cross_replica_sum', sums), \
      internals.replaced(tf.compat.v1.tpu, 'cross_replica_sum', sums), \
      internals.replaced(tf.compat.v1.tpu, 'CrossShardOptimizer',
                         _cross_shard_optimizer_keeping_rows(sums)), \
      _creator_scope_on_every_graph(graph, variables.creator), \
      _unpartitioned_variables():
    for position, shard in enumerate(reversed(range(num_shards))):
      sums.shard = variables.shard = shard
      with _collections_of(graph, shard, first_built=position == 0), \
          _variable_store(variables, position > 0, shared_table_creators):
        results[shard] = build_shard(shard)
  if training and num_shards > 1 and not sums.summed:
    if not tf.compat.v1.control_flow_v2_enabled():
      raise ValueError(
          'CrossShardOptimizer must be used for model training on TPUs.')
    if sliced:
      _warn_if_core_0_trains_alone(
          getattr(results[0], 'train_op', None), num_shards,
          [v for v in variables.created
           if v.trainable and not naming.is_dummy(v.op.name)])
  return [results[shard] for shard in range(num_shards)]


_warned_core_0_trains_alone = []


def _warn_if_core_0_trains_alone(train_op, num_shards, trainable):
  """Warns, once per process, that `train_op` updates `trainable` variables
  with core 0's gradients only (no shard summed them)."""
  if _warned_core_0_trains_alone:
    return
  updated = sorted(_variables_written_by(train_op) &
                   {variable.op.name for variable in trainable})
  if not updated:
    return
  _warned_core_0_trains_alone.append(True)
  tf.compat.v1.logging.warning(
      'TPUConfig.num_shards=%d, and the train_op updates trainable variables '
      '(%s) with no cross-replica sum: as on a TPU, only core 0\'s update is '
      'applied, so they learn from 1/%d of every batch (core 0\'s slice). '
      'Wrap the optimizer in tf.compat.v1.tpu.CrossShardOptimizer to train '
      'them on the whole batch.', num_shards, ', '.join(updated[:3]) + (
          ', ...' if len(updated) > 3 else ''), num_shards)


# Op types that write the variable of their first input (`assign`s, optimizer
# applies, scatter updates; their resource and ref forms).
_WRITES = ('Assign', 'Apply', 'Scatter')
# Ops a variable's handle (or ref) passes through on its way to a write.
_PASSED_THROUGH = ('Enter', 'RefEnter', 'Identity', 'RefIdentity')
_VARIABLE_OPS = ('VarHandleOp', 'VariableV2', 'Variable')


def _variables_written_by(op):
  """Names of the variables that `op` or an op it depends on writes."""
  written, seen, pending = set(), set(), [op] if op is not None else []
  while pending:
    op = pending.pop()
    if op.name in seen:
      continue
    seen.add(op.name)
    if op.inputs and any(word in op.type for word in _WRITES):
      variable = _variable_of(op.inputs[0])
      if variable is not None:
        written.add(variable)
    pending.extend(op.control_inputs)
    pending.extend(tensor.op for tensor in op.inputs)
  return written


def global_step_read_at_step_start(graph, ops_before):
  """Makes each read of the global step among the ops `graph` built after its
  first `ops_before` run before the step's increment built with them (unless
  it waits for the increment).

  A TPU step reads a variable as it was at the step's start, so a host_call's
  `get_global_step()` (TF's summaries idiom) is its step's; in one
  `session.run` the read and the optimizer's increment race, and the
  summaries would land on the next step, or twice on one.
  """
  global_step = tf.compat.v1.train.get_global_step(graph)
  if global_step is None and getattr(graph, 'outer_graph', None) is not None:
    global_step = tf.compat.v1.train.get_global_step(graph.outer_graph)
  if global_step is None:
    return
  on_global_step = [op for op in graph.get_operations()[ops_before:]
                    if op.inputs and
                    _variable_of(op.inputs[0]) == global_step.op.name]
  reads = [op for op in on_global_step if op.type == 'ReadVariableOp']
  for increment in on_global_step:
    if any(word in increment.type for word in _WRITES):
      internals.add_control_inputs(increment, [
          read for read in reads if increment.name not in _ops_before(read)])


def _ops_before(op):
  """The names of the ops `op` depends on (inputs and control inputs)."""
  seen, pending = set(), [op]
  while pending:
    current = pending.pop()
    for before in list(current.control_inputs) + [t.op for t in current.inputs]:
      if before.name not in seen:
        seen.add(before.name)
        pending.append(before)
  return seen


def _variable_of(tensor):
  """The name of the variable whose handle (or ref) `tensor` is, or None."""
  while tensor is not None:
    if tensor.op.type in _VARIABLE_OPS:
      return tensor.op.name
    if tensor.op.type in _PASSED_THROUGH:
      tensor = tensor.op.inputs[0]
    elif tensor.op.type == 'Placeholder':  # a loop body's capture
      tensor = internals.captured_by(tensor)
    else:
      return None
  return None


def batch_size_of(value):
  """The batch of a Tensor, SparseTensor or RaggedTensor (a tensor)."""
  if isinstance(value, tf.SparseTensor):
    return value.dense_shape[0]
  if isinstance(value, tf.RaggedTensor):
    return value.nrows()
  return tf.shape(value, out_type=tf.int64)[0]


def batch_splitter(value, num_shards, name='Labels'):
  """`shard -> that shard's slice` (of `num_shards` equal ones) of a batched
  value or a structure of them (dict, list, tuple, namedtuple).

  A batch that does not divide into the shards fails the step, naming the
  feature (as a TPU refuses such a batch); nothing is silently left out.  The
  batch is read and checked here, once for all shards.
  """
  if isinstance(value, dict):
    splitters = {k: batch_splitter(v, num_shards, 'Feature ' + str(k))
                 for k, v in value.items()}
    return lambda shard: {k: split(shard) for k, split in splitters.items()}
  if isinstance(value, (list, tuple)):
    splitters = [batch_splitter(v, num_shards, name) for v in value]

    def split_sequence(shard):
      parts = [split(shard) for split in splitters]
      return (type(value)(*parts) if hasattr(value, '_fields')  # a namedtuple
              else type(value)(parts))
    return split_sequence
  if value is None:
    return lambda shard: None
  if not isinstance(value, (tf.SparseTensor, tf.RaggedTensor)):
    value = tf.convert_to_tensor(value)
  batch = tf.cast(batch_size_of(value), tf.int64)
  check = inputs.check_batch_divides(name, batch, num_shards)
  with tf.control_dependencies([check]):
    size = batch // num_shards
  return functools.partial(_slice_of_shard, value, size, num_shards)


def _slice_of_shard(value, size, num_shards, shard):
  """Rows `[size * shard, size * (shard + 1))` of a batched tensor."""
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
