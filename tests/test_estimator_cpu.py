"""tpu_fc.estimator on CPU (use_tpu=False), on every TensorFlow lane."""
import collections
import logging
import os
import shutil
import types

import numpy as np
import pytest

from tpu_fc._tf import tf
import tpu_fc.estimator as est_lib
from tpu_fc.estimator import ModeKeys
from tpu_fc.estimator import RunConfig
from tpu_fc.estimator import TPUConfig
from tpu_fc.estimator import TPUEstimator
from tpu_fc.estimator import TPUEstimatorSpec
from tpu_fc.estimator.tpu.tpu_estimator_spec import to_estimator_spec

pytestmark = pytest.mark.filterwarnings(
    'ignore:`tf.layers.dense` is deprecated')

N = 16
BATCH = 4
VOCAB = 5
X = np.linspace(-1, 1, 2 * N).astype(np.float32).reshape(N, 2)
IDS = np.arange(N, dtype=np.int64).reshape(N, 1) % VOCAB
LABELS = (X[:, :1] > 0).astype(np.float32)


def input_fn(params, mode=None):
  """(features, labels) batches of fixed data; predict gets features only."""
  features = {'x': X, 'ids': IDS}
  if mode == ModeKeys.PREDICT:
    dataset = tf.data.Dataset.from_tensor_slices(features)
  else:
    dataset = tf.data.Dataset.from_tensor_slices((features, LABELS))
  return dataset.batch(params['batch_size'])


def repeated_input_fn(params):
  return input_fn(params).repeat()


def _logits(features):
  columns = [
      tf.feature_column.numeric_column('x', shape=(2,)),
      tf.compat.v1.tpu.experimental.embedding_column(
          tf.feature_column.categorical_column_with_identity('ids', VOCAB), 2),
  ]
  hidden = tf.compat.v1.feature_column.input_layer(features, columns)
  return tf.compat.v1.layers.dense(hidden, 1, name='logits')


def _train_op(loss):
  return tf.compat.v1.train.AdagradOptimizer(0.1).minimize(
      loss, tf.compat.v1.train.get_global_step())


def metric_fn(labels, logits):
  return {
      'accuracy': tf.compat.v1.metrics.accuracy(
          labels, tf.cast(logits > 0, tf.float32)),
      'mean_logit': tf.compat.v1.metrics.mean(logits),
  }


def make_model_fn(eval_tensors='dict', host_call=None, training_hooks=(),
                  evaluation_hooks=()):
  """A TPU model_fn; `eval_tensors` picks the list or dict eval_metrics form."""

  def model_fn(features, labels, mode, params):
    logits = _logits(features)
    if mode == ModeKeys.PREDICT:
      return TPUEstimatorSpec(
          mode, predictions={'logits': logits, 'prob': tf.sigmoid(logits)})
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    tensors = ({'labels': labels, 'logits': logits} if eval_tensors == 'dict'
               else [labels, logits])
    return TPUEstimatorSpec(
        mode, loss=loss, train_op=_train_op(loss),
        eval_metrics=(metric_fn, tensors),
        host_call=host_call(loss) if host_call else None,
        training_hooks=list(training_hooks),
        evaluation_hooks=list(evaluation_hooks))

  return model_fn


def make_estimator(model_dir, model_fn=None, batch=BATCH, **config_kwargs):
  config = RunConfig(model_dir=str(model_dir), **config_kwargs)
  return TPUEstimator(
      model_fn=model_fn or make_model_fn(), config=config, use_tpu=False,
      train_batch_size=batch, eval_batch_size=batch, predict_batch_size=batch)


class CallCounter(tf.compat.v1.train.SessionRunHook):
  """Counts session runs; records variable values when the session starts."""

  def __init__(self, variable_name=None):
    self.runs = 0
    self.initial = None
    self._variable_name = variable_name

  def after_create_session(self, session, coord):
    if self._variable_name:
      variable, = [v for v in tf.compat.v1.global_variables()
                   if v.op.name == self._variable_name]
      self.initial = session.run(variable)

  def after_run(self, run_context, run_values):
    self.runs += 1


def _summaries(directory):
  """{tag: [(step, value)]} from the event files directly in `directory`."""
  found = {}
  for path in sorted(tf.io.gfile.glob(os.path.join(directory,
                                                   'events.out.tfevents.*'))):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        number = (value.simple_value if value.HasField('simple_value') else
                  tf.make_ndarray(value.tensor))
        found.setdefault(value.tag, []).append((event.step, number))
  return found


def _checkpoint_steps(model_dir):
  state = tf.train.get_checkpoint_state(str(model_dir))
  return [int(p.rsplit('-', 1)[1]) for p in state.all_model_checkpoint_paths]


# ----------------------------------------------------------------- training


def test_train_resumes_from_latest_checkpoint(tmp_path):
  est = make_estimator(tmp_path)
  est.train(repeated_input_fn, steps=3)
  assert est.get_variable_value('global_step') == 3
  kernel = est.get_variable_value('logits/kernel')
  counter = CallCounter('logits/kernel')
  est.train(repeated_input_fn, steps=2, hooks=[counter])
  np.testing.assert_array_equal(counter.initial, kernel)
  assert counter.runs == 2
  assert est.get_variable_value('global_step') == 5
  assert est.latest_checkpoint() == str(tmp_path / 'model.ckpt-5')
  assert 'logits/kernel/Adagrad' in est.get_variable_names()


def test_train_max_steps_and_end_of_input(tmp_path, tf_log):
  est = make_estimator(tmp_path)
  est.train(repeated_input_fn, max_steps=3)
  assert est.get_variable_value('global_step') == 3
  counter = CallCounter()
  est.train(repeated_input_fn, max_steps=3, hooks=[counter])
  assert counter.runs == 0
  assert 'Skipping training since max_steps has already saved.' in tf_log
  est.train(input_fn)  # no steps: runs until the 4 batches are used up
  assert est.get_variable_value('global_step') == 7


@pytest.mark.parametrize('kwargs,message', [
    (dict(steps=1, max_steps=2), 'Can not provide both steps and max_steps.'),
    (dict(steps=0), 'Must specify steps > 0, given: 0'),
    (dict(max_steps=-1), 'Must specify max_steps > 0, given: -1'),
])
def test_train_steps_validation(kwargs, message, tmp_path):
  with pytest.raises(ValueError) as info:
    make_estimator(tmp_path).train(input_fn, **kwargs)
  assert str(info.value) == message


def test_keep_checkpoint_max_and_saving_listeners(tmp_path):

  class Listener(tf.compat.v1.train.CheckpointSaverListener):

    def __init__(self):
      self.saved_steps = []

    def after_save(self, session, global_step_value):
      self.saved_steps.append(global_step_value)

  listener = Listener()
  est = make_estimator(tmp_path, save_checkpoints_steps=1,
                       keep_checkpoint_max=2)
  est.train(repeated_input_fn, steps=4, saving_listeners=[listener])
  assert listener.saved_steps == [0, 1, 2, 3, 4]
  assert _checkpoint_steps(tmp_path) == [3, 4]
  assert sorted(p for p in os.listdir(tmp_path) if p.endswith('.index')) == [
      'model.ckpt-3.index', 'model.ckpt-4.index']


def test_saving_listeners_need_checkpoints(tmp_path):
  est = make_estimator(tmp_path, save_checkpoints_secs=None)
  with pytest.raises(ValueError, match='There should be a CheckpointSaverHook'):
    est.train(input_fn, saving_listeners=[
        tf.compat.v1.train.CheckpointSaverListener()])


def test_summaries_and_progress_logs(tmp_path, tf_log):
  est = make_estimator(tmp_path, save_summary_steps=2, log_step_count_steps=2,
                       tpu_config=TPUConfig(iterations_per_loop=1))
  est.train(repeated_input_fn, steps=5)
  # TF 2.15's TPUEstimator(use_tpu=False) turned Estimator's loss line off.
  assert not [m for m in tf_log if m.startswith('loss = ')]
  assert sum(m.startswith('global_step/sec: ') for m in tf_log) == 2
  assert sum(m.startswith('examples/sec: ') for m in tf_log) == 2
  assert any(m.startswith('Loss for final step: ') for m in tf_log)
  summaries = _summaries(str(tmp_path))
  # As in TF, the step read for a summary races with the train op's increment.
  assert [step for step, _ in summaries['loss']] == [1, 3, 5]
  assert [step for step, _ in summaries['global_step/sec']] == [3, 5]
  assert len(summaries['examples/sec']) == 2


def test_no_batch_size_logs_rate_without_examples(tmp_path, tf_log):
  """TF 2.15 raised TypeError at the first rate log without a batch size."""

  def model_fn(features, labels, params):
    assert 'batch_size' not in params
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, _logits(features))
    return TPUEstimatorSpec(ModeKeys.TRAIN, loss=loss, train_op=_train_op(loss))

  def fixed_batch_input_fn(params):
    assert params == {}
    return input_fn({'batch_size': BATCH}).repeat()

  est = make_estimator(tmp_path, model_fn=model_fn, batch=None,
                       log_step_count_steps=1)
  est.train(fixed_batch_input_fn, steps=3)
  assert sum(m.startswith('global_step/sec') for m in tf_log) == 2
  assert not any(m.startswith('examples/sec') for m in tf_log)


def test_host_call_summaries_written(tmp_path):
  logdir = str(tmp_path / 'host')

  def host_call(loss):

    def host_fn(global_step, loss):
      with tf.compat.v2.summary.create_file_writer(logdir).as_default():
        tf.compat.v2.summary.scalar('host_loss', loss[0], step=global_step[0])
        return tf.compat.v1.summary.all_v2_summary_ops()

    step = tf.compat.v1.train.get_global_step()
    return host_fn, [tf.reshape(step, [1]), tf.reshape(loss, [1])]

  est = make_estimator(tmp_path, model_fn=make_model_fn(host_call=host_call))
  est.train(repeated_input_fn, steps=3)
  steps = [step for step, _ in _summaries(logdir)['host_loss']]
  # The step is read in the run that increments it (as in TF): run k logs k or
  # k + 1 (a loaded machine showed [0, 1, 3]).
  assert len(steps) == 3
  for run, step in enumerate(steps):
    assert step in (run, run + 1)
  est.evaluate(input_fn, steps=2)
  assert [step for step, _ in _summaries(logdir)['host_loss']][3:] == [3, 3]


def test_training_hooks_scaffold_fn_and_chief_hooks(tmp_path):
  counter = CallCounter()
  chief_counter = CallCounter()
  scaffold_calls = []

  def model_fn(features, labels, mode, params):
    spec = make_model_fn(training_hooks=[counter])(features, labels, mode,
                                                   params)

    def scaffold_fn():
      scaffold_calls.append(mode)
      return tf.compat.v1.train.Scaffold(
          saver=tf.compat.v1.train.Saver(max_to_keep=1))

    return spec._replace(scaffold_fn=scaffold_fn)

  est = make_estimator(tmp_path, model_fn=model_fn, save_checkpoints_steps=1)
  est.train(repeated_input_fn, steps=3)
  assert counter.runs == 3
  assert scaffold_calls == [ModeKeys.TRAIN]
  assert _checkpoint_steps(tmp_path) == [3]  # the scaffold's Saver was used

  def plain_model_fn(features, labels, mode, params):
    spec = make_model_fn()(features, labels, mode, params).as_estimator_spec()
    return spec._replace(training_chief_hooks=[chief_counter])

  make_estimator(tmp_path / 'plain', model_fn=plain_model_fn).train(
      repeated_input_fn, steps=2)
  assert chief_counter.runs == 2


def test_warm_start_from_checkpoint_dir_and_settings(tmp_path):
  source = make_estimator(tmp_path / 'source')
  source.train(repeated_input_fn, steps=2)
  kernel = source.get_variable_value('logits/kernel')
  bias = source.get_variable_value('logits/bias')

  counter = CallCounter('logits/kernel')
  warm = TPUEstimator(make_model_fn(), config=RunConfig(
      model_dir=str(tmp_path / 'warm')), use_tpu=False, train_batch_size=BATCH,
                      warm_start_from=source.model_dir)
  warm.train(repeated_input_fn, steps=1, hooks=[counter])
  np.testing.assert_array_equal(counter.initial, kernel)

  settings = types.SimpleNamespace(  # duck-typed tf.estimator.WarmStartSettings
      ckpt_to_initialize_from=source.model_dir,
      vars_to_warm_start='logits/kernel$', var_name_to_vocab_info=None,
      var_name_to_prev_var_name=None)
  partial = TPUEstimator(make_model_fn(), config=RunConfig(
      model_dir=str(tmp_path / 'partial')), use_tpu=False,
                         train_batch_size=BATCH, warm_start_from=settings)
  counter = CallCounter('logits/bias')
  partial.train(repeated_input_fn, steps=1, hooks=[counter])
  np.testing.assert_array_equal(counter.initial, np.zeros_like(bias))
  assert not np.array_equal(counter.initial, bias)

  saved_model = tmp_path / 'saved_model'  # only its variables/ are read
  os.makedirs(saved_model / 'variables')
  for path in tf.io.gfile.glob(str(tmp_path / 'source' / 'model.ckpt-2.*')):
    suffix = os.path.basename(path)[len('model.ckpt-2'):]
    tf.io.gfile.copy(path, str(saved_model / 'variables' / 'variables') +
                     suffix)
  from_saved_model = TPUEstimator(
      make_model_fn(), config=RunConfig(model_dir=str(tmp_path / 'sm_warm')),
      use_tpu=False, train_batch_size=BATCH, warm_start_from=str(saved_model))
  counter = CallCounter('logits/kernel')
  from_saved_model.train(repeated_input_fn, steps=1, hooks=[counter])
  np.testing.assert_array_equal(counter.initial, kernel)


# --------------------------------------------------------------- evaluation


@pytest.mark.parametrize('eval_tensors', ['list', 'dict'])
def test_evaluate_dict_until_end_of_input(eval_tensors, tmp_path):
  counter = CallCounter()
  est = make_estimator(tmp_path, model_fn=make_model_fn(
      eval_tensors=eval_tensors, evaluation_hooks=[counter]))
  est.train(repeated_input_fn, steps=2)
  results = est.evaluate(input_fn)
  assert sorted(results) == ['accuracy', 'global_step', 'loss', 'mean_logit']
  assert results['global_step'] == 2
  assert counter.runs == N // BATCH
  predictions = np.concatenate(
      [p['logits'] for p in est.predict(input_fn, yield_single_examples=False)])
  np.testing.assert_allclose(results['mean_logit'], predictions.mean(),
                             rtol=1e-5)
  np.testing.assert_allclose(results['accuracy'],
                             np.mean((predictions > 0) == LABELS), rtol=1e-5)
  summaries = _summaries(est.eval_dir())
  assert [step for step, _ in summaries['loss']] == [2]
  assert summaries['checkpoint_path'][0][1] == str(
      tmp_path / 'model.ckpt-2').encode()


def test_evaluate_steps_name_checkpoint_path_and_metric_ops(tmp_path, tf_log):

  def model_fn(features, labels, mode, params):
    del params
    logits = _logits(features)
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    return est_lib.EstimatorSpec(
        mode, loss=loss, train_op=_train_op(loss),
        eval_metric_ops={'mean_label': tf.compat.v1.metrics.mean(labels)})

  counter = CallCounter()
  est = make_estimator(tmp_path, model_fn=model_fn)
  results = est.evaluate(input_fn, steps=2, name='holdout', hooks=[counter])
  assert counter.runs == 2
  assert results['global_step'] == 0
  assert results['mean_label'] == pytest.approx(LABELS[:2 * BATCH].mean())
  assert any(m.startswith('Could not find trained model in model_dir')
             for m in tf_log)
  assert 'mean_label' in _summaries(str(tmp_path / 'eval_holdout'))
  est.train(repeated_input_fn, steps=1)
  est.train(repeated_input_fn, steps=1)
  first = str(tmp_path / 'model.ckpt-1')
  assert est.evaluate(input_fn, checkpoint_path=first)['global_step'] == 1
  with pytest.raises(ValueError, match='Must specify steps > 0, given: 0'):
    est.evaluate(input_fn, steps=0)


# --------------------------------------------------------------- prediction


def test_predict_single_batched_and_keys(tmp_path):
  est = make_estimator(tmp_path)
  est.train(repeated_input_fn, steps=1)
  single = list(est.predict(input_fn))
  assert len(single) == N
  assert sorted(single[0]) == ['logits', 'prob']
  assert single[0]['logits'].shape == (1,)
  batches = list(est.predict(input_fn, yield_single_examples=False))
  assert [b['prob'].shape for b in batches] == [(BATCH, 1)] * (N // BATCH)
  np.testing.assert_allclose(
      np.concatenate([b['prob'] for b in batches]),
      np.stack([s['prob'] for s in single]), rtol=1e-6)
  only_prob = list(est.predict(input_fn, predict_keys=['prob']))
  assert sorted(only_prob[0]) == ['prob']
  with pytest.raises(ValueError, match='Expected to run at least one output'):
    next(est.predict(input_fn, predict_keys=['missing']))


def test_predict_single_tensor_and_labels_dropped(tmp_path):

  def model_fn(features, labels, mode, params):
    assert labels is None and params['batch_size'] == BATCH
    return TPUEstimatorSpec(mode, predictions=_logits(features)[:, 0])

  est = make_estimator(tmp_path, model_fn=model_fn)
  values = list(est.predict(lambda params: input_fn(params, ModeKeys.TRAIN)))
  assert len(values) == N
  assert all(isinstance(v, np.float32) for v in values)
  with pytest.raises(ValueError, match='predict_keys argument is not valid'):
    next(est.predict(input_fn, predict_keys=['x']))


def test_predict_does_not_leave_its_graph_as_default(tmp_path):
  predictions = make_estimator(tmp_path).predict(input_fn)
  next(predictions)
  assert tf.executing_eagerly()
  assert int(tf.constant(2) * 2) == 4
  assert len(list(predictions)) == N - 1


# -------------------------------------------------- model_fn / input_fn args


def test_params_and_config_passed_to_input_fn_and_model_fn(tmp_path):
  seen = {}

  def model_fn(features, labels, mode, params, config):
    seen['model_fn'] = (mode, dict(params), config.model_dir,
                        config.log_step_count_steps)
    return make_model_fn()(features, labels, mode, params)

  def my_input_fn(params, mode, config, input_context):
    seen['input_fn_' + mode] = (dict(params), config.model_dir, input_context)
    return input_fn(params, mode)

  est = TPUEstimator(model_fn, config=RunConfig(model_dir=str(tmp_path)),
                     params={'lr': 0.1}, use_tpu=False, train_batch_size=4,
                     eval_batch_size=8, predict_batch_size=2)
  est.train(my_input_fn, steps=1)
  assert seen['input_fn_train'] == ({'lr': 0.1, 'batch_size': 4},
                                    str(tmp_path), None)
  assert seen['model_fn'] == ('train', {'lr': 0.1, 'batch_size': 4,
                                        'use_tpu': False}, str(tmp_path), None)
  est.evaluate(my_input_fn, steps=1)
  assert seen['input_fn_eval'][0]['batch_size'] == 8
  assert len(next(est.predict(my_input_fn, yield_single_examples=False))[
      'prob']) == 2
  assert est.params == {'lr': 0.1}
  assert est.config.log_step_count_steps is None


def test_model_fn_with_fewer_args(tmp_path):

  def model_fn(features, params):
    del params
    return TPUEstimatorSpec(ModeKeys.PREDICT,
                            predictions={'logits': _logits(features)})

  est = make_estimator(tmp_path, model_fn=model_fn)
  assert len(list(est.predict(input_fn))) == N

  def model_fn_no_mode(features, labels, params):
    del params
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, _logits(features))
    return TPUEstimatorSpec(ModeKeys.TRAIN, loss=loss, train_op=_train_op(loss))

  make_estimator(tmp_path / 'no_mode', model_fn=model_fn_no_mode).train(
      input_fn, steps=1)


@pytest.mark.parametrize('model_fn,in_fn,message', [
    (lambda features, labels: None, input_fn,
     "does not include params argument, required by TPUEstimator to pass "
     "batch size as params['batch_size']"),
    (lambda features, params: None, input_fn,
     'model_fn does not take labels, but input_fn returns labels.'),
    (make_model_fn(), lambda: None,
     'does not include params argument, required by TPUEstimator to pass '
     'batch size as params["batch_size"]'),
    (lambda features, labels, mode, params: 'not a spec', input_fn,
     'model_fn should return an EstimatorSpec.'),
])
def test_call_time_errors(model_fn, in_fn, message, tmp_path):
  est = make_estimator(tmp_path, model_fn=model_fn)
  with pytest.raises(ValueError) as info:
    est.train(in_fn, steps=1)
  assert message in str(info.value)


def test_input_fn_returning_tensors(tmp_path):

  def tensors_input_fn(params):
    size = params['batch_size']
    features = {'x': tf.constant(X[:size]), 'ids': tf.constant(IDS[:size])}
    return features, tf.constant(LABELS[:size])

  est = make_estimator(tmp_path)
  est.train(tensors_input_fn, steps=2)
  assert est.evaluate(tensors_input_fn, steps=1)['global_step'] == 2


# ------------------------------------------------------------ construction


def _model_fn(features, labels, mode, params):
  del features, labels, mode, params


@pytest.mark.parametrize('kwargs,error,message', [
    (dict(config=None), ValueError,
     '`config` must be provided with type `tpu_config.RunConfig`'),
    (dict(params={'batch_size': 8}), ValueError,
     "['batch_size', 'context'] are reserved keys but existed in params "
     "{'batch_size': 8}."),
    (dict(use_tpu=True), ValueError, '`train_batch_size` cannot be `None`'),
    (dict(use_tpu=True, train_batch_size=0), ValueError,
     'train_batch_size must be positive, got 0'),
    (dict(use_tpu=True, train_batch_size=1, eval_batch_size=1.5), TypeError,
     "eval_batch_size must be int, got <class 'float'>"),
    (dict(model_fn=lambda features, labels, mode: None, params={}), ValueError,
     'does not include params argument, but params ({}) is passed to '
     'Estimator.'),
    (dict(model_fn=lambda labels, params: None), ValueError,
     'must include features argument.'),
    (dict(model_fn=lambda features, params, hparams: None), ValueError,
     "has following not expected args: ['hparams']"),
    (dict(warm_start_from=1.5), ValueError,
     "warm_start_from must be a string or a WarmStartSettings, instead got "
     "<class 'float'>"),
    (dict(model_dir='/elsewhere'), ValueError,
     "`model_dir` are set both in constructor and `RunConfig`, but with "
     "different values. In constructor: '/elsewhere', in `RunConfig`: '"),
    (dict(embedding_config_spec=types.SimpleNamespace(
        partition_strategy='mod')), ValueError,
     'Mod sharding of embedding tables not supported on CPU.'),
    (dict(embedding_config_spec=types.SimpleNamespace(partition_strategy='div'),
          config=RunConfig(tpu_config=TPUConfig(num_shards=1))), ValueError,
     'Setting TPUConfig.num_shards==1 is unsupported when '
     'embedding_config_spec is not None.'),
])
def test_constructor_errors(kwargs, error, message, tmp_path):
  kwargs = dict(dict(model_fn=_model_fn, use_tpu=False,
                     config=RunConfig(model_dir=str(tmp_path))), **kwargs)
  with pytest.raises(error) as info:
    TPUEstimator(**kwargs)
  assert message in str(info.value)


@pytest.mark.parametrize('use_tpu', [True, False])
@pytest.mark.parametrize('user_setting', [None, 'ON'])
def test_table_copy_rewrite_is_off_on_the_tpu_unless_the_user_set_it(
    user_setting, use_tpu):
  """Grappler's arithmetic optimizer copies whole tables per step (see config);
  with use_tpu=False TF's session defaults stand (TF 2.15's numbers)."""
  session_config = None
  if user_setting:
    session_config = tf.compat.v1.ConfigProto(log_device_placement=True)
    session_config.graph_options.rewrite_options.arithmetic_optimization = (
        session_config.graph_options.rewrite_options.ON)
  est = TPUEstimator(_model_fn, config=RunConfig(session_config=session_config),
                     use_tpu=use_tpu, train_batch_size=8)
  rewrite_options = est.config.session_config.graph_options.rewrite_options
  expected = {None: rewrite_options.OFF if use_tpu else rewrite_options.DEFAULT,
              'ON': rewrite_options.ON}[user_setting]
  assert rewrite_options.arithmetic_optimization == expected
  assert est.config.session_config.log_device_placement == bool(user_setting)
  if session_config is not None:  # the user's object is not changed
    assert session_config.graph_options.rewrite_options.arithmetic_optimization == (
        rewrite_options.ON)


def test_constructor_defaults_and_warnings(tmp_path, tf_log):
  est = TPUEstimator(_model_fn, config=RunConfig(), use_tpu=False,
                     model_dir=tmp_path, export_to_cpu=False,
                     export_to_tpu=False)
  assert est.model_dir == str(tmp_path)
  assert est.config.session_config.allow_soft_placement
  assert 'eval_on_tpu ignored because use_tpu is False.' in tf_log
  assert any('includes params argument, but params are not passed' in m
             for m in tf_log)
  with pytest.raises(ValueError, match='Could not find trained model'):
    est.get_variable_names()
  temporary = TPUEstimator(_model_fn, config=RunConfig(), use_tpu=False,
                           eval_on_tpu=False)
  assert os.path.isdir(temporary.model_dir)
  shutil.rmtree(temporary.model_dir)
  assert any(m.startswith('Using temporary folder as model directory')
             for m in tf_log)


# ------------------------------------------------------------------ configs


def test_run_config_defaults_replace_and_immutability(tmp_path):
  config = RunConfig()
  assert (config.save_checkpoints_secs, config.save_checkpoints_steps) == (
      600, None)
  assert (config.save_summary_steps, config.keep_checkpoint_max,
          config.keep_checkpoint_every_n_hours, config.log_step_count_steps,
          config.master, config.evaluation_master) == (100, 5, 10000, 100, '',
                                                       '')
  assert RunConfig(save_checkpoints_steps=10).save_checkpoints_secs is None
  assert RunConfig(master='m').evaluation_master == 'm'
  replaced = config.replace(save_checkpoints_steps=7, model_dir=tmp_path)
  assert (replaced.save_checkpoints_steps, replaced.save_checkpoints_secs,
          replaced.model_dir) == (7, None, str(tmp_path))
  assert config.save_checkpoints_secs == 600
  replaced = config.replace(tpu_config=TPUConfig(3))
  assert replaced.tpu_config.iterations_per_loop == 3
  with pytest.raises(AttributeError):
    config.model_dir = 'x'
  with pytest.raises(ValueError, match='Replacing master is not supported'):
    config.replace(master='x')
  with pytest.raises(ValueError, match='cannot be both set'):
    config.replace(save_checkpoints_steps=1, save_checkpoints_secs=1)
  with pytest.raises(ValueError, match='^model_dir should be non-empty$'):
    config.replace(model_dir='')


@pytest.mark.parametrize('name', ['train_distribute', 'eval_distribute',
                                  'experimental_distribute'])
def test_run_config_takes_no_distribution_strategy(name):
  """None (a script's default) is TF's; a strategy is refused, saying why."""
  config = RunConfig(**{name: None})
  assert getattr(config, name) is None
  strategy = tf.distribute.OneDeviceStrategy('/cpu:0')
  message = (r'^RunConfig\({}=...\): tpu_fc runs no tf.distribute strategy; '
             r'.*TPUConfig\(num_shards=...\).*Leave {} None.$'.format(name, name))
  with pytest.raises(ValueError, match=message):
    RunConfig(**{name: strategy})
  with pytest.raises(ValueError, match=message):
    config.replace(**{name: strategy})


def test_tpu_config_values_and_validation():
  config = TPUConfig()
  assert (config.iterations_per_loop, config.num_shards,
          config.per_host_input_for_training,
          config.eval_training_input_configuration) == (2, None, 2, 2)
  assert TPUConfig(per_host_input_for_training=False
                  ).per_host_input_for_training == 1
  for value in ('30s', '2m', '1h', 5):
    assert TPUConfig(iterations_per_loop=value).iterations_per_loop == value
  for value in ('0', '2d', 's', -1, '1.5h'):
    with pytest.raises(ValueError,
                       match='Invalid TPUConfig `iterations_per_loop` value'):
      TPUConfig(iterations_per_loop=value)
  with pytest.raises(ValueError, match='num_cores_per_replica must be 1, 2'):
    TPUConfig(num_cores_per_replica=6)
  assert est_lib.InputPipelineConfig.PER_HOST_V2 == 3
  assert est_lib.InputPipelineConfig.SLICED == 5


def test_duck_typed_configs(tmp_path):
  """tensorflow_estimator-style configs are read attribute by attribute."""
  foreign_tpu = types.SimpleNamespace(**TPUConfig(iterations_per_loop='10s')
                                      ._asdict())
  assert RunConfig(tpu_config=foreign_tpu).tpu_config == TPUConfig(
      iterations_per_loop='10s')
  foreign = types.SimpleNamespace(
      model_dir=str(tmp_path), tf_random_seed=3, save_summary_steps=5,
      save_checkpoints_steps=None, save_checkpoints_secs=None,
      session_config=None, keep_checkpoint_max=1,
      keep_checkpoint_every_n_hours=1, log_step_count_steps=10,
      tpu_config=foreign_tpu, master='', evaluation_master='', cluster=None)
  est = TPUEstimator(_model_fn, config=foreign, use_tpu=False)
  assert (est.config.tf_random_seed, est.config.save_checkpoints_secs,
          est.config.save_checkpoints_steps, est.model_dir) == (
              3, None, None, str(tmp_path))
  assert est.config.tpu_config.iterations_per_loop == '10s'


# -------------------------------------------------------------------- specs


def _in_graph(fn):
  with tf.Graph().as_default():
    return fn()


@pytest.mark.parametrize('make_spec,error,message', [
    (lambda: TPUEstimatorSpec(ModeKeys.TRAIN, loss=tf.constant(1.)),
     ValueError, 'Missing train_op.'),
    (lambda: TPUEstimatorSpec(ModeKeys.EVAL), ValueError, 'Missing loss.'),
    (lambda: est_lib.EstimatorSpec(ModeKeys.PREDICT), ValueError,
     'Missing predictions.'),
    (lambda: TPUEstimatorSpec(ModeKeys.EVAL, loss=tf.ones([2])), ValueError,
     'Loss must be scalar, given: '),
    (lambda: TPUEstimatorSpec(ModeKeys.EVAL, loss=tf.constant(1.),
                              eval_metrics=(metric_fn,)),
     ValueError, 'eval_metrics should have two elements.'),
    (lambda: TPUEstimatorSpec(ModeKeys.EVAL, loss=tf.constant(1.),
                              eval_metrics=(metric_fn, [tf.constant(1.)])),
     RuntimeError, 'In TPUEstimatorSpec.eval_metrics, length of tensors 1 '
     'does not match method args of the function, which takes 2.'),
    (lambda: TPUEstimatorSpec(ModeKeys.EVAL, loss=tf.constant(1.),
                              host_call=(1, [])),
     TypeError, 'host_call[0] should be callable.'),
    (lambda: TPUEstimatorSpec(ModeKeys.EVAL, loss=tf.constant(1.),
                              training_hooks=[object()]),
     TypeError, 'All hooks must be SessionRunHook instances, given: '),
    (lambda: est_lib.EstimatorSpec(ModeKeys.EVAL, loss=tf.constant(1.),
                                   eval_metric_ops={'m': 1}),
     TypeError, 'Values of eval_metric_ops must be (metric_value, update_op) '
     'tuples, given: 1 for key: m'),
    (lambda: est_lib.EstimatorSpec(ModeKeys.EVAL, loss=tf.constant(1.)
                                  )._replace(mode=ModeKeys.TRAIN),
     ValueError, 'mode of EstimatorSpec cannot be changed.'),
])
def test_spec_validation(make_spec, error, message):
  with pytest.raises(error) as info:
    _in_graph(make_spec)
  assert message in str(info.value)


def test_as_estimator_spec_runs_host_fns_in_order():
  calls = []

  def scaffold_fn():
    calls.append('scaffold_fn')
    return tf.compat.v1.train.Scaffold()

  def metrics(value):
    calls.append('eval_metrics')
    return {'m': tf.compat.v1.metrics.mean(value)}

  def host_fn(value):
    calls.append('host_call')
    return [tf.identity(value)]

  def build():
    value = tf.constant([1.])
    return TPUEstimatorSpec(
        ModeKeys.EVAL, loss=tf.constant(1.), eval_metrics=(metrics, [value]),
        host_call=(host_fn, {'value': value}),
        scaffold_fn=scaffold_fn).as_estimator_spec()

  spec = _in_graph(build)
  assert calls == ['eval_metrics', 'host_call', 'scaffold_fn']
  assert sorted(spec.eval_metric_ops) == ['m']
  assert len(spec.evaluation_hooks) == len(spec.training_hooks) == 1
  assert spec.export_outputs is None


def test_foreign_spec_namedtuples_are_accepted():
  """tensorflow_estimator's specs are namedtuples with the same fields."""
  foreign_tpu_spec = collections.namedtuple(
      'TPUEstimatorSpec', TPUEstimatorSpec._fields)
  foreign_spec = collections.namedtuple('EstimatorSpec',
                                        est_lib.EstimatorSpec._fields)

  def build():
    loss = tf.constant(2.)
    tpu_spec = to_estimator_spec(foreign_tpu_spec(
        mode=ModeKeys.EVAL, predictions=None, loss=loss, train_op=None,
        eval_metrics=(lambda x: {'m': tf.compat.v1.metrics.mean(x)}, [loss]),
        export_outputs=None, scaffold_fn=None, host_call=None,
        training_hooks=(), evaluation_hooks=(), prediction_hooks=()))
    plain_spec = to_estimator_spec(foreign_spec(
        mode=ModeKeys.EVAL, predictions={}, loss=loss, train_op=None,
        eval_metric_ops={}, export_outputs=None, training_chief_hooks=(),
        training_hooks=(), scaffold=None, evaluation_hooks=(),
        prediction_hooks=()))
    return tpu_spec, plain_spec

  tpu_spec, plain_spec = _in_graph(build)
  assert isinstance(tpu_spec, est_lib.EstimatorSpec)
  assert sorted(tpu_spec.eval_metric_ops) == ['m']
  assert isinstance(plain_spec.scaffold, tf.compat.v1.train.Scaffold)
