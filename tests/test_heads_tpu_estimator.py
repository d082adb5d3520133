"""Heads inside a TPUEstimator model_fn, with use_tpu=False and on the emulated TPU.

Each head class (tpu_fc's, `harness.heads.ESTIMATOR_CASES`) tops a linear
model whose model_fn returns `head.create_estimator_spec`: it trains one
step, evaluates (the emulated TPU with `eval_on_tpu=False`: TF 2.15's TPU
evaluation refuses a head's `EstimatorSpec`, and its metric_fn's Keras
metrics, as tpu_fc's does; for one head, `EVALUATED_ON_TPU`), predicts and
exports; the evaluation's losses are checked in numpy against the trained
kernel, the served outputs against `predict`.  `install()` binds tpu_fc's
heads into `tf.estimator` on TF >= 2.16 and leaves TF 2.15's own there.  On
the legacy lane the same model with TF 2.15's heads in TF's
TPUEstimator(use_tpu=False) must give the same numbers.
"""
import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf

from harness import heads
from harness import lanes


LR = 0.5
KERNEL = np.array([[0.5, -0.25, 0.75], [-0.5, 1., 0.25]], np.float32)


def model_fn_of(case, implementation='tpu_fc', tpu_spec=False,
                cross_shard=True, keras=False):
  """A linear model topped by the case's head, trained by SGD (summed over
  the shards by `CrossShardOptimizer` if `cross_shard`: TF 2.15's
  use_tpu=False has no CPU kernel for it; `keras`: Keras' SGD, given to the
  head, stepping the global step); `tpu_spec`: it returns the head's
  `TPUEstimatorSpec`."""

  def model_fn(features, labels, mode, params):
    del params
    head = heads.CASES[case][1](heads.implementation(implementation))
    logits = tf.compat.v1.layers.dense(
        features['x'], head.logits_dimension, use_bias=False,
        kernel_initializer=tf.compat.v1.constant_initializer(
            KERNEL[:, :head.logits_dimension]))

    def train_op_fn(loss):
      optimizer = tf.compat.v1.train.GradientDescentOptimizer(LR)
      if cross_shard:
        optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
      return optimizer.minimize(loss, tf.compat.v1.train.get_global_step())

    create = (head._create_tpu_estimator_spec if tpu_spec  # pylint: disable=protected-access
              else head.create_estimator_spec)
    if not keras:
      return create(features=features, mode=mode, logits=logits,
                    labels=labels, train_op_fn=train_op_fn)
    optimizer = tf.keras.optimizers.legacy.SGD(LR)
    optimizer.iterations = tf.compat.v1.train.get_global_step()
    return create(features=features, mode=mode, logits=logits, labels=labels,
                  optimizer=optimizer,
                  trainable_variables=tf.compat.v1.trainable_variables())

  return model_fn


def input_fn_of(case):
  def input_fn(params):
    features, labels, _ = heads.batch(case)
    return tf.data.Dataset.from_tensor_slices((features, labels)).batch(
        params['batch_size'], drop_remainder=True).repeat()
  return input_fn


def predict_input_fn(params):
  features = {'x': heads.batch('binary')[0]['x']}
  return tf.data.Dataset.from_tensor_slices(features).batch(
      params['batch_size'], drop_remainder=True)


def _estimator(case, model_dir, use_tpu, driver=tpu_fc, **kwargs):
  return driver.TPUEstimator(
      model_fn=model_fn_of(case, **kwargs), use_tpu=use_tpu,
      config=driver.RunConfig(model_dir=str(model_dir)),
      train_batch_size=heads.BATCH, eval_batch_size=heads.BATCH,
      predict_batch_size=heads.BATCH,
      **({'eval_on_tpu': False} if use_tpu else {}))


def _examples(x):
  return [tf.train.Example(features=tf.train.Features(feature={
      'x': tf.train.Feature(float_list=tf.train.FloatList(value=row))
  })).SerializeToString() for row in x]


def expected_losses(case, kernel):
  """(loss, {metric: value}) of the case's evaluation, in numpy."""
  features, labels, _ = heads.batch(case)
  logits = features['x'] @ kernel
  if case == 'multi_head':
    parts = {name: heads.numpy_losses(part, labels[name], part_logits, features)
             for name, part, part_logits in (
                 ('bin', 'binary', logits[:, :1]),
                 ('reg', 'regression', logits[:, 1:]))}
    losses = {'bin': heads.numpy_loss(parts['bin'], features['w']),
              'reg': heads.numpy_loss(parts['reg'], 1.)}
    return losses['bin'] + 0.5 * losses['reg'], {
        'loss/bin': losses['bin'], 'loss/reg': losses['reg'],
        'average_loss/reg': parts['reg'].mean()}
  head = heads.CASES[case][1](heads.implementation('tpu_fc'))
  key = lambda name: '{}/{}'.format(name, head.name) if head.name else name
  weights = features['w'] if head._weight_column else 1.  # pylint: disable=protected-access
  losses = heads.numpy_losses(case, labels, logits, features)
  return heads.numpy_loss(losses, weights, head.loss_reduction), {
      key('average_loss'): heads.numpy_average(losses, weights)}


# Evaluation, the costly mode (a head's metrics), runs on the emulated TPU
# for one head only: with `eval_on_tpu=False` it evaluates on the CPU as
# use_tpu=False does, where every head evaluates; every pair of head, device
# and mode is still covered (each head trains, predicts and exports on both).
EVALUATED_ON_TPU = ('regression',)


@pytest.fixture(scope='module')
def run(tmp_path_factory):
  """run(case, use_tpu, implementation='tpu_fc', driver='tpu_fc', **kwargs):
  the case's model (`implementation`'s head in `driver`'s TPUEstimator)
  trained one step, evaluated (as `EVALUATED_ON_TPU` says), predicted and
  (tpu_fc's) exported and served, once per arguments: the module's tests
  share it."""
  runs = {}

  def run_of(case, use_tpu, implementation='tpu_fc', driver='tpu_fc',
             **kwargs):
    key = (case, use_tpu, implementation, driver,
           tuple(sorted(kwargs.items())))
    if key not in runs:
      runs[key] = _train_evaluate_predict_export(
          tmp_path_factory.mktemp(case), case, use_tpu, implementation,
          lanes.driver(driver),
          evaluate=not use_tpu or case in EVALUATED_ON_TPU,
          export=driver == 'tpu_fc', **kwargs)
    return runs[key]

  return run_of


def _train_evaluate_predict_export(tmp_path, case, use_tpu, implementation,
                                   driver, evaluate, export, **kwargs):
  """{'kernel'[, 'evaluation'], 'predictions'[, 'served', 'signatures']}."""
  estimator = _estimator(case, tmp_path / 'model', use_tpu, driver=driver,
                         implementation=implementation, **kwargs)
  estimator.train(input_fn_of(case), steps=1)
  result = dict(
      kernel=estimator.get_variable_value('dense/kernel'),
      predictions=list(estimator.predict(predict_input_fn,
                                         yield_single_examples=False))[0])
  if evaluate:
    result['evaluation'] = estimator.evaluate(input_fn_of(case), steps=1)
  if export:
    export_dir = estimator.export_saved_model(
        str(tmp_path / 'export'),
        tpu_fc.export.build_parsing_serving_input_receiver_fn(
            {'x': tf.io.FixedLenFeature([heads.X_DIM], tf.float32)}))
    signatures = tf.saved_model.load(export_dir.decode()).signatures
    result['signatures'] = sorted(signatures.keys())
    x = heads.batch('binary')[0]['x']
    result['served'] = {
        key: value.numpy() for key, value in signatures['serving_default'](
            inputs=tf.constant(_examples(x))).items()}
  return result


def check_run(result, case):
  """The run's evaluation against its trained kernel in numpy, its
  predictions against the kernel, what it served against its predictions."""
  kernel = result['kernel']
  assert not np.allclose(kernel, KERNEL[:, :kernel.shape[1]])  # trained

  if 'evaluation' in result:
    results = result['evaluation']
    loss, metrics = expected_losses(case, kernel)
    assert results['loss'] == pytest.approx(loss, rel=1e-5)
    for key, value in metrics.items():
      assert results[key] == pytest.approx(value, rel=1e-5), key

  x = heads.batch('binary')[0]['x']
  predictions = result['predictions']
  logits = predictions.get('logits', predictions.get(
      'predictions', predictions.get(('reg', 'predictions'))))
  np.testing.assert_allclose(logits, (x @ kernel)[:, -logits.shape[1]:],
                             rtol=1e-5, atol=1e-6)

  if 'served' in result:
    served = result['served']
    output, prediction = ('scores', 'probabilities') if 'scores' in served else (
        'outputs', 'predictions')
    prediction = predictions.get(prediction,
                                 predictions.get(('bin', prediction)))
    np.testing.assert_allclose(served[output], prediction, rtol=1e-6)
    assert 'predict' in result['signatures']


USE_TPU = pytest.mark.parametrize('use_tpu', [False, True],
                                  ids=['cpu', 'emulated_tpu'])


@USE_TPU
@pytest.mark.parametrize('case', heads.ESTIMATOR_CASES)
def test_head_trains_evaluates_predicts_and_exports(run, case, use_tpu):
  check_run(run(case, use_tpu), case)


@pytest.mark.legacy_only
@USE_TPU
def test_tf_heads_run_in_tpu_fc_estimators(run, use_tpu):
  """What `install()` leaves bound on TF 2.15: TF's own heads."""
  check_run(run('multi_head', use_tpu, 'tf'), 'multi_head')


@USE_TPU
def test_a_keras_optimizer_trains_a_head(tmp_path, use_tpu):
  estimator = _estimator('regression', tmp_path, use_tpu, keras=True)
  estimator.train(input_fn_of('regression'), steps=1)
  assert estimator.get_variable_value('global_step') == 1
  features, labels, _ = heads.batch('regression')
  x, start = features['x'], KERNEL[:, :2]
  # d/dK of sum(w (x K - y)^2) / (batch * 2)
  gradient = x.T @ (2 * features['w'] * (x @ start - labels)) / labels.size
  np.testing.assert_allclose(estimator.get_variable_value('dense/kernel'),
                             start - LR * gradient, rtol=1e-5)


def test_emulated_tpu_evaluation_refuses_a_heads_specs_as_tf(tmp_path):
  """TF 2.15's TPU evaluation takes only a `TPUEstimatorSpec`, and its
  metric_fn's `(value, update_op)` pairs: a head gives an `EstimatorSpec`,
  or (`_create_tpu_estimator_spec`) Keras metric objects."""
  case = 'regression'
  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn_of(case), use_tpu=True, train_batch_size=heads.BATCH,
      eval_batch_size=heads.BATCH,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path)))
  estimator.train(input_fn_of(case), steps=1)
  with pytest.raises(RuntimeError, match='must have type`TPUEstimatorSpec`'):
    estimator.evaluate(input_fn_of(case), steps=1)
  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn_of(case, tpu_spec=True), use_tpu=True,
      train_batch_size=heads.BATCH, eval_batch_size=heads.BATCH,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path)))
  with pytest.raises(TypeError, match="'Mean' object is not subscriptable"):
    estimator.evaluate(input_fn_of(case), steps=1)


def test_a_heads_tpu_spec_runs_on_the_cpu(tmp_path):
  """`_create_tpu_estimator_spec` (what TF's canned TPU models returned) with
  use_tpu=False: its metric_fn's Keras metrics, evaluated on the CPU."""
  case = 'binary_weighted'
  estimator = _estimator(case, tmp_path, False, tpu_spec=True)
  estimator.train(input_fn_of(case), steps=1)
  results = estimator.evaluate(input_fn_of(case), steps=1)
  _, metrics = expected_losses(case, estimator.get_variable_value(
      'dense/kernel'))
  assert results['average_loss/bin'] == pytest.approx(
      metrics['average_loss/bin'], rel=1e-5)
  assert 'auc/bin' in results


HEAD_NAMES = ('Head', 'BinaryClassHead', 'MultiClassHead', 'MultiLabelHead',
              'RegressionHead', 'PoissonRegressionHead',
              'LogisticRegressionHead', 'MultiHead')


def test_install_binds_the_heads_where_tf_has_none():
  with tpu_fc.legacy_names.installed():
    for api in (tf, tf.compat.v1, tf.compat.v2):
      for name in HEAD_NAMES:
        head = getattr(api.estimator, name)
        assert (head.__module__.startswith('tensorflow_estimator') if
                lanes.LEGACY else head.__module__.startswith('tpu_fc'))
    from tensorflow.estimator import BinaryClassHead  # pylint: disable=g-import-not-at-top
    assert BinaryClassHead is tf.estimator.BinaryClassHead
    if not lanes.LEGACY:  # canned estimators: out of scope
      with pytest.raises(AttributeError, match='DNNClassifier'):
        tf.estimator.DNNClassifier  # pylint: disable=pointless-statement


@pytest.mark.legacy_only
@pytest.mark.parametrize('case', heads.ESTIMATOR_CASES)
def test_head_in_tpu_estimator_matches_tf(run, case):
  """tpu_fc's heads in tpu_fc's TPUEstimator(use_tpu=False) and TF 2.15's
  heads in TF's: the same kernel, evaluation and predictions.  TF's
  use_tpu=False has no CPU kernel for `CrossShardOptimizer`; tpu_fc's run
  (shared with the test above) has it, summing over its one shard."""
  ours = run(case, False)
  theirs = run(case, False, 'tf', driver='tf', cross_shard=False)
  np.testing.assert_array_equal(ours['kernel'], theirs['kernel'])
  assert sorted(ours['evaluation']) == sorted(theirs['evaluation'])
  for key, value in theirs['evaluation'].items():
    np.testing.assert_allclose(ours['evaluation'][key], value, rtol=1e-6,
                               err_msg=key)
  assert sorted(map(str, ours['predictions'])) == sorted(
      map(str, theirs['predictions']))
  for key, value in theirs['predictions'].items():
    np.testing.assert_array_equal(ours['predictions'][key], value)
