"""The heads under test: each case built from tpu_fc's heads or (legacy lane)
TF 2.15's, its batch, and the losses a head computes, in numpy.

A case is a head kind with options (`CASES`); `batch(case)` gives its
features ('x', and the weights 'w'), labels and logits, the same for every
implementation.  `numpy_losses` is the unweighted per-example (or per-logit)
loss each kind's documentation defines, written from the formulas.
"""
import collections
import math
import types

import numpy as np

from tpu_fc._tf import tf

BATCH = 4
X_DIM = 2
_HEAD_NAMES = ('BinaryClassHead', 'MultiClassHead', 'MultiLabelHead',
               'RegressionHead', 'PoissonRegressionHead',
               'LogisticRegressionHead', 'MultiHead')


def implementation(name):
  """The head classes by name: tpu_fc's ('tpu_fc') or TF 2.15's ('tf',
  legacy lane)."""
  if name == 'tpu_fc':
    from tpu_fc.estimator.head import binary_class_head, multi_class_head, multi_head, multi_label_head, regression_head  # pylint: disable=g-import-not-at-top,g-multiple-import
  else:
    from tensorflow_estimator.python.estimator.head import binary_class_head, multi_class_head, multi_head, multi_label_head, regression_head  # pylint: disable=g-import-not-at-top,g-multiple-import
  modules = (binary_class_head, multi_class_head, multi_label_head,
             regression_head, multi_head)
  return types.SimpleNamespace(**{
      head: next(getattr(m, head) for m in modules if hasattr(m, head))
      for head in _HEAD_NAMES})


def _abs_error(labels, logits, features):
  """A `loss_fn` reading features: |labels - logits| * (1 + x[:, :1])."""
  return tf.abs(labels - logits) * (1. + features['x'][:, :1])


# case name -> (kind, head of an implementation `h`).
CASES = {
    'binary': ('binary', lambda h: h.BinaryClassHead()),
    'binary_weighted': ('binary', lambda h: h.BinaryClassHead(
        weight_column='w', thresholds=[0.3, 0.6], name='bin')),
    'binary_vocabulary': ('binary_strings', lambda h: h.BinaryClassHead(
        label_vocabulary=['no', 'yes'], loss_reduction='sum')),
    'multi_class': ('multi_class', lambda h: h.MultiClassHead(
        3, weight_column='w')),
    'multi_class_vocabulary': ('multi_class_strings', lambda h: h.MultiClassHead(
        3, label_vocabulary=['a', 'b', 'c'], name='mc')),
    'multi_label': ('multi_label', lambda h: h.MultiLabelHead(
        3, weight_column='w', thresholds=[0.5],
        classes_for_class_based_metrics=[0, 2])),
    'multi_label_sparse': ('multi_label_sparse', lambda h: h.MultiLabelHead(
        3, label_vocabulary=['a', 'b', 'c'],
        classes_for_class_based_metrics=['b'], name='ml')),
    'regression': ('regression', lambda h: h.RegressionHead(
        label_dimension=2, weight_column='w')),
    'regression_loss_fn': ('regression_1d', lambda h: h.RegressionHead(
        loss_fn=_abs_error, inverse_link_fn=tf.math.exp, name='reg')),
    'poisson': ('poisson', lambda h: h.PoissonRegressionHead(
        weight_column='w')),
    'logistic': ('logistic', lambda h: h.LogisticRegressionHead(
        loss_reduction='sum')),
    'multi_head': ('multi_head', lambda h: h.MultiHead(
        [h.BinaryClassHead(weight_column='w', name='bin'),
         h.RegressionHead(label_dimension=2, name='reg')],
        head_weights=[1., 0.5])),
}
# One case of each head class: what runs inside TPUEstimator.
ESTIMATOR_CASES = ('binary_weighted', 'multi_class', 'multi_label',
                   'regression', 'poisson', 'logistic', 'multi_head')

Batch = collections.namedtuple('Batch', 'features labels logits')


def _labels(kind, rng):
  """Labels of a kind: numpy arrays (a dict for `multi_head`), or a
  SparseTensor's (indices, values, dense_shape) for `multi_label_sparse`."""
  if kind in ('binary', 'logistic'):
    values = rng.randint(0, 2, (BATCH, 1)).astype(np.float32)
    return values if kind == 'binary' else values * 0.8 + 0.1
  if kind == 'binary_strings':
    return np.array([['no'], ['yes'], ['yes'], ['no']])
  if kind == 'multi_class':
    return np.array([[0], [2], [1], [2]], np.int64)
  if kind == 'multi_class_strings':
    return np.array([['a'], ['c'], ['b'], ['c']])
  if kind == 'multi_label':
    return np.array([[1, 0, 1], [0, 0, 0], [0, 1, 1], [1, 1, 0]], np.int64)
  if kind == 'multi_label_sparse':
    return ([[0, 0], [0, 1], [2, 0], [3, 0]], ['a', 'c', 'b', 'c'], [BATCH, 2])
  if kind in ('regression', 'regression_1d'):
    return rng.normal(size=(BATCH, 2 if kind == 'regression' else 1)).astype(
        np.float32)
  if kind == 'poisson':
    return np.array([[0.], [1.], [3.], [2.]], np.float32)
  return {'bin': _labels('binary', rng), 'reg': _labels('regression', rng)}


LOGITS_DIMENSION = dict(binary=1, binary_strings=1, multi_class=3,
                        multi_class_strings=3, multi_label=3,
                        multi_label_sparse=3, regression=2, regression_1d=1,
                        poisson=1, logistic=1, multi_head=3)


def batch(case, seed=0):
  """The case's features, labels and logits (numpy; labels of a sparse
  kind as (indices, values, dense_shape))."""
  kind = CASES[case][0]
  rng = np.random.RandomState(seed)
  features = {'x': rng.normal(size=(BATCH, X_DIM)).astype(np.float32),
              'w': np.array([[1.], [0.5], [2.], [0.25]], np.float32)}
  logits = rng.normal(size=(BATCH, LOGITS_DIMENSION[kind])).astype(np.float32)
  return Batch(features, _labels(kind, rng), logits)


def label_tensors(labels):
  """Labels as a head takes them: a sparse kind's as a SparseTensor."""
  if isinstance(labels, tuple):
    indices, values, dense_shape = labels
    return tf.SparseTensor(np.array(indices, np.int64), values, dense_shape)
  return labels


def _sigmoid_cross_entropy(labels, logits):
  return (np.maximum(logits, 0) - logits * labels +
          np.log1p(np.exp(-np.abs(logits))))


def _stirling(labels):
  """The log(z!) approximation `log_poisson_loss` adds for z > 1."""
  return np.where(labels > 1, labels * np.log(np.maximum(labels, 1)) - labels
                  + 0.5 * np.log(2 * math.pi * np.maximum(labels, 1)), 0.)


def numpy_losses(case, labels, logits, features):
  """The case's unweighted loss per example ([B, 1]) or per logit."""
  kind = CASES[case][0]
  if kind in ('binary', 'logistic'):
    return _sigmoid_cross_entropy(labels, logits)
  if kind == 'multi_class':
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_softmax = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    return -np.take_along_axis(log_softmax, labels, axis=1)
  if kind == 'multi_label':
    return _sigmoid_cross_entropy(labels, logits).mean(axis=1, keepdims=True)
  if kind == 'regression':
    return (labels - logits) ** 2
  if kind == 'regression_1d':  # `_abs_error`
    return np.abs(labels - logits) * (1. + features['x'][:, :1])
  if kind == 'poisson':
    return np.exp(logits) - labels * logits + _stirling(labels)
  raise ValueError('no numpy loss of ' + case)


def numpy_loss(losses, weights, reduction='sum_over_batch_size'):
  """Keras' `compute_weighted_loss` of `losses` (weights broadcast)."""
  weighted = losses * weights
  return weighted.sum() / (1 if reduction == 'sum' else weighted.size)


def numpy_average(values, weights):
  """A Keras `Mean` of `values` weighted by broadcast `weights`."""
  weights = np.broadcast_to(weights, values.shape)
  return (values * weights).sum() / weights.sum()
