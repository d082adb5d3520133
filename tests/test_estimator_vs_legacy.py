"""tpu_fc.estimator.TPUEstimator(use_tpu=False) against TF 2.15's real one.

The same model_fn / input_fn run through both drivers must give the same
per-step losses, eval metrics, predictions and checkpoints, and checkpoints
must cross-restore both ways. Legacy lane only.
"""
import logging

import numpy as np
import pytest

from tpu_fc._tf import tf
import tpu_fc.estimator as ours

from harness import lanes

legacy = tf.compat.v1.estimator.tpu if lanes.LEGACY else None
pytestmark = [pytest.mark.legacy_only, pytest.mark.filterwarnings(
    'ignore:`tf.layers.dense` is deprecated')]

BATCH = 4
N = 16
VOCAB = 7
DIM = 3
SEQ_LEN = 3
RTOL = 1e-5


def _sparse_ids(rng, max_len, empty_every=5):
  """Ragged id lists as (indices, values, dense_shape); some rows empty."""
  indices, values = [], []
  for row in range(N):
    length = 0 if row % empty_every == 2 else rng.randint(1, max_len + 1)
    for col in range(length):
      indices.append([row, col])
      values.append(rng.randint(0, VOCAB))
  return (np.array(indices, np.int64), np.array(values, np.int64),
          np.array([N, max_len], np.int64))


def _make_data():
  rng = np.random.RandomState(0)
  data = {name: _sparse_ids(rng, 3) for name in ('ids', 'ids2', 'ids3')}
  data['seq'] = _sparse_ids(rng, SEQ_LEN)
  weight_indices, weight_ids, shape = data['ids2']
  data['w'] = (weight_indices, rng.uniform(0.5, 2.0, len(weight_ids)).astype(
      np.float32), shape)
  labels = (np.arange(N) % 3 == 0).astype(np.float32).reshape(N, 1)
  return data, labels


DATA, LABELS = _make_data()


def input_fn(params, mode):
  """Fixed sparse features; predict gets features only."""
  features = {k: tf.SparseTensor(*v) for k, v in DATA.items()}
  if mode == 'infer':
    dataset = tf.data.Dataset.from_tensor_slices(features)
  else:
    dataset = tf.data.Dataset.from_tensor_slices((features, LABELS))
  return dataset.batch(params['batch_size'], drop_remainder=True)


def fixed_init(seed):
  values = np.random.RandomState(seed).uniform(-1, 1, (VOCAB, DIM))
  return tf.compat.v1.constant_initializer(values.astype(np.float32))


def random_init(seed):
  """The column's default: a truncated normal seeded by the graph."""
  del seed


def _tpu_column(init, key, seed, weight_key=None, sequence=False):
  if sequence:
    categorical = tf.feature_column.sequence_categorical_column_with_identity(
        key, VOCAB)
  else:
    categorical = tf.feature_column.categorical_column_with_identity(
        key, VOCAB)
  if weight_key:
    categorical = tf.feature_column.weighted_categorical_column(
        categorical, weight_key)
  return tf.compat.v1.tpu.experimental.embedding_column(
      categorical, DIM, initializer=init(seed),
      max_sequence_length=SEQ_LEN if sequence else 0)


def _input_layer_net(features, init):
  columns = [_tpu_column(init, 'ids', 1),
             _tpu_column(init, 'ids2', 2, weight_key='w')]
  return tf.compat.v1.feature_column.input_layer(features, columns)


def _dense_features_net(features, init):
  shared = tf.compat.v1.tpu.experimental.shared_embedding_columns(
      [tf.feature_column.categorical_column_with_identity('ids2', VOCAB),
       tf.feature_column.categorical_column_with_identity('ids3', VOCAB)],
      DIM, initializer=init(3))
  layer = tf.keras.layers.DenseFeatures([_tpu_column(init, 'ids', 1)] + shared)
  return layer(features)


def _sequence_net(features, init):
  sequence_layer = tf.keras.experimental.SequenceFeatures(
      [_tpu_column(init, 'seq', 4, sequence=True)])
  sequence_input, sequence_length = sequence_layer(features)
  mask = tf.sequence_mask(sequence_length, SEQ_LEN, dtype=tf.float32)
  pooled = tf.reduce_sum(sequence_input * mask[:, :, None], axis=1)
  weighted = tf.keras.layers.DenseFeatures(
      [_tpu_column(init, 'ids2', 2, weight_key='w')])(features)
  return tf.concat([pooled, weighted], axis=1)


NETS = {
    'input_layer': _input_layer_net,
    'dense_features': _dense_features_net,
    'sequence': _sequence_net,
}


class _LossRecorder(tf.compat.v1.train.SessionRunHook):

  def __init__(self, loss, sink):
    self._loss = loss
    self._sink = sink

  def before_run(self, run_context):
    return tf.compat.v1.train.SessionRunArgs(self._loss)

  def after_run(self, run_context, run_values):
    self._sink.append(run_values.results)


def make_model_fn(net, spec_module, losses, init=fixed_init):
  """model_fn over `net`; returns `spec_module`'s TPUEstimatorSpec.

  `fixed_init` makes every initial value a constant; `random_init` uses TF's
  graph-seeded initializers (Keras' own defaults ignore tf_random_seed).
  """

  def model_fn(features, labels, mode, params):
    hidden = net(features, init)
    if init is fixed_init:
      kernel_init = tf.compat.v1.constant_initializer(
          np.linspace(-0.5, 0.5, hidden.shape[-1]).reshape(-1, 1))
    else:
      kernel_init = tf.compat.v1.glorot_uniform_initializer()
    logits = tf.compat.v1.layers.dense(
        hidden, 1, kernel_initializer=kernel_init, name='logits')
    if mode == 'infer':
      return spec_module.TPUEstimatorSpec(
          mode, predictions={'logits': logits, 'prob': tf.sigmoid(logits)})
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    train_op = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(
        loss, tf.compat.v1.train.get_global_step())

    def metric_fn(labels, logits):
      return {
          'accuracy': tf.compat.v1.metrics.accuracy(
              labels, tf.cast(logits > 0, tf.float32)),
          'mean_logit': tf.compat.v1.metrics.mean(logits),
      }

    assert params['batch_size'] == BATCH and not params['use_tpu']
    return spec_module.TPUEstimatorSpec(
        mode, loss=loss, train_op=train_op,
        eval_metrics=(metric_fn, {'labels': labels, 'logits': logits}),
        training_hooks=[_LossRecorder(loss, losses)])

  return model_fn


def _estimator(driver, model_fn, model_dir, **config_kwargs):
  config = driver.RunConfig(model_dir=str(model_dir), save_summary_steps=1,
                            **config_kwargs)
  return driver.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=False,
      train_batch_size=BATCH, eval_batch_size=BATCH, predict_batch_size=BATCH)


def _train_twice(first, second, net, model_dir):
  """Trains 2 steps with `first`, 2 more with `second`; returns the losses."""
  losses = []
  for driver in (first, second):
    model_fn = make_model_fn(net, legacy, losses)
    _estimator(driver, model_fn, model_dir).train(input_fn, steps=2)
  return losses


@pytest.mark.parametrize('net_name', sorted(NETS))
def test_same_training_eval_predictions_and_checkpoints(net_name, tmp_path):
  net = NETS[net_name]
  runs = {}
  for name, driver in (('legacy', legacy), ('ours', ours)):
    losses = []
    est = _estimator(driver, make_model_fn(net, legacy, losses),
                     tmp_path / name)
    est.train(input_fn, steps=3)
    runs[name] = dict(
        losses=losses,
        metrics=est.evaluate(input_fn),
        predictions=list(est.predict(input_fn)),
        variables=dict(tf.train.list_variables(str(tmp_path / name))),
        values={n: est.get_variable_value(n) for n in est.get_variable_names()})
  want, got = runs['legacy'], runs['ours']
  assert len(want['losses']) == 3
  np.testing.assert_allclose(got['losses'], want['losses'], rtol=RTOL)
  assert sorted(got['metrics']) == sorted(want['metrics'])
  for key in want['metrics']:
    np.testing.assert_allclose(got['metrics'][key], want['metrics'][key],
                               rtol=RTOL)
  assert len(got['predictions']) == len(want['predictions']) == N
  for got_pred, want_pred in zip(got['predictions'], want['predictions']):
    assert sorted(got_pred) == sorted(want_pred)
    for key in want_pred:
      np.testing.assert_allclose(got_pred[key], want_pred[key], rtol=RTOL)
  assert got['variables'] == want['variables']
  for name, value in want['values'].items():
    np.testing.assert_allclose(got['values'][name], value, rtol=RTOL)


def _adam_mlp_model_fn(features, labels, mode, params):
  """Dense layers trained by Adam: Grappler's arithmetic stages change the
  last bits of such a step within 20 steps, were they set otherwise."""
  del params
  hidden = tf.compat.v1.layers.dense(
      _dense_features_net(features, fixed_init), 8, tf.nn.relu,
      kernel_initializer=tf.compat.v1.glorot_uniform_initializer(seed=1))
  logits = tf.compat.v1.layers.dense(
      hidden, 1, kernel_initializer=tf.compat.v1.glorot_uniform_initializer(
          seed=2))
  loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
  return legacy.TPUEstimatorSpec(mode, loss=loss, train_op=(
      tf.compat.v1.train.AdamOptimizer(0.01).minimize(
          loss, tf.compat.v1.train.get_global_step())))


def test_many_steps_of_dense_arithmetic_are_tfs_to_the_bit(tmp_path):
  """TF's session defaults, so the same graph computes the same bits."""
  values = {}
  for name, driver in (('legacy', legacy), ('ours', ours)):
    est = _estimator(driver, _adam_mlp_model_fn, tmp_path / name,
                     tf_random_seed=7)
    est.train(lambda params: input_fn(params, 'train').repeat(), steps=20)
    values[name] = {n: est.get_variable_value(n)
                    for n in est.get_variable_names()}
  assert sorted(values['ours']) == sorted(values['legacy'])
  for name, value in values['legacy'].items():
    np.testing.assert_array_equal(values['ours'][name], value, err_msg=name)


@pytest.mark.parametrize('method', ['evaluate', 'predict'])
def test_a_checkpoint_path_that_is_no_checkpoint_is_tfs_error(method, tmp_path):
  """A script's `except ValueError` around it keeps working (before: a
  NotFoundError from reading the checkpoint's shapes)."""
  errors = []
  for name, driver in (('legacy', legacy), ('ours', ours)):
    est = _estimator(driver, make_model_fn(NETS['dense_features'], legacy, []),
                     tmp_path / name)
    est.train(input_fn, steps=1)
    missing = str(tmp_path / name / 'model.ckpt-99')
    errors.append(_error(
        lambda: est.evaluate(input_fn, checkpoint_path=missing)
        if method == 'evaluate' else
        next(est.predict(input_fn, checkpoint_path=missing))))
  assert errors[0][0] is errors[1][0] is ValueError
  assert errors[1][1] == errors[0][1].replace('legacy', 'ours')


@pytest.mark.parametrize('net_name', ['dense_features', 'sequence'])
def test_checkpoints_cross_restore(net_name, tmp_path):
  net = NETS[net_name]
  reference = _train_twice(legacy, legacy, net, tmp_path / 'll')
  assert len(reference) == 4
  np.testing.assert_allclose(
      _train_twice(legacy, ours, net, tmp_path / 'lo'), reference, rtol=RTOL)
  np.testing.assert_allclose(
      _train_twice(ours, legacy, net, tmp_path / 'ol'), reference, rtol=RTOL)


def test_our_spec_class_matches_legacy_spec_class(tmp_path):
  losses = {'legacy': [], 'ours': []}
  for name, driver in (('legacy', legacy), ('ours', ours)):
    model_fn = make_model_fn(_input_layer_net, driver, losses[name])
    _estimator(driver, model_fn, tmp_path / name).train(input_fn, steps=3)
  np.testing.assert_allclose(losses['ours'], losses['legacy'], rtol=RTOL)


def test_seeded_initialization_matches_legacy(tmp_path):
  """Same graph op order as TF, so tf_random_seed gives the same init."""
  initial = {}
  for name, driver in (('legacy', legacy), ('ours', ours)):
    model_fn = make_model_fn(_dense_features_net, legacy, [],
                             init=random_init)
    _estimator(driver, model_fn, tmp_path / name,
               tf_random_seed=7).train(input_fn, steps=1)
    checkpoint = str(tmp_path / name / 'model.ckpt-0')
    initial[name] = {n: tf.train.load_variable(checkpoint, n)
                     for n, _ in tf.train.list_variables(checkpoint)}
  assert sorted(initial['ours']) == sorted(initial['legacy'])
  for name, value in initial['legacy'].items():
    np.testing.assert_array_equal(initial['ours'][name], value)


def _error(fn, *args, **kwargs):
  """(type, message) of the exception `fn(*args, **kwargs)` raises."""
  with pytest.raises(Exception) as info:
    fn(*args, **kwargs)
  return type(info.value), str(info.value)


def _model_fn(features, labels, mode, params):
  del features, labels, mode, params


def _model_fn_no_params(features, labels, mode):
  del features, labels, mode


def _model_fn_extra_arg(features, labels, params, extra):
  del features, labels, params, extra


CONSTRUCTOR_ERRORS = {
    'reserved_params': dict(params={'batch_size': 3}),
    'reserved_context': dict(params={'context': 1, 'a': 2}),
    'tpu_without_batch_size': dict(use_tpu=True),
    'tpu_negative_batch_size': dict(use_tpu=True, train_batch_size=-1),
    'tpu_float_batch_size': dict(use_tpu=True, train_batch_size=2.0),
    'tpu_eval_batch_size': dict(use_tpu=True, train_batch_size=2,
                                eval_batch_size=0),
    'tpu_predict_batch_size': dict(use_tpu=True, train_batch_size=2,
                                   predict_batch_size='8'),
    'params_without_params_arg': dict(model_fn=_model_fn_no_params,
                                      params={'a': 1}),
    'unexpected_model_fn_arg': dict(model_fn=_model_fn_extra_arg),
    'model_fn_none': dict(model_fn=None),
    'bad_warm_start': dict(warm_start_from=3),
    'model_dir_conflict': dict(model_dir='/tmp/elsewhere'),
}


@pytest.mark.parametrize('case', sorted(CONSTRUCTOR_ERRORS))
def test_constructor_errors_match_legacy(case, tmp_path):
  results = []
  for driver in (legacy, ours):
    kwargs = dict(model_fn=_model_fn, use_tpu=False,
                  config=driver.RunConfig(model_dir=str(tmp_path)))
    kwargs.update(CONSTRUCTOR_ERRORS[case])
    results.append(_error(driver.TPUEstimator, **kwargs))
  assert results[0] == results[1]


def test_constructor_rejects_missing_config_like_legacy():
  for config in (None, tf.estimator.RunConfig()):
    assert (_error(ours.TPUEstimator, _model_fn, config=config) ==
            _error(legacy.TPUEstimator, _model_fn, config=config))


CONFIG_ERRORS = {
    'iterations_suffix': ('TPUConfig', dict(iterations_per_loop='3x')),
    'iterations_zero': ('TPUConfig', dict(iterations_per_loop=0)),
    'num_shards_zero': ('TPUConfig', dict(num_shards=0)),
    'num_shards_str': ('TPUConfig', dict(num_shards='2')),
    'cores_per_replica': ('TPUConfig', dict(num_cores_per_replica=3)),
    'partition_dims_len': ('TPUConfig', dict(input_partition_dims=[1, 2, 3])),
    'partition_dims_mode': ('TPUConfig', dict(input_partition_dims=[[1]])),
    'partition_dims_cores': ('TPUConfig', dict(
        input_partition_dims=[[1]], per_host_input_for_training=3)),
    'eval_input_config': ('TPUConfig', dict(
        eval_training_input_configuration=3)),
    'infeed_sleep': ('TPUConfig', dict(initial_infeed_sleep_secs=-1)),
    'both_checkpoint_triggers': ('RunConfig', dict(
        save_checkpoints_steps=1, save_checkpoints_secs=2)),
    'empty_model_dir': ('RunConfig', dict(model_dir='')),
    'float_seed': ('RunConfig', dict(tf_random_seed=1.5)),
    'session_config': ('RunConfig', dict(session_config=3)),
    'keep_max': ('RunConfig', dict(keep_checkpoint_max=-1)),
    'keep_hours': ('RunConfig', dict(keep_checkpoint_every_n_hours=0)),
    'log_steps': ('RunConfig', dict(log_step_count_steps=0)),
    'summary_steps': ('RunConfig', dict(save_summary_steps=-1)),
    'master_and_cluster': ('RunConfig', dict(master='a', cluster=object())),
}


@pytest.mark.parametrize('case', sorted(CONFIG_ERRORS))
def test_config_errors_match_legacy(case):
  cls_name, kwargs = CONFIG_ERRORS[case]
  assert (_error(getattr(ours, cls_name), **kwargs) ==
          _error(getattr(legacy, cls_name), **kwargs))


def test_config_values_match_legacy():
  for kwargs in ({}, dict(save_checkpoints_steps=5), dict(master='grpc://x'),
                 dict(save_checkpoints_secs=None, evaluation_master='e')):
    mine, theirs = ours.RunConfig(**kwargs), legacy.RunConfig(**kwargs)
    for field in ('model_dir', 'tf_random_seed', 'save_summary_steps',
                  'save_checkpoints_steps', 'save_checkpoints_secs',
                  'session_config', 'keep_checkpoint_max',
                  'keep_checkpoint_every_n_hours', 'log_step_count_steps',
                  'master', 'evaluation_master', 'is_chief', 'task_type',
                  'task_id', 'num_ps_replicas', 'num_worker_replicas'):
      assert getattr(mine, field) == getattr(theirs, field), (kwargs, field)
  for kwargs in ({}, dict(iterations_per_loop='2h', num_shards=8,
                          per_host_input_for_training=False)):
    assert tuple(ours.TPUConfig(**kwargs)) == tuple(legacy.TPUConfig(**kwargs))
  replaced = [c.replace(save_checkpoints_steps=3).replace(tf_random_seed=1)
              for c in (ours.RunConfig(), legacy.RunConfig())]
  assert [(c.save_checkpoints_steps, c.save_checkpoints_secs,
           c.tf_random_seed) for c in replaced] == [(3, None, 1)] * 2


def test_accepts_legacy_run_config_and_estimator_spec(tmp_path):
  """tensorflow_estimator's RunConfig/TPUConfig/EstimatorSpec, duck-typed."""
  config = legacy.RunConfig(
      model_dir=str(tmp_path), save_checkpoints_steps=2,
      tpu_config=legacy.TPUConfig(iterations_per_loop=4))

  def model_fn(features, labels, mode, params):
    del params
    logits = tf.compat.v1.layers.dense(
        _input_layer_net(features, fixed_init), 1)
    loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
    train_op = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(
        loss, tf.compat.v1.train.get_global_step())
    return tf.compat.v1.estimator.EstimatorSpec(
        mode, loss=loss, train_op=train_op,
        eval_metric_ops={'m': tf.compat.v1.metrics.mean(logits)})

  est = ours.TPUEstimator(model_fn, config=config, use_tpu=False,
                          train_batch_size=BATCH, eval_batch_size=BATCH)
  assert est.config.tpu_config.iterations_per_loop == 4
  assert est.config.save_checkpoints_steps == 2
  est.train(input_fn, steps=3)
  assert est.evaluate(input_fn)['global_step'] == 3
  assert [p for p in sorted(tf.io.gfile.listdir(str(tmp_path)))
          if p.endswith('.index')] == ['model.ckpt-0.index',
                                       'model.ckpt-2.index',
                                       'model.ckpt-3.index']


def test_eval_on_tpu_warning_matches_legacy(tmp_path, tf_log):
  messages = {}
  for name, driver in (('legacy', legacy), ('ours', ours)):
    del tf_log[:]
    driver.TPUEstimator(_model_fn, use_tpu=False,
                        config=driver.RunConfig(model_dir=str(tmp_path)))
    messages[name] = [m for m in tf_log
                      if m.startswith(('_TPUContext', 'eval_on_tpu'))]
  assert messages['ours'] == messages['legacy'] == [
      '_TPUContext: eval_on_tpu True',
      'eval_on_tpu ignored because use_tpu is False.']


def _summary_steps(directory):
  """{tag: steps} of the summaries in `directory`'s event files."""
  steps = {}
  for path in tf.io.gfile.glob(str(directory / 'events.out.tfevents.*')):
    for event in tf.compat.v1.train.summary_iterator(path):
      for value in event.summary.value:
        steps.setdefault(value.tag, []).append(event.step)
  return steps


def test_logs_and_events_match_legacy(tmp_path, tf_log):
  """Rate logs every ceil(log_step_count_steps / iterations_per_loop) steps;
  no `loss = ..., step = ...` lines (TF 2.15's TPUEstimator logs them on a TPU
  only)."""
  logs, tags = {}, {}
  for name, driver in (('legacy', legacy), ('ours', ours)):
    del tf_log[:]
    est = _estimator(driver, make_model_fn(_input_layer_net, legacy, []),
                     tmp_path / name, log_step_count_steps=4,
                     tpu_config=driver.TPUConfig(iterations_per_loop=2))
    est.train(lambda params: input_fn(params, 'train').repeat(), steps=7)
    est.evaluate(input_fn, steps=2)
    logs[name] = [m.split(':')[0] for m in tf_log
                  if m.startswith(('global_step/sec', 'examples/sec'))]
    tags[name] = (_summary_steps(tmp_path / name),
                  _summary_steps(tmp_path / name / 'eval'))
    logs[name + '_loss_steps'] = [
        m.split(', step = ')[1].split(' ')[0] for m in tf_log
        if m.startswith('loss = ')]
  assert logs['ours'] == logs['legacy']
  assert logs['legacy_loss_steps'] == logs['ours_loss_steps'] == []
  assert logs['ours'].count('global_step/sec') == 3
  train_steps, eval_steps = tags['ours']
  assert sorted(train_steps) == sorted(tags['legacy'][0])
  assert train_steps['loss'] == tags['legacy'][0]['loss']
  assert eval_steps == tags['legacy'][1]
  assert {'loss', 'global_step/sec', 'examples/sec'} <= set(train_steps)
  assert {'loss', 'accuracy', 'mean_logit', 'checkpoint_path'} <= set(
      eval_steps)
