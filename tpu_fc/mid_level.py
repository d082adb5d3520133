"""`tf.tpu.experimental.embedding.TPUEmbedding` and `TPUEmbeddingV0` for
migrated TF2 code, without a TPU.

TF's own class trains only under a `TPUStrategy`; outside one it only serves.
This one keeps its constructor, methods, error texts and checkpoint (a child
`<table>` per table and `<table>/<slot>` per slot, so a checkpoint restores into
TF's class and back), and trains on the host with the engine of the emulated
TPUEstimator: the same lookup, the same TPU update rules (`tpu_fc.reference`),
and with `num_cores` emulated TPU cores the same rule for several cores.  A
migrated model can so be checked step by step against its legacy form on a
laptop.

One step is `enqueue` -> `dequeue` -> `apply_gradients`, eagerly or within one
`tf.function`, as on a TPU; the gradients are d(loss)/d(activations).

`TPUEmbeddingV0` (tensor-core tables, trained by the model's own optimizer) is
TF's own class, allowed outside a `TPUStrategy`: its lookup already runs on a
CPU, and its tables get row (`IndexedSlices`) gradients.
"""
from __future__ import annotations

import contextlib
import functools
import threading
import types
from typing import Any

from tpu_fc import _tf_internals as internals
from tpu_fc import spec as spec_lib
from tpu_fc._tf import tf
from tpu_fc.lookup import host_engine
from tpu_fc.lookup import inputs
from tpu_fc.lookup import replicas


def _as_a_tpu_creates_them(next_creator, **kwargs):
  """A variable creator refusing, with TF's error, a variable a TPU's sharded
  variable creator could not make (its initial value must be a partial of its
  initializer with the shape, or a callable given with the shape: TF's
  `extract_variable_info`), e.g. one a `slot_variable_creation_fn` made
  from a tensor."""
  internals.tpu_variable_info(kwargs)
  return next_creator(**kwargs)


# The engine builds its ops with explicit tf.cond: AutoGraph converting its
# ~130 functions made a traced step 10x slower to build (7 s vs 0.6 s).
_not_autographed = tf.autograph.experimental.do_not_convert


class TPUEmbedding(internals.TPUEmbeddingBase):
  """TF's `tf.tpu.experimental.embedding.TPUEmbedding`, trained on the host.

  TF's base class of its mid-level APIs checks the configs, names the tables
  and creates the variables as TF's own `TPUEmbedding` does (restored on
  creation from a checkpoint read before `build`).

  Output shapes are per core, as TF's per replica: a `FeatureConfig`'s, else
  those `build` is given; a feature with neither takes each enqueue's (TF's
  TPU would fix them at the first enqueue and refuse another batch size
  later; tpu_fc lets it vary, e.g. for an evaluation batch).

  A step is `enqueue` -> `dequeue` -> `apply_gradients`, eagerly or in one
  `tf.function` (XLA-compiled too), under the default strategy or
  `OneDeviceStrategy`; or in `strategy.run` of `MirroredStrategy` or
  `MultiWorkerMirroredStrategy`, each replica a TPU core of one TPU: one
  copy of each table, one lookup and one update a step for all of them
  (`tpu_fc.lookup.replicas`).  Its checkpoint
  (`tf.train.Checkpoint(embedding=...)`) is TF's class's.

  Args:
    feature_config: a nest (dict, list, ...) of
      `tf.tpu.experimental.embedding.FeatureConfig`: the structure of the
      inputs `enqueue` takes and of the activations `dequeue` gives; tables
      without a name are named `table_<i>`.
    optimizer: the `tf.tpu.experimental.embedding` optimizer (SGD, Adagrad,
      AdagradMomentum, Adam, FTRL) of the tables without their own; None:
      those tables cannot train (`apply_gradients` refuses).
    pipeline_execution_with_tensor_core: as on a TPU, step N+1 looks up
      before step N's update lands (it is applied right after that lookup); a
      checkpoint save applies a parked update first.
    num_cores: the TPU cores to emulate (tpu_fc's own; per replica under a
      strategy of several): the batch is split over them as `TPUStrategy`
      would; their gradients of a row are summed into one update, or, with
      the optimizer's `use_gradient_accumulation=False`, applied one core
      after another, the core holding the id first.

  Raises:
    ValueError: an optimizer that is no mid-level one, two tables of one
      name, a `FeatureConfig.output_shape` without a batch dimension or
      without an example, `num_cores` not a positive int, or a strategy of
      several replicas other than `MirroredStrategy` and
      `MultiWorkerMirroredStrategy` (naming it).
    NotImplementedError: a table the host engine cannot train: a combiner
      other than 'mean', 'sum' or 'sqrtn' (e.g. TF 2.21's `CustomCombiner`),
      or an optimizer other than those five.
  """

  # TF's own rules for output shapes (`build` and `enqueue`): read from input
  # shapes or a batch size, checked against the recorded ones, merged in.
  _get_output_shapes_from_input_shapes = (
      internals.tpu_output_shapes_from_input_shapes)
  _get_output_shapes_from_batch_size = (
      internals.tpu_output_shapes_from_batch_size)
  _check_output_shapes = internals.tpu_check_output_shapes
  _update_output_shapes = internals.tpu_update_output_shapes
  _is_tensor_shape_match = internals.tpu_is_tensor_shape_match
  # Whether dense ids take weights: TF's TPUEmbedding refuses them, a
  # SparseCore's enqueue applies them (`tpu_fc.keras_rs`).
  _weighs_dense_ids = False

  def __init__(self, feature_config: Any, optimizer: Any,
               pipeline_execution_with_tensor_core: bool = False,
               num_cores: int = 1):
    # A single un-nested config has the empty path: its name names it.
    named = [(path or config.name or 'feature', config) for path, config in
             internals.flatten_with_joined_string_paths(feature_config)]
    inputs.check_output_shape_configs(named)
    # The config's structure in plain containers, for dequeue's result: an
    # attribute holds it wrapped (TF's tracking), and on TF 2.15 a tf.function
    # cannot return such a wrapper (wrapt's proxy breaks its type tracing).
    self._like_config = functools.partial(
        tf.nest.pack_sequence_as, tf.nest.map_structure(lambda _: 0,
                                                        feature_config))
    super().__init__(feature_config, optimizer)
    self._pipelined = pipeline_execution_with_tensor_core
    self._named = dict(named)
    self._paths = [path for path, _ in named]
    if not isinstance(num_cores, int) or num_cores < 1:
      raise ValueError('num_cores must be a positive int, got {!r}.'.format(
          num_cores))
    self._num_cores = num_cores
    # What the engine cannot do is refused now (a combiner, an optimizer), not
    # at the first enqueue.
    self._layout = spec_lib.layout_of_mid_level(self._named)
    self._engine = None
    self._first_sequence_lengths = {}  # what the first enqueue made of the
    # output shapes (`inputs.mid_level`)
    # What this thread's (a replica's) last enqueue looked up, for dequeue and
    # apply_gradients (a `_Step`, or its `_ReplicaStep`).
    self._last = threading.local()
    replicas.check_strategy(tf.distribute.get_strategy())

  # Variables -------------------------------------------------------------------

  def build(self, per_replica_input_shapes: Any = None,
            per_replica_batch_size: int | None = None) -> None:
    """TF's `build`: records the output shapes `per_replica_input_shapes` (per
    core here; or the deprecated `per_replica_batch_size`) give where no
    `FeatureConfig.output_shape` sets them (TF's rules and errors), then
    creates the tables and slots (TF's names) as on a TPU.  As TF's TPU
    class, it needs every feature's output shape; the first `enqueue` (or
    `embedding_tables`) builds without them, each enqueue giving its own.

    Variables restored from a checkpoint read before `build` take their
    values on creation.  A second call does nothing.

    Args:
      per_replica_input_shapes: a nest like `feature_config` of each input's
        shape on one core (`tf.TensorShape`s, as TF takes them); an int is
        taken as the per-core batch size (deprecated, logged); None: the
        shapes come from `FeatureConfig.output_shape`.
      per_replica_batch_size: the per-core batch size, when
        `per_replica_input_shapes` is None (deprecated, logged).

    Raises:
      ValueError: a structure other than `feature_config`'s, shapes that do
        not fit a feature's config (TF's rules), or a feature whose output
        shape is not fully defined (TF's TPU error, naming it); a
        `slot_variable_creation_fn` making variables a TPU could not create
        (TF's error).
    """
    self._build(per_replica_input_shapes, per_replica_batch_size,
                every_shape_known=True)

  def _build(self, per_replica_input_shapes, per_replica_batch_size,
             every_shape_known):
    if self._built:
      return
    self._record_output_shapes(per_replica_input_shapes,
                               per_replica_batch_size)
    inputs.check_output_shapes_defined(self._paths, self._output_shapes,
                                       every_shape_known)
    strategy = tf.distribute.get_strategy()
    with self._one_copy_each(strategy), tf.variable_creator_scope(
        _as_a_tpu_creates_them):
      super().build()
    replicas.same_on_every_machine(strategy, [
        variable for variables in self._variables.values()
        for variable in variables.values()])
    self._engine = host_engine.HostEmbeddingEngine(
        self._layout, optimization_parameters=None,
        tables={name: v['parameters'] for name, v in self._variables.items()},
        slots={name: {slot: var for slot, var in v.items()
                      if slot != 'parameters'}
               for name, v in self._variables.items()})

  def _record_output_shapes(self, per_replica_input_shapes,
                            per_replica_batch_size):
    """TF's `_get_and_update_output_shapes_from_input`, but a feature no
    shape was given for keeps none (its enqueues' inputs give it)."""
    incoming = None
    if per_replica_batch_size and per_replica_input_shapes is None:
      tf.compat.v1.logging.warning(
          'per_replica_batch_size argument will be deprecated, please specify '
          'all the input shapes using per_replica_input_shapes argument.')
      incoming = self._get_output_shapes_from_batch_size(per_replica_batch_size)
    if isinstance(per_replica_input_shapes, int):
      tf.compat.v1.logging.warning(
          'Passing batch size to per_replica_input_shapes argument will be '
          'deprecated, please specify all the input shapes using '
          'per_replica_input_shapes argument.')
      incoming = self._get_output_shapes_from_batch_size(
          per_replica_input_shapes)
    elif per_replica_input_shapes is not None:
      tf.nest.assert_same_structure(tf.nest.flatten(per_replica_input_shapes),
                                    tf.nest.flatten(self._feature_config))
      incoming = self._get_output_shapes_from_input_shapes(
          tf.nest.flatten(per_replica_input_shapes))
    if incoming is not None:
      self._check_output_shapes(incoming)
      self._update_output_shapes(incoming)

  def _one_copy_each(self, strategy):
    """Under a strategy of several replicas: one variable per table and slot
    (`replicas.one_copy_creator`), its slots made here even where the
    optimizer has a `slot_variable_creation_fn` (a Keras optimizer's, which
    would make one per replica)."""
    scope = contextlib.ExitStack()
    if strategy.num_replicas_in_sync > 1:
      scope.enter_context(tf.variable_creator_scope(
          replicas.one_copy_creator(strategy)))
      for optimizer in {id(table.optimizer): table.optimizer
                        for table in self._table_config}.values():
        if optimizer.slot_variable_creation_fn is not None:
          tf.compat.v1.logging.warning(
              'Under %s the tables\' slots are tpu_fc\'s, one each, not the '
              'slot_variable_creation_fn\'s (a Keras optimizer\'s would be '
              'one per replica).', type(strategy).__name__)
          scope.enter_context(internals.replaced(
              optimizer, 'slot_variable_creation_fn', None))
    return scope

  def _maybe_build(self):
    if self._built:
      return
    context = replicas.replica_context()
    if context is not None:  # once, for every replica
      context.merge_call(lambda _: self._maybe_build())
      return
    with tf.init_scope():  # variables outside any tf.function being traced
      self._build(None, None, every_shape_known=False)

  def _create_variables_and_slots(self):
    return {table.name: self._create_variables(table, trainable=True)
            for table in self._table_config}

  @property
  def embedding_tables(self) -> dict[Any, tf.Variable]:
    """`{TableConfig: table variable}`, as TF's class gives them on CPU.

    Builds the object first if needed.  Read, assign or checkpoint them; an
    update through them bypasses the optimizer's slots.
    """
    self._maybe_build()
    return {table: self._variables[table.name]['parameters']
            for table in self._table_config}

  # One step --------------------------------------------------------------------

  @_not_autographed
  def enqueue(self, features: Any, weights: Any = None, training: bool = True,
              name: str | None = None, device: str | None = None) -> None:
    """Looks up `features` (the structure of the feature config).

    Builds the object first if needed.  The lookup is TPUEstimator's emulated
    engine's: negative ids are padding.

    Under `MirroredStrategy` or `MultiWorkerMirroredStrategy` each replica
    is a TPU core (`num_cores` each): called in `strategy.run`, a replica's
    features are its slice of the global batch; the replicas' inputs are
    gathered, looked up once, and each replica dequeues its slice.

    Args:
      features: a nest like `feature_config` of each feature's ids for the
        whole batch (every emulated core's examples in core order): a dense
        `[batch]` or `[batch, 1]` tensor (one id per example), a
        `SparseTensor` or `RaggedTensor` `[batch, ids]`, a rank-3
        `SparseTensor` `[batch, n, ids]` or dense `[batch, n, 1]` or
        `[batch, n]` (one id per position, looked up into `[batch, n, dim]`;
        `[batch, n]` against an output shape `[batch]`: n ids per example,
        combined), or one example without a batch dimension (a rank-0 id, a
        rank-1 SparseTensor; one replica only).
      weights: None, or a nest like `features` of the ids' weights (None
        entries allowed), for sparse and ragged inputs only.
      training: False: a lookup only, which `apply_gradients` refuses to
        follow.
      name, device: TF's; not used (one host).

    Raises:
      ValueError: a structure other than `feature_config`'s, weights for a
        dense or sequence input or of another type than their input, a dense
        input to a sequence feature, an input of another type, rank or dtype
        than ids (integers), or an input that does not fit the feature's
        recorded output shape; a strategy other than those two with several
        replicas.
      tf.errors.InvalidArgumentError: when the step runs, an id at or above
        its table's vocabulary size, or a batch that does not split into
        the cores; the message names the feature.
    """
    del name, device  # one host
    context = replicas.replica_context()
    self._maybe_build()
    tf.nest.assert_same_structure(self._feature_config, features)
    flat_inputs = dict(zip(self._paths, tf.nest.flatten(features)))
    flat_weights = dict.fromkeys(self._paths)
    if weights is not None:
      tf.nest.assert_same_structure(self._feature_config, weights)
      flat_weights = dict(zip(self._paths, tf.nest.flatten(weights)))
    if context is None:
      self._last.step = self._look_up(flat_inputs, flat_weights, training,
                                      self._num_cores)
      return
    every_input, every_weight, slices = replicas.gather_inputs(
        context, self._paths, flat_inputs, flat_weights)
    step = context.merge_call(lambda _: self._look_up(
        every_input, every_weight, training,
        self._num_cores * context.num_replicas_in_sync))
    self._last.step = _ReplicaStep(step, slices, context)

  def _look_up(self, flat_inputs, flat_weights, training, num_cores):
    """The `_Step` of one lookup of the inputs by feature path on
    `num_cores` cores."""
    enqueued, activations = inputs.mid_level(
        self._layout, self._named, flat_inputs, flat_weights,
        dict(zip(self._paths, self._output_shapes)), num_cores,
        self._first_sequence_lengths, self._check_output_shapes,
        dense_weights=self._weighs_dense_ids)
    lookup_step, lookups = self._engine.activations(enqueued, num_cores)
    return _Step(lookup_step, lookups,
                 {path: activations[path](lookups[path])
                  for path in self._paths}, training, _graph())

  @_not_autographed
  def dequeue(self, name: str | None = None) -> Any:
    """The activations of the last `enqueue` (the feature config's structure).

    Args:
      name: TF's; not used.

    Returns:
      A nest like `feature_config` of float32 activations in each feature's
      output shape (per core, the cores' one after another): `[batch, dim]`,
      `[batch, max_sequence_length, dim]` for a sequence feature, `[batch, n,
      dim]` for a high-dimensional input.  The tape sees them, never the
      tables.

    Raises:
      RuntimeError: not built, no `enqueue` before, or an `enqueue` in
        another graph (eagerly vs. in a `tf.function`).
    """
    del name
    step = self._current_step('dequeue')
    return self._like_config([step.activations[path] for path in self._paths])

  @_not_autographed
  def apply_gradients(self, gradients: Any, name: str | None = None) -> Any:
    """Applies d(loss)/d(activations) to the tables with the TPU update rules.

    TF's checks first, in TF's order (built, the structure, each gradient a
    tensor); then those of the step it applies to.

    Args:
      gradients: a nest like `feature_config` of the gradients of the loss
        by the activations `dequeue` gave (their shapes); a None entry sends
        a zero gradient (logged: not right for every optimizer, e.g. Adam).
      name: TF's; not used.

    Returns:
      The update op (in a graph); eagerly, the update is applied.

    Raises:
      RuntimeError: not built, no `enqueue` before (or one in another graph),
        an `enqueue(training=False)`, a second call for one `enqueue`, or a
        table without an optimizer.
      ValueError: a structure other than `feature_config`'s, a gradient that
        is not a tensor, or one of another shape than its activation.
    """
    del name
    return self._apply_gradients(gradients, step=None)

  @_not_autographed
  def _apply_gradients(self, gradients, step):
    """`apply_gradients` to the lookup `step` (None: the last `enqueue`'s)."""
    if not self._built:
      self._current_step('apply_gradients')  # (raises TF's error)
    tf.nest.assert_same_structure(self._feature_config, gradients)
    flat_gradients = tf.nest.flatten(gradients)
    for path, gradient in zip(self._paths, flat_gradients):
      if gradient is not None and not isinstance(gradient, tf.Tensor):
        raise ValueError('found non-tensor type: {} at path {}.'.format(
            type(gradient), path))
    step = self._current_step('apply_gradients', step)
    if not step.training:
      raise RuntimeError('apply_gradients called after enqueue(training=False):'
                         ' enqueue the step with training=True to train it.')
    if step.applied:
      raise RuntimeError(
          'apply_gradients called twice after one enqueue: a TPU takes one '
          'set of gradients per enqueued batch (a second would update the '
          'tables again). Sum the gradients into one call, or enqueue the '
          'next batch first.')
    if any(table.optimizer is None for table in self._table_config):
      raise RuntimeError('apply_gradients needs an optimizer; this TPUEmbedding'
                         ' was created with optimizer=None.')
    given = []
    for path, gradient in zip(self._paths, flat_gradients):
      expected = step.activations[path].shape
      if gradient is None:
        tf.compat.v1.logging.warning(
            'No gradient passed for feature %s, sending zero gradient. This may'
            ' not be correct behavior for certain optimizers like Adam.', path)
        gradient = tf.zeros_like(step.activations[path])
      elif not gradient.shape.is_compatible_with(expected):
        raise ValueError('Found gradient of shape {} at path {}. Expected '
                         'shape {}.'.format(gradient.shape, path, expected))
      given.append(tf.cast(gradient, tf.float32))
    if isinstance(step, _ReplicaStep):  # every replica's, applied once
      every = replicas.gather(step.context, given)
      return step.context.merge_call(
          lambda _: self._apply_to(step.whole, every))
    return self._apply_to(step, given)

  def _apply_to(self, step, gradients):
    """The update of the `_Step` from its activations' gradients (by path)."""
    step.applied = True
    return self._engine.apply_gradients(
        step.lookup_step,
        {path: tf.reshape(gradient, tf.shape(step.lookups[path]))
         for path, gradient in zip(self._paths, gradients)},
        pipelined=self._pipelined)

  def _trackable_children(self, *args, **kwargs):
    """The tables and slots; a checkpoint first gets the parked update of
    pipelined execution (on a TPU it is in flight, not lost)."""
    # Every time: a traced step parks an update on each call, unseen here.
    if self._pipelined and self._engine is not None and tf.executing_eagerly():
      self._engine.flush_op()  # (applies what is parked, if anything)
    return super()._trackable_children(*args, **kwargs)

  def _current_step(self, method, step=None):
    """`step` (None: the last `enqueue`'s), if `method` may use it here."""
    if not self._built:
      raise RuntimeError(
          '{} called on unbuilt TPUEmbedding object. Please either call '
          'enqueue first or manually call the build method.'.format(method))
    step = step or getattr(self._last, 'step', None)
    if step is None:
      raise RuntimeError('{} called before enqueue: enqueue the step\'s '
                         'features first.'.format(method))
    if step.graph is not _graph():
      raise RuntimeError(
          '{} must run where enqueue ran (both eagerly, or in one '
          'tf.function): tpu_fc looks up on the host, with no TPU queue '
          'between functions.'.format(method))
    return step

  @_not_autographed
  def _lookup_for_layer(self, features, weights, trap):
    """`enqueue` and `dequeue` of one call of a Keras layer, which may look up
    more than once a step: the activations, through a gradient trap on
    `trap` (the value of a trainable variable of the layer) whose gradient
    applies theirs to this lookup, as `apply_gradients` does, and is zero
    (TFRS's and keras-rs's TPU path)."""
    self.enqueue(features, weights, training=True)
    step = self._current_step('dequeue')
    activations = self.dequeue()

    @tf.custom_gradient
    def gradient_trap(trap):
      def gradient(*activation_gradients):
        self._apply_gradients(self._like_config(list(activation_gradients)),
                              step=step)
        return tf.zeros_like(trap)
      return tf.nest.flatten(activations), gradient

    return self._like_config(gradient_trap(trap))


class _Step:
  """What one enqueue looked up: the engine's `LookupStep`, and by feature
  path its lookups and the activations dequeue gives (in the features' output
  shapes)."""

  def __init__(self, lookup_step, lookups, activations, training, graph):
    self.lookup_step = lookup_step
    self.lookups = lookups
    self.activations = activations
    self.training = training
    self.graph = graph
    self.applied = False  # one apply_gradients per enqueue, as on a TPU


class _ReplicaStep:
  """One replica's view of a `_Step` of the whole batch (`whole`): its slice
  of each activation; its gradients go to `whole` through its replica
  `context`."""

  def __init__(self, whole, slices, context):
    self.whole = whole
    self.context = context
    self.activations = {path: slices[path].of(activation)
                        for path, activation in whole.activations.items()}

  def __getattr__(self, name):  # training, graph, applied: the whole's
    return getattr(self.whole, name)


def _graph():
  """The graph being built, or None when executing eagerly."""
  if tf.executing_eagerly():
    return None
  return tf.compat.v1.get_default_graph()


class TPUEmbeddingV0(internals.TFTPUEmbeddingV0):
  """TF's `tf.tpu.experimental.embedding.TPUEmbeddingV0`, outside a
  `TPUStrategy` too: `__call__` / `embedding_lookup(features, weights=None)`,
  `embedding_tables`, `build`, TF's checkpoint.

  The tensor-core form of a table: every method is TF's own.
  `embedding_lookup(features, weights=None)` (also `__call__`) takes a nest
  like `feature_config` of dense, sparse or ragged ids (weights for sparse
  and ragged ones only), builds the tables if needed, and returns the
  activations, gathered from the tables in the model's graph; the tables
  (`embedding_tables`: `{TableConfig: variable}`) are trained by the
  model's own optimizer with row (`IndexedSlices`) gradients, as a
  TPUEstimator's 'tpu_tensor_core' columns are.  The `optimizer` only
  decides the slot variables `build` creates beside the tables.

  Args:
    feature_config: a nest of `tf.tpu.experimental.embedding.FeatureConfig`.
    optimizer: a `tf.tpu.experimental.embedding` optimizer (for the tables'
      slots), or None.

  Raises:
    ValueError: TF's checks of the configs (an optimizer that is no
      mid-level one, two tables of one name); from `embedding_lookup`, TF's
      checks of the inputs (structure, type, weights).
  """

  def __init__(self, feature_config: Any, optimizer: Any):  # pylint: disable=super-init-not-called
    # TF's constructor minus its TPUStrategy check; the rest is TF's.
    internals.TPUEmbeddingBase.__init__(self, feature_config, optimizer)
    self._strategy = tf.distribute.get_strategy()
    self._built = False


def under_tpu_strategy():
  """Whether the current strategy is a `TPUStrategy` (TF's classes run there)."""
  return isinstance(tf.distribute.get_strategy(),
                    (tf.distribute.TPUStrategy,
                     tf.distribute.experimental.TPUStrategy))


class _OutsideTPUStrategy(type):
  """Metaclass of the names `install()` binds: TF's class under a
  `TPUStrategy`, tpu_fc's elsewhere; an instance of either is an instance.
  A class defined on such a name subclasses the one of where it is defined."""

  def __new__(mcs, name, bases, namespace, **kwargs):
    if 'tf_class' in namespace:  # a name `install()` binds
      return super().__new__(mcs, name, bases, namespace, **kwargs)
    bases = tuple(base._target() if isinstance(base, mcs) else base
                  for base in bases)
    return types.new_class(name, bases, kwargs,
                           lambda body: body.update(namespace))

  def _target(cls):
    return cls.tf_class if under_tpu_strategy() else cls.tpu_fc_class

  def __call__(cls, *args, **kwargs):
    return cls._target()(*args, **kwargs)

  def __getattr__(cls, name):  # class attributes, e.g. an unbound method
    return getattr(cls._target(), name)

  def __instancecheck__(cls, instance):
    return isinstance(instance, (cls.tf_class, cls.tpu_fc_class))

  def __subclasscheck__(cls, subclass):
    return issubclass(subclass, (cls.tf_class, cls.tpu_fc_class))


def installable_classes():
  """{public name: class} for `tf.tpu.experimental.embedding` (`install()`)."""
  return {
      tf_class.__name__: _OutsideTPUStrategy(tf_class.__name__, (), dict(
          tf_class=tf_class, tpu_fc_class=ours, __module__=__name__,
          __doc__='{} under a TPUStrategy, else tpu_fc.mid_level.{}.'.format(
              tf_class.__name__, ours.__name__)))
      for tf_class, ours in ((internals.TFTPUEmbedding, TPUEmbedding),
                             (internals.TFTPUEmbeddingV0, TPUEmbeddingV0))}
