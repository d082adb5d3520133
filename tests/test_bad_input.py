"""Bad input through the public API: a clear error, or the documented legacy behaviour.

Every case of docs/bad_input.md runs through `tpu_fc.TPUEstimator` on each lookup path
it concerns: 'cpu' (use_tpu=False), 'embedding_core' (use_tpu=True, the emulated
embedding core on 2 shards) and 'tensor_core' (embedding_lookup_device='tpu_tensor_core').
An error case asserts the error type and that its message names the feature (or
checkpoint, or model_dir) and the offending value or shape.  A behaviour case trains
one step of SGD (learning rate 1) on `loss = sum(activation * COEF)`, so the table
moves by exactly the gradient of the ids the lookup keeps; the expected table is
computed here in numpy from the ids and weights the legacy rule keeps.  On the legacy
lane the 'cpu' path is also run through TF 2.15's own TPUEstimator(use_tpu=False),
which must give the same table or the same error.
"""
import dataclasses
import os
import re
from typing import Any, Callable, Optional, Tuple

import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf

from harness import lanes
from harness.oracle import outcome

fc = tf.feature_column
PATHS = ('cpu', 'embedding_core', 'tensor_core')
TPU_PATHS = ('embedding_core', 'tensor_core')
V, D, B, NS, L = 5, 2, 4, 2, 2    # vocabulary, dimension, batch, shards, max seq length
TABLE0 = np.arange(V * D, dtype=np.float32).reshape(V, D) / 10
COEF = np.arange(1.0, D + 1.0, dtype=np.float32)  # d(loss)/d(activation), per example
WIDTH = 3                                  # tensor_core_shape[1]
TABLE_NAME = {'ids': 'dense_features/ids_embedding/embedding_weights',
              'weighted': 'dense_features/ids_weighted_by_w_embedding/'
                          'embedding_weights',
              'sequence': 'sequence_features/s_embedding/embedding_weights'}
NAN = float('nan')


# The model -----------------------------------------------------------------------


def make_columns(path, kind='ids', vocabulary=V, dimension=D):
  """The one embedding column of a case: plain, weighted or sequence ids."""
  init = tf.compat.v1.constant_initializer(
      np.arange(vocabulary * dimension, dtype=np.float32).reshape(
          vocabulary, dimension) / 10)
  device = {}
  if path == 'tensor_core':
    device = dict(embedding_lookup_device='tpu_tensor_core',
                  tensor_core_shape=[None, WIDTH])
  if kind == 'sequence':
    categorical = fc.sequence_categorical_column_with_identity('s', vocabulary)
    return [tpu_fc.embedding_column(categorical, dimension, initializer=init,
                                    max_sequence_length=L, **device)]
  categorical = fc.categorical_column_with_identity('ids', vocabulary)
  if kind == 'weighted':
    categorical = fc.weighted_categorical_column(categorical, 'w')
  return [tpu_fc.embedding_column(categorical, dimension, initializer=init,
                                  **device)]


def make_model_fn(columns, spec_cls=tpu_fc.TPUEstimatorSpec):
  """loss = sum(activation * COEF), trained by SGD(1) (cross-shard on a TPU).

  (COEF = 1, 2, ... over the activation's last axis, also for other dimensions.)
  """
  sequence = columns[0].get_max_sequence_length() > 0

  def model_fn(features, labels, mode, params):
    del labels
    if sequence:
      net, _ = tf.keras.experimental.SequenceFeatures(columns)(features)
    else:
      net = tf.keras.layers.DenseFeatures(columns)(features)
    if mode == tpu_fc.ModeKeys.PREDICT:
      return spec_cls(mode, predictions={'net': net})
    loss = tf.reduce_sum(net * tf.range(1.0, net.shape[-1] + 1.0))  # COEF
    if mode == tpu_fc.ModeKeys.EVAL:
      return spec_cls(mode, loss=loss)
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(1.0)
    if params['use_tpu']:
      optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
    return spec_cls(mode, loss=loss, train_op=optimizer.minimize(
        loss, tf.compat.v1.train.get_global_step()))

  return model_fn


def make_estimator(model_dir, path, kind='ids', **column_args):
  columns = make_columns(path, kind, **column_args)
  use_tpu = path != 'cpu'
  spec = tpu_fc.EmbeddingConfigSpec(
      feature_columns=columns,
      optimization_parameters=tpu_fc.StochasticGradientDescentParameters(1.0))
  return tpu_fc.TPUEstimator(
      model_fn=make_model_fn(columns), use_tpu=use_tpu, train_batch_size=B,
      eval_batch_size=B, predict_batch_size=B,
      config=tpu_fc.RunConfig(model_dir=str(model_dir),
                              tpu_config=tpu_fc.TPUConfig(num_shards=NS)),
      embedding_config_spec=spec if use_tpu else None)


def make_input_fn(make_features, rows=B):
  """input_fn of `make_features()` (built in its graph) and zero labels."""

  def input_fn(params):
    del params
    return make_features(), tf.zeros([rows, 1])

  return input_fn


def legacy_table_after_one_step(model_dir, kind, make_features):
  """TF 2.15's own TPUEstimator(use_tpu=False): the table, or the error outcome."""
  columns = make_columns('cpu', kind)
  estimator = tf.compat.v1.estimator.tpu.TPUEstimator(
      model_fn=make_model_fn(columns,
                             tf.compat.v1.estimator.tpu.TPUEstimatorSpec),
      use_tpu=False, train_batch_size=B,
      config=tf.compat.v1.estimator.tpu.RunConfig(model_dir=str(model_dir)))
  error = outcome(estimator.train, make_input_fn(make_features), max_steps=1)
  return error or estimator.get_variable_value(TABLE_NAME[kind])


# Inputs and expectations -------------------------------------------------------


def sparse(rows, dtype=tf.int64, width=None):
  """A [B, width] SparseTensor of per-example value lists."""
  indices = [[b, j] for b, row in enumerate(rows) for j in range(len(row))]
  values = [v for row in rows for v in row]
  width = width or max([len(row) for row in rows] + [1])
  return tf.SparseTensor(np.array(indices, np.int64).reshape(-1, 2),
                         tf.constant(values, dtype), [len(rows), width])


def expected_table(kept, path):
  """The table after one step, from the (id, weight) pairs each example keeps.

  mean combiner: each kept id gets COEF * weight / sum(weights of its example);
  a sequence entry (weight None) gets COEF; on a TPU path CrossShardOptimizer
  divides the loss by the number of shards.
  """
  gradient = np.zeros((V, D), np.float32)
  for entries in kept:
    norm = sum(w for _, w in entries if w is not None)
    for i, w in entries:
      gradient[i] += COEF if w is None else COEF * w / norm
  scale = 1.0 if path == 'cpu' else 1.0 / NS
  return TABLE0 - scale * gradient


def unweighted(rows):
  return [[(i, 1.0) for i in row] for row in rows]


IDS = [[1], [2, 3], [3], [4]]


@dataclasses.dataclass
class Case:
  """One bad input on some paths: `raises` (type, message fragments) or `kept`.

  `kept(path)` gives the (id, weight) pairs per example that the lookup keeps, for
  `expected_table`; None where the path raises.  `features` builds the input.
  """
  name: str
  features: Callable[[], Any]
  paths: Tuple[str, ...] = PATHS
  kind: str = 'ids'
  raises: Optional[Callable[[str], Any]] = None
  kept: Optional[Callable[[str], Any]] = None


def _raises_on_tpu(error, *fragments, cpu=None, start=None):
  """Raises (error, fragments, start) on TPU paths; `cpu` on the CPU path (None:
  trains)."""
  return lambda path: cpu if path == 'cpu' else (error, fragments, start)


# How an out-of-range id {} is reported, per path (TPU paths: all such ids).
OUT_OF_RANGE_START = {
    'cpu': 'Feature ids (column ids_embedding): id {} is out of range [0, 5); '
           'use a num_buckets above the largest id',
    'embedding_core': 'Feature ids (table tbl_ids): ids [{}] are out of range '
                      '[0, 5); use a vocabulary size above the largest id',
    'tensor_core': 'Feature ids (table ids_embedding): ids [{}] are out of '
                   'range [0, 5); use a vocabulary size above the largest id',
}


CASES = [
    Case('id_at_or_above_vocabulary',
         lambda: {'ids': sparse([[1], [2, 7], [3], [4]])},
         raises=lambda path: (
             tf.errors.InvalidArgumentError,
             # (TF's gather says `indices[2] = 7 is not in`, its segment
             # reduction `Bad: indices[2] == 7 out of range`: either may fail
             # first)
             ('indices[2] =',) if path == 'cpu' else (),
             OUT_OF_RANGE_START[path].format(7))),
    Case('negative_ids_are_dropped',
         lambda: {'ids': sparse([[1], [2, -1], [-3], [4]])},
         kept=lambda path: unweighted([[1], [2], [], [4]])),
    Case('string_ids',
         lambda: {'ids': sparse([['1'], ['2'], ['3'], ['4']], tf.string)},
         raises=_raises_on_tpu(
             ValueError, 'SparseTensor with string as values are not '
             'supported.', 'feature_key = ids.',
             cpu=(ValueError, ("Invalid input, not integer. key: ids dtype: "
                               "<dtype: 'string'>",)))),
    Case('float_ids',
         lambda: {'ids': sparse([[1.0], [2.0], [3.0], [4.0]], tf.float32)},
         raises=_raises_on_tpu(
             ValueError, 'SparseTensor with string as values are not '
             'supported.', 'feature_key = ids.',
             cpu=(ValueError, ("Invalid input, not integer. key: ids dtype: "
                               "<dtype: 'float32'>",)))),
    Case('rank_3_ids',
         lambda: {'ids': tf.SparseTensor([[0, 0, 0], [1, 0, 0]], tf.constant(
             [1, 2], tf.int64), [B, 1, 1])},
         raises=_raises_on_tpu(
             ValueError, 'Feature ids must have rank 2 ([batch, ids]) for the '
             'TPU embedding, got rank 3.'),
         kept=lambda path: unweighted([[1], [2], [], []])),
    Case('missing_feature',
         lambda: {'other': sparse(IDS)},
         raises=lambda path: {
             'cpu': (ValueError, ('Feature ids is not in features dictionary.',)),
             'embedding_core': (KeyError, (
                 'Feature ids (table tbl_ids) is missing from the features '
                 "given to the TPU embedding; got ['other'].",)),
             'tensor_core': (KeyError, (
                 'Feature ids (tensor-core column ids_embedding) is missing '
                 "from the features; got ['other'].",))}[path]),
    Case('unknown_keys_are_ignored',
         lambda: {'ids': sparse(IDS), 'unknown': tf.ones([B, 3]),
                  'unknown_ids': sparse([[9], [9], [9], [9]])},
         kept=lambda path: unweighted(IDS)),
    Case('rows_without_ids_are_zeros',
         lambda: {'ids': sparse([[], [2, 3], [], [4]], width=2)},
         kept=lambda path: unweighted([[], [2, 3], [], [4]])),
    Case('nan_weight',
         lambda: {'ids': sparse(IDS), 'w': sparse([[1.0], [NAN, 1.0], [1.0],
                                                   [1.0]], tf.float32)},
         paths=('cpu', 'embedding_core'), kind='weighted',
         raises=_raises_on_tpu(
             tf.errors.InvalidArgumentError,
             start='Feature ids: weights w must be finite; got [nan]. '),
         kept=lambda path: [[(1, 1.0)], [(3, 1.0)], [(3, 1.0)], [(4, 1.0)]]),
    Case('non_positive_weights',
         lambda: {'ids': sparse([[1], [2, 3], [3, 4], [4]]),
                  'w': sparse([[1.0], [2.0, -1.0], [0.0, 1.0], [1.0]],
                              tf.float32)},
         paths=('cpu', 'embedding_core'), kind='weighted',
         kept=lambda path: (
             [[(1, 1.0)], [(2, 2.0)], [(4, 1.0)], [(4, 1.0)]] if path == 'cpu'
             else [[(1, 1.0)], [(2, 2.0), (3, -1.0)], [(3, 0.0), (4, 1.0)],
                   [(4, 1.0)]])),
    Case('fewer_weights_than_ids',
         lambda: {'ids': sparse(IDS), 'w': sparse([[1.0], [1.0], [1.0], [1.0]],
                                                  tf.float32)},
         paths=('cpu', 'embedding_core'), kind='weighted',
         raises=_raises_on_tpu(
             ValueError, 'Feature ids: weights w must hold one weight per id',
             'got 4 weights for 5 ids.',
             cpu=(ValueError, ('Dimensions 5 and 4 are not compatible',)))),
    Case('dense_weights',
         lambda: {'ids': sparse(IDS), 'w': tf.ones([B, 2])},
         paths=('cpu', 'embedding_core'), kind='weighted',
         raises=_raises_on_tpu(
             ValueError, 'weighted_categorical_column with weight key name w '
             'has dense weights. Dense weights are not supported on TPU.',
             cpu=(tf.errors.InvalidArgumentError, ('ids_weighted_by_w_embedding',
                                                   'LogicalAnd')))),
    Case('weights_for_dense_ids_with_id_0',
         lambda: {'ids': tf.constant([[1], [0], [3], [4]], tf.int64),
                  'w': sparse([[1.0], [1.0], [2.0], [1.0]], tf.float32)},
         paths=('cpu', 'embedding_core'), kind='weighted',
         raises=_raises_on_tpu(
             tf.errors.InvalidArgumentError,
             start='Feature ids: weights w must hold one weight per id, at '
             'the same indices; got 4 weights for 3 ids.'),
         kept=lambda path: [[(1, 1.0)], [(0, 1.0)], [(3, 2.0)], [(4, 1.0)]]),
    Case('sequence_longer_than_max_sequence_length',
         lambda: {'s': sparse([[1, 2, 3, 4], [1], [], [2, 2, 4]])},
         paths=('cpu', 'embedding_core'), kind='sequence',
         kept=lambda path: [
             [(i, None) for i in row[:None if path == 'cpu' else L]]
             for row in [[1, 2, 3, 4], [1], [], [2, 2, 4]]]),
    Case('empty_batch',  # the TPU's batch is the configured one (B)
         lambda: {'ids': tf.SparseTensor(np.zeros([0, 2], np.int64),
                                         tf.zeros([0], tf.int64), [0, 2])},
         raises=_raises_on_tpu(
             ValueError, 'input_fn gave the embedding features a batch of 0 '
             'examples, but the configured batch size (train_batch_size / '
             "eval_batch_size) is 4; as on a TPU, whose embedding config fixes "
             "the batch, batch the input by params['batch_size'].",
             start='Feature ids: '),
         kept=lambda path: []),
]


def _case_params():
  return [pytest.param(case, path, id='{}-{}'.format(case.name, path))
          for case in CASES for path in case.paths]


def _assert_raised(error, expected_type, fragments, start=None):
  """`error` (an `outcome`) is `expected_type`, its message holds `fragments`
  and, given `start`, begins with it (not with TF's listing of the op)."""
  assert error is not None, 'expected {}, but the step ran'.format(
      expected_type.__name__)
  error_type, message = error
  assert issubclass(error_type, expected_type), (error_type, message)
  for fragment in fragments:
    assert fragment in message, (fragment, message)
  if start is not None:
    assert message.startswith(start), (start, message)
    assert 'Detected at node' not in message, message


@pytest.mark.parametrize('case, path', _case_params())
def test_bad_input_in_training(case, path, tmp_path):
  estimator = make_estimator(tmp_path / 'tpu_fc', path, case.kind)
  rows = 0 if case.name == 'empty_batch' else B
  error = outcome(estimator.train, make_input_fn(case.features, rows),
                  max_steps=1)
  expected_error = case.raises(path) if case.raises else None
  if expected_error:
    _assert_raised(error, *expected_error)
  else:
    assert error is None, error
    table = estimator.get_variable_value(TABLE_NAME[case.kind])
    np.testing.assert_allclose(table, expected_table(case.kept(path), path),
                               rtol=1e-6, atol=1e-6)
  if lanes.LEGACY and path == 'cpu':
    legacy = legacy_table_after_one_step(tmp_path / 'tf', case.kind,
                                         case.features)
    if expected_error:
      assert isinstance(legacy, tuple), 'TF 2.15 trains where tpu_fc raises'
      assert legacy[0] is error[0], (legacy, error)
      assert _reason(legacy[1]) in _as_tf215_reports(_reason(error[1]))
    else:
      np.testing.assert_allclose(legacy, table, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('mode', ['train', 'evaluate', 'predict'])
@pytest.mark.parametrize('path', PATHS)
def test_out_of_range_ids_are_reported_first(path, mode, tmp_path):
  """Feature, table or column, ids, range and what to do come first, in TF's
  error class, without TF's listing of the op or a chained traceback.

  Predict looks up on the CPU on every path, so it reports as use_tpu=False;
  the inference lookup's segment reduction (evaluate and predict on the CPU)
  says it in its own words, training's gather in TF's, or, where Grappler's
  arithmetic rewrite (TF's session default with use_tpu=False) has the
  segment reduction read the whole table and it fails first, in its words.
  """
  estimator = make_estimator(tmp_path, path)
  with pytest.raises(tf.errors.InvalidArgumentError) as raised:
    _use(estimator, mode, tmp_path, ids=[[1], [9, 7], [3], [7]])
  message = str(raised.value)
  if path == 'cpu' or mode == 'predict':
    # Then TF's reason and node: the op names the first such id it meets.
    first, reason, node = message.splitlines()
    assert first.startswith(tuple(
        OUT_OF_RANGE_START['cpu'].format(i) for i in (7, 9))), message
    patterns = ((_GATHER_OUT_OF_RANGE, _SEGMENT_OUT_OF_RANGE)
                if mode == 'train' else (_SEGMENT_OUT_OF_RANGE,))
    assert any(pattern.fullmatch(reason) for pattern in patterns), message
    # (prediction runs the model_fn once per emulated core: any core's lookup
    # may meet a bad id first)
    assert re.match(r'\[\[\{\{node dense_features(_\d+)?/', node.lstrip()), node
  else:
    assert message == OUT_OF_RANGE_START[path].format('7 9') + (
        ', or hash or clip the ids in input_fn.')
  assert 'Detected at node' not in message, message
  assert raised.value.__cause__ is None and raised.value.__suppress_context__


def test_a_training_lookups_segment_reduction_report_is_explained():
  """TF's text when the rewritten lookup's segment reduction fails first (the
  race above: seen about once in 25 steps)."""
  from tpu_fc.estimator import input_errors  # pylint: disable=g-import-not-at-top
  tf_text = ('Bad: indices[1] == 9 out of range [0, 5)\n\t [[{{node dense_features/'
             'ids_embedding_1/ids_embedding_weights/embedding_lookup_sparse}}]]')
  assert input_errors._explanation(tf_text) == (  # pylint: disable=protected-access
      OUT_OF_RANGE_START['cpu'].format(9) + ' in its identity column (or a '
      'default_value for such ids), or hash or clip the ids in input_fn.\n' +
      tf_text)


_GATHER_OUT_OF_RANGE = re.compile(
    r'indices\[(\d+)\] = (-?\d+) is not in \[0, (\d+)\)')
_SEGMENT_OUT_OF_RANGE = re.compile(
    r'Bad: indices\[(\d+)\] == (-?\d+) out of range \[0, (\d+)\)')


def _as_tf215_reports(reason):
  """The texts TF 2.15 may give for what tpu_fc's CPU path reports as `reason`.

  Grappler's arithmetic rewrite (on in both: TF's session defaults) turns each
  lookup into a read of the whole table, so an out-of-range id is reported by
  the gather or by that SparseSegmentMean, whichever op fails first.
  """
  gather = _SEGMENT_OUT_OF_RANGE.sub(r'indices[\1] = \2 is not in [0, \3)',
                                     reason)
  return {gather, _GATHER_OUT_OF_RANGE.sub(
      r'Bad: indices[\1] == \2 out of range [0, \3)', gather)}


def _reason(message):
  """The line of an error message saying what failed (op errors: not where)."""
  lines = [line.strip() for line in message.strip().splitlines()]
  for before, line in zip(lines, lines[1:]):
    if line.startswith('[[{{node'):
      return before
  return lines[0]


# Batches and shards -------------------------------------------------------------


@pytest.mark.parametrize('with_labels', [True, False])
@pytest.mark.parametrize('path', PATHS)
def test_a_short_last_batch(path, with_labels, tmp_path):
  """5 examples in batches of 4, the last batch short (1 example).

  On the CPU a plain graph takes any batch, as TF 2.15 does.  On the emulated
  TPU, as on a TPU, the batch is the configured one: labels of unknown batch
  get TF 2.15's static-shape error; ids alone fail the step that gets 1.
  """
  ids = [[1], [2], [3], [4], [2]]

  def input_fn(params):
    features = {'ids': tf.ragged.constant(ids, tf.int64).to_sparse()}
    dataset = tf.data.Dataset.from_tensor_slices(
        (features, np.zeros([len(ids), 1], np.float32)) if with_labels else
        features)
    return dataset.batch(params['batch_size'])

  estimator = make_estimator(tmp_path, path)
  error = outcome(estimator.train, input_fn, max_steps=2)
  if path == 'cpu':
    assert error is None, error
    np.testing.assert_allclose(
        estimator.get_variable_value(TABLE_NAME['ids']),
        expected_table(unweighted(ids[:4]) + unweighted(ids[4:]), path),
        rtol=1e-6, atol=1e-6)
    return
  if with_labels:
    _assert_raised(error, ValueError, [
        '. A TPU (and its emulation) needs every dimension known: batch the '
        'Dataset with drop_remainder=True'],
                   start='The labels to the model returned by input_fn must '
                   'have static shape. Tensor: ')
    return
  _assert_raised(error, tf.errors.InvalidArgumentError, [
      'input_fn gave the embedding features a batch of 1 examples, but the '
      'configured batch size (train_batch_size / eval_batch_size) is 4'],
                 start='Feature ids')
  # Steps 1 and 2 run as one loop (iterations_per_loop=2), which failed as a
  # whole, as on a TPU: the checkpoint of step 0 is kept and restores.
  assert estimator.get_variable_value('global_step') == 0


def test_global_batch_not_divisible_by_num_shards(tmp_path):
  columns = make_columns('embedding_core')
  estimator = tpu_fc.TPUEstimator(
      model_fn=make_model_fn(columns), train_batch_size=6,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path),
                              tpu_config=tpu_fc.TPUConfig(num_shards=4)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=columns,
          optimization_parameters=tpu_fc.AdagradParameters(0.1)))
  with pytest.raises(ValueError, match='train batch size 6 must be divisible '
                     'by number of replicas 4'):
    estimator.train(make_input_fn(lambda: {'ids': sparse((IDS * 2)[:6])}, 6),
                    max_steps=1)


# Configuration ------------------------------------------------------------------


def _shared_with_different_vocabularies(module):
  return module.shared_embedding_columns(
      [fc.categorical_column_with_identity('a', 5),
       fc.categorical_column_with_identity('b', 6)], D)


def _mod_on_cpu(module, spec_cls, parameters_cls, model_dir):
  columns = make_columns('cpu')
  return module.TPUEstimator(
      model_fn=make_model_fn(columns), use_tpu=False, train_batch_size=B,
      config=module.RunConfig(model_dir=str(model_dir)),
      embedding_config_spec=spec_cls(
          feature_columns=columns, partition_strategy='mod',
          optimization_parameters=parameters_cls(0.1)))


def test_shared_columns_with_different_vocabularies():
  error = outcome(_shared_with_different_vocabularies, tpu_fc)
  _assert_raised(error, ValueError, [
      'all categorical_columns must have the same number of buckets',
      'with buckets: 5', 'with buckets: 6'])
  if lanes.LEGACY:
    assert error == outcome(_shared_with_different_vocabularies,
                            tf.compat.v1.tpu.experimental)


def test_mod_partition_strategy_on_cpu(tmp_path):
  error = outcome(_mod_on_cpu, tpu_fc, tpu_fc.EmbeddingConfigSpec,
                  tpu_fc.AdagradParameters, tmp_path)
  _assert_raised(error, ValueError,
                 ['Mod sharding of embedding tables not supported on CPU.'])
  if lanes.LEGACY:
    legacy = tf.compat.v1.estimator.tpu
    assert error == outcome(
        _mod_on_cpu, legacy, legacy.experimental.EmbeddingConfigSpec,
        tf.compat.v1.tpu.experimental.AdagradParameters, tmp_path)


def _train_one_step_on_tpu(model_dir, columns=None, spec=None,
                           tpu_config=None, **estimator_kwargs):
  """One emulated-TPU training step of the case's model (its bad part given)."""
  columns = columns or make_columns('embedding_core')
  estimator = tpu_fc.TPUEstimator(
      model_fn=make_model_fn(columns), train_batch_size=B,
      config=tpu_fc.RunConfig(model_dir=str(model_dir), tpu_config=(
          tpu_config or tpu_fc.TPUConfig(num_shards=NS))),
      embedding_config_spec=spec or tpu_fc.EmbeddingConfigSpec(
          feature_columns=columns,
          optimization_parameters=tpu_fc.AdagradParameters(0.1)),
      **estimator_kwargs)
  estimator.train(make_input_fn(lambda: {'ids': sparse(IDS)}), max_steps=1)


@pytest.mark.parametrize('path', TPU_PATHS)
@pytest.mark.parametrize('kind', ['vocabulary', 'hash'])
def test_untransformed_values_out_of_range_say_to_map_them_in_input_fn(
    tmp_path, path, kind):
  """On a TPU an integer vocabulary or hash column's values reach the table as
  ids (TF 2.15 did the same): the error names the column and says how to map
  them to indices in input_fn (not to grow the vocabulary).  (Feature
  `values`: the column's once-per-process log is another test's.)"""
  categorical = (
      fc.categorical_column_with_vocabulary_list(
          'values', [10, 20, 30, 40, 50], dtype=tf.int64) if kind == 'vocabulary'
      else fc.categorical_column_with_hash_bucket('values', V, dtype=tf.int64))
  device = (dict(embedding_lookup_device='tpu_tensor_core',
                 tensor_core_shape=[None, WIDTH]) if path == 'tensor_core'
            else {})
  columns = [tpu_fc.embedding_column(categorical, D, **device)]
  estimator = tpu_fc.TPUEstimator(
      model_fn=make_model_fn(columns), train_batch_size=B,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path),
                              tpu_config=tpu_fc.TPUConfig(num_shards=NS)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=columns,
          optimization_parameters=tpu_fc.AdagradParameters(0.1)))
  _assert_raised(
      outcome(estimator.train, make_input_fn(
          lambda: {'values': sparse([[10], [20, 30], [3], [40]])}), max_steps=1),
      tf.errors.InvalidArgumentError,
      ['ids [10 20 30 40] are out of range [0, 5); its column {} has a {}, '
       'which a TPU does not apply to the values of an embedding feature'
       .format(categorical.name, kind),
       "features['values'] = <the embedding column>.categorical_column."
       "_transform_feature({'values': features['values']})"],
      start='Feature values (table ')


def test_a_combiner_typo_gets_tfs_error_before_training(tmp_path):
  """Refused when the TPU builds its tables, with the text of TF's TableConfig."""
  columns = [tpu_fc.embedding_column(fc.categorical_column_with_identity(
      'ids', V), D, combiner='avg')]
  error = outcome(_train_one_step_on_tpu, tmp_path, columns)
  _assert_raised(error, ValueError, [
      'combiner must be "mean", "sum", "sqrtn" or None. Received: avg.'])
  assert not os.path.exists(tmp_path / 'checkpoint')
  if lanes.LEGACY:
    assert error == outcome(lanes.tf_tpu_embedding.TableConfig, V, D,
                            combiner='avg')


def _dict_spec(table_optimizer=None, unused_table=False, **spec_kwargs):
  tables = {'t': tpu_fc.TableConfig(V, D, optimization_parameters=(
      table_optimizer))}
  if unused_table:
    tables['u'] = tpu_fc.TableConfig(V, D)
  return tpu_fc.EmbeddingConfigSpec(
      feature_to_config_dict={'ids': tpu_fc.FeatureConfig('t')},
      table_to_config_dict=tables, **spec_kwargs)


@pytest.mark.parametrize('spec_kwargs, message', [
    (dict(), '`optimization_parameters` is missing.'),
    (dict(optimization_parameters='adagrad'), '`optimization_parameters` must '
     'inherit from `_OptimizationParameters`. `type(optimization_parameters)`='
     "<class 'str'>"),
    (dict(optimization_parameters=tpu_fc.AdagradParameters(0.1),
          unused_table=True),
     "`table_to_config_dict` specifies table that is not used in "
     "`feature_to_config_dict`: {'u'}."),
])
def test_dict_configs_get_tfs_checks_when_the_tpu_builds_them(
    tmp_path, spec_kwargs, message):
  """TF 2.15's texts (`tpu_embedding._validate_*`, run by its TPU's build)."""
  spec = _dict_spec(**spec_kwargs)
  _assert_raised(outcome(_train_one_step_on_tpu, tmp_path, spec=spec),
                 ValueError, [message])
  _assert_raised(outcome(spec.to_mid_level), ValueError, [message])


def test_a_dict_spec_whose_tables_all_have_optimizers_needs_no_other():
  spec = _dict_spec(table_optimizer=tpu_fc.AdagradParameters(0.1))
  config = spec.to_mid_level()
  assert config.optimizer is None
  assert isinstance(config.tables[0].optimizer,
                    tf.tpu.experimental.embedding.Adagrad)


def test_two_shared_groups_of_one_name_and_other_shapes_are_refused(tmp_path):
  columns = (tpu_fc.shared_embedding_columns(
      [fc.categorical_column_with_identity('ids', V),
       fc.categorical_column_with_identity('b', V)], D,
      shared_embedding_collection_name='t') +
             tpu_fc.shared_embedding_columns(
                 [fc.categorical_column_with_identity('c', V)], D + 1,
                 shared_embedding_collection_name='t'))
  _assert_raised(outcome(_train_one_step_on_tpu, tmp_path, columns),
                 ValueError, ['Columns of table t differ', 'of dimension 3',
                              'its own shared_embedding_collection_name'])


@pytest.mark.parametrize('make_bad, fragments', [
    (lambda: dict(tpu_config={'num_shards': 4}),
     ['tpu_config must be a TPUConfig', "got {'num_shards': 4}"]),
    (lambda: dict(spec=_dict_spec(
        optimization_parameters=tpu_fc.AdagradParameters(0.1),
        experimental_gradient_multiplier_fn=0.5)),
     ['experimental_gradient_multiplier_fn must be a function of the global '
      'step', 'got 0.5']),
    (lambda: dict(columns=[tpu_fc.embedding_column(
        fc.categorical_column_with_identity('ids', V), D,
        learning_rate_fn=0.1)]),
     ['Column ids_embedding: learning_rate_fn must be a function of the '
      'global step', 'got 0.1']),
], ids=['tpu_config_dict', 'multiplier', 'learning_rate_fn'])
def test_configs_of_the_wrong_kind_are_named(tmp_path, make_bad, fragments):
  _assert_raised(outcome(lambda: _train_one_step_on_tpu(tmp_path,
                                                        **make_bad())),
                 (TypeError, ValueError), fragments)


def test_a_numeric_column_in_the_spec_gets_tfs_error_on_the_tpu(tmp_path):
  columns = make_columns('embedding_core') + [fc.numeric_column('x')]
  _assert_raised(outcome(_train_one_step_on_tpu, tmp_path, spec=(
      tpu_fc.EmbeddingConfigSpec(
          feature_columns=columns,
          optimization_parameters=tpu_fc.AdagradParameters(0.1)))),
                 TypeError, ['Unsupported feature column', 'NumericColumn'])


def _predict_on_shards(module, spec_cls, parameters_cls, model_dir, **kwargs):
  columns = make_columns('embedding_core')
  estimator = module.TPUEstimator(
      model_fn=make_model_fn(columns), train_batch_size=8,
      predict_batch_size=6, config=module.RunConfig(
          model_dir=str(model_dir), tpu_config=module.TPUConfig(num_shards=4)),
      embedding_config_spec=spec_cls(
          feature_columns=columns,
          optimization_parameters=parameters_cls(0.1)), **kwargs)
  return list(estimator.predict(make_input_fn(lambda: {'ids': sparse(IDS)})))


def test_a_predict_batch_not_divisible_by_the_shards_gets_tfs_error(tmp_path):
  error = outcome(_predict_on_shards, tpu_fc, tpu_fc.EmbeddingConfigSpec,
                  tpu_fc.AdagradParameters, tmp_path)
  # (TF 2.15's text, tpu_context.py's validate; its class first looks for a TPU)
  _assert_raised(error, ValueError, ['predict batch size 6 must be divisible '
                                     'by number of replicas 4'])


def test_export_saved_model_api_version_is_taken_as_tfs(tmp_path):
  for version in (1, 2):
    tpu_fc.TPUEstimator(model_fn=make_model_fn(make_columns('cpu')),
                        use_tpu=False, train_batch_size=B,
                        config=tpu_fc.RunConfig(model_dir=str(tmp_path)),
                        export_saved_model_api_version=version)
  bad = outcome(_predict_on_shards, tpu_fc, tpu_fc.EmbeddingConfigSpec,
                tpu_fc.AdagradParameters, tmp_path,
                export_saved_model_api_version=3)
  _assert_raised(bad, ValueError, [
      'export_saved_model_api_version should be 1 or 2; got 3.'])
  if lanes.LEGACY:
    legacy = tf.compat.v1.estimator.tpu
    assert bad == outcome(_predict_on_shards, legacy,
                          legacy.experimental.EmbeddingConfigSpec,
                          tf.compat.v1.tpu.experimental.AdagradParameters,
                          tmp_path, export_saved_model_api_version=3)


# Checkpoints and model_dir --------------------------------------------------------


@pytest.fixture(name='trained_dirs', scope='module')
def _trained_dirs(tmp_path_factory):
  """path -> model_dir trained 2 steps (checkpoints 1 and 2) with V=5, D=2."""
  dirs = {}
  for path in PATHS:
    model_dir = tmp_path_factory.mktemp(path)
    estimator = make_estimator(model_dir, path)
    estimator._config = estimator._config.replace(save_checkpoints_steps=1)  # pylint: disable=protected-access
    estimator.train(make_input_fn(lambda: {'ids': sparse(IDS)}), max_steps=2)
    dirs[path] = model_dir
  return dirs


def _use(estimator, mode, tmp_path, ids=IDS, keys=('ids',)):
  """Runs `mode` of the estimator once on `ids` as each of the features
  `keys` (export: to tmp_path)."""
  features = lambda: {key: sparse(ids) for key in keys}
  input_fn = make_input_fn(features)
  if mode == 'train':
    return estimator.train(input_fn, steps=1)
  if mode == 'evaluate':
    return estimator.evaluate(input_fn, steps=1)
  if mode == 'predict':
    return next(estimator.predict(lambda params: features()))
  with tf.Graph().as_default():
    placeholders = features()
  return estimator.export_saved_model(
      str(tmp_path / 'export'),
      tpu_fc.export.build_raw_serving_input_receiver_fn(placeholders))


@pytest.mark.parametrize('mode', ['train', 'evaluate', 'predict', 'export'])
@pytest.mark.parametrize('path', PATHS)
@pytest.mark.parametrize('changed', [dict(vocabulary=6), dict(dimension=3)],
                         ids=['vocabulary', 'dimension'])
def test_checkpoint_with_other_table_shape(trained_dirs, path, mode, changed,
                                           tmp_path):
  estimator = make_estimator(trained_dirs[path], path, **changed)
  model_shape = [changed.get('vocabulary', V), changed.get('dimension', D)]
  error = outcome(_use, estimator, mode, tmp_path)
  for error_type in (ValueError, tf.errors.InvalidArgumentError):  # (TF's)
    _assert_raised(error, error_type, [
        'Restoring from checkpoint failed.',
        'model.ckpt-2 does not fit this model',
        '{} (checkpoint [5, 2], model {})'.format(TABLE_NAME['ids'],
                                                  model_shape)])


def _changed_model(module, model_dir, path):
  """`module`'s TPUEstimator (tpu_fc's, or TF 2.15's on the 'cpu' path) of the
  trained model changed: the ids table has 6 rows (the checkpoint 5), a
  column `more` adds a table and the model a variable `extra`."""
  columns = make_columns(path, vocabulary=6) + [tpu_fc.embedding_column(
      fc.categorical_column_with_identity('more', V), D)]
  model_fn = make_model_fn(columns, module.TPUEstimatorSpec)

  def changed_model_fn(features, labels, mode, params):
    tf.compat.v1.get_variable('extra', [1])
    return model_fn(features, labels, mode, params)

  use_tpu = path != 'cpu'
  return module.TPUEstimator(
      model_fn=changed_model_fn, use_tpu=use_tpu, train_batch_size=B,
      eval_batch_size=B, predict_batch_size=B,
      config=module.RunConfig(model_dir=str(model_dir),
                              tpu_config=module.TPUConfig(num_shards=NS)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=columns,
          optimization_parameters=tpu_fc.StochasticGradientDescentParameters(
              1.0)) if use_tpu else None)


@pytest.mark.parametrize('mode', ['train', 'evaluate', 'predict'])
@pytest.mark.parametrize('path', PATHS)
def test_a_changed_model_gets_tfs_not_found_error_naming_all_it_lacks(
    trained_dirs, path, mode, tmp_path):
  """TF raises NotFoundError for the first key the checkpoint lacks (a script
  catches it); tpu_fc's names every lacking variable and table, and the table
  whose shape changed too."""
  model_dir = _copy_of(trained_dirs[path], tmp_path)
  keys = ('ids', 'more')
  error = outcome(_use, _changed_model(tpu_fc, model_dir, path), mode,
                  tmp_path, keys=keys)
  _assert_raised(error, tf.errors.NotFoundError, [
      'lacks variables this model needs: '
      'dense_features/more_embedding/embedding_weights, extra;',
      'changed shape: {} (checkpoint [5, 2], model [6, 2])'.format(
          TABLE_NAME['ids'])], start='Checkpoint {}'.format(
              os.path.join(str(model_dir), 'model.ckpt-2')))
  if lanes.LEGACY and path == 'cpu':
    tf_error = outcome(_use, _changed_model(
        tf.compat.v1.estimator.tpu, model_dir, path), mode, tmp_path,
                       keys=keys)
    assert tf_error[0] is tf.errors.NotFoundError, tf_error


def _copy_of(model_dir, tmp_path):
  copy = tmp_path / 'copy'
  tf.io.gfile.makedirs(str(copy))
  for name in tf.io.gfile.listdir(str(model_dir)):
    if not tf.io.gfile.isdir(os.path.join(str(model_dir), name)):
      tf.io.gfile.copy(os.path.join(str(model_dir), name),
                       os.path.join(str(copy), name))
  return copy


def _truncate_data(prefix):
  data, = tf.io.gfile.glob(prefix + '.data-*')
  size = os.path.getsize(data)
  with open(data, 'r+b') as f:
    f.truncate(size // 2)


def _corrupt_index(prefix):
  with open(prefix + '.index', 'r+b') as f:
    f.seek(8)
    f.write(b'not a checkpoint index')


@pytest.mark.parametrize('damage', [_truncate_data, _corrupt_index],
                         ids=['truncated', 'corrupt'])
@pytest.mark.parametrize('path', ['cpu', 'embedding_core'])
def test_unreadable_checkpoint_is_named_and_the_previous_one_restores(
    trained_dirs, path, damage, tmp_path):
  model_dir = _copy_of(trained_dirs[path], tmp_path)
  estimator = make_estimator(model_dir, path)
  latest = estimator.latest_checkpoint()
  damage(latest)
  error = outcome(estimator.train, make_input_fn(lambda: {'ids': sparse(IDS)}),
                  steps=1)
  _assert_raised(error, tf.errors.DataLossError, [
      'Checkpoint {} cannot be read'.format(latest), 'truncated or corrupt'])
  # The cure the message gives: remove the damaged checkpoint, resume.
  for name in tf.io.gfile.glob(latest + '.*'):
    tf.io.gfile.remove(name)
  previous = latest.replace('ckpt-2', 'ckpt-1')
  tf.compat.v1.train.update_checkpoint_state(str(model_dir), previous,
                                             [previous])
  estimator.train(make_input_fn(lambda: {'ids': sparse(IDS)}), steps=1)
  assert estimator.get_variable_value('global_step') == 2
  np.testing.assert_allclose(  # steps 1 and 2 again: two identical gradients
      estimator.get_variable_value(TABLE_NAME['ids']),
      expected_table(unweighted(IDS) * 2, path), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize('path', ['cpu', 'embedding_core'])
def test_unwritable_model_dir(path, tmp_path):
  blocker = tmp_path / 'a_file'
  blocker.write_text('')
  model_dir = blocker / 'model'
  estimator = make_estimator(model_dir, path)
  error = outcome(estimator.train, make_input_fn(lambda: {'ids': sparse(IDS)}),
                  max_steps=1)
  _assert_raised(error, PermissionError, [
      'model_dir {} is not writable'.format(model_dir)])
  # evaluate too, before its input_fn (not after a whole evaluation).
  error = outcome(estimator.evaluate, lambda params: 1 / 0, steps=1)
  _assert_raised(error, PermissionError, [
      'eval_dir {} is not writable, so no evaluation summary could be '
      'saved'.format(model_dir / 'eval')])
