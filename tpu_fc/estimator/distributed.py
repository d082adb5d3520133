"""Between-graph replication on TF's distributed runtime: ps tasks and workers.

What Estimator did with `TF_CONFIG`, for the driver: every task starts one
`tf.distribute.Server`; ps tasks join it; the chief and the workers each build
the whole graph with `replica_device_setter`, so variables live on the ps tasks
and ops on the task itself, and train in a `MonitoredTrainingSession` on their
own server.  tpu_fc adds:

* **Parts on their ps**: part N of a partitioned variable (and of its slots,
  partitioned alike) on ps N, so each ps applies the updates of its own rows.
* **Synchronous training** (`RunConfig(sync_replicas=True)`):
  `SyncReplicasOptimizer` semantics for the model optimizer and for the
  updates a layer above applies itself (see `SyncReplicas`).
"""
import contextlib
import threading
import time

from tpu_fc import _tf_internals as internals
from tpu_fc._tf import tf
from tpu_fc.estimator import run_config

_servers = {}
_servers_lock = threading.Lock()


def is_parameter_server_cluster(config):
  """Whether this task trains in a ps cluster (an evaluator does not)."""
  return config.num_ps_replicas > 0


def server(config):
  """This task's server, created and started as Estimator's `train_and_evaluate`
  did; one per task and process.

  A TF server cannot be stopped and holds its port for the life of the
  process, so `train_and_evaluate`, `Estimator.train` and later runs of a task
  share its first one (tasks run as threads of one process each have theirs).
  `server_lib.Server` is looked up on each call, as TF's training looks it up:
  a replacement of it (TF's tests patch it) makes servers of its own.
  """
  server_class = internals.server_lib.Server
  key = (server_class, config.task_type, config.task_id,
         repr(sorted(config.cluster_spec.as_dict().items())))
  with _servers_lock:
    if key not in _servers:
      tf.compat.v1.logging.info(
          'Starting the TensorFlow server of %s task %d.', config.task_type,
          config.task_id)
      _servers[key] = server_class(
          config.cluster_spec, job_name=config.task_type,
          task_index=config.task_id, config=_server_config(config),
          start=False, protocol=config.protocol)
      _servers[key].start()
    return _servers[key]


def _server_config(config):
  """The server's own session config, as TF's: of `config.session_config`
  only the GPU options, which the server creates its devices with."""
  if config.session_config is None:
    return tf.compat.v1.ConfigProto(log_device_placement=False)
  return tf.compat.v1.ConfigProto(
      log_device_placement=False,
      gpu_options=config.session_config.gpu_options)


def join(config):
  """Serves this ps task's variables until the process is stopped."""
  tf.compat.v1.logging.info('ps task %d serves variables at %s.',
                            config.task_id, server(config).target)
  server(config).join()


def wait_for_chief(config, poll_secs=0.5):
  """On a worker, returns once the chief has initialized (or restored) the model.

  `MonitoredTrainingSession` would check every 30 seconds; polling here lets a
  worker start (or rejoin) as soon as the variables are ready.  Gives up at
  `session_creation_timeout_secs`, leaving the error to the session.
  """
  uninitialized = tf.compat.v1.report_uninitialized_variables(
      tf.compat.v1.global_variables())
  deadline = time.monotonic() + config.session_creation_timeout_secs
  with tf.compat.v1.Session(config.master, config=config.session_config) as session:
    while session.run(uninitialized).size and time.monotonic() < deadline:
      time.sleep(poll_secs)


class TaskSessionHook(tf.compat.v1.train.SessionRunHook):
  """Readies a cluster task's session in its `begin`, before the session is
  created: starts the task's server (`server`), which the session runs
  through, and, for a worker's training, waits for the chief
  (`wait_for_chief`; last among the hooks, after their `begin` added any
  variables).

  TF's Estimator connects to the cluster only in the session it creates
  (`training.MonitoredTrainingSession`, ...); so does tpu_fc's: whatever
  creates the session decides whether the cluster is reached.
  """

  def __init__(self, config, waits_for_chief):
    self._config = config
    self._waits_for_chief = waits_for_chief

  def begin(self):
    server(self._config)
    if self._waits_for_chief:
      wait_for_chief(self._config)


class _PartsOnTheirPs:
  """ps strategy: part N of a partitioned variable on ps N, others round robin.

  So a variable's rows and their optimizer state (slots partitioned alike)
  always share a ps task.
  """

  def __init__(self, num_tasks):
    self._num_tasks = num_tasks
    self._next_task = 0

  def __call__(self, op):
    part = internals.PART_NAME.search(op.name)
    if part:
      return int(part.group(1)) % self._num_tasks
    task = self._next_task
    self._next_task = (self._next_task + 1) % self._num_tasks
    return task


def device_fn(config):
  """`config.device_fn`, else Estimator's replica device setter (None if local)."""
  if config.device_fn is not None:
    return config.device_fn
  if not is_parameter_server_cluster(config):
    return None
  return tf.compat.v1.train.replica_device_setter(
      ps_tasks=config.num_ps_replicas,
      worker_device='/job:{}/task:{}'.format(config.task_type, config.task_id),
      merge_devices=True, cluster=config.cluster_spec,
      ps_strategy=_PartsOnTheirPs(config.num_ps_replicas))


def input_context(config):
  """The `tf.distribute.InputContext` of this task's input pipeline."""
  return tf.distribute.InputContext(
      num_input_pipelines=config.num_worker_replicas,
      input_pipeline_id=config.global_id_in_cluster,
      num_replicas_in_sync=(config.num_worker_replicas
                            if run_config.synchronous(config) else 1))


class SyncReplicas:
  """`SyncReplicasOptimizer` semantics for a whole training step.

  While the model is built, every `tf.compat.v1.train.Optimizer.apply_gradients`
  and every update a layer above routes through `aggregate_rows` hands its
  gradients here instead of applying them.  Each task's train op then adds its
  gradients, tagged with the step they were computed at, to accumulators on the
  ps holding the variable (stale ones are dropped), and waits for a token.  On
  the chief, a thread runs the sync op: take the average of `replicas`
  gradients from every accumulator, apply them with the original updates, then
  increment the global step (which those updates may read first) and put one
  token in each replica's own queue.

  Two departures from TF's `SyncReplicasOptimizer`, so that a step equals a
  single-host step over the union of the replicas' batches: tokens are per
  replica (with TF's one shared queue a fast replica can take a slow one's
  token and give the step a second gradient of its own), and sparse gradients
  are summed and divided by `replicas` (TF's sparse accumulators average each
  row over the replicas that touched it).
  """

  def __init__(self, replicas, replica):
    self._replicas = replicas
    self._replica = replica
    self._updates = {}  # variables -> (accumulate op, update op); last wins
    self._increments_global_step = False
    self._accumulators = []
    self._local_step = None

  def _create_local_step(self):
    """The step this task's gradients are computed at; a local variable on the task."""
    with tf.compat.v1.colocate_with(tf.no_op(name='sync_rep_local_anchor')):
      self._local_step = tf.compat.v1.Variable(
          0, dtype=tf.int64, trainable=False, use_resource=True,
          name='sync_rep_local_step',
          collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])

  def _aggregated(self, gradient, variable):
    """(accumulate op, average gradient): the gradient through `variable`'s accumulator."""
    shared_name = variable.op.name + '/grad_accum'
    sparse = isinstance(gradient, tf.IndexedSlices)
    # The accumulator and what the chief takes from it are on the chief's side.
    with tf.device(variable.device):
      if sparse:
        with _chief_side():
          accumulator = tf.compat.v1.SparseConditionalAccumulator(
              gradient.dtype, shape=variable.shape, shared_name=shared_name,
              reduction_type='SUM')
          taken = accumulator.take_indexed_slices_grad(self._replicas)
          # A row may come back more than once (after the first take): summed.
          rows, positions = tf.unique(taken.indices, out_idx=tf.int64)
          total = tf.math.unsorted_segment_sum(taken.values, positions,
                                               tf.size(rows, out_type=tf.int64))
          average = tf.IndexedSlices(
              total / tf.cast(self._replicas, total.dtype), rows,
              taken.dense_shape)
        accumulate = accumulator.apply_indexed_slices_grad(
            tf.IndexedSlices(gradient.values,
                             tf.cast(gradient.indices, tf.int64),
                             tf.constant(variable.shape.as_list(), tf.int64)),
            local_step=self._local_step)
      else:
        with _chief_side():
          accumulator = tf.compat.v1.ConditionalAccumulator(
              gradient.dtype, shape=variable.shape, shared_name=shared_name)
          average = accumulator.take_grad(self._replicas)
        accumulate = accumulator.apply_grad(gradient,
                                            local_step=self._local_step)
    self._accumulators.append((accumulator, variable.device))
    return accumulate, average

  def aggregate_rows(self, variable, gradient, apply):
    """`apply(average gradient)` of a variable updated outside an optimizer
    (the TPU layer's tables), through the aggregation; runs before the
    optimizers' updates on the chief."""
    accumulate, average = self._aggregated(gradient, variable)
    with _chief_side():
      self._updates[('rows', variable.op.name)] = (accumulate, apply(average))
    return accumulate

  def _apply_gradients(self, original, optimizer, grads_and_vars,
                       global_step=None, name=None):
    """`Optimizer.apply_gradients` while building: accumulate, update on the chief."""
    pairs = [(g, v) for g, v in grads_and_vars if g is not None]
    accumulates, averages = [], []
    for gradient, variable in pairs:
      accumulate, average = self._aggregated(gradient, variable)
      accumulates.append(accumulate)
      averages.append((average, variable))
    with _chief_side():
      update = original(optimizer, averages, None, name)
    self._increments_global_step |= global_step is not None
    key = ('model', tuple(v.op.name for _, v in pairs))
    self._updates[key] = (tf.group(*accumulates), update)
    return self._updates[key][0]

  @contextlib.contextmanager
  def building(self):
    """Routes the model optimizers' updates here while the model is built.

    TF's one hook into every TF1 optimizer's `apply_gradients` is a current
    `tf.distribute` strategy (its `merge_call`), but under any non-default
    strategy a Keras `Loss` object with its default reduction raises: so
    `Optimizer.apply_gradients` is replaced while the model_fn is built
    (`test_sync_chief_alone_equals_one_host_with_batch_norm` holds both).
    """
    original = internals.Optimizer.apply_gradients

    def apply_gradients(optimizer, grads_and_vars, global_step=None,
                        name=None):
      return self._apply_gradients(original, optimizer, list(grads_and_vars),
                                   global_step, name)

    self._create_local_step()  # before any model variable: shards replay those
    with internals.replaced(internals.Optimizer, 'apply_gradients',
                            apply_gradients):
      yield

  def train_op(self, train_op, global_step, is_chief):
    """The task's train op, and the hook that runs the chief's side; call after building."""
    if not any(key[0] == 'model' for key in self._updates):
      raise ValueError(
          'sync_replicas needs the model_fn to train with a '
          'tf.compat.v1.train.Optimizer (its apply_gradients is what is '
          'synchronized); none was called.')
    accumulates = [accumulate for accumulate, _ in self._updates.values()]
    rows = [u for key, (_, u) in self._updates.items() if key[0] == 'rows']
    model = [u for key, (_, u) in self._updates.items() if key[0] == 'model']
    graph = tf.compat.v1.get_default_graph()
    with tf.device(global_step.device), graph.name_scope(None):
      tokens = [tf.queue.FIFOQueue(-1, tf.int64, shapes=(),
                                   name='sync_token_q_%d' % replica,
                                   shared_name='sync_token_q_%d' % replica)
                for replica in range(self._replicas)]
      with tf.control_dependencies([train_op] + accumulates):
        token = tokens[self._replica].dequeue()
      worker_train_op = self._local_step.assign(token).op
      with tf.control_dependencies(rows):
        update = tf.group(*model)
      if self._increments_global_step:
        with tf.control_dependencies([update]):
          update = global_step.assign_add(1).op
      with tf.control_dependencies([update]):
        step = global_step.read_value()
        sync_op = tf.group(*[queue.enqueue(step) for queue in tokens])
    local_init = self._local_step.assign(global_step.read_value()).op
    chief_init = tf.group(
        [local_init] + [_set_global_step(accumulator, device, global_step)
                        for accumulator, device in self._accumulators])
    return worker_train_op, _SyncReplicasHook(sync_op, local_init, chief_init,
                                              is_chief)


def _chief_side():
  """Where accumulators and the chief's updates are built: free of control deps.

  (A row update is built after the model's train op, under its control;
  the sync op must not run a task's step.)
  """
  return tf.control_dependencies(None)


def _set_global_step(accumulator, device, global_step):
  with tf.device(device):
    return accumulator.set_global_step(global_step.read_value())


class _SyncReplicasHook(tf.compat.v1.train.SessionRunHook):
  """Starts each task's local step at the global step; on the chief, runs the sync op.

  The chief's sync op runs in a thread for the life of the session; the
  session's close cancels its last (blocked) run.
  """

  def __init__(self, sync_op, local_init, chief_init, is_chief):
    self._sync_op = sync_op
    self._local_init = local_init
    self._chief_init = chief_init
    self._is_chief = is_chief
    self._stop = threading.Event()

  def after_create_session(self, session, coord):
    del coord
    if not self._is_chief:
      session.run(self._local_init)
      return
    session.run(self._chief_init)
    self._stop.clear()
    threading.Thread(target=self._run_sync_op, args=(session,),
                     daemon=True).start()

  def _run_sync_op(self, session):
    while not self._stop.is_set():
      try:
        session.run(self._sync_op)
      except (tf.errors.CancelledError, tf.errors.AbortedError,
              tf.errors.UnavailableError, RuntimeError) as error:
        if not self._stop.is_set():
          tf.compat.v1.logging.warning('Synchronous update stopped: %s', error)
        return

  def end(self, session):
    del session
    self._stop.set()
