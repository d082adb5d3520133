"""Every TensorFlow internal tpu_fc uses: `tensorflow.python` modules and private names.

TF exports no public twin of these.  Each exists, functionally unchanged, in TF
2.15 and 2.21; using the very functions Estimator and TPUEstimator used keeps
logs, graph structure (hence seeded initial values), checkpoint names and
evaluation bookkeeping identical.  They are imported, and their private names
read, only here, so a TF upgrade that moves one fails in this one named place
(`tests/test_tf_internals.py` checks each on both lanes); the rest of tpu_fc
uses the names below.
"""
import contextlib
import re

from tpu_fc._tf import tf  # noqa: F401  (TF must be imported via tpu_fc._tf)

# pylint: disable=g-direct-tensorflow-import,protected-access,unused-import
from tensorflow.core.framework import attr_value_pb2
from tensorflow.python.data.experimental.ops import iterator_ops
from tensorflow.python.feature_column import feature_column as core_fc_v1
from tensorflow.python.feature_column import feature_column_lib as fc_lib
from tensorflow.python.ops import control_flow_util
from tensorflow.python.ops import resource_variable_ops
from tensorflow.python.ops import summary_ops_v2
from tensorflow.python.ops import variable_scope
from tensorflow.python.ops import variables as variables_lib
from tensorflow.python.platform import tf_logging
from tensorflow.python.saved_model import path_helpers
from tensorflow.python.saved_model import save_context
from tensorflow.python.saved_model.model_utils import export_output
from tensorflow.python.saved_model.model_utils import export_utils
from tensorflow.python.tpu import feature_column as tpu_fc_v1
from tensorflow.python.tpu import feature_column_v2 as tpu_fc_v2
from tensorflow.python.tpu import tpu_embedding_base
from tensorflow.python.tpu import tpu_embedding_v1
from tensorflow.python.tpu import tpu_embedding_v2
from tensorflow.python.tpu import tpu_embedding_v2_utils
from tensorflow.python.tpu import tpu_function
from tensorflow.python.tpu import tpu_system_metadata
from tensorflow.python.tpu.ops import tpu_ops
from tensorflow.python.trackable import trackable_utils
from tensorflow.python.training import basic_session_run_hooks
from tensorflow.python.training import evaluation
from tensorflow.python.training import optimizer as optimizer_lib
from tensorflow.python.training import server_lib
from tensorflow.python.training import training
from tensorflow.python.training import training_util
from tensorflow.python.training.saving import saveable_object_util
from tensorflow.python.util import function_utils
from tensorflow.python.util import nest
from tensorflow.python.util import tf_inspect

# Estimator ----------------------------------------------------------------------

# Argument names of a function, partial or callable object (self excluded).
fn_args = function_utils.fn_args
# Full argspec that also sees through TF decorators (host_call arity check).
getfullargspec = tf_inspect.getfullargspec
# The `global_step + 0` read hooks fetch; Estimator creates it right after the
# global step, before input_fn, so op ids (and seeded initializers) match.
get_or_create_global_step_read = training_util._get_or_create_global_step_read


def fetched_read(variable):
  """The op `session.run(variable)` runs: the read made with the variable."""
  return variable._as_graph_element()  # pylint: disable=protected-access
# Estimator's evaluation loop, its steps hook and its eval-step counter.
evaluate_once = evaluation._evaluate_once
StopAfterNEvalsHook = evaluation._StopAfterNEvalsHook
get_or_create_eval_step = evaluation._get_or_create_eval_step
# Init ops of every `tf.summary.create_file_writer` writer in the graph.
summary_writer_initializer_ops = summary_ops_v2.summary_writer_initializer_op
# `server_lib.Server` and `basic_session_run_hooks.SecondOrStepTimer` (the
# modules imported above; `tf.distribute.Server`,
# `tf.compat.v1.train.SecondOrStepTimer`): train_and_evaluate reads them when
# it runs, where TF's training reads them, and so does Estimator's training
# `training.MonitoredTrainingSession` (`tf.compat.v1.train.
# MonitoredTrainingSession`), where TF's Estimator reads it: replacing one
# there (TF's own tests patch them) reaches tpu_fc's too.
# The job a TPU's computations go to, from its master and cluster (TPU
# estimator's `master_job`).
master_job = tpu_system_metadata.master_job
# TF's logging module (`tf.compat.v1.logging`'s functions): a warning logged
# through it, looked up when logged, as TPUEstimator logged its input
# pipeline's, is one a patch of `tf_logging.warn` (TF's own tests) sees.
# The TF1 optimizer base class (`CrossShardOptimizer`'s and SyncReplicas').
Optimizer = optimizer_lib.Optimizer


@contextlib.contextmanager
def replaced(owner, name, value):
  """`owner.name` is `value` inside, TF's own again outside.

  The one way tpu_fc replaces a TF attribute, each only while it builds a
  graph, where TF has no hook for what it needs: an emulated TPU's
  `cross_replica_sum` (`tpu_ops.cross_replica_sum`, `tf.compat.v1.tpu.
  cross_replica_sum`) and `tf.compat.v1.tpu.CrossShardOptimizer` (a subclass
  of TF's, summing across shards built one after another,
  `estimator/tpu/replication.py`), and
  `Optimizer.apply_gradients` for synchronous replicas
  (`estimator/distributed.py`); and a mid-level optimizer's
  `slot_variable_creation_fn` while `mid_level` makes one copy of each slot
  under a strategy of several replicas.  `tests/test_tf_internals.py` checks
  each TF attribute exists on both lanes.
  """
  original = getattr(owner, name)
  setattr(owner, name, value)
  try:
    yield
  finally:
    setattr(owner, name, original)


def set_steps_per_run(step_counter_hook, steps_per_run):
  """A `StepCounterHook` counting `steps_per_run` steps per session.run."""
  step_counter_hook._set_steps_per_run(steps_per_run)


def saver_listeners(saver_hook):
  """The `CheckpointSaverListener`s of a `CheckpointSaverHook`."""
  return saver_hook._listeners


# Export ----------------------------------------------------------------------------

# PREDICT-mode validation of `export_outputs`, adding the default signature.
get_export_outputs = export_utils.get_export_outputs
export_outputs_for_mode = export_utils.export_outputs_for_mode
build_all_signature_defs = export_utils.build_all_signature_defs
# The SavedModel tags of each mode's meta graph.
EXPORT_TAG_MAP = export_utils.EXPORT_TAG_MAP
SINGLE_LABEL_DEFAULT_NAME = export_utils.SINGLE_LABEL_DEFAULT_NAME
get_timestamped_export_dir = export_utils.get_timestamped_export_dir
get_temp_export_dir = export_utils.get_temp_export_dir
SINGLE_FEATURE_DEFAULT_NAME = export_utils.SINGLE_FEATURE_DEFAULT_NAME
SINGLE_RECEIVER_DEFAULT_NAME = export_utils.SINGLE_RECEIVER_DEFAULT_NAME
ExportOutput = export_output.ExportOutput
ClassificationOutput = export_output.ClassificationOutput
RegressionOutput = export_output.RegressionOutput
PredictOutput = export_output.PredictOutput
EvalOutput = export_output.EvalOutput


def add_train_op(builder, train_op):
  """Stores a TRAIN or EVAL meta graph's `train_op` (None: nothing) in the
  collection a SavedModel's train_op goes in, as Estimator's export does."""
  builder._add_train_op(train_op)
# `<saved_model>/variables/variables`: what warm starting from a SavedModel
# reads.
saved_model_variables_path = path_helpers.get_variables_path
saved_model_variables_dir = path_helpers.get_variables_dir

# Checkpoints and variables ----------------------------------------------------------

op_list_to_dict = saveable_object_util.op_list_to_dict
# A child's name in an object checkpoint's keys: '.' -> '..', '/' -> '.S'.
escape_checkpoint_name = trackable_utils.escape_local_name
make_saveable_from_iterator = iterator_ops.make_saveable_from_iterator
PartitionedVariable = variables_lib.PartitionedVariable
# The op names of part N of a partitioned variable and its ops (TF names the
# parts `<variable>/part_N`).
PART_NAME = re.compile(r'/part_(\d+)(?:/|$)')


def mark_as_only_part(variable, full_name):
  """Makes `variable` the one part of a partitioned variable `full_name`, as
  TF's TPU mode creates tables and slots (`.../part_0`): TF's warm start and
  `init_from_checkpoint` find a part by that name."""
  shape = variable.shape.as_list()
  variable._set_save_slice_info(variables_lib.Variable.SaveSliceInfo(
      full_name, shape, [0] * len(shape), shape))
with_variable_store = variable_scope.with_variable_store


def new_variable_store():
  """A fresh store for `tf.compat.v1.get_variable` (one per emulated shard)."""
  return variable_scope._VariableStore()


def default_variable_store():
  return variable_scope._get_default_variable_store()


def variable_creator_scope_of(graph, creator):
  """`creator` on `graph`'s own creator stack (not only the default graph's)."""
  return graph._variable_creator_scope(creator)


def graph_key(graph):
  """The key TF keeps per-graph state under (e.g. shared columns' tables)."""
  return graph._graph_key


def set_shared_name(handle, shared_name):
  """Makes the resource `handle` (a bare VarHandleOp's output) name
  `shared_name`, i.e. another variable's resource."""
  handle.op._set_attr('shared_name', attr_value_pb2.AttrValue(s=shared_name))


def is_stateful(op):
  return op._is_stateful


def captured_by(tensor):
  """The outer graph's tensor that a function graph's (a v2 loop body's)
  placeholder `tensor` captures, or None."""
  for external, internal in getattr(tensor.graph, 'captures', ()):
    if internal is tensor:
      return external
  return None


def creation_order(op):
  """A key sorting ops in the order the graph created them."""
  return op._id


def add_control_inputs(op, control_inputs):
  """Makes the built `op` run after `control_inputs`."""
  op._add_control_inputs(control_inputs)  # pylint: disable=protected-access


# Feature columns ---------------------------------------------------------------------

EmbeddingDevice = tpu_fc_v2.EmbeddingDevice
TPUEmbeddingColumnV2 = tpu_fc_v2._TPUEmbeddingColumnV2
TPUSharedEmbeddingColumnV2 = tpu_fc_v2._TPUSharedEmbeddingColumnV2
TPUDeviceSpecificEmbeddingColumnV2 = (
    tpu_fc_v2._TPUDeviceSpecificEmbeddingColumnV2)
TPUSharedDeviceSpecificEmbeddingColumnV2 = (
    tpu_fc_v2._TPUSharedDeviceSpecificEmbeddingColumnV2)
tpu_embedding_column_v2 = tpu_fc_v2.embedding_column_v2
tpu_shared_embedding_columns_v2 = tpu_fc_v2.shared_embedding_columns_v2
pad_sparse_embedding_lookup_indices = (
    tpu_fc_v2.pad_sparse_embedding_lookup_indices)
TENSOR_CORE_MASK_KEY_SUFFIX = tpu_fc_v2._TENSOR_CORE_MASK_KEY_SUFFIX
# The graph collection where TF's TPU columns record their variable scopes.
TPU_FC_TO_SCOPE = tpu_fc_v1._TPU_FC_TO_SCOPE
is_running_on_cpu = tpu_fc_v1._is_running_on_cpu
# The CPU lookups the TPU columns' own CPU paths call.
embedding_column_dense_tensor_v1 = fc_lib.EmbeddingColumn._get_dense_tensor
shared_embedding_column_dense_tensor = (
    fc_lib.SharedEmbeddingColumn._get_dense_tensor_internal)
# Every column type that `EmbeddingConfigSpec` takes as a feature column.
EMBEDDING_AND_NUMERIC_COLUMN_TYPES = (
    (core_fc_v1._NumericColumn, fc_lib.NumericColumn) +
    (tpu_fc_v1._TPUEmbeddingColumn, tpu_fc_v1._TPUSharedEmbeddingColumn,
     tpu_fc_v2._TPUEmbeddingColumnV2, tpu_fc_v2._TPUSharedEmbeddingColumnV2) +
    (core_fc_v1._EmbeddingColumn, fc_lib.EmbeddingColumn,
     core_fc_v1._SharedEmbeddingColumn))

# Heads --------------------------------------------------------------------------------

# The column types a head's `weight_column` may be (a string is made one).
NUMERIC_COLUMN_TYPES = (fc_lib.NumericColumn, core_fc_v1._NumericColumn)


def numeric_column_dense_tensor(column, features):
  """`column`'s tensor of `features`, through the v1 column API TF's heads
  read weights with (a rank-1 feature gets a last dimension of 1)."""
  return column._get_dense_tensor(core_fc_v1._LazyBuilder(features))


def compute_weighted_loss(losses, sample_weight, reduction):
  """Keras' weighted loss reduction, which TF's heads reduce their losses
  with (read on call: it loads Keras)."""
  return tf.compat.v2.keras.__internal__.losses.compute_weighted_loss(
      losses, sample_weight=sample_weight, reduction=reduction)


# Weights broadcast to a metric's values, as TF's heads weight their metrics.
broadcast_weights = tf.compat.v2.__internal__.ops.broadcast_weights

# TPU -----------------------------------------------------------------------------------

tpu_shard_context = tpu_function.tpu_shard_context
# The module whose `cross_replica_sum` emulated shards replace.
tpu_ops_module = tpu_ops
# The mid-level API's optimizer base class.
MidLevelOptimizer = tpu_embedding_v2_utils._Optimizer
# TF's own mid-level classes, whatever `install()` bound to their public names.
TFTPUEmbedding = tpu_embedding_v2.TPUEmbedding
TFTPUEmbeddingV0 = tpu_embedding_v1.TPUEmbeddingV0
# The base of TF's mid-level `TPUEmbeddingV0` (whose constructor alone requires
# a `TPUStrategy`; tpu_fc's V0 runs TF's class without it) and of tpu_fc's
# `TPUEmbedding`: config checks, table names, variables as TF creates them.
TPUEmbeddingBase = tpu_embedding_base.TPUEmbeddingBase
# Feature paths as the mid-level API names them in its error texts ('a/b').
flatten_with_joined_string_paths = nest.flatten_with_joined_string_paths
# A structure's leaves at the places of a shallower one's (TPUEstimator's
# `input_partition_dims` against the features: a list there is one leaf).
flatten_up_to = nest.flatten_up_to
# TF's `TPUEmbedding`'s rules for output shapes, which tpu_fc's runs as its own
# methods: read from `build`'s input shapes or batch size, checked against the
# recorded ones (TF's texts), merged into them.
tpu_output_shapes_from_input_shapes = (
    tpu_embedding_v2.TPUEmbedding._get_output_shapes_from_input_shapes)
tpu_output_shapes_from_batch_size = (
    tpu_embedding_v2.TPUEmbedding._get_output_shapes_from_batch_size)
tpu_check_output_shapes = tpu_embedding_v2.TPUEmbedding._check_output_shapes
tpu_update_output_shapes = tpu_embedding_v2.TPUEmbedding._update_output_shapes
tpu_is_tensor_shape_match = tpu_embedding_v2.TPUEmbedding._is_tensor_shape_match
# What a TPU's sharded variable creator reads of a variable it makes (name,
# shape, dtype, initializer), raising TF's error where it cannot.
tpu_variable_info = tpu_embedding_v2.extract_variable_info


def forget_shared_table(creator, graph):
  """Drops a `SharedEmbeddingColumnCreator`'s cached table of `graph`, so the
  next column to ask for it creates it again."""
  creator._embedding_weights.pop(graph._graph_key, None)


def mid_level_feature_config(embedding):
  """The nest of `FeatureConfig`s a mid-level API object was made with (the
  tables' configs hold the optimizer each trains with)."""
  return embedding._feature_config


def mid_level_variables(embedding):
  """`{table name: {'parameters': table, slot name: slot}}` of a built
  mid-level API object (TF's or tpu_fc's), the slots a
  `slot_variable_creation_fn` made elsewhere (a Keras optimizer's) included:
  its checkpoint children lack those."""
  return embedding._variables


# Whether a SavedModel is being written (`tf.saved_model.save` traces the
# functions it exports within): tpu_fc's Keras layers then export their CPU
# lookup, as TF's serving classes do.
in_saved_model_export = save_context.in_save_context


def compiling_with_xla():
  """Whether the graph being built is compiled by XLA (a `tf.function` with
  `jit_compile=True`, or within one): ops without an XLA kernel (string
  formatting) must stay out."""
  return control_flow_util.GraphOrParentsInXlaContext(
      tf.compat.v1.get_default_graph())


_PLAIN_VARIABLE_ARGS = ('initial_value', 'trainable', 'validate_shape',
                        'caching_device', 'name', 'dtype', 'constraint',
                        'synchronization', 'aggregation', 'shape')


def plain_variable(strategy, **kwargs):
  """A variable made from a variable creator's `kwargs` without the creators
  below (a strategy's, which would make one copy per replica), which
  `strategy` still counts as created in its scope (Keras checks it)."""
  return resource_variable_ops.ResourceVariable(
      distribute_strategy=strategy,
      **{name: value for name, value in kwargs.items()
         if name in _PLAIN_VARIABLE_ARGS})
