"""tpu_fc's heads (tpu_fc/estimator/head/): what each mode's spec holds.

On the legacy lane every case runs through tpu_fc's heads and TF 2.15's own
on the same batch, graph and eager, and must give the same predictions,
export outputs, losses, metrics, summaries and errors.  On both lanes the
losses and metrics are checked against numbers derived in numpy from the
heads' documented formulas (`harness.heads`), the outputs against what the
heads document.
"""
import re

import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf

from harness import heads

TRAIN, EVAL, PREDICT = (tpu_fc.ModeKeys.TRAIN, tpu_fc.ModeKeys.EVAL,
                        tpu_fc.ModeKeys.PREDICT)
MODES = (TRAIN, EVAL, PREDICT)
REGULARIZATION = [0.25, 0.5]
ATOL = 1e-6  # float32 sums of a few values near 1
legacy_only = pytest.mark.legacy_only


def _output_tensors(output):
  """An export output's tensors by field."""
  if hasattr(output, 'scores'):
    return {'scores': output.scores, 'classes': output.classes}
  if hasattr(output, 'value'):
    return {'value': output.value}
  return dict(output.outputs)


def _summaries(serialized):
  summary = tf.compat.v1.Summary()
  summary.ParseFromString(serialized)
  return {value.tag: value.simple_value for value in summary.value}


def graph_results(implementation, case, mode, regularization_losses=None):
  """(what the spec holds, the values it computes) of `case`'s head in a
  graph: predictions, export outputs, loss, the train op (`train_op_fn`:
  the loss it is given), metrics after one update, summaries."""
  with tf.Graph().as_default():
    head = heads.CASES[case][1](heads.implementation(implementation))
    features, labels, logits = heads.batch(case)
    spec = head.create_estimator_spec(
        features=features, mode=mode, logits=logits,
        labels=None if mode == PREDICT else heads.label_tensors(labels),
        train_op_fn=tf.identity, regularization_losses=regularization_losses)
    outputs = {(name, field): tensor
               for name, output in (spec.export_outputs or {}).items()
               for field, tensor in _output_tensors(output).items()}
    structure = dict(
        predictions=sorted(map(str, spec.predictions)),
        export_outputs={name: type(output).__name__
                        for name, output in (spec.export_outputs or {}).items()},
        metrics=sorted(spec.eval_metric_ops),
        fields=[field for field in ('loss', 'train_op')
                if getattr(spec, field) is not None])
    fetches = dict(
        predictions={str(k): v for k, v in spec.predictions.items()},
        outputs={str(k): v for k, v in outputs.items()},
        **{field: getattr(spec, field) for field in structure['fields']})
    summary = tf.compat.v1.summary.merge_all()
    if summary is not None:
      fetches['summaries'] = summary
    with tf.compat.v1.Session() as session:
      session.run([tf.compat.v1.global_variables_initializer(),
                   tf.compat.v1.local_variables_initializer(),
                   tf.compat.v1.tables_initializer()])
      session.run({k: v[1] for k, v in spec.eval_metric_ops.items()})
      values = session.run(fetches)
      values['metrics'] = session.run(
          {k: v[0] for k, v in spec.eval_metric_ops.items()})
  if 'summaries' in values:
    values['summaries'] = _summaries(values['summaries'])
  return structure, values


def eager_results(implementation, case):
  """A head's eager loss, predictions and metric values of `case`."""
  head = heads.CASES[case][1](heads.implementation(implementation))
  features, labels, logits = heads.batch(case)
  labels = heads.label_tensors(labels)
  metrics = head.update_metrics(
      head.metrics(regularization_losses=REGULARIZATION), features, logits,
      labels, regularization_losses=REGULARIZATION)
  return dict(
      loss=head.loss(labels, logits, features=features, mode=EVAL,
                     regularization_losses=REGULARIZATION).numpy(),
      predictions={str(k): v.numpy()
                   for k, v in head.predictions(logits).items()},
      metrics={k: metric.result().numpy() for k, metric in metrics.items()})


def assert_same_values(actual, expected, path='values'):
  """Nested dicts of the same keys and equal arrays (floats to ATOL)."""
  if isinstance(expected, dict):
    assert sorted(actual) == sorted(expected), path
    for key in expected:
      assert_same_values(actual[key], expected[key], '{}[{!r}]'.format(
          path, key))
  elif np.asarray(expected).dtype.kind in 'fc':
    np.testing.assert_allclose(actual, expected, rtol=ATOL, atol=ATOL,
                               err_msg=path)
  else:
    np.testing.assert_array_equal(actual, expected, err_msg=path)


# --------------------------------------------------------------------------------
# 1. The same as TF 2.15's heads (legacy lane).
# --------------------------------------------------------------------------------


@legacy_only
@pytest.mark.parametrize('mode', MODES)
@pytest.mark.parametrize('case', sorted(heads.CASES))
def test_spec_of_each_mode_matches_tf(case, mode):
  regularization = REGULARIZATION if case.startswith('binary') else None
  ours = graph_results('tpu_fc', case, mode, regularization)
  theirs = graph_results('tf', case, mode, regularization)
  assert ours[0] == theirs[0]
  assert_same_values(ours[1], theirs[1])


@legacy_only
@pytest.mark.parametrize('case', sorted(heads.CASES))
def test_eager_loss_predictions_and_metrics_match_tf(case):
  assert_same_values(eager_results('tpu_fc', case),
                     eager_results('tf', case))


def _error_of(build):
  """The error `build()` raises, an object's repr in its text as '<object>'."""
  try:
    build()
  except Exception as e:  # pylint: disable=broad-except
    return type(e).__name__, re.sub(r'<[\w.]+ object at 0x\w+>', '<object>',
                                    str(e))
  return None


def _train_spec(head, labels=((1.,), (0.,)), logits=((0.5,), (-1.,)),
                **kwargs):
  return head.create_estimator_spec(
      features={}, mode=TRAIN, logits=np.array(logits, np.float32),
      labels=np.array(labels), **kwargs)


ERRORS = {
    'tf1_optimizer': lambda h: _train_spec(
        h.BinaryClassHead(),
        optimizer=tf.compat.v1.train.GradientDescentOptimizer(0.1),
        trainable_variables=[]),
    'no_train_op': lambda h: _train_spec(h.BinaryClassHead()),
    'optimizer_and_train_op_fn': lambda h: _train_spec(
        h.BinaryClassHead(), train_op_fn=tf.identity,
        optimizer=tf.keras.optimizers.legacy.SGD(0.1),
        trainable_variables=[]),
    'keras_optimizer_without_get_updates': lambda h: _train_spec(
        h.BinaryClassHead(), optimizer=tf.keras.optimizers.SGD(0.1),
        trainable_variables=[]),
    'no_trainable_variables': lambda h: _train_spec(
        h.BinaryClassHead(), optimizer=tf.keras.optimizers.legacy.SGD(0.1)),
    'update_ops_not_a_list': lambda h: _train_spec(
        h.BinaryClassHead(), train_op_fn=tf.identity, update_ops=tf.no_op()),
    'no_labels': lambda h: h.BinaryClassHead().loss(
        None, np.zeros([2, 1]), features={}),
    'label_dimension': lambda h: h.RegressionHead(label_dimension=2).loss(
        np.zeros([2, 3]), np.zeros([2, 2]), features={}),
    'logits_dimension': lambda h: h.MultiClassHead(3).predictions(
        np.zeros([2, 2])),
    'prediction_key': lambda h: h.BinaryClassHead().predictions(
        np.zeros([2, 1]), ['probability']),
    'float_class_ids': lambda h: h.MultiClassHead(3).loss(
        np.zeros([2, 1]), np.zeros([2, 3]), features={}),
    'weight_column_type': lambda h: h.BinaryClassHead(weight_column=3).loss(
        np.zeros([2, 1]), np.zeros([2, 1]), features={}),
    'n_classes': lambda h: h.MultiClassHead(2),
    'vocabulary_size': lambda h: h.MultiLabelHead(
        3, label_vocabulary=['a', 'b']),
    'loss_fn_arguments': lambda h: h.RegressionHead(
        loss_fn=lambda labels, logits, weights: labels),
    'loss_reduction': lambda h: h.LogisticRegressionHead(
        loss_reduction='none'),
    'thresholds': lambda h: h.BinaryClassHead(thresholds=[0.5, 1.]),
    'class_metrics': lambda h: h.MultiLabelHead(
        2, classes_for_class_based_metrics=[2]),
    'unnamed_multi_head': lambda h: h.MultiHead([h.RegressionHead()]),
    'multi_head_reductions': lambda h: h.MultiHead([
        h.RegressionHead(name='a'),
        h.RegressionHead(name='b', loss_reduction='sum')]).loss_reduction,
    'multi_head_labels': lambda h: h.MultiHead([
        h.RegressionHead(name='a')]).loss(np.zeros([2, 1]), np.zeros([2, 1])),
    'multi_head_split': lambda h: h.MultiHead([
        h.RegressionHead(name='a')]).predictions(np.zeros([2, 2])),
}


@legacy_only
@pytest.mark.parametrize('error', sorted(ERRORS))
def test_errors_match_tf(error):
  with tf.Graph().as_default():
    ours = _error_of(lambda: ERRORS[error](heads.implementation('tpu_fc')))
  with tf.Graph().as_default():
    theirs = _error_of(lambda: ERRORS[error](heads.implementation('tf')))
  assert ours is not None
  assert ours == theirs


def _keras_trained(implementation, names=None):
  """A regression head's variable after one step of a Keras SGD (momentum:
  a slot); `names`: a list given the global variables' names."""
  with tf.Graph().as_default():
    features, labels, _ = heads.batch('regression_loss_fn')
    variable = tf.Variable([[0.5], [-0.25]])
    head = heads.implementation(implementation).RegressionHead()
    spec = head.create_estimator_spec(
        features=features, mode=TRAIN, logits=features['x'] @ variable,
        labels=labels,
        optimizer=tf.keras.optimizers.legacy.SGD(0.1, momentum=0.5),
        trainable_variables=[variable])
    if names is not None:
      names.extend(sorted(v.op.name for v in
                          tf.compat.v1.global_variables()))
    with tf.compat.v1.Session() as session:
      session.run(tf.compat.v1.global_variables_initializer())
      session.run(spec.train_op)
      return session.run(variable)


@legacy_only
def test_keras_optimizer_trains_as_tf():
  """The same step, and the same variable names (the optimizer's under the
  head's 'training' scope): checkpoints carry over."""
  ours, theirs = [], []
  np.testing.assert_allclose(_keras_trained('tpu_fc', ours),
                             _keras_trained('tf', theirs), rtol=ATOL)
  assert ours == theirs and len(ours) > 2


# --------------------------------------------------------------------------------
# 2. Numbers derived by hand (both lanes).
# --------------------------------------------------------------------------------


def test_keras_optimizer_takes_a_gradient_step():
  features, labels, _ = heads.batch('regression_loss_fn')
  x, start = features['x'], np.array([[0.5], [-0.25]], np.float32)
  # d/dv of mean((x v - y)^2) = 2 x^T (x v - y) / batch; momentum's first
  # step is plain SGD's
  gradient = 2 * x.T @ (x @ start - labels) / heads.BATCH
  np.testing.assert_allclose(_keras_trained('tpu_fc'), start - 0.1 * gradient,
                             rtol=1e-5)


NUMPY_CASES = ('binary', 'binary_weighted', 'multi_class', 'multi_label',
               'regression', 'regression_loss_fn', 'poisson', 'logistic')


@pytest.mark.parametrize('case', NUMPY_CASES)
def test_loss_and_loss_metrics_by_hand(case):
  head = heads.CASES[case][1](heads.implementation('tpu_fc'))
  features, labels, logits = heads.batch(case)
  losses = heads.numpy_losses(case, labels, logits, features)
  weights = features['w'] if head._weight_column else 1.  # pylint: disable=protected-access
  key = lambda name: '{}/{}'.format(name, head.name) if head.name else name
  _, values = graph_results('tpu_fc', case, EVAL, REGULARIZATION)
  np.testing.assert_allclose(
      values['loss'], heads.numpy_loss(losses, weights, head.loss_reduction) +
      sum(REGULARIZATION), rtol=1e-5)
  metrics = values['metrics']
  np.testing.assert_allclose(metrics[key('average_loss')],
                             heads.numpy_average(losses, weights), rtol=1e-5)
  np.testing.assert_allclose(metrics[key('regularization_loss')],
                             sum(REGULARIZATION))
  if key('label/mean') in metrics:
    predicted = values['predictions'].get('logistic', values['predictions'].get(
        'predictions'))
    np.testing.assert_allclose(metrics[key('label/mean')],
                               heads.numpy_average(labels, weights), rtol=1e-5)
    np.testing.assert_allclose(metrics[key('prediction/mean')],
                               heads.numpy_average(predicted, weights),
                               rtol=1e-5)


def test_binary_classification_metrics_by_hand():
  features, labels, logits = heads.batch('binary_weighted')
  weights = features['w']
  logistic = 1 / (1 + np.exp(-logits))
  _, values = graph_results('tpu_fc', 'binary_weighted', EVAL)
  metrics = {k.split('/bin')[0]: v for k, v in values['metrics'].items()}

  def weighted(condition):
    return (weights * condition).sum()

  for name, threshold in (('', 0.5), ('/positive_threshold_0.3', 0.3),
                          ('/positive_threshold_0.6', 0.6)):
    predicted = logistic > threshold
    np.testing.assert_allclose(
        metrics['accuracy' + name],
        weighted(predicted == labels) / weights.sum(), rtol=1e-6)
    np.testing.assert_allclose(
        metrics['precision' + name],
        weighted(predicted & (labels == 1)) / weighted(predicted), rtol=1e-6)
    np.testing.assert_allclose(
        metrics['recall' + name],
        weighted(predicted & (labels == 1)) / weighted(labels == 1), rtol=1e-6)
  label_mean = weighted(labels) / weights.sum()
  np.testing.assert_allclose(metrics['accuracy_baseline'],
                             max(label_mean, 1 - label_mean), rtol=1e-6)
  assert 0 <= metrics['auc'] <= 1 and 0 <= metrics['auc_precision_recall'] <= 1


def test_binary_predictions_and_outputs_by_hand():
  logits = heads.batch('binary_vocabulary').logits
  structure, values = graph_results('tpu_fc', 'binary_vocabulary', PREDICT)
  assert structure['export_outputs'] == {
      'serving_default': 'ClassificationOutput',
      'classification': 'ClassificationOutput',
      'regression': 'RegressionOutput', 'predict': 'PredictOutput'}
  assert structure['fields'] == [] and structure['metrics'] == []
  predictions, outputs = values['predictions'], values['outputs']
  logistic = 1 / (1 + np.exp(-logits))
  np.testing.assert_allclose(predictions['logistic'], logistic, rtol=1e-6)
  np.testing.assert_allclose(predictions['probabilities'],
                             np.hstack([1 - logistic, logistic]), rtol=1e-6)
  class_ids = (logits > 0).astype(np.int64)
  np.testing.assert_array_equal(predictions['class_ids'], class_ids)
  np.testing.assert_array_equal(predictions['classes'],
                                np.where(class_ids, b'yes', b'no'))
  np.testing.assert_array_equal(predictions['all_classes'],
                                [[b'no', b'yes']] * heads.BATCH)
  np.testing.assert_array_equal(predictions['all_class_ids'],
                                [[0, 1]] * heads.BATCH)
  np.testing.assert_array_equal(
      outputs[str(('serving_default', 'classes'))],
      [[b'no', b'yes']] * heads.BATCH)
  np.testing.assert_allclose(outputs[str(('regression', 'value'))], logistic,
                             rtol=1e-6)
  assert sorted(k for k in outputs if 'predict' in k) == sorted(
      str(('predict', key)) for key in predictions)


def test_multi_head_merges_its_heads():
  features, labels, logits = heads.batch('multi_head')
  structure, values = graph_results('tpu_fc', 'multi_head', PREDICT)
  assert structure['export_outputs'] == {
      'serving_default': 'ClassificationOutput',
      'bin': 'ClassificationOutput', 'bin/classification':
          'ClassificationOutput', 'bin/regression': 'RegressionOutput',
      'bin/predict': 'PredictOutput', 'reg': 'RegressionOutput',
      'reg/regression': 'RegressionOutput', 'reg/predict': 'PredictOutput',
      'predict': 'PredictOutput'}
  assert str(('predict', 'reg/predictions')) in values['outputs']
  np.testing.assert_allclose(values['predictions'][str(('reg', 'predictions'))],
                             logits[:, 1:])
  structure, values = graph_results('tpu_fc', 'multi_head', EVAL)
  binary = heads.numpy_losses('binary', labels['bin'], logits[:, :1], features)
  regression = heads.numpy_losses('regression', labels['reg'], logits[:, 1:],
                                  features)
  binary_loss = heads.numpy_loss(binary, features['w'])
  regression_loss = heads.numpy_loss(regression, 1.)
  np.testing.assert_allclose(values['loss'],
                             binary_loss + 0.5 * regression_loss, rtol=1e-5)
  np.testing.assert_allclose(values['metrics']['loss/bin'], binary_loss,
                             rtol=1e-5)
  np.testing.assert_allclose(values['metrics']['average_loss/reg'],
                             regression.mean(), rtol=1e-5)
  assert 'auc/bin' in structure['metrics']
  _, values = graph_results('tpu_fc', 'multi_head', TRAIN)
  assert sorted(values['summaries']) == ['loss', 'loss/bin', 'loss/reg']
  np.testing.assert_allclose(values['train_op'], values['loss'])


def test_train_summaries_and_train_op_by_hand():
  features, labels, logits = heads.batch('binary_weighted')
  structure, values = graph_results('tpu_fc', 'binary_weighted', TRAIN,
                                    REGULARIZATION)
  assert structure['fields'] == ['loss', 'train_op']
  loss = heads.numpy_loss(heads.numpy_losses('binary_weighted', labels, logits,
                                             features), features['w'])
  np.testing.assert_allclose(values['train_op'], loss + sum(REGULARIZATION),
                             rtol=1e-5)
  assert values['summaries'] == pytest.approx(
      {'loss/bin': loss + sum(REGULARIZATION),
       'regularization_loss/bin': sum(REGULARIZATION)})
