"""The driver's Saver: legacy names, and restores across training modes.

A model trained with `use_tpu=False` keeps the model optimizer's slots next to each
table (`<table>/Adam`, `<table>/Adam_1`), the emulated TPU the embedding optimizer's
(`<table>/Adam/m`, `<table>/Adam/v`), and either may lack the other's.  So that a
checkpoint of one mode restores into the other, the Saver restores everything the
checkpoint has and starts the *optimizer state* it lacks from its initial values,
with a warning.  Any other missing variable (a table, a dense weight) is TF's
`NotFoundError`, naming every one (and any that changed shape); a variable whose
shape differs from the checkpoint's (a changed vocabulary size or dimension) is TF's
`InvalidArgumentError` (and a `ValueError`: `CheckpointShapeError`) naming them, and
a checkpoint that cannot be read is an error that names it.

With `CheckpointInputPipelineHook`, each checkpoint also holds the training input's
position (its iterator state), written by the same save as the weights, so a restart
resumes both from one consistent point.

A reader (evaluate, predict, export) reads the checkpoint it chose from a `held` copy
of its files, which a trainer's `keep_checkpoint_max` cannot delete; what it reports
names the original.
"""
import collections
import contextlib
import errno
import fcntl
import logging
import os
import shutil
import socket
import tempfile
import threading
import weakref

from tpu_fc import _tf_internals as internals
from tpu_fc._tf import tf

# Optimizer state that is not a slot of one variable (Adam's power accumulators).
_NON_SLOT_STATE = ('beta1_power', 'beta2_power')


def latest_checkpoint(directory):
  """`tf.train.latest_checkpoint(directory)`, refusing names outside it.

  The `checkpoint` state file names the checkpoints that are read, restored and
  pruned (`keep_checkpoint_max` deletes the oldest it names); a name outside
  `directory` (absolute, or through '..') would have the driver read or delete
  files there.  An explicit `checkpoint_path=` or warm start stays the user's
  choice.
  """
  state = tf.train.get_checkpoint_state(directory)
  if state is None:
    return None
  root = os.path.abspath(directory)
  for path in [state.model_checkpoint_path] + list(
      state.all_model_checkpoint_paths):
    full = os.path.normpath(os.path.join(root, path))
    if os.path.commonpath([root, full]) != root:
      raise ValueError(
          'The checkpoint state file {} names {}, outside {}: tpu_fc reads, '
          'restores and deletes checkpoints only inside the model_dir. Remove '
          'that name from the file (or the file), or pass the checkpoint '
          'explicitly (checkpoint_path=, warm start).'.format(
              os.path.join(directory, 'checkpoint'), full, directory))
  return tf.train.latest_checkpoint(directory)


def latest_global_step(directory):
  """The global step of `directory`'s latest checkpoint; 0 without one."""
  checkpoint = latest_checkpoint(directory)
  if not checkpoint:
    return 0
  reader = tf.compat.v1.train.NewCheckpointReader(checkpoint)
  if not reader.has_tensor(tf.compat.v1.GraphKeys.GLOBAL_STEP):
    return 0
  return reader.get_tensor(tf.compat.v1.GraphKeys.GLOBAL_STEP)


TRAINING_LOCK = '.tpu_fc_training.lock'


@contextlib.contextmanager
def training_lock(model_dir):
  """Holds `model_dir` for one training run; a second run fails at once.

  Two runs would overwrite each other's checkpoints (or trip on a shared temp
  folder).  An `flock` on `model_dir/.tpu_fc_training.lock`, which the OS
  releases when its process ends, however it ends: a killed run leaves no
  stale lock.  Local directories only (a `gs://` model_dir is not locked).
  """
  if '://' in model_dir:
    yield
    return
  with open(os.path.join(model_dir, TRAINING_LOCK), 'a+') as lock:
    try:
      fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      lock.seek(0)
      raise RuntimeError(
          'model_dir {} is being trained by another run ({}): two runs would '
          "overwrite each other's checkpoints. Wait for it to end, or train "
          'into another model_dir.'.format(
              model_dir, lock.read().strip() or 'unknown')) from None
    lock.truncate(0)
    lock.write('pid {} on {}'.format(os.getpid(), socket.gethostname()))
    lock.flush()
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


# The temporary directories of held checkpoints.
HELD_DIRECTORY_PREFIX = '.tpu_fc_reading-'
# {held copy's prefix: the checkpoint's own prefix}, while held.
_held_originals = {}
_held_lock = threading.Lock()


def original_path(path):
  """The checkpoint whose held copy `path` is; else `path` itself."""
  return _held_originals.get(path, path)


class _OriginalPathsInLogs(logging.Filter):
  """Names a held copy in TF's log records (a Saver's `Restoring parameters
  from ...`) by its original checkpoint."""

  def filter(self, record):
    if isinstance(record.args, tuple):
      record.args = tuple(original_path(arg) if isinstance(arg, str) else arg
                          for arg in record.args)
    return True


_ORIGINAL_PATHS_IN_LOGS = _OriginalPathsInLogs()


def _link_or_copy(source, destination):
  """A hard link, or a copy where links fail (across filesystems, gs://); a
  source deleted meanwhile raises FileNotFoundError or NotFoundError."""
  if '://' not in source:
    try:
      os.link(source, destination)
      return
    except OSError as error:
      if error.errno == errno.ENOENT:
        raise
  tf.io.gfile.copy(source, destination)


def _held_directory(prefix):
  """A new temporary directory beside checkpoint `prefix` (where hard links
  work), or in the system's temp dir where that cannot be written (gs://, a
  read-only directory)."""
  directory = os.path.dirname(prefix)
  if '://' not in directory:
    try:
      return tempfile.mkdtemp(prefix=HELD_DIRECTORY_PREFIX, dir=directory)
    except OSError:
      pass
  return tempfile.mkdtemp(prefix=HELD_DIRECTORY_PREFIX)


@contextlib.contextmanager
def held(prefix):
  """Checkpoint `prefix`, held while it is read.

  Yields the prefix of a copy of its index and data files, hard-linked
  (copied where links fail) into a temporary directory, which the block reads
  however a trainer prunes the checkpoint (`keep_checkpoint_max`); the
  directory is removed after the block.  Yields None if the checkpoint was
  (or was being) deleted before all its files were held.
  """
  directory = _held_directory(prefix)
  copy = os.path.join(directory, os.path.basename(prefix))
  try:
    files = tf.io.gfile.glob(prefix + '.data-*')
    try:
      for path in [prefix + '.index'] + files:
        _link_or_copy(path, copy + path[len(prefix):])
    except (FileNotFoundError, tf.errors.NotFoundError):
      files = []
    if not files:
      yield None
      return
    with _held_lock:
      if not _held_originals:
        tf.get_logger().addFilter(_ORIGINAL_PATHS_IN_LOGS)
      _held_originals[copy] = prefix
    try:
      yield copy
    finally:
      with _held_lock:
        del _held_originals[copy]
        if not _held_originals:
          tf.get_logger().removeFilter(_ORIGINAL_PATHS_IN_LOGS)
  finally:
    shutil.rmtree(directory, ignore_errors=True)


def _is_optimizer_state(name, names):
  base = name.rsplit('/', 1)[-1].split('_')[0:2]
  if '_'.join(base) in _NON_SLOT_STATE:
    return True
  return any(name.startswith(other + '/') for other in names if other != name)


def _variables_saved_as(var_list, names):
  """The variables `var_list` saves under `names`.

  `var_list` values are variables, partitioned variables (an engine table in a
  cluster), or (from `op_list_to_dict`) the handle of a resource variable or the
  parts of a partitioned one: those are found by name.
  """
  by_name = collections.defaultdict(list)
  for variable in tf.compat.v1.global_variables():
    info = getattr(variable, '_save_slice_info', None)
    by_name[info.full_name if info else variable.op.name].append(variable)
  found = []
  for name in names:
    value = var_list[name]
    if isinstance(value, internals.PartitionedVariable):
      found.extend(value)
    else:
      found.extend([value] if hasattr(value, 'initializer') else by_name[name])
  return found


def _model_shape(value):
  """The full shape a `var_list` value is saved with, or None if unknown."""
  if isinstance(value, (list, tuple)):  # the parts of a partitioned variable
    info = getattr(value[0], '_save_slice_info', None)
    return list(info.full_shape) if info else None
  shape = getattr(value, 'shape', None)
  if (shape is None or getattr(value, 'dtype', None) == tf.resource or
      not shape.is_fully_defined()):
    return None  # a saveable object, a resource handle
  return shape.as_list()


def _changed_shapes(shapes, var_list):
  """'name (checkpoint [..], model [..])' of each variable of `var_list` whose
  shape differs from the checkpoint's `shapes`, sorted."""
  return sorted(
      '{} (checkpoint {}, model {})'.format(name, shapes[name], model)
      for name, model in ((n, _model_shape(v)) for n, v in var_list.items())
      if name in shapes and model is not None and model != shapes[name])


class CheckpointShapeError(tf.errors.InvalidArgumentError, ValueError):
  """Variables of the model differ in shape from the checkpoint's: TF's error
  of that restore (a script catching it catches this), and a ValueError."""

  def __init__(self, message):
    super().__init__(None, None, message)


def _check_shapes(checkpoint_path, shapes, var_list):
  """Raises, naming them, if variables differ in shape from the checkpoint's."""
  changed = _changed_shapes(shapes, var_list)
  if changed:
    raise CheckpointShapeError(
        'Restoring from checkpoint failed. This is most likely due to a '
        'mismatch between the current graph and the graph from the '
        'checkpoint: checkpoint {} does not fit this model: {} changed shape. '
        'A changed vocabulary size or embedding dimension cannot restore the '
        'old table; restore it into the model that wrote it, or start from a '
        'new model_dir.'.format(original_path(checkpoint_path),
                                ', '.join(changed)))


def _reason(error):
  """The line of an OpError's message that says what failed (not where)."""
  lines = [line.strip() for line in str(error).strip().splitlines()]
  for before, line in zip(lines, lines[1:]):
    if line.startswith('[[{{node'):
      return before
  return lines[0]


@contextlib.contextmanager
def _unreadable_explained(checkpoint_path):
  """Re-raises a failure to read the checkpoint's contents (not, e.g., its
  absence) as a DataLossError naming a truncated or corrupt checkpoint, and
  the cure."""
  try:
    yield
  except tf.errors.OpError as e:
    if not (isinstance(e, (tf.errors.DataLossError, tf.errors.OutOfRangeError))
            or type(e) is tf.errors.OpError):  # pylint: disable=unidiomatic-typecheck
      raise
    raise tf.errors.DataLossError(None, None, (
        'Checkpoint {} cannot be read ({}): it is truncated or corrupt. Remove '
        'its files (and its line in the `checkpoint` file) to resume from the '
        'previous checkpoint.'.format(original_path(checkpoint_path),
                                      _reason(e)))) from e


def checkpoint_shapes(checkpoint_path):
  """{name: shape} of a checkpoint; a clear error if it cannot be read."""
  with _unreadable_explained(checkpoint_path):
    return dict(tf.train.list_variables(checkpoint_path))


def _names_read_as(checkpoint_path, shapes, var_list, alias):
  """{name: checkpoint name} of the `var_list` names a checkpoint holds under
  another name, `alias(name)` (a table as TF's TPU named it); logged."""
  read_as = {}
  for name in var_list:
    other = alias(name) if alias and name not in shapes else None
    if other in shapes and other not in var_list:
      read_as[name] = other
  if read_as:
    tf.compat.v1.logging.info(
        'Checkpoint %s holds %s as TensorFlow\'s TPU named them (%s); they are '
        'restored from there.', original_path(checkpoint_path),
        ', '.join(sorted(read_as)), ', '.join(sorted(read_as.values())))
  return read_as


def _as_read(var_list, read_as):
  """`var_list` under the names the checkpoint holds its variables by."""
  return {read_as.get(n, n): v for n, v in var_list.items()}


def restored_names(checkpoint_path, shapes, var_list, alias=None):
  """{name: checkpoint name} of the `var_list` names a checkpoint holds under
  another name, `alias(name)` (a table as TF's TPU named it); raises, naming
  them, if any variable differs in shape from what the checkpoint holds.

  Args:
    shapes: the checkpoint's {name: shape} (`checkpoint_shapes`).
    alias: `name -> the name another writer of the model's checkpoints gave
      it, or None`; used only where the checkpoint lacks `name`.
  """
  read_as = _names_read_as(checkpoint_path, shapes, var_list, alias)
  _check_shapes(checkpoint_path, shapes, _as_read(var_list, read_as))
  return read_as


def renaming_saver(checkpoint_path, var_list, alias=None):
  """A Saver that restores `var_list` from a checkpoint holding some of it
  under other names (`restored_names`), or None if it holds all under their
  own; clear errors if it cannot restore them."""
  read_as = restored_names(checkpoint_path, checkpoint_shapes(checkpoint_path),
                           var_list, alias)
  if not read_as:
    return None
  return tf.compat.v1.train.Saver(var_list=_as_read(var_list, read_as),
                                  sharded=True)


def _check_restorable(checkpoint_path, shapes, var_list, lacking):
  """Raises TF's NotFoundError if the checkpoint lacks variables (`lacking`)
  the model cannot start anew, naming each and any that changed shape (a
  script catching TF's error catches it); else `_check_shapes`."""
  if lacking:
    changed = _changed_shapes(shapes, var_list)
    raise tf.errors.NotFoundError(None, None, (
        'Checkpoint {} lacks variables this model needs: {}{}. The model '
        'changed since the checkpoint was written (a renamed column or layer, '
        'a new table?); restore it into the model that wrote it, or start '
        'from a new model_dir.'.format(
            original_path(checkpoint_path), ', '.join(lacking),
            '; and these changed shape: ' + ', '.join(changed)
            if changed else '')))
  _check_shapes(checkpoint_path, shapes, var_list)


class TolerantSaver(tf.compat.v1.train.Saver):
  """A Saver that restores a checkpoint lacking some optimizer state (see module).

  `input_pipeline` saveables are saved with the variables but never restored by
  `restore` (the input's own hook restores them once its iterator is initialized).
  """

  def __init__(self, var_list, checkpoint_path, input_pipeline=(),
               may_start_anew=(), alias=None, **kwargs):
    super().__init__(  # Saver rewrites its dict
        var_list=dict(var_list, **{s.name: s for s in input_pipeline}), **kwargs)
    self._variables_only = (tf.compat.v1.train.Saver(
        var_list=dict(var_list), sharded=True) if input_pipeline else None)
    self._partial = None
    if not checkpoint_path:
      return
    shapes = checkpoint_shapes(checkpoint_path)
    read_as = _names_read_as(checkpoint_path, shapes, var_list, alias)
    missing = sorted(name for name in var_list
                     if name not in shapes and name not in read_as)
    _check_restorable(checkpoint_path, shapes, _as_read(var_list, read_as), [
        n for n in missing if n not in may_start_anew and
        not _is_optimizer_state(n, var_list)])
    if not missing and not read_as:
      return
    present = _as_read({n: v for n, v in var_list.items() if n not in missing},
                       read_as)
    self._partial = (
        checkpoint_path,
        tf.compat.v1.train.Saver(var_list=present, sharded=True),
        tf.compat.v1.variables_initializer(
            _variables_saved_as(var_list, missing)), missing)

  def restore(self, sess, save_path):
    with _unreadable_explained(save_path):
      if self._partial is not None and save_path == self._partial[0]:
        _, saver, initialize, missing = self._partial
        if missing:
          tf.compat.v1.logging.warning(
              'Checkpoint %s has no %s (optimizer state of another training '
              'mode or optimizer, or variables of hooks it was trained '
              'without); they start from their initial values.',
              original_path(save_path), ', '.join(missing))
          sess.run(initialize)
        return saver.restore(sess, save_path)
      if self._variables_only is not None:
        return self._variables_only.restore(sess, save_path)
      return super().restore(sess, save_path)


def _step_of(prefix):
  try:
    return int(prefix.rsplit('-', 1)[1])
  except (IndexError, ValueError):
    return None


def remove_cut_short_saves(model_dir):
  """Deletes the files of saves a killed process cut short.

  A save writes the checkpoint's files, then names it in the checkpoint state;
  killed before that, it leaves files that may not read and that no checkpoint
  state names.  Those of a step past the last named checkpoint which do not
  read are removed (the restarted run saves that step again); nothing named,
  nothing that reads, and nothing in a directory without a checkpoint state
  is touched.
  """
  latest = latest_checkpoint(model_dir)
  latest_step = _step_of(latest) if latest else None
  if latest_step is None:  # no checkpoint state, or names of another writer
    return
  for index in tf.io.gfile.glob(os.path.join(model_dir, '*.index')):
    prefix = index[:-len('.index')]
    step = _step_of(prefix)
    if step is None or step <= latest_step:
      continue
    try:
      tf.train.load_checkpoint(prefix)
    except (tf.errors.OpError, RuntimeError) as error:
      for path in tf.io.gfile.glob(prefix + '.*'):
        tf.io.gfile.remove(path)
      tf.compat.v1.logging.warning(
          'Removed %s, a checkpoint whose save was cut short (it was never '
          'named in the checkpoint state; %s).', prefix, _reason(error))


def saver_at_finalize(scaffold, graph, checkpoint_path, config, names=None,
                      input_pipeline=(), alias=None):
  """`scaffold` itself, adding the graph's Saver (unless it has one) when
  finalized.

  The model_fn's Scaffold is the one the session finalizes, as in TF's
  Estimator (a `finalize` it overrides runs, once).

  As TF's Estimator built its Saver: after the hooks' `begin`, so variables a
  hook creates there (early stopping's `signal_early_stopping/STOP`) are saved
  too.  A checkpoint without them restores the rest and starts them from their
  initial values (TF's restore failed).

  Args:
    names: {checkpoint name: variable} of what the model's build named (the
      emulated TPU's legacy table names), or None: every variable under its
      own name.  Variables built after it are saved under their own names.
    input_pipeline: the input position saveables every checkpoint holds
      (`InputPipelinePosition.saveable`).
    alias: as `restored_names`.
  """
  names = names or {}
  named = {id(v) for v in _variables_saved_as(names, names)}
  built = {id(v) for v in tf.compat.v1.global_variables()}

  def add_saver():
    if graph.get_collection(tf.compat.v1.GraphKeys.SAVERS):
      return
    variables = tf.compat.v1.global_variables()
    later = internals.op_list_to_dict(
        [v for v in variables if id(v) not in built])
    if names:  # and what the model built after naming
      var_list = {**names, **internals.op_list_to_dict(
          [v for v in variables if id(v) not in named])}
    else:
      var_list = internals.op_list_to_dict(
          variables + tf.compat.v1.get_collection(
              tf.compat.v1.GraphKeys.SAVEABLE_OBJECTS))
    graph.add_to_collection(tf.compat.v1.GraphKeys.SAVERS, TolerantSaver(
        var_list, checkpoint_path, sharded=True,
        input_pipeline=input_pipeline,
        may_start_anew=later, alias=alias,
        max_to_keep=config.keep_checkpoint_max,
        keep_checkpoint_every_n_hours=config.keep_checkpoint_every_n_hours,
        save_relative_paths=True))

  return _adding_saver_at_finalize(scaffold, add_saver)


# Scaffold -> the function adding its graph's Saver, until it is finalized.
_SAVER_ADDERS = weakref.WeakKeyDictionary()


def _adding_saver_at_finalize(scaffold, add_saver):
  """`scaffold`, whose `finalize` runs `add_saver()` first."""
  _SAVER_ADDERS[scaffold] = add_saver
  finalize = scaffold.finalize

  def finalize_adding_saver():
    adder = _SAVER_ADDERS.pop(scaffold, None)
    if adder is not None and scaffold.saver is None:
      adder()
    return finalize()

  scaffold.finalize = finalize_adding_saver
  return scaffold


def copied_scaffold(scaffold, **fields):
  """A Scaffold of `scaffold`'s fields and `fields`, adding the same Saver
  when finalized (TF's `Scaffold(copy_from_scaffold=...)`)."""
  copy = tf.compat.v1.train.Scaffold(copy_from_scaffold=scaffold, **fields)
  add_saver = _SAVER_ADDERS.get(scaffold)
  return copy if add_saver is None else _adding_saver_at_finalize(copy,
                                                                  add_saver)


class BeforeSave(tf.compat.v1.train.CheckpointSaverListener):
  """Runs `ops` before each save, e.g. to apply parked table updates."""

  def __init__(self, ops):
    self._ops = ops

  def before_save(self, session, global_step_value):
    del global_step_value
    session.run(self._ops)


def before_save_listeners(before_save):
  """The listeners that run the ops of `before_save` (functions building
  them, called here, outside any in-graph loop) before each save (maybe
  none)."""
  ops = [build_op() for build_op in before_save]
  return [BeforeSave(ops)] if ops else []


class InputPipelinePosition:
  """The position of a training input's iterator, saved in every model checkpoint.

  Built with the TRAIN graph, before its Saver, which saves `saveable` with
  the variables; `restore` runs once the iterator is initialized in a new
  session, from the checkpoint that session restored.
  """

  def __init__(self, iterator, model_dir, external_state_policy=None):
    self._model_dir = model_dir
    self.saveable = internals.make_saveable_from_iterator(
        iterator, external_state_policy)
    self._saver = tf.compat.v1.train.Saver(
        var_list={self.saveable.name: self.saveable}, sharded=True)

  def restore(self, session):
    """Moves the (initialized) iterator to the latest checkpoint's position."""
    checkpoint_path = latest_checkpoint(self._model_dir)
    if not checkpoint_path:
      return
    saved = checkpoint_shapes(checkpoint_path)
    if not all(spec.name in saved for spec in self.saveable.specs):
      tf.compat.v1.logging.warning(
          'Checkpoint %s has no input pipeline position (it was written '
          'without CheckpointInputPipelineHook); the input starts from its '
          'beginning.', checkpoint_path)
      return
    tf.compat.v1.logging.info('Restoring the input pipeline position from %s',
                              checkpoint_path)
    self._saver.restore(session, checkpoint_path)
