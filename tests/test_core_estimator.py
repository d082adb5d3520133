"""The core `Estimator` and its `RunConfig` (`tpu_fc.estimator.estimator`,
`run_config`): what `TPUEstimator` is built on, and what a TPUEstimator
script's CPU/GPU twin runs where TF has no `tf.estimator`.  Expectations are
derived by hand; on the legacy lane TF 2.15's own classes must meet them too
(`lanes.DRIVERS`)."""
import collections
import functools
import glob
import itertools
import json
import os
import re
import sys

import numpy as np
import pytest

from tpu_fc import cluster
from tpu_fc import export
from tpu_fc import local_network
from tpu_fc._tf import tf

from harness import inputs
from harness import lanes
from harness import models
from harness import scripts

pytestmark = pytest.mark.filterwarnings(
    'ignore:`tf.layers.dense` is deprecated')

def _config_of_a_subclass(driver, model_dir, is_chief):
  """A RunConfig subclass with state of its own, as TF's early-stopping
  tests write one, and an attribute set on the instance."""

  class ChiefOrNotConfig(driver.RunConfig):

    def __init__(self):
      super().__init__(model_dir=model_dir)
      self._is_chief = is_chief

    @property
    def is_chief(self):
      return self._is_chief

  config = ChiefOrNotConfig()
  config.i_am_test = True
  return config


@pytest.mark.parametrize('name', lanes.DRIVERS)
@pytest.mark.parametrize('is_chief', [True, False], ids=['chief', 'not_chief'])
def test_a_run_config_keeps_its_subclass_state_and_attributes(name, is_chief,
                                                              tmp_path):
  """`replace`, `Estimator.config` and the model_fn's config are copies of
  the subclass with its attributes (TF deep-copies), so the early-stopping
  hooks read `is_chief` from it: the chief's decides, another task's waits
  for its signal."""
  driver = lanes.core_driver(name)
  config = _config_of_a_subclass(driver, str(tmp_path), is_chief)
  received = []
  estimator = driver.Estimator(models.core_model_fn(driver, received.append),
                               config=config)
  replaced = config.replace(save_summary_steps=7)
  copies = [replaced, estimator.config]
  if is_chief:  # (another task's session would wait for the chief's)
    estimator.train(inputs.ones_x, steps=1)
    copies.append(received[0])
  for copy in copies:
    assert type(copy).__name__ == 'ChiefOrNotConfig'
    assert (copy.is_chief, copy.i_am_test, copy.model_dir) == (
        is_chief, True, str(tmp_path))
  assert (replaced.save_summary_steps, config.save_summary_steps) == (7, 100)
  assert replaced is not config and estimator.config is not estimator.config
  hook = driver.stop_if_no_decrease_hook(estimator, 'loss', 10)
  assert type(hook).__name__ == ('_StopOnPredicateHook' if is_chief
                                 else '_CheckForStoppingHook')


@pytest.mark.legacy_only
def test_tf_2_15s_run_config_serves_tpu_fcs_estimator(tmp_path):
  """On TF 2.15 `install()` leaves `tf.estimator.RunConfig` TF's: tpu_fc's
  core Estimator takes it, a subclass with its state too, as TF's does."""
  ours = lanes.core_driver('tpu_fc')
  config = _config_of_a_subclass(lanes.core_driver('tf'), str(tmp_path), True)
  received = []
  estimator = ours.Estimator(models.core_model_fn(ours, received.append),
                             config=config)
  estimator.train(inputs.ones_x, steps=1)
  assert type(received[0]).__name__ == 'ChiefOrNotConfig'
  assert received[0].i_am_test
  assert estimator.evaluate(inputs.ones_x, steps=1)['global_step'] == 1
  assert type(ours.stop_if_no_decrease_hook(estimator, 'loss', 10)).__name__ == (
      '_StopOnPredicateHook')


@pytest.mark.parametrize('name', lanes.DRIVERS)
def test_training_logs_the_loss_step_and_step_rate(name, tmp_path, tf_log):
  """Every `log_step_count_steps` steps; a TPUEstimator logs its own way."""
  driver = lanes.core_driver(name)
  estimator = driver.Estimator(
      models.core_model_fn(driver),
      config=driver.RunConfig(model_dir=str(tmp_path), log_step_count_steps=2))
  estimator.train(lambda: inputs.ones_x().repeat(), steps=5)
  logged = [re.sub(r'\d[\d.]*(e[-+]?\d+)?', 'N', message) for message in tf_log
            if re.match(r'loss = |global_step/sec', message)]
  assert logged == ['loss = N, step = N', 'global_step/sec: N',
                    'loss = N, step = N (N sec)', 'global_step/sec: N',
                    'loss = N, step = N (N sec)']


# TF_CONFIG -> (service, master, evaluation_master, device filters) of the
# core RunConfig, then of the TPU's, which copies master into an unset
# evaluation_master (outside an evaluator) and sets no device filters.
CLUSTER = {'chief': ['host0:2222'], 'worker': ['host1:2222']}
SETTINGS = [
    (None, (None, '', '', None), (None, '', '', None)),
    ({'service': {'tpu_worker_job_name': 'w'}},
     ({'tpu_worker_job_name': 'w'}, '', '', None),
     ({'tpu_worker_job_name': 'w'}, '', '', None)),
    ({'session_master': 'grpc://m:1'},
     (None, 'grpc://m:1', '', None), (None, 'grpc://m:1', 'grpc://m:1', None)),
    ({'eval_session_master': 'grpc://e:1'},
     (None, '', 'grpc://e:1', None), (None, '', 'grpc://e:1', None)),
    ({'cluster': CLUSTER, 'task': {'type': 'worker', 'index': 0}},
     (None, 'grpc://host1:2222', '', ['/job:ps', '/job:worker/task:0']),
     (None, 'grpc://host1:2222', 'grpc://host1:2222', None)),
    ({'cluster': CLUSTER, 'task': {'type': 'evaluator', 'index': 0},
      'eval_session_master': 'grpc://e:1'},
     (None, '', 'grpc://e:1', None), (None, '', 'grpc://e:1', None)),
]


@pytest.mark.parametrize('name', lanes.DRIVERS)
@pytest.mark.parametrize('tf_config,core,tpu', SETTINGS,
                         ids=['local', 'service', 'session_master',
                              'eval_session_master', 'worker', 'evaluator'])
def test_service_master_and_evaluation_master_from_tf_config(
    monkeypatch, name, tf_config, core, tpu):
  if tf_config is None:
    monkeypatch.delenv('TF_CONFIG', raising=False)
  else:
    monkeypatch.setenv('TF_CONFIG', json.dumps(tf_config))
  driver = lanes.core_driver(name)

  def settings(config):
    return (config.service, config.master, config.evaluation_master,
            list(config.session_config.device_filters)
            if config.session_config else None)

  assert settings(driver.RunConfig()) == core
  assert settings(driver.TPURunConfig()) == tpu


@pytest.mark.parametrize('name', lanes.DRIVERS)
@pytest.mark.parametrize('tf_config,error', [
    ({'task': {'type': 'ps', 'index': 0}}, (
        ValueError, 'If "cluster" is not set in TF_CONFIG, task type must be '
        'WORKER.')),
    ({'task': {'type': 'worker', 'index': 1}}, (
        ValueError, 'If "cluster" is not set in TF_CONFIG, task index must '
        'be 0.')),
    ({'service': 789}, (
        TypeError, 'If "service" is set in TF_CONFIG, it must be a dict. '
        "Given <class 'int'>")),
], ids=['local_ps', 'local_index', 'service'])
def test_tf_config_errors(monkeypatch, name, tf_config, error):
  monkeypatch.setenv('TF_CONFIG', json.dumps(tf_config))
  driver = lanes.core_driver(name)
  for run_config_class in (driver.RunConfig, driver.TPURunConfig):
    assert _constructed(run_config_class) == error


def _place_on_cpu(op):
  del op
  return '/cpu:0'


def _place_keyword_only(*, op):
  del op
  return '/cpu:0'


def _place_on(device, op):
  del op
  return device


# TF's rule: `device_fn`'s positional arguments, those a partial binds
# excepted, are exactly ('op',).
DEVICE_FNS = {
    'one_op': (_place_on_cpu, 'constructed'),
    'partial': (functools.partial(_place_on, '/cpu:0'), 'constructed'),
    'lambda': (lambda op: '/cpu:0', 'constructed'),
    'keyword_only_op': (_place_keyword_only, 'refused'),
    'other_name': (lambda operation: '/cpu:0', 'refused'),
    'two_arguments': (_place_on, 'refused'),
    'not_callable': ('/cpu:0', 'refused'),
}


@pytest.mark.parametrize('name', lanes.DRIVERS)
@pytest.mark.parametrize('case', sorted(DEVICE_FNS))
def test_device_fn_must_take_exactly_op(name, case):
  device_fn, expected = DEVICE_FNS[case]
  outcome = _constructed(
      lambda: lanes.core_driver(name).RunConfig(device_fn=device_fn))
  assert outcome == expected if expected == 'constructed' else outcome == (
      ValueError, 'device_fn must be callable with exactly one argument "op".')


def _overriding(base, member, class_name='Overriding'):
  """A subclass of `base` defining `member` (same qualified name for tpu_fc's
  and TF's bases, so their errors read alike)."""
  def method(self, *args, **kwargs):
    del self, args, kwargs
  return type(class_name, (base,), {member: method,
                                    '__module__': __name__})


def _constructed(make):
  try:
    make()
  except (TypeError, ValueError) as error:
    return type(error), str(error)
  return 'constructed'


REFUSED = ("Subclasses of Estimator cannot override members of Estimator. "
           "<class '{}.Overriding'> does override ['{}']")
CONSTRUCTION = {
    'no_model_fn': (
        lambda d, m: d.Estimator(model_fn=None, model_dir=m),
        (ValueError, 'model_fn must be provided to Estimator.')),
    'config_checked_before_model_fn': (
        lambda d, m: d.Estimator(model_fn=None, config='NotARunConfig'),
        (ValueError, 'config must be an instance of `RunConfig`, but '
         'provided NotARunConfig.')),
    'overrides_predict': (
        lambda d, m: _overriding(d.Estimator, 'predict')(
            models.core_model_fn(d), model_dir=m),
        (ValueError, REFUSED.format(__name__, 'predict'))),
    'overrides_a_private_member': (
        lambda d, m: _overriding(d.Estimator, '_call_input_fn')(
            models.core_model_fn(d), model_dir=m),
        (ValueError, REFUSED.format(__name__, '_call_input_fn'))),
    'adds_a_member': (
        lambda d, m: _overriding(d.Estimator, 'predict_proba')(
            models.core_model_fn(d), model_dir=m), 'constructed'),
    'overrides_an_allowed_member': (
        lambda d, m: _overriding(d.Estimator, 'latest_checkpoint')(
            models.core_model_fn(d), model_dir=m), 'constructed'),
    'tpu_estimator_subclass_overrides_train': (
        lambda d, m: _overriding(d.TPUEstimator, 'train')(
            lambda features, labels, mode, params: None, use_tpu=False,
            config=d.TPURunConfig(model_dir=m)),
        (ValueError, REFUSED.format(__name__, 'train'))),
    'a_class_named_tpu_estimator_is_exempt': (
        lambda d, m: _overriding(d.TPUEstimator, 'train', 'TPUEstimator')(
            lambda features, labels, mode, params: None, use_tpu=False,
            config=d.TPURunConfig(model_dir=m)), 'constructed'),
}


@pytest.mark.parametrize('name', lanes.DRIVERS)
@pytest.mark.parametrize('case', sorted(CONSTRUCTION))
def test_estimator_construction_checks_in_tfs_order_and_words(name, case,
                                                              tmp_path):
  make, expected = CONSTRUCTION[case]
  driver = lanes.core_driver(name)
  assert _constructed(lambda: make(driver, str(tmp_path))) == expected


NEVER_ENDS = ('Input graph does not use tf.data.Dataset or contain a '
              'QueueRunner. That means predict yields forever. This is '
              'probably a mistake.')


@pytest.mark.parametrize('name', lanes.DRIVERS)
def test_predict_warns_of_an_input_that_never_ends(name, tmp_path, tf_log):
  """Features computed from constants: TF's warning, and the predictions
  (model as initialized) go on; from a Dataset or its iterator: no warning.
  TPUEstimator gives none (TF's skips the check)."""
  driver = lanes.core_driver(name)
  estimator = driver.Estimator(models.core_model_fn(driver),
                               model_dir=str(tmp_path))
  input_fns = {
      'constant': lambda: {'x': tf.constant(inputs.ONES)},
      'dataset': lambda: inputs.ones_x().map(lambda x, y: x),
      'iterator': lambda: tf.compat.v1.data.make_one_shot_iterator(
          inputs.ones_x()).get_next(),
  }
  warned = {}
  for kind, input_fn in input_fns.items():
    del tf_log[:]
    assert len(list(itertools.islice(
        estimator.predict(input_fn), 5))) == (5 if kind == 'constant' else 2)
    warned[kind] = NEVER_ENDS in tf_log
  assert warned == {'constant': True, 'dataset': False, 'iterator': False}
  del tf_log[:]

  def tpu_model_fn(features, labels, mode, params):
    del labels, params
    return driver.EstimatorSpec(mode, predictions={'x': features['x']})

  tpu_estimator = driver.TPUEstimator(
      tpu_model_fn, use_tpu=False,
      config=driver.TPURunConfig(model_dir=str(tmp_path / 'tpu')))
  next(tpu_estimator.predict(lambda params: input_fns['constant']()))
  assert NEVER_ENDS not in tf_log


@pytest.mark.parametrize('name', lanes.DRIVERS)
def test_features_by_int_and_str_keys_train_and_evaluate(name, tmp_path):
  """Features may be a dict by int and str keys (TF's receivers take them),
  which `tf.nest` cannot order: training and evaluation read them as given
  (the metric: the mean of max(features['a'], features[42]) = (43 + 50) / 2).
  """
  driver = lanes.core_driver(name)

  def model_fn(features, labels, mode):
    del labels
    highest = tf.math.maximum(features['a'], features[42])
    return driver.EstimatorSpec(
        mode, loss=tf.constant(1.), train_op=tf.compat.v1.assign_add(
            tf.compat.v1.train.get_global_step(), 1),
        eval_metric_ops={'highest': tf.compat.v1.metrics.mean(highest)})

  def input_fn():
    return {'a': tf.constant([1., 50.]), 42: tf.constant([43., 2.])}, None

  estimator = driver.Estimator(model_fn, model_dir=str(tmp_path))
  estimator.train(input_fn, steps=1)
  assert estimator.evaluate(input_fn, steps=1) == {
      'highest': 46.5, 'loss': 1.0, 'global_step': 1}


@pytest.mark.parametrize('name', lanes.DRIVERS)
def test_an_export_places_softly_as_the_sessions_config_says(name, tmp_path):
  """The export restores the checkpoint in a session of the estimator's
  config: by default soft placement, so a model with an op pinned to a GPU
  the machine lacks exports (and serves the trained value, 1 + 2)."""
  driver = lanes.core_driver(name)

  def model_fn(features, labels, mode):
    del labels
    step = tf.compat.v1.train.get_global_step()
    with tf.device('/device:GPU:99'):
      pinned = tf.cast(step, tf.float32) + 2.
    prediction = features['x'][:, 0] * 0. + pinned
    return driver.EstimatorSpec(
        mode, predictions={'y': prediction}, loss=tf.constant(1.),
        train_op=tf.compat.v1.assign_add(step, 1))

  estimator = driver.Estimator(model_fn, model_dir=str(tmp_path / 'model'))
  estimator.train(inputs.ones_x, steps=1)
  export_dir = estimator.export_saved_model(
      str(tmp_path / 'export'), export.build_raw_serving_input_receiver_fn(
          {'x': tf.constant(inputs.ONES)}))
  served = tf.saved_model.load(export_dir).signatures['serving_default'](
      x=tf.constant(inputs.ONES))
  assert served['y'].numpy().tolist() == [3., 3.]


def test_a_variable_of_another_shape_fails_its_restore_as_tf_s(tmp_path):
  """A model whose variable changed shape since the checkpoint (a scalar
  then [1]) fails to restore with TF's error and words, as TF 2.15's
  Estimator does with TF1 behaviour (its own test); with TF2's, TF's restores
  the scalar silently (docs/bad_input.md)."""
  driver = lanes.core_driver('tpu_fc')

  def model_fn_of(value):
    def model_fn(features, labels, mode):
      del features, labels
      tf.Variable(value, name='weight')
      return driver.EstimatorSpec(mode, loss=tf.constant(0.),
                                  train_op=tf.compat.v1.assign_add(
                                      tf.compat.v1.train.get_global_step(), 1))
    return model_fn

  driver.Estimator(model_fn_of(1.), model_dir=str(tmp_path)).train(
      inputs.ones_x, steps=1)
  with pytest.raises(tf.errors.InvalidArgumentError,
                     match='Restoring from checkpoint failed.*a mismatch '
                     'between the current graph and the graph from the '
                     'checkpoint'):
    driver.Estimator(model_fn_of([1.]), model_dir=str(tmp_path)).train(
        inputs.ones_x, steps=1)


@pytest.mark.subprocess
@pytest.mark.parametrize('name', lanes.DRIVERS)
def test_with_a_master_and_workers_worker_0_alone_writes_summaries(
    name, tmp_path):
  """TF's rule for the legacy `master` layout (the master also evaluates):
  summaries and step rates come from worker 0 alone, not from the master
  (the chief) nor from another worker.  A ps, a master and 2 workers in one
  process (tests/scripts/master_worker_summaries.py), each task training 5
  steps in turn, in a network namespace of their own."""
  holder = local_network.holder()
  if holder.pid is None:
    pytest.skip('no network namespace on this machine: ' + holder.reason)
  try:
    run = scripts.run(local_network.task_command(
        [sys.executable, os.path.join(scripts.SCRIPTS,
                                      'master_worker_summaries.py'),
         name, str(tmp_path)], holder.pid), env=scripts.env())
  finally:
    holder.stop()
  assert run.returncode == 0, run.stderr[-3000:]
  assert json.loads(run.stdout.splitlines()[-1]) == {
      'master 0': [], 'worker 0': ['global_step/sec', 'loss'],
      'worker 1': []}


def _listens(port):
  """Whether a socket of this network namespace listens on `port`."""
  for path in ('/proc/net/tcp', '/proc/net/tcp6'):
    with open(path) as table:
      for line in table.readlines()[1:]:
        local_address, state = line.split()[1], line.split()[3]
        if state == '0A' and int(local_address.rsplit(':', 1)[1], 16) == port:
          return True
  return False


class _NoSession(tf.compat.v1.train.SessionRunHook):
  """Stops the run before its session is created."""

  def begin(self):
    raise RuntimeError('no session for this run')


@pytest.mark.parametrize('name', lanes.DRIVERS)
def test_a_cluster_task_reaches_the_cluster_only_through_its_session(
    name, tmp_path, monkeypatch):
  """Whatever creates the session decides whether the task reaches its
  cluster (TF's own tests replace `MonitoredTrainingSession`): TF's Estimator
  starts no server; tpu_fc's starts the task's as the session is created,
  after every hook's `begin`, so a run stopped before starts none."""
  driver = lanes.core_driver(name)
  spec = cluster.cluster_spec(num_ps=1, num_workers=1)
  monkeypatch.setenv('TF_CONFIG', json.dumps(
      {'cluster': spec, 'task': {'type': 'chief', 'index': 0}}))
  estimator = driver.Estimator(models.core_model_fn(driver),
                               config=driver.RunConfig(model_dir=str(tmp_path)))
  for run in (lambda: estimator.train(inputs.ones_x, hooks=[_NoSession()],
                                      steps=1),
              lambda: estimator.evaluate(inputs.ones_x, hooks=[_NoSession()]),
              lambda: next(estimator.predict(inputs.ones_x,
                                             hooks=[_NoSession()]))):
    with pytest.raises(RuntimeError, match='no session for this run'):
      run()
  assert not _listens(int(spec['chief'][0].rsplit(':', 1)[1]))


@pytest.mark.parametrize('name', lanes.DRIVERS)
def test_the_estimator_modules_v2_name_is_the_v2_apis_estimator(name):
  """`EstimatorV2`, the name TF's module gives `tf.estimator.Estimator` (and
  TF's tests of Estimator build it by), is tpu_fc's one Estimator."""
  assert (lanes.core_module(name, 'estimator').EstimatorV2 is
          lanes.core_driver(name).Estimator)


@pytest.mark.parametrize('name', lanes.DRIVERS)
def test_an_estimator_keeps_its_session_config_where_tf_s_does(name,
                                                               tmp_path):
  """`_session_config` (TF's Estimator's, which subclasses and TF's tests
  read): the given config's, else soft placement and one Grappler round."""
  driver = lanes.core_driver(name)
  default = tf.compat.v1.ConfigProto(allow_soft_placement=True)
  rewrite_options = default.graph_options.rewrite_options
  rewrite_options.meta_optimizer_iterations = type(rewrite_options).ONE
  given = tf.compat.v1.ConfigProto(log_device_placement=True)
  for config, want in ((driver.RunConfig(), default),
                       (driver.RunConfig(session_config=given), given)):
    estimator = driver.Estimator(models.core_model_fn(driver), config=config,
                                 model_dir=str(tmp_path))
    assert estimator._session_config == want  # pylint: disable=protected-access


@pytest.mark.parametrize('name', lanes.DRIVERS)
def test_call_logit_fn_passes_what_the_logit_fn_takes(name):
  """`call_logit_fn` (tf.estimator.experimental's): the features always, the
  mode, params and config where the logit_fn names them; its logits a Tensor
  or a dict of Tensors by string, else a ValueError."""
  module = lanes.core_module(name, 'model_fn')
  received = []

  def logit_fn(features, params, mode):
    received.append((sorted(features), params, mode))
    return {'head': features['x']}

  with tf.Graph().as_default():
    x = tf.constant([[1.0]])
    logits = module.call_logit_fn(logit_fn, {'x': x}, 'train', {'p': 1},
                                  'the config')
    assert logits == {'head': x}
    assert received == [(['x'], {'p': 1}, 'train')]
    assert module.call_logit_fn(lambda features: x, {}, 'eval', None,
                                None) is x
    for bad in ([x], {1: x}, {'head': 1.0}):
      with pytest.raises(ValueError, match='logit_fn should return a Tensor '
                         'or a dictionary mapping strings to Tensors'):
        module.call_logit_fn(lambda features, bad=bad: bad, {}, 'eval', None,
                             None)


def _evaluation_summaries(eval_dir):
  """{step: {tag: value}} of the scalar summaries in `eval_dir`."""
  tf.compat.v1.summary.FileWriterCache.clear()
  written = collections.defaultdict(dict)
  for path in glob.glob(os.path.join(eval_dir, 'events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        written[event.step][value.tag] = value.simple_value
  return dict(written)


@pytest.mark.parametrize('name', lanes.DRIVERS)
def test_the_estimator_modules_evaluation_and_global_step_helpers(name,
                                                                  tmp_path):
  """What TF's tests of Estimator, the exporters and early stopping write and
  read evaluations with, under TF's names: `_write_dict_to_summary` (one
  Summary of the results at a step, without the global step and what is no
  number) and `_load_global_step_from_checkpoint_dir` (0: no checkpoint)."""
  module = lanes.core_module(name, 'estimator')
  driver = lanes.core_driver(name)
  model_dir, eval_dir = str(tmp_path), str(tmp_path / 'eval')
  assert module._load_global_step_from_checkpoint_dir(model_dir) == 0  # pylint: disable=protected-access
  driver.Estimator(models.core_model_fn(driver), model_dir=model_dir).train(
      lambda: inputs.ones_x().repeat(), steps=3)
  assert module._load_global_step_from_checkpoint_dir(model_dir) == 3  # pylint: disable=protected-access
  with tf.Graph().as_default():
    module._write_dict_to_summary(eval_dir, {  # pylint: disable=protected-access
        'loss': 0.5, 'accuracy': np.float32(0.25), 'count': np.int64(3),
        'global_step': 7, 'name': 'not a number'}, 7)
  assert _evaluation_summaries(eval_dir) == {
      7: {'loss': 0.5, 'accuracy': 0.25, 'count': 3.0}}
