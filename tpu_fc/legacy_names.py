"""`install()`: bind the legacy TensorFlow names to tpu_fc, so legacy scripts run unchanged.

After `install()`, `tf.compat.v1.tpu.experimental.embedding_column`, the `*Parameters`
classes, `tf.compat.v1.estimator.tpu.*`, `tf.estimator.tpu.experimental.
EmbeddingConfigSpec`, `tf.estimator.ModeKeys`, ... are tpu_fc's, on TF 2.15 and on TF
versions without `tf.estimator`; so are `tf.tpu.experimental.embedding.TPUEmbedding`
and `TPUEmbeddingV0` when created outside a `TPUStrategy` (migrated TF2 scripts), and
tensorflow-recommenders' `tfrs.layers.embedding.TPUEmbedding` (`tpu_fc.tfrs`: trained on
the CPU by its embedding optimizer's TPU rules; TFRS's own under a `TPUStrategy`), bound
when the script imports TFRS (`install()` does not import it).
Estimator namespaces are replaced by namespaces that hold tpu_fc's names and defer
every other name to the namespace they replace (on TF 2.15 that is
tensorflow_estimator, imported only if the script asks for such a name).
Names a script needs around a `TPUEstimator` (`TrainSpec`, `EvalSpec`, the exporters,
`Estimator`, `RunConfig` and `EstimatorSpec` (the core ones, under `TPUEstimator`),
`WarmStartSettings`, `VocabInfo`, the session-run hooks,
`experimental.InMemoryEvaluatorHook`, `experimental.make_stop_at_checkpoint_step_hook`,
`experimental.build_raw_supervised_input_receiver_fn`, `experimental.call_logit_fn`,
`tf.compat.v1.estimator.inputs`'s `numpy_input_fn` and `pandas_input_fn`) are tpu_fc's
only where that namespace lacks them (TF 2.15's own work with tpu_fc's estimators);
`train_and_evaluate`, `add_metrics` and the early-stopping hooks
(`tf.estimator.experimental.stop_if_*_hook`) are tpu_fc's for tpu_fc's estimators and
the replaced namespace's for any other.  `uninstall()` restores everything.

`python -m tpu_fc run SCRIPT.py [ARGS...]` runs a legacy script with the names
bound (and binds them in its multiprocessing children started by spawn or
forkserver, which `install()` in the script itself does not reach).
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.abc
import multiprocessing.spawn
import os
import runpy
import sys
import types

from tpu_fc import columns
from tpu_fc import export as export_lib
from tpu_fc import optimizers
from tpu_fc import spec as spec_lib
from tpu_fc._tf import TF_VERSION
from tpu_fc._tf import tf

_LEGACY_EMBEDDING_MODULE = 'tensorflow.python.tpu.tpu_embedding'
_EXPORT_NAMES = ('ServingInputReceiver', 'TensorServingInputReceiver',
                 'build_parsing_serving_input_receiver_fn',
                 'build_raw_serving_input_receiver_fn', 'PredictOutput',
                 'ClassificationOutput', 'RegressionOutput', 'EvalOutput',
                 'ExportOutput')
# What tensorflow_estimator re-exported from TF core under `tf.estimator`.
_SESSION_RUN_HOOK_NAMES = (
    'SessionRunHook', 'SessionRunArgs', 'SessionRunContext', 'SessionRunValues',
    'LoggingTensorHook', 'StopAtStepHook', 'CheckpointSaverHook',
    'CheckpointSaverListener', 'StepCounterHook', 'SummarySaverHook',
    'NanTensorHook', 'NanLossDuringTrainingError', 'GlobalStepWaiterHook',
    'FinalOpsHook', 'FeedFnHook', 'ProfilerHook', 'SecondOrStepTimer')

# `tf.estimator`'s heads and their modules in `tpu_fc.estimator.head`, bound
# where TF has no heads (TF >= 2.16; TF 2.15's namespace keeps its own).
_HEADS = {'Head': 'base_head', 'BinaryClassHead': 'binary_class_head',
          'MultiClassHead': 'multi_class_head',
          'MultiLabelHead': 'multi_label_head',
          'RegressionHead': 'regression_head',
          'PoissonRegressionHead': 'regression_head',
          'LogisticRegressionHead': 'regression_head',
          'MultiHead': 'multi_head'}

# (owner, attribute, had it, original value), in binding order.
_bindings = []
# (name, the module it replaced or None) of what install() put into sys.modules.
_inserted_modules = []
# The finder binding tensorflow-recommenders' layer name when TFRS is imported.
_after_import = []
# The module defining tensorflow-recommenders' `TPUEmbedding` layer.
_TFRS_LAYER_MODULE = 'tensorflow_recommenders.layers.embedding.tpu_embedding_layer'
# The namespaces under an API module's `estimator` that scripts import by path
# (`inputs`: TF 1's API only).
_ESTIMATOR_SUBMODULES = ('tpu', 'tpu.experimental', 'experimental', 'export',
                         'inputs')


class _Namespace(types.ModuleType):
  """tpu_fc's names first, then those of the namespace it stands in for.

  `defaults` are tpu_fc's names that only stand in where that namespace has
  none of its own.
  """

  def __init__(self, name, names, fallback=None, defaults=None):
    super().__init__(name)
    self.__dict__.update(names)
    self.__dict__['_tpu_fc_fallback'] = fallback
    self.__dict__['_tpu_fc_defaults'] = dict(defaults or {})

  def __getattr__(self, name):
    fallback = self.__dict__['_tpu_fc_fallback']
    defaults = self.__dict__['_tpu_fc_defaults']
    target = fallback() if fallback is not None else None
    if target is not None and not name.startswith('__') and (
        name not in defaults or hasattr(target, name)):
      return getattr(target, name)
    if name in defaults:
      return defaults[name]
    provided = [k for k in self.__dict__ if not k.startswith('_')] + list(defaults)
    raise AttributeError(
        'module {!r} has no attribute {!r} (tpu_fc provides: {})'.format(
            self.__name__, name, ', '.join(sorted(provided))))


def _attribute_getter(getter, name):
  """A lazy getter of `getter().name` (None where there is none); None
  without `getter`."""
  if getter is None:
    return None

  def get():
    owner = getter()
    return getattr(owner, name, None) if owner is not None else None
  return get


def _module_getter(module):
  """A getter of `module` that loads a TF lazy loader by its module's name.

  Loading through the lazy loader itself would bind the loaded module to its
  parent's attribute, undoing `install()`'s binding there.
  """
  return lambda: importlib.import_module(module.__name__)


def _existing(owner, name):
  """`owner.name` without triggering a lazy import, or None."""
  return owner.__dict__.get(name) if hasattr(owner, '__dict__') else None


def _estimator_namespace(name, original, v1):
  """A `tf.estimator`-like namespace with tpu_fc's TPU and mode names (`v1`:
  of TF 1's API, with `inputs`)."""
  from tpu_fc import estimator  # pylint: disable=g-import-not-at-top  (the driver imports tpu_fc)
  from tpu_fc.estimator import early_stopping  # pylint: disable=g-import-not-at-top
  from tpu_fc.estimator import estimator as estimator_lib  # pylint: disable=g-import-not-at-top
  from tpu_fc.estimator import extenders  # pylint: disable=g-import-not-at-top
  from tpu_fc.estimator import hooks  # pylint: disable=g-import-not-at-top
  from tpu_fc.estimator import inputs  # pylint: disable=g-import-not-at-top
  from tpu_fc.estimator import model_fn as model_fn_lib  # pylint: disable=g-import-not-at-top
  from tpu_fc.estimator import run_config  # pylint: disable=g-import-not-at-top
  original_getter = _module_getter(original) if original is not None else None
  tpu_getter = _attribute_getter(original_getter, 'tpu')
  tpu_experimental = _Namespace(
      name + '.tpu.experimental',
      {'EmbeddingConfigSpec': spec_lib.EmbeddingConfigSpec},
      _attribute_getter(tpu_getter, 'experimental'))
  tpu = _Namespace(name + '.tpu', dict(
      TPUEstimator=estimator.TPUEstimator,
      TPUEstimatorSpec=estimator.TPUEstimatorSpec,
      RunConfig=estimator.RunConfig,
      TPUConfig=estimator.TPUConfig,
      InputPipelineConfig=estimator.InputPipelineConfig,
      experimental=tpu_experimental), tpu_getter)
  export = _Namespace(name + '.export', {
      n: getattr(export_lib, n) for n in _EXPORT_NAMES},
                      _attribute_getter(original_getter, 'export'))
  experimental_getter = _attribute_getter(original_getter, 'experimental')
  names = dict(
      tpu=tpu, export=export, ModeKeys=estimator.ModeKeys,
      experimental=_Namespace(name + '.experimental', {
          hook.__name__: _for_tpu_fc_estimators(hook, experimental_getter)
          for hook in early_stopping.TF_EXPERIMENTAL_FUNCTIONS},
                              experimental_getter, dict(
          InMemoryEvaluatorHook=hooks.InMemoryEvaluatorHook,
          make_stop_at_checkpoint_step_hook=(
              hooks.make_stop_at_checkpoint_step_hook),
          build_raw_supervised_input_receiver_fn=(
              export_lib.build_raw_supervised_input_receiver_fn),
          call_logit_fn=model_fn_lib.call_logit_fn)),
      train_and_evaluate=_for_tpu_fc_estimators(
          estimator.train_and_evaluate, original_getter),
      add_metrics=_for_tpu_fc_estimators(extenders.add_metrics,
                                         original_getter))
  if TF_VERSION >= (2, 16):
    names.update({head: getattr(importlib.import_module(
        'tpu_fc.estimator.head.' + module), head)
                  for head, module in _HEADS.items()})
  if v1:
    names['inputs'] = _Namespace(
        name + '.inputs', {}, _attribute_getter(original_getter, 'inputs'),
        dict(numpy_input_fn=inputs.numpy_input_fn,
             pandas_input_fn=inputs.pandas_input_fn))
  # The names TPUEstimator scripts need around it, and the core Estimator and
  # RunConfig of their CPU/GPU twins, where TF has none of its own.
  defaults = {name: getattr(tf.compat.v1.train, name)
              for name in _SESSION_RUN_HOOK_NAMES}
  defaults.update(
      TrainSpec=estimator.TrainSpec, EvalSpec=estimator.EvalSpec,
      Exporter=estimator.Exporter, LatestExporter=estimator.LatestExporter,
      FinalExporter=estimator.FinalExporter,
      BestExporter=estimator.BestExporter, RunConfig=run_config.RunConfig,
      Estimator=estimator_lib.Estimator,
      EstimatorSpec=estimator.EstimatorSpec,
      WarmStartSettings=estimator_lib.WarmStartSettings,
      VocabInfo=tf.compat.v1.train.VocabInfo)
  return _Namespace(name, names, original_getter, defaults)


def _for_tpu_fc_estimators(function, original_getter):
  """`function` for tpu_fc's `TPUEstimator`, the namespace's own for any other.

  TF's own (`train_and_evaluate`, the early-stopping hooks) accept only its own
  estimators, tpu_fc's only tpu_fc's; where TF has none, tpu_fc's explains that.
  """
  from tpu_fc.estimator import estimator as estimator_lib  # pylint: disable=g-import-not-at-top

  @functools.wraps(function)
  def dispatch(estimator, *args, **kwargs):
    original = original_getter() if original_getter else None
    if original is not None and not isinstance(estimator,
                                               estimator_lib.Estimator):
      return getattr(original, function.__name__)(estimator, *args, **kwargs)
    return function(estimator, *args, **kwargs)

  return dispatch


def _api_modules():
  """Every TF API module that has (or had) an `estimator` namespace.

  `tf`, `tf.compat.v2`, `tf.compat.v1` and `tf.compat.v1.compat.v2` are distinct
  module objects, each with its own `estimator` attribute.
  """
  modules = (tf, tf.compat.v1, tf.compat.v2, tf.compat.v1.compat.v2,
             tf.compat.v2.compat.v1)
  return list({id(m): m for m in modules}.values())


def _mid_level_modules():
  """Every TF API module `tpu.experimental.embedding` (distinct per API)."""
  modules = [api.tpu.experimental.embedding for api in _api_modules()
             if hasattr(getattr(getattr(api, 'tpu', None), 'experimental',
                                None), 'embedding')]
  return list({id(m): m for m in modules}.values())


def _bind(owner, name, value):
  had = name in owner.__dict__
  _bindings.append((owner, name, had, owner.__dict__.get(name)))
  setattr(owner, name, value)


def _legacy_embedding_module():
  """Stand-in for `tensorflow.python.tpu.tpu_embedding` where TF no longer has it."""
  module = types.ModuleType(_LEGACY_EMBEDDING_MODULE,
                            'tpu_fc stand-in for the removed legacy module.')
  for cls in optimizers.ALL_OPTIMIZERS:
    setattr(module, cls.__name__, cls)
  module.TableConfig = spec_lib.TableConfig
  module.FeatureConfig = spec_lib.FeatureConfig
  return module


def install() -> None:
  """Binds the legacy names to tpu_fc; calling it again changes nothing.

  Call it before the script reads the names: a name bound to a variable
  earlier (`from tensorflow.compat.v1.estimator.tpu import TPUEstimator`)
  keeps TF's object.  It binds `tf.compat.v1.tpu.experimental`'s
  `embedding_column`, `shared_embedding_columns` and ten `*Parameters`; in
  every TF API module (`tf`, `tf.compat.v1`, `tf.compat.v2`) an `estimator`
  namespace (with `tpu`, `tpu.experimental.EmbeddingConfigSpec`, `export`,
  `experimental`, `ModeKeys`, `train_and_evaluate`, ...; where TF has none,
  also the core `Estimator`, `RunConfig` and `EstimatorSpec`; see the module
  doc), also importable by path (`import
  tensorflow.estimator.tpu`), and `tpu.experimental.embedding.TPUEmbedding`
  and `TPUEmbeddingV0` (tpu_fc's outside a `TPUStrategy`, TF's under one);
  where TF has no `tensorflow.python.tpu.tpu_embedding` (TF >= 2.16), a
  stand-in module with the `*Parameters`, `TableConfig` and `FeatureConfig`;
  on TF >= 2.16 the heads in the estimator namespaces (`Head`,
  `BinaryClassHead`, ..., `MultiHead`: `tpu_fc.estimator.head`); and
  tensorflow-recommenders' `TPUEmbedding` layer, wherever TFRS's modules
  hold it, to `tpu_fc.tfrs.TPUEmbedding`: now if TFRS is loaded, else when
  it is imported.  Loads TensorFlow (not TFRS).
  """
  if _bindings:
    return
  experimental = tf.compat.v1.tpu.experimental
  _bind(experimental, 'embedding_column', columns.embedding_column)
  _bind(experimental, 'shared_embedding_columns',
        columns.shared_embedding_columns)
  for cls in optimizers.ALL_OPTIMIZERS:
    _bind(experimental, cls.__name__, cls)
  v1_apis = {id(tf.compat.v1), id(tf.compat.v2.compat.v1)}
  for api in _api_modules():
    _bind(api, 'estimator', _estimator_namespace(
        api.__name__ + '.estimator', _existing(api, 'estimator'),
        v1=id(api) in v1_apis))
  from tpu_fc import mid_level  # pylint: disable=g-import-not-at-top  (needs the engine)
  classes = mid_level.installable_classes()
  for module in _mid_level_modules():
    for name, cls in classes.items():
      _bind(module, name, cls)
  for path, api in (('tensorflow', tf), ('tensorflow.compat.v1', tf.compat.v1),
                    ('tensorflow.compat.v2', tf.compat.v2)):
    _insert_module(path + '.estimator', api.estimator)
    for submodule in _ESTIMATOR_SUBMODULES:
      if submodule.split('.')[0] in api.estimator.__dict__:
        _insert_module('{}.estimator.{}'.format(path, submodule),
                       functools.reduce(getattr, submodule.split('.'),
                                        api.estimator))
  try:
    importlib.import_module(_LEGACY_EMBEDDING_MODULE)
  except ImportError:
    module = _legacy_embedding_module()
    _bind(sys.modules['tensorflow.python.tpu'], 'tpu_embedding', module)
    _insert_module(_LEGACY_EMBEDDING_MODULE, module)
  if _TFRS_LAYER_MODULE in sys.modules:
    _bind_tfrs_layer()
  else:  # TFRS, if installed, loads only when the script imports it
    _after_import.append(_AfterImport(_TFRS_LAYER_MODULE, _bind_tfrs_layer))
    sys.meta_path.insert(0, _after_import[-1])


class _AfterImport(importlib.abc.MetaPathFinder):
  """Runs `then()` right after module `name` is first executed, before any
  other module can import a name from it (its loader, found by the other
  finders, is wrapped)."""

  def __init__(self, name, then):
    self._name = name
    self._then = then

  def find_spec(self, fullname, path, target=None):
    if fullname != self._name:
      return None
    for finder in sys.meta_path:
      spec = (None if finder is self or not hasattr(finder, 'find_spec')
              else finder.find_spec(fullname, path, target))
      if spec is not None and spec.loader is not None:
        spec.loader = _ThenLoader(spec.loader, self._then)
        return spec
    return None


class _ThenLoader(importlib.abc.Loader):
  """`loader`, running `then()` after it executed a module."""

  def __init__(self, loader, then):
    self._loader = loader
    self._then = then

  def create_module(self, spec):
    return self._loader.create_module(spec)

  def exec_module(self, module):
    self._loader.exec_module(module)
    self._then()

  def __getattr__(self, name):  # get_source, ... for tracebacks
    return getattr(self._loader, name)


def _bind_tfrs_layer():
  from tpu_fc import tfrs  # pylint: disable=g-import-not-at-top  (imports TFRS)
  tfrs.bind_layer_names()


def _insert_module(name, module):
  """`sys.modules[name] = module`, undone by `uninstall()`: an import by that
  path (`from tensorflow.estimator.experimental import ...`) gets tpu_fc's
  namespace, not TF's module (which the import would bind over tpu_fc's)."""
  _inserted_modules.append((name, sys.modules.get(name)))
  sys.modules[name] = module


def uninstall() -> None:
  """Restores every name `install()` bound, and the modules it put in
  `sys.modules`; without an `install()` before, changes nothing."""
  while _after_import:
    sys.meta_path.remove(_after_import.pop())
  if _bindings and _TFRS_LAYER_MODULE in sys.modules:
    from tpu_fc import tfrs  # pylint: disable=g-import-not-at-top
    tfrs.unbind_layer_names()
  while _bindings:
    owner, name, had, original = _bindings.pop()
    if had:
      setattr(owner, name, original)
    else:
      delattr(owner, name)
  while _inserted_modules:
    name, replaced = _inserted_modules.pop()
    if replaced is None:
      del sys.modules[name]
    else:
      sys.modules[name] = replaced


def is_installed() -> bool:
  return bool(_bindings)


@contextlib.contextmanager
def installed():
  """The legacy names bound inside the block; left bound if they already were."""
  already = is_installed()
  install()
  try:
    yield
  finally:
    if not already:
      uninstall()


def run_script(path, run_name):
  """Runs the script at `path` as module `run_name`; returns its globals.

  As `python path` would: the script's folder first on `sys.path`, so files next
  to it import.  Only a `run_name` of '__main__' runs its `if __name__ ==
  '__main__'` block; multiprocessing children of such a run bind the legacy
  names too (`_children_bind_legacy_names`).
  """
  script = os.path.abspath(path)
  sys.path.insert(0, os.path.dirname(script))
  if run_name != '__main__':
    return runpy.run_path(script, run_name=run_name)
  with _children_bind_legacy_names(script):
    return runpy.run_path(script, run_name=run_name)


def spec_from_reference(reference):
  """`MODULE:ATTR` or `path/to/file.py:ATTR` -> the EmbeddingConfigSpec it names.

  ATTR may be a spec or a zero-argument callable returning one.  The file or
  module is loaded as `tpu-fc run` runs a script -- legacy names bound, its
  folder on `sys.path` -- except that its `__main__` block does not run.
  """
  module_name, _, attribute = reference.rpartition(':')
  if not module_name or not attribute:
    raise ValueError('--spec must be MODULE:ATTR or FILE.py:ATTR, got {!r}.'.format(
        reference))
  with installed():
    if module_name.endswith('.py'):
      if not os.path.isfile(module_name):
        raise ValueError('--spec {}: no such file {} (relative paths start at '
                         '{}).'.format(reference, module_name, os.getcwd()))
      namespace = run_script(module_name, run_name='__tpu_fc_spec__')
    else:
      if os.getcwd() not in sys.path:  # as `python -m` has it; `tpu-fc` not
        sys.path.insert(0, os.getcwd())
      try:
        namespace = vars(importlib.import_module(module_name))
      except ImportError as error:
        raise ValueError('--spec {}: cannot import {} ({}; relative module '
                         'paths start at {}).'.format(
                             reference, module_name, error, os.getcwd())) from error
    if attribute not in namespace:
      raise ValueError('{} has no attribute {!r}.'.format(module_name,
                                                          attribute))
    spec = namespace[attribute]
    if callable(spec) and not isinstance(spec, spec_lib.EmbeddingConfigSpec):
      spec = spec()
  if not isinstance(spec, spec_lib.EmbeddingConfigSpec):
    raise ValueError('{} is a {}, not an EmbeddingConfigSpec.'.format(
        reference, type(spec).__name__))
  return spec


# The script a `tpu-fc run` runs, for its multiprocessing children.
RUN_SCRIPT_ENV = 'TPU_FC_RUN_SCRIPT'


@contextlib.contextmanager
def _children_bind_legacy_names(script):
  """Children started by spawn or forkserver run the main script again, from
  its path: they run `tpu_fc._spawned_script` instead, which binds the legacy
  names first (a fork child inherits them)."""
  original = multiprocessing.spawn.get_preparation_data

  def preparation_data(name):
    data = original(name)
    if data.get('init_main_from_path') == script:
      del data['init_main_from_path']
      data['init_main_from_name'] = 'tpu_fc._spawned_script'
    return data

  os.environ[RUN_SCRIPT_ENV] = script
  multiprocessing.spawn.get_preparation_data = preparation_data
  try:
    yield
  finally:
    multiprocessing.spawn.get_preparation_data = original
