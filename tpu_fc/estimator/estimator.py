"""`Estimator`: tf.estimator's driver rebuilt on TF core, TPU-agnostic.

It sequences modes: for each call it builds a fresh graph (seed, global step,
input_fn, then the model through `_build_mode_graph`, the one graph-building
step a subclass overrides, which returns a `model_fn.BuiltGraph`) and hands
what was built to `sessions`, which runs it.  In a parameter-server cluster
(`TF_CONFIG`, see `distributed`) training is Estimator's between-graph
replication: ps tasks serve variables, the chief and the workers build the
graph with a replica device setter and train on their own server.
"""
from __future__ import annotations

import collections
import contextlib
import copy
import os
import socket
import tempfile
import threading
from typing import Any, Callable, Iterable, Iterator, Mapping

import numpy as np
from google.protobuf import message

from tpu_fc._tf import tf
from tpu_fc import _tf_internals as internals
from tpu_fc.estimator import checkpoints
from tpu_fc.estimator import distributed
from tpu_fc.estimator import hooks as hooks_lib
from tpu_fc.estimator import input_fn as input_fn_lib
from tpu_fc.estimator import model_fn as model_fn_lib
from tpu_fc.estimator import run_config
from tpu_fc.estimator import saved_model
from tpu_fc.estimator import sessions
from tpu_fc.estimator.checkpoints import (  # (TF's Estimator's name of it)
    latest_global_step as _load_global_step_from_checkpoint_dir)
from tpu_fc.estimator.hooks import CheckpointInputPipelineHook
from tpu_fc.estimator.hooks import EvaluationStepsHook
from tpu_fc.estimator.model_fn import ModeKeys

# Times a reader chooses the latest checkpoint again when a trainer deleted the
# one it chose before it could hold it (`checkpoints.held`).
_HOLD_ATTEMPTS = 10
_VALID_MODEL_FN_ARGS = frozenset(
    ['features', 'labels', 'mode', 'params', 'self', 'config'])
# The members of Estimator a subclass may override (TF 2.15's list).
_ALLOWED_OVERRIDES = frozenset([
    'model_fn', '_create_and_assert_global_step', '_export_all_saved_models',
    '_tf_api_names', '_tf_api_names_v1', '_estimator_api_names',
    '_estimator_api_names_v1', '_estimator_api_constants',
    '_estimator_api_constants_v1', 'latest_checkpoint'])


class WarmStartSettings(
    collections.namedtuple('WarmStartSettings', [
        'ckpt_to_initialize_from', 'vars_to_warm_start',
        'var_name_to_vocab_info', 'var_name_to_prev_var_name'
    ])):
  """`tf.compat.v1.train.warm_start` args (tf.estimator.WarmStartSettings)."""

  def __new__(cls,
              ckpt_to_initialize_from,
              vars_to_warm_start='.*',
              var_name_to_vocab_info=None,
              var_name_to_prev_var_name=None):
    if not ckpt_to_initialize_from:
      raise ValueError(
          '`ckpt_to_initialize_from` MUST be set in WarmStartSettings')
    return super(WarmStartSettings, cls).__new__(
        cls, ckpt_to_initialize_from, vars_to_warm_start,
        var_name_to_vocab_info or {}, var_name_to_prev_var_name or {})


def _warm_start_settings(warm_start_from):
  """A path (checkpoint, its directory or a SavedModel) or settings object."""
  if warm_start_from is None:
    return None
  if isinstance(warm_start_from, (str, bytes)):
    index = os.path.join(
        internals.saved_model_variables_dir(warm_start_from),
        'variables.index')
    if tf.io.gfile.exists(index):
      tf.compat.v1.logging.info('Warm-starting from a SavedModel')
      return WarmStartSettings(
          internals.saved_model_variables_path(warm_start_from))
    return WarmStartSettings(warm_start_from)
  if hasattr(warm_start_from, 'ckpt_to_initialize_from'):
    return WarmStartSettings(*(getattr(warm_start_from, field, None)
                               for field in WarmStartSettings._fields))
  raise ValueError('warm_start_from must be a string or a WarmStartSettings, '
                   'instead got {}'.format(type(warm_start_from)))


def verify_model_fn_args(model_fn, params):
  """TF's checks of a model_fn's arguments against `params` (a TypeError
  for what is not callable)."""
  args = set(internals.fn_args(model_fn))
  if 'features' not in args:
    raise ValueError('model_fn (%s) must include features argument.' % model_fn)
  if params is not None and 'params' not in args:
    raise ValueError('model_fn (%s) does not include params argument, '
                     'but params (%s) is passed to Estimator.' %
                     (model_fn, params))
  if params is None and 'params' in args:
    tf.compat.v1.logging.warn(
        'Estimator\'s model_fn (%s) includes params '
        'argument, but params are not passed to Estimator.', model_fn)
  check_fn_args(model_fn, 'model_fn', _VALID_MODEL_FN_ARGS)


def check_fn_args(fn, kind, allowed):
  """TF's error for arguments of `fn` (a model_fn, compare_fn, metric_fn)
  that are not `allowed`."""
  unexpected = list(set(internals.fn_args(fn)) - allowed)
  if unexpected:
    raise ValueError('%s (%s) has following not expected args: %s' %
                     (kind, fn, unexpected))


def check_positive(value, name):
  """TF's error for a count of steps given (not None) but not positive."""
  if value is not None and value <= 0:
    raise ValueError('Must specify {} > 0, given: {}'.format(name, value))


def check_estimator(estimator):
  """TF's TypeError unless `estimator` is tpu_fc's (functions that take one:
  `train_and_evaluate`, the early-stopping hooks, `add_metrics`)."""
  if not isinstance(estimator, Estimator):
    raise TypeError('`estimator` must have type `tf.estimator.Estimator` '
                    '(here: tpu_fc\'s Estimator or TPUEstimator). Got: {}'.format(
                        type(estimator)))


def add_item_to_params(params, key, value):
  if hasattr(params, 'set_hparam'):  # HParams-like params
    if key in params:
      params.set_hparam(key, value)
    else:
      params.add_hparam(key, value)
  else:
    params[key] = value


def _create_global_step(graph):
  """The global step: an int64 resource variable (every mode's graph is a new
  one)."""
  with graph.as_default() as g, g.name_scope(None):
    return tf.compat.v1.get_variable(
        tf.compat.v1.GraphKeys.GLOBAL_STEP,
        shape=[],
        dtype=tf.dtypes.int64,
        initializer=tf.compat.v1.initializers.zeros(),
        trainable=False,
        use_resource=True,
        collections=[
            tf.compat.v1.GraphKeys.GLOBAL_VARIABLES,
            tf.compat.v1.GraphKeys.GLOBAL_STEP
        ])


def _check_writable(directory, kind='model_dir', output='checkpoint'):
  """Fails before the work, naming `directory`, if its output cannot go there."""
  try:
    tf.io.gfile.makedirs(directory)
    # (one probe per process and thread: a cluster's tasks check at once)
    probe = os.path.join(directory, '.tpu_fc_write_test.{}.{}.{}'.format(
        socket.gethostname(), os.getpid(), threading.get_ident()))
    with tf.io.gfile.GFile(probe, 'w') as f:
      f.write('')
    tf.io.gfile.remove(probe)
  except (tf.errors.OpError, OSError) as e:
    raise PermissionError('{} {} is not writable, so no {} could be saved: '
                          '{}'.format(kind, directory, output, e)) from e


class Estimator(object):
  """`tf.estimator.Estimator`'s driver: train, evaluate, predict and export a
  model_fn, with checkpoints in `model_dir`.

  Subclasses override `_build_mode_graph` (and the small hooks below it) to
  build a mode's model their way; this class knows no TPU.
  """

  def __init__(self, model_fn: Callable[..., Any],
               model_dir: str | os.PathLike | None = None,
               config: run_config.RunConfig | None = None,
               params: Mapping[str, Any] | None = None,
               warm_start_from: str | WarmStartSettings | None = None):
    self._assert_members_are_not_overridden()
    self._config = self._finalize_config(config, model_dir)
    self._model_dir = self._config.model_dir
    tf.compat.v1.logging.info('Using config: %s', self._config)
    if model_fn is None:
      raise ValueError('model_fn must be provided to Estimator.')
    self._check_model_fn_args(model_fn, params)
    self._model_fn = model_fn
    self._params = copy.deepcopy(params or {})
    self._warm_start_settings = _warm_start_settings(warm_start_from)

  def _assert_members_are_not_overridden(self):
    """TF's rule: a subclass may add members, not override Estimator's (but
    for TF's short allow-list); a class named `TPUEstimator` is exempt, as
    TF exempts its own.  As TF, only the instance's own class is checked."""
    cls = type(self)
    if cls.__name__ == 'TPUEstimator':
      return
    members = {name for name in dir(Estimator) if not name.startswith('__')}
    overridden = sorted(
        name for name in members & set(vars(cls)) - _ALLOWED_OVERRIDES
        if getattr(Estimator, name) != getattr(cls, name))
    if overridden:
      raise ValueError(
          'Subclasses of Estimator cannot override members of Estimator. '
          '{} does override {}'.format(cls, overridden))

  def _check_model_fn_args(self, model_fn, params):
    """`verify_model_fn_args`, after the config's checks (TF's order)."""
    verify_model_fn_args(model_fn, params)

  @staticmethod
  def _finalize_config(config, model_dir):
    """Estimator's defaults: session config, and model_dir (else a temp dir)."""
    if config is None:
      config = run_config.RunConfig()
      tf.compat.v1.logging.info('Using default config.')
    if not run_config.is_run_config(config):
      raise ValueError(
          'config must be an instance of `RunConfig`, but provided %s.' % config)
    config = config.replace(session_config=(
        config.session_config or run_config.default_session_config()))
    model_dir = run_config.path_to_str(model_dir)
    if model_dir is not None and config.model_dir not in (None, model_dir):
      raise ValueError(
          '`model_dir` are set both in constructor and `RunConfig`, but with '
          "different values. In constructor: '{}', in `RunConfig`: "
          "'{}' ".format(model_dir, config.model_dir))
    if model_dir:
      return config.replace(model_dir=model_dir)
    if config.model_dir is None:
      model_dir = tempfile.mkdtemp()
      tf.compat.v1.logging.warn('Using temporary folder as model directory: %s',
                                model_dir)
      return config.replace(model_dir=model_dir)
    return config

  @property
  def model_dir(self) -> str:
    """The directory of checkpoints, summaries and evaluations."""
    return self._model_dir

  @property
  def config(self) -> run_config.RunConfig:
    """A copy of the `RunConfig` in use (`model_dir` and `session_config`
    filled in)."""
    return copy.deepcopy(self._config)

  @property
  def _session_config(self):
    """The config every session runs with, under TF's Estimator's name of it
    (which subclasses and TF's tests read)."""
    return self._config.session_config

  @property
  def params(self) -> Any:
    """A copy of the `params` given (without what the estimator adds)."""
    return copy.deepcopy(self._params)

  @property
  def model_fn(self) -> Callable[..., Any]:
    """The model_fn bound to `params`: `(features, labels, mode, config) ->
    EstimatorSpec`, as an export calls it (tf.estimator's `model_fn`)."""
    return self._model_fn_as_exported

  def eval_dir(self, name: str | None = None) -> str:
    """Where `evaluate(name=...)` writes its summaries.

    Args:
      name: the evaluation's name; None: the default evaluation.

    Returns:
      `<model_dir>/eval`, or `<model_dir>/eval_<name>`.
    """
    return os.path.join(self._model_dir, 'eval' if not name else 'eval_' + name)

  def latest_checkpoint(self) -> str | None:
    """The prefix of the newest checkpoint in `model_dir`, or None."""
    return checkpoints.latest_checkpoint(self._model_dir)

  def get_variable_names(self) -> list[str]:
    """The names of the variables in the latest checkpoint (legacy names: a
    table is `.../<column>_embedding/embedding_weights`, its slots below it).

    Raises:
      ValueError: `model_dir` has no checkpoint.
    """
    return [name for name, _ in tf.train.list_variables(
        self._checkpoint_available())]

  def get_variable_value(self, name: str) -> np.ndarray:
    """A variable's value in the latest checkpoint.

    Args:
      name: its name in the checkpoint (see `get_variable_names`).

    Returns:
      The value, a numpy array.

    Raises:
      ValueError: `model_dir` has no checkpoint.
      tf.errors.NotFoundError: the checkpoint has no variable `name`.
    """
    return tf.train.load_variable(self._checkpoint_available(), name)

  # Export --------------------------------------------------------------------

  def export_saved_model(self,
                         export_dir_base: str | bytes | os.PathLike,
                         serving_input_receiver_fn: Callable[[], Any],
                         assets_extra: Mapping[str, str] | None = None,
                         as_text: bool = False,
                         checkpoint_path: str | None = None,
                         experimental_mode: str = ModeKeys.PREDICT) -> bytes:
    """Exports the `experimental_mode` graph (PREDICT: for serving) with a
    checkpoint's values (the latest, or `checkpoint_path`) as a SavedModel.

    Returns the timestamped export directory under `export_dir_base` (bytes).

    The SavedModel loads with `tf.saved_model.load` and runs with
    `saved_model_cli`, without tpu_fc.

    Args:
      export_dir_base: the directory the timestamped export directory is
        made in.
      serving_input_receiver_fn: `() -> ServingInputReceiver` (or
        `TensorServingInputReceiver`; tpu_fc's or TF's), e.g. from
        `tpu_fc.export.build_parsing_serving_input_receiver_fn`; for TRAIN or
        EVAL, `() -> SupervisedInputReceiver`.
      assets_extra: {path in the export's `assets.extra`: source file}
        copied there; None: none.
      as_text: write the SavedModel proto as text.
      checkpoint_path: the checkpoint to export; None: the latest in
        `model_dir`, else the warm-start checkpoint.
      experimental_mode: the `ModeKeys` of the graph exported.

    Returns:
      The export directory, `export_dir_base/<timestamp>`, as bytes.

    Raises:
      ValueError: no `serving_input_receiver_fn`, no checkpoint to export,
        `checkpoint_path` not a checkpoint, the graph needs variables the
        checkpoint lacks, or the estimator's export settings forbid it.
    """
    if not serving_input_receiver_fn:
      raise ValueError('An input_receiver_fn must be defined.')
    return self.experimental_export_all_saved_models(
        export_dir_base, {experimental_mode: serving_input_receiver_fn},
        assets_extra, as_text, checkpoint_path)

  def experimental_export_all_saved_models(
      self,
      export_dir_base: str | bytes | os.PathLike,
      input_receiver_fn_map: Mapping[str, Callable[[], Any]],
      assets_extra: Mapping[str, str] | None = None,
      as_text: bool = False,
      checkpoint_path: str | None = None) -> bytes:
    """One SavedModel with a meta graph per mode of `input_receiver_fn_map`
    ({ModeKeys: input_receiver_fn}; TRAIN, EVAL, PREDICT, each tagged as TF
    tags it) and one set of variables, a checkpoint's (the latest, or
    `checkpoint_path`), as tf.estimator's.

    Returns the timestamped export directory under `export_dir_base` (bytes).

    Args:
      export_dir_base: as in `export_saved_model`.
      input_receiver_fn_map: `ModeKeys` value -> input_receiver_fn: a
        `SupervisedInputReceiver` for TRAIN and EVAL (e.g.
        `tpu_fc.export.build_raw_supervised_input_receiver_fn`), a
        `ServingInputReceiver` for PREDICT.  TRAIN and EVAL signatures hold
        the loss, predictions and metrics.
      assets_extra, as_text, checkpoint_path: as in `export_saved_model`.

    Returns:
      The export directory, `export_dir_base/<timestamp>`, as bytes.

    Raises:
      ValueError: no mode to export, no checkpoint to export, or as in
        `export_saved_model`.
    """
    if not checkpoint_path:
      self._checkpoint_to_export()  # TF's order: no checkpoint is told first
    self._check_export(input_receiver_fn_map)
    return self._reading_checkpoint(
        checkpoint_path, self._checkpoint_to_export,
        lambda checkpoint: saved_model.export_all_saved_models(
            lambda features, labels, mode: self._model_fn_as_exported(
                features, labels, mode, self.config),
            export_dir_base, input_receiver_fn_map, checkpoint, assets_extra,
            as_text, self._config.tf_random_seed, self._checkpoint_alias,
            self._session_config))

  def export_savedmodel(self,
                        export_dir_base,
                        serving_input_receiver_fn,
                        assets_extra=None,
                        as_text=False,
                        checkpoint_path=None,
                        strip_default_attrs=False):
    """The TF1 name of `export_saved_model` (default attributes are always stripped)."""
    del strip_default_attrs
    return self.export_saved_model(export_dir_base, serving_input_receiver_fn,
                                   assets_extra, as_text, checkpoint_path)

  def _check_export(self, input_receiver_fn_map):
    """Raises (or warns) before an export of these modes that the settings
    forbid; none here."""

  def _model_fn_as_exported(self, features, labels, mode, config):
    """The `EstimatorSpec` of the model_fn in `mode` as an export (and
    `model_fn`) calls it: with the estimator's params."""
    return model_fn_lib.to_estimator_spec(self._call_model_fn(
        features, labels, mode, config, copy.deepcopy(self._params)))

  # Checkpoints to read -------------------------------------------------------

  def _log_if_untrained(self, checkpoint, mode):
    if not checkpoint:
      tf.compat.v1.logging.info(
          'Could not find trained model in model_dir: {}, running '
          'initialization to {}.'.format(self._model_dir, mode))

  def _reading_checkpoint(self, checkpoint_path, choose, read):
    """`read(checkpoint)` of `checkpoint_path`, or, without one, of `choose()`
    (None: no checkpoint), from a copy held while it is read
    (`checkpoints.held`), so that a trainer's `keep_checkpoint_max` cannot
    delete it meanwhile; what `read` reports names the original
    (`checkpoints.original_path`).  A chosen checkpoint deleted before it
    could be held is chosen anew, up to `_HOLD_ATTEMPTS` times."""
    if checkpoint_path:
      with checkpoints.held(checkpoint_path) as copy:
        if copy is None:  # TF's Saver.restore's error
          raise ValueError('The passed save_path is not a valid checkpoint: '
                           '{}'.format(checkpoint_path))
        return read(copy)
    for _ in range(_HOLD_ATTEMPTS):
      chosen = choose()
      if not chosen:
        return read(chosen)
      with checkpoints.held(chosen) as copy:
        if copy is not None:
          return read(copy)
      tf.compat.v1.logging.warning(
          'Checkpoint %s was deleted before it could be read (pruned by a '
          "training run's keep_checkpoint_max?); reading the latest one.",
          chosen)
    raise ValueError(
        'Checkpoint {} was deleted before it could be read, as were the {} '
        'chosen before it: a training run prunes checkpoints faster than they '
        'can be held. Pass checkpoint_path= of one it keeps.'.format(
            chosen, _HOLD_ATTEMPTS - 1))

  def _checkpoint_to_export(self):
    """The latest checkpoint, else the warm-start one (as Estimator exports)."""
    checkpoint_path = self.latest_checkpoint()
    if not checkpoint_path and self._warm_start_settings:
      checkpoint_path = self._warm_start_settings.ckpt_to_initialize_from
      if tf.io.gfile.isdir(checkpoint_path):
        checkpoint_path = tf.train.latest_checkpoint(checkpoint_path)
    if not checkpoint_path:
      raise ValueError("Couldn't find trained model at {}.".format(
          self._model_dir))
    return checkpoint_path

  def _checkpoint_available(self):
    """The latest checkpoint; raises (TF's error) without one."""
    checkpoint = self.latest_checkpoint()
    if not checkpoint:
      raise ValueError('Could not find trained model in model_dir: {}.'.format(
          self._model_dir))
    return checkpoint

  # Modes ---------------------------------------------------------------------

  def train(self,
            input_fn: Callable[..., Any],
            hooks: Iterable[Any] | None = None,
            steps: int | None = None,
            max_steps: int | None = None,
            saving_listeners: Iterable[Any] | None = None) -> Estimator:
    """Trains `steps` more steps (up to global step `max_steps`, or until
    input ends) from the latest checkpoint in model_dir, else from
    `warm_start_from`, else from scratch.

    A ps task of a cluster serves variables instead, until stopped (TF
    raised there); an evaluator task raises, as in TF.  Training holds
    model_dir: a second run on it fails at once, and a failed step loses no
    checkpoint.  Bad input fails the step with an error naming the feature.

    Args:
      input_fn: `([params, mode, config, input_context]) -> Dataset` of
        `(features, labels)`, or `features, labels` tensors.
      hooks: this training's `tf.compat.v1.train.SessionRunHook`s.
      steps: how many steps this call trains (> 0); None: up to `max_steps`
        or the input's end.
      max_steps: the global step to stop at (> 0); not with `steps`.
      saving_listeners: `CheckpointSaverListener`s called around each save.

    Returns:
      This estimator.

    Raises:
      ValueError: on an evaluator task; `steps` with `max_steps`, or one
        <= 0; listeners without checkpoint saving; labels given to a
        model_fn without `labels`, or a spec the mode cannot run.
      TypeError: a hook or listener of another type.
      RuntimeError: another run is training this model_dir.
      PermissionError: `model_dir` is not writable.
    """
    if self._config.task_type == 'evaluator':
      raise ValueError(
          'Train has been called wrong configuration. Please use '
          'tf.estimator.train_and_evaluate which calls proper API according '
          'to given configuration. Current configuration: {}.'.format(
              self.config))
    if self._config.task_type == 'ps':
      distributed.join(self._config)
    if steps is not None and max_steps is not None:
      raise ValueError('Can not provide both steps and max_steps.')
    check_positive(steps, 'steps')
    check_positive(max_steps, 'max_steps')
    if (max_steps is not None and
        max_steps <= _load_global_step_from_checkpoint_dir(self._model_dir)):
      tf.compat.v1.logging.info(
          'Skipping training since max_steps has already saved.')
      return self
    hooks = hooks_lib.check_hooks_type(hooks)
    self._check_training_steps(steps, max_steps)
    position_hooks = [h for h in hooks
                      if isinstance(h, CheckpointInputPipelineHook)]
    hooks = [h for h in hooks if h not in position_hooks]
    saving_listeners = hooks_lib.checked_types(
        saving_listeners, tf.compat.v1.train.CheckpointSaverListener,
        'saving_listeners must be a list of CheckpointSaverListener, '
        'given: {}')
    _check_writable(self._model_dir)
    with contextlib.ExitStack() as held:
      if self._config.is_chief:  # the one task that writes checkpoints
        held.enter_context(checkpoints.training_lock(self._model_dir))
        checkpoints.remove_cut_short_saves(self._model_dir)
      loss = self._train(input_fn, hooks, position_hooks, saving_listeners,
                         steps, max_steps)
    tf.compat.v1.logging.info('Loss for final step: %s.', loss)
    return self

  def _check_training_steps(self, steps, max_steps):
    """Raises for `train` steps the mode cannot run (where TF's Estimator
    converts them to hooks, before input_fn); any here."""

  def _train(self, input_fn, hooks, position_hooks, saving_listeners, steps,
             max_steps):
    """Builds the TRAIN graph and trains; returns the last loss."""
    with tf.Graph().as_default() as graph, graph.device(
        distributed.device_fn(self._config)):
      built, input_hooks, saves_input_position = self._build_graph(
          input_fn, ModeKeys.TRAIN, self.latest_checkpoint(),
          position_hooks[0] if position_hooks else None)
      built = built._replace(spec=self._with_progress_logging(built))
      return sessions.train(
          built, input_hooks + hooks + self._stop_hooks(built, steps,
                                                        max_steps),
          saving_listeners, self._config, saves_input_position,
          self._task_session_hooks(training=True))

  def _stop_hooks(self, built, steps, max_steps):
    """The hooks that end training at `steps` / `max_steps`."""
    del built
    if steps is None and max_steps is None:
      return []
    return [tf.compat.v1.train.StopAtStepHook(steps, max_steps)]

  def _with_progress_logging(self, built):
    """The TRAIN spec with Estimator's loss and step logging first among its
    training hooks (the step rate: `sessions.train`)."""
    spec = built.spec
    if self._config.log_step_count_steps is None:
      return spec
    logging_hook = tf.compat.v1.train.LoggingTensorHook(
        {'loss': spec.loss, 'step': tf.compat.v1.train.get_global_step()},
        every_n_iter=self._config.log_step_count_steps)
    return spec._replace(
        training_hooks=(logging_hook,) + tuple(spec.training_hooks))

  def evaluate(self,
               input_fn: Callable[..., Any],
               steps: int | None = None,
               hooks: Iterable[Any] | None = None,
               checkpoint_path: str | None = None,
               name: str | None = None) -> dict[str, Any]:
    """Evaluates a checkpoint (the latest, or `checkpoint_path`; none: the
    model as initialized, logged) on `steps` batches, or until input ends.

    The checkpoint is held while it is read, so a trainer's
    `keep_checkpoint_max` cannot delete it meanwhile.

    Args:
      input_fn: as `train` takes it.
      steps: how many batches (> 0); None: until the input ends.
      hooks: this evaluation's `tf.compat.v1.train.SessionRunHook`s.
      checkpoint_path: the checkpoint; None: the latest.
      name: the evaluation's name (summaries in `eval_dir(name)`); None:
        the default.

    Returns:
      The model's metrics by name, `loss` (its mean over the batches) and
      `global_step`.

    Raises:
      ValueError: `steps` <= 0, `checkpoint_path` not a checkpoint, or as
        `train`.
      TypeError: a hook of another type.
      PermissionError: `eval_dir(name)` is not writable.
    """
    hooks = hooks_lib.check_hooks_type(hooks)
    hooks.extend(self._convert_eval_steps_to_hooks(steps))
    hooks.extend(self._task_session_hooks())
    _check_writable(self.eval_dir(name), 'eval_dir', 'evaluation summary')

    def evaluate_checkpoint(checkpoint):
      self._log_if_untrained(checkpoint, 'evaluate')
      with tf.Graph().as_default():
        built, input_hooks, _ = self._build_graph(
            input_fn, ModeKeys.EVAL, checkpoint, eval_steps=steps)
        return _write_evaluation(
            self.eval_dir(name), checkpoint,
            sessions.evaluate(built, input_hooks + hooks, checkpoint,
                              self._config))

    return self._reading_checkpoint(checkpoint_path, self.latest_checkpoint,
                                    evaluate_checkpoint)

  def _check_evaluation_steps(self, steps):
    """Raises for `evaluate` steps the mode cannot run; any here."""

  # tf.estimator's evaluation steps, which TF's InMemoryEvaluatorHook calls
  # (`hooks.InMemoryEvaluatorHook` is tpu_fc's).

  def _convert_eval_steps_to_hooks(self, steps):
    """The hooks that end an evaluation after `steps` (None: at input's end)."""
    self._check_evaluation_steps(steps)
    check_positive(steps, 'steps')
    return [] if steps is None else [EvaluationStepsHook(steps)]

  def _evaluate_build_graph(self, input_fn, hooks, checkpoint_path):
    """Builds the EVAL graph in the default graph; returns (scaffold, update
    op, metric values, all hooks: the input's, `hooks`, the spec's).  Its
    steps are those of the `EvaluationStepsHook` in `hooks`."""
    steps = [hook.steps for hook in hooks
             if isinstance(hook, EvaluationStepsHook)]
    built, input_hooks, _ = self._build_graph(
        input_fn, ModeKeys.EVAL, checkpoint_path,
        eval_steps=steps[0] if steps else None)
    scaffold, update_op, eval_dict, model_hooks = sessions.evaluation_graph(
        built)
    return (scaffold, update_op, eval_dict,
            input_hooks + list(hooks) + model_hooks)

  def _evaluate_run(self, checkpoint_path, scaffold, update_op, eval_dict,
                    all_hooks, output_dir):
    """Runs what `_evaluate_build_graph` built and writes the metric values
    to `output_dir`; returns them."""
    return _write_evaluation(output_dir, checkpoint_path, sessions.run_evaluation(
        checkpoint_path, scaffold, update_op, eval_dict, all_hooks,
        self._config))

  def predict(self,
              input_fn: Callable[..., Any],
              predict_keys: Iterable[str] | None = None,
              hooks: Iterable[Any] | None = None,
              checkpoint_path: str | None = None,
              yield_single_examples: bool = True) -> Iterator[Any]:
    """A generator of predictions until input ends: dicts, or the values of a
    single tensor, per example or per batch.

    It builds, restores and raises when first iterated.

    Args:
      input_fn: as `train` takes it (its labels are not used).
      predict_keys: the predictions to compute; None: all of them.
      hooks: this prediction's `tf.compat.v1.train.SessionRunHook`s.
      checkpoint_path: the checkpoint; None: the latest (none: the model as
        initialized, logged).
      yield_single_examples: True: example by example (every tensor split
        along its first dimension); False: batch by batch.

    Yields:
      The predictions' values, per example (or batch).

    Raises:
      ValueError: `predict_keys` with predictions that are no dict or naming
        none of them, predictions of different batch sizes (single
        examples), `checkpoint_path` not a checkpoint, or as `train`.
      TypeError: a hook of another type.
    """
    hooks = hooks_lib.check_hooks_type(hooks) + self._task_session_hooks()

    def start_predicting(checkpoint):
      """The predictions' generator, its session started (restored) now."""
      self._log_if_untrained(checkpoint, 'predict')
      with tf.Graph().as_default():
        built, input_hooks, _ = self._build_graph(input_fn, ModeKeys.PREDICT,
                                                  checkpoint)
        return sessions.predict(built, input_hooks + hooks, checkpoint,
                                self._config, predict_keys,
                                yield_single_examples)

    predictions = self._reading_checkpoint(
        checkpoint_path, self.latest_checkpoint, start_predicting)
    yield from predictions

  def _task_session_hooks(self, training=False):
    """In a ps cluster, the hook that readies this task's sessions (starts
    its server; before training on a worker, waits for the chief)."""
    if not distributed.is_parameter_server_cluster(self._config):
      return []
    return [distributed.TaskSessionHook(
        self._config, waits_for_chief=training and not self._config.is_chief)]

  # Graphs --------------------------------------------------------------------

  def _build_graph(self, input_fn, mode, checkpoint_path, position_hook=None,
                   eval_steps=None):
    """Builds `mode`'s graph in the default graph.

    Same op order as Estimator (seed, global step, its read for TRAIN,
    input_fn, model), so a `tf_random_seed` gives the same initial values.
    Warm-starts when there is no `checkpoint_path` to restore.  With a
    `CheckpointInputPipelineHook`, checkpoints hold the input's position.

    Returns:
      (the `BuiltGraph`, its spec's scaffold adding the Saver; the input's
      hooks; whether checkpoints hold the input's position).
    """
    graph = tf.compat.v1.get_default_graph()
    tf.compat.v1.random.set_random_seed(self._config.tf_random_seed)
    _create_global_step(graph)
    if mode == ModeKeys.TRAIN:
      internals.get_or_create_global_step_read(graph)
    inputs = self._call_input_fn(input_fn, mode)
    input_hooks = list(inputs.hooks)
    positions = []
    if position_hook is not None:
      if not inputs.from_dataset:
        tf.compat.v1.logging.warn(
            'CheckpointInputPipelineHook: input_fn returned tensors, not a '
            'Dataset; there is no input position to save.')
      positions = [hook.save_position(self._model_dir,
                                      position_hook.external_state_policy)
                   for hook in input_hooks]
    with self._cluster_training(mode) as sync:
      built = self._build_mode_graph(mode, inputs, sync, eval_steps)
    spec = built.spec
    if sync is not None:
      train_op, hook = sync.train_op(
          spec.train_op, tf.compat.v1.train.get_global_step(graph),
          self._config.is_chief)
      spec = spec._replace(train_op=train_op,
                           training_hooks=tuple(spec.training_hooks) + (hook,))
    if spec.scaffold.saver is None:
      spec = spec._replace(scaffold=checkpoints.saver_at_finalize(
          spec.scaffold, graph, checkpoint_path, self._config,
          built.checkpoint_names,
          [position.saveable for position in positions],
          self._checkpoint_alias))
    if self._warm_start_settings and not checkpoint_path:
      tf.compat.v1.logging.info('Warm-starting with WarmStartSettings: %s' %
                                (self._warm_start_settings,))
      tf.compat.v1.train.warm_start(*self._warm_start_settings)
    return built._replace(spec=spec), input_hooks, bool(positions)

  def _checkpoint_alias(self, name):
    """The name another writer of this model's checkpoints gave variable
    `name`, or None: an Estimator's checkpoints are its own."""
    del name
    return None

  def _build_mode_graph(self, mode, inputs, sync, eval_steps):
    """Builds `mode`'s model on `inputs` (an `input_fn.Input`); returns its
    `BuiltGraph`.

    `sync`: the `distributed.SyncReplicas` of synchronous training, or None;
    `eval_steps`: `evaluate`'s steps.  Here: the model_fn once, as Estimator.
    """
    del sync, eval_steps
    features, labels = inputs.next_batch()
    return model_fn_lib.BuiltGraph(model_fn_lib.to_estimator_spec(
        self._call_model_fn(features, labels, mode, self.config,
                            copy.deepcopy(self._params))))

  @contextlib.contextmanager
  def _cluster_training(self, mode):
    """Around the TRAIN model in a ps cluster: yields the `SyncReplicas` of
    synchronous training, else None."""
    if (mode != ModeKeys.TRAIN or
        not distributed.is_parameter_server_cluster(self._config) or
        not run_config.synchronous(self._config)):
      yield None
      return
    sync = distributed.SyncReplicas(self._config.num_worker_replicas,
                                    self._config.global_id_in_cluster)
    with sync.building():
      yield sync

  def _call_input_fn(self, input_fn, mode):
    """Calls input_fn on the CPU; returns its `input_fn.Input`."""
    return self._invoke_input_fn(input_fn, mode, self._input_fn_params(mode))

  def _invoke_input_fn(self, input_fn, mode, params, keep_labels=False):
    """One call of input_fn, given `params` if it takes them; its `Input`,
    whose labels are dropped in PREDICT unless `keep_labels`."""
    args = internals.fn_args(input_fn)
    kwargs = {}
    if 'params' in args:
      kwargs['params'] = params
    if 'config' in args:
      kwargs['config'] = self.config
    if 'mode' in args:
      kwargs['mode'] = mode
    if 'input_context' in args:
      kwargs['input_context'] = (
          distributed.input_context(self._config)
          if distributed.is_parameter_server_cluster(self._config) else None)
    with tf.compat.v1.device('/device:CPU:0'):
      result = input_fn(**kwargs)
    inputs = input_fn_lib.parse_input_fn_result(result)
    if mode == ModeKeys.PREDICT:
      self._validate_features_in_predict_input(result)
      if not keep_labels:  # labels, if any, are not the model's
        return inputs._replace(
            next_batch=lambda: (inputs.next_batch()[0], None))
    return inputs

  def _validate_features_in_predict_input(self, result):
    """TF's warning for a prediction input that never ends."""
    if not input_fn_lib.reads_dataset_or_queue(result):
      tf.compat.v1.logging.warning(
          'Input graph does not use tf.data.Dataset or contain a '
          'QueueRunner. That means predict yields forever. '
          'This is probably a mistake.')

  def _input_fn_params(self, mode):
    """The `params` input_fn gets in `mode`: a copy of the estimator's."""
    del mode
    return copy.deepcopy(self._params)

  def _call_model_fn(self, features, labels, mode, config, params):
    """Calls model_fn with the arguments it declares; returns its result."""
    args = internals.fn_args(self._model_fn)
    kwargs = {}
    if 'labels' in args:
      kwargs['labels'] = labels
    elif labels is not None:
      raise ValueError(
          'model_fn does not take labels, but input_fn returns labels.')
    if 'mode' in args:
      kwargs['mode'] = mode
    if 'config' in args:
      kwargs['config'] = config
    if 'params' in args:
      kwargs['params'] = params
    else:
      self._check_model_fn_without_params()
    tf.compat.v1.logging.info('Calling model_fn.')
    result = self._model_fn(features=features, **kwargs)
    tf.compat.v1.logging.info('Done calling model_fn.')
    return result

  def _check_model_fn_without_params(self):
    """Raises if the model_fn must take `params`; it need not here."""


# tensorflow_estimator's name of the v2 API's `tf.estimator.Estimator` (its
# `Estimator` is v1's; TF's tests of Estimator build `EstimatorV2`): one class
# here serves both.
EstimatorV2 = Estimator


def _write_evaluation(output_dir, checkpoint_path, results):
  """Writes an evaluation's `results` and the checkpoint it read (if any) as
  summaries to `output_dir`, as TF's Estimator does; returns `results`."""
  step = results[tf.compat.v1.GraphKeys.GLOBAL_STEP]
  _write_dict_to_summary(output_dir, results, step)
  if checkpoint_path:
    _write_checkpoint_path_to_summary(
        output_dir, checkpoints.original_path(checkpoint_path), step)
  return results


def _dict_to_str(dictionary):
  """The results as the evaluation's log line shows them."""
  return ', '.join('%s = %s' % (k, v)
                   for k, v in sorted(dictionary.items())
                   if not isinstance(v, bytes))


def _write_dict_to_summary(output_dir, dictionary, current_global_step):
  """Writes eval results as one Summary at `current_global_step`, as TF's
  Estimator does (under its name: TF's tests of the exporters and early
  stopping write evaluations with it)."""
  tf.compat.v1.logging.info('Saving dict for global step %d: %s',
                            current_global_step, _dict_to_str(dictionary))
  summary_proto = tf.compat.v1.Summary()
  for key, value in dictionary.items():
    if value is None or key == tf.compat.v1.GraphKeys.GLOBAL_STEP:
      continue
    if isinstance(value, (np.float32, float)):
      summary_proto.value.add(tag=key, simple_value=float(value))
    elif isinstance(value, (np.int64, np.int32, int)):
      summary_proto.value.add(tag=key, simple_value=int(value))
    elif isinstance(value, bytes):
      try:
        summ = tf.compat.v1.Summary.FromString(value)
      except message.DecodeError:
        tf.compat.v1.logging.warn(
            'Skipping summary for %s, cannot parse string to Summary.', key)
        continue
      for i, _ in enumerate(summ.value):
        summ.value[i].tag = '%s/%d' % (key, i)
      summary_proto.value.extend(summ.value)
    elif isinstance(value, np.ndarray):
      summary_value = summary_proto.value.add(tag=key, node_name=key)
      summary_value.tensor.CopyFrom(tf.make_tensor_proto(value))
      tf.compat.v1.logging.info(
          'Summary for np.ndarray is not visible in Tensorboard by default. '
          'Consider using a Tensorboard plugin for visualization (see '
          'https://github.com/tensorflow/tensorboard-plugin-example/blob/master'
          '/README.md for more information).')
    else:
      tf.compat.v1.logging.warn(
          'Skipping summary for %s, must be a float, np.float32, np.int64, '
          'np.int32 or int or np.ndarray or a serialized string of Summary.',
          key)
  _add_summary(output_dir, summary_proto, current_global_step)


def _write_checkpoint_path_to_summary(output_dir, checkpoint_path,
                                      current_global_step):
  """Writes the evaluated checkpoint's path as a string summary, as TF's
  Estimator does."""
  tf.compat.v1.logging.info("Saving 'checkpoint_path' summary for global step "
                            '%d: %s', current_global_step, checkpoint_path)
  summary_proto = tf.compat.v1.Summary()
  summary_proto.value.add(
      tag='checkpoint_path',
      tensor=tf.make_tensor_proto(checkpoint_path, dtype=tf.string))
  _add_summary(output_dir, summary_proto, current_global_step)


def _add_summary(output_dir, summary_proto, step):
  """Adds `summary_proto` at `step` to `output_dir`'s events, flushed (the
  writer TF's Estimator shares with the summary hooks)."""
  writer = tf.compat.v1.summary.FileWriterCache.get(output_dir)
  writer.add_summary(summary_proto, step)
  writer.flush()
