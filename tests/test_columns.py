"""tpu_fc.embedding_column / shared_embedding_columns side by side with TF's own.

The reference is TF's `tensorflow.python.tpu.feature_column_v2` factories
(`embedding_column_v2`, `shared_embedding_columns_v2`), which exist, byte-identical,
on both lanes; expected error texts are also written out here from
LEGACY_SEMANTICS §2, so each case is checked against TF and against the spec text.
Nothing expected is computed with tpu_fc.
"""
import copy
import pickle

import numpy as np
import pytest

from harness.oracle import outcome
import tpu_fc  # before tensorflow: sets TF_USE_LEGACY_KERAS on the latest lane
from tpu_fc.columns import lookup_device
from tpu_fc import build_context
import tensorflow as tf  # pylint: disable=g-bad-import-order
from tensorflow.python.tpu import feature_column_v2 as tf_tpu_fc  # pylint: disable=g-bad-import-order

fc = tf.feature_column

TF_EMBEDDING = tf_tpu_fc.embedding_column_v2
TF_SHARED = tf_tpu_fc.shared_embedding_columns_v2

CPU_TRAINING_ERROR = ('Using TPUEmbeddingColumn with embedding_lookup_device="cpu" '
                      'during training is not supported.')
BAD_DEVICE = ("If set, embedding_lookup_device must be in ['cpu', "
              "'tpu_tensor_core', 'tpu_embedding_core']")
TC_NEEDS_SHAPE = ('Using embedding_lookup_device=tpu_tensor_core requires '
                  'tensor_core_shape to be set.')
TC_NO_SEQUENCE = ('embedding_lookup_device=tpu_tensor_core currently does not '
                  'support sequence columns.')
NUMERIC_TYPE = "<class 'tensorflow.python.feature_column.feature_column_v2.NumericColumn'>"


def test_reference_factories_are_tf_exports():
  # The side-by-side reference is what tf.compat.v1.tpu.experimental exports.
  assert tf.compat.v1.tpu.experimental.embedding_column is TF_EMBEDDING
  assert tf.compat.v1.tpu.experimental.shared_embedding_columns is TF_SHARED
  assert tpu_fc.embedding_column is not TF_EMBEDDING


# --------------------------------------------------------------------------------
# Validation: same exception type and text as TF, and as LEGACY_SEMANTICS §2.
# --------------------------------------------------------------------------------

def _ids(name='ids', buckets=10):
  return fc.categorical_column_with_identity(name, buckets)


def _seq(name='seq', buckets=10):
  return fc.sequence_categorical_column_with_identity(name, buckets)


def _weighted():
  return fc.weighted_categorical_column(_ids('d'), 'd_weight')


# id, builder -> (args, kwargs), expected exception type, expected text.
EMBEDDING_CASES = [
    ('not_categorical_numeric', lambda: ((fc.numeric_column('num'), 4), {}),
     TypeError, 'categorical_column for tpu embedding_column must be type '
     'CategoricalColumn, got {}.'.format(NUMERIC_TYPE)),
    ('not_categorical_string', lambda: (('ids', 4), {}), TypeError,
     "categorical_column for tpu embedding_column must be type "
     "CategoricalColumn, got <class 'str'>."),
    ('not_categorical_embedding', lambda: ((fc.embedding_column(_ids(), 3), 4), {}),
     TypeError, "categorical_column for tpu embedding_column must be type "
     "CategoricalColumn, got <class 'tensorflow.python.feature_column."
     "feature_column_v2.EmbeddingColumn'>."),
    ('dimension_none', lambda: ((_ids(), None), {}), ValueError,
     'Invalid dimension None.'),
    ('dimension_zero', lambda: ((_ids(), 0), {}), ValueError,
     'Invalid dimension 0.'),
    ('dimension_negative', lambda: ((_ids(), -1), {}), ValueError,
     'Invalid dimension -1.'),
    ('tensor_core_shape_size_3',
     lambda: ((_ids(), 4), dict(tensor_core_shape=[1, 2, 3])), ValueError,
     'tensor_core_shape must be size 2. Got [1, 2, 3].'),
    ('tensor_core_shape_size_1',
     lambda: ((_ids(), 4), dict(tensor_core_shape=[8],
                                embedding_lookup_device='tpu_tensor_core')),
     ValueError, 'tensor_core_shape must be size 2. Got [8].'),
    ('initializer_not_callable',
     lambda: ((_ids(), 4), dict(initializer='zeros')), ValueError,
     'initializer must be callable if specified. Embedding of column_name: ids'),
    ('initializer_number_weighted',
     lambda: ((_weighted(), 4), dict(initializer=0.5)), ValueError,
     'initializer must be callable if specified. Embedding of column_name: '
     'd_weighted_by_d_weight'),
    ('bad_device', lambda: ((_ids(), 4), dict(embedding_lookup_device='gpu')),
     ValueError, BAD_DEVICE),
    ('bad_device_case', lambda: ((_ids(), 4), dict(embedding_lookup_device='CPU')),
     ValueError, BAD_DEVICE),
    ('tensor_core_without_shape',
     lambda: ((_ids(), 4), dict(embedding_lookup_device='tpu_tensor_core')),
     ValueError, TC_NEEDS_SHAPE),
    ('tensor_core_empty_shape',
     lambda: ((_ids(), 4), dict(embedding_lookup_device='tpu_tensor_core',
                                tensor_core_shape=[])),
     ValueError, TC_NEEDS_SHAPE),
    ('tensor_core_sequence',
     lambda: ((_seq(), 4), dict(embedding_lookup_device='tpu_tensor_core',
                                tensor_core_shape=[None, 3],
                                max_sequence_length=3)),
     ValueError, TC_NO_SEQUENCE),
    ('sequence_max_length_0', lambda: ((_seq(), 4), {}), ValueError,
     'max_sequence_length must be greater than 0 for sequence columns. Got '
     'max_sequence_length=0 for sequence column seq.'),
    ('sequence_max_length_negative_cpu',
     lambda: ((_seq(), 4), dict(max_sequence_length=-1,
                                embedding_lookup_device='cpu')), ValueError,
     'max_sequence_length must be greater than 0 for sequence columns. Got '
     'max_sequence_length=-1 for sequence column seq.'),
    ('non_sequence_max_length_3',
     lambda: ((_ids(), 4), dict(max_sequence_length=3)), ValueError,
     'Non zero max_seq_length=3 specified for non sequence column ids.'),
    ('non_sequence_max_length_weighted_embedding_core',
     lambda: ((_weighted(), 4), dict(max_sequence_length=2,
                                     embedding_lookup_device='tpu_embedding_core')),
     ValueError, 'Non zero max_seq_length=2 specified for non sequence column '
     'd_weighted_by_d_weight.'),
    # Order of the checks.
    ('order_type_before_dimension', lambda: ((fc.numeric_column('num'), 0), {}),
     TypeError, 'categorical_column for tpu embedding_column must be type '
     'CategoricalColumn, got {}.'.format(NUMERIC_TYPE)),
    ('order_dimension_before_shape',
     lambda: ((_ids(), 0), dict(tensor_core_shape=[1])), ValueError,
     'Invalid dimension 0.'),
    ('order_shape_before_initializer',
     lambda: ((_ids(), 4), dict(tensor_core_shape=[1], initializer='x')),
     ValueError, 'tensor_core_shape must be size 2. Got [1].'),
    ('order_initializer_before_device',
     lambda: ((_ids(), 4), dict(initializer='x', embedding_lookup_device='gpu')),
     ValueError,
     'initializer must be callable if specified. Embedding of column_name: ids'),
    ('order_device_before_sequence_length',
     lambda: ((_seq(), 4), dict(embedding_lookup_device='gpu')), ValueError,
     BAD_DEVICE),
    ('order_tc_shape_before_tc_sequence',
     lambda: ((_seq(), 4), dict(embedding_lookup_device='tpu_tensor_core',
                                max_sequence_length=2)),
     ValueError, TC_NEEDS_SHAPE),
    ('order_tc_sequence_before_sequence_length',
     lambda: ((_seq(), 4), dict(embedding_lookup_device='tpu_tensor_core',
                                tensor_core_shape=[None, 2])),
     ValueError, TC_NO_SEQUENCE),
]


def _bucket_mismatch_text(args):
  """The bucket-mismatch text for ([ids2 (20 buckets), ids (10)], dim)."""
  ids2, ids = args[0]
  # The message names the columns sorted by name: ids first.
  return ('To use shared_embedding_column, all categorical_columns must have '
          'the same number of buckets. Given column: {} with buckets: 10 does  '
          'not match column: {} with buckets: 20'.format(ids, ids2))


SHARED_CASES = [
    ('not_categorical', lambda: (([_ids(), fc.numeric_column('num')], 4), {}),
     TypeError, 'categorical_column for tpu  shared_embedding_columns must be '
     'type CategoricalColumn, got {}.'.format(NUMERIC_TYPE)),
    ('not_categorical_first_string', lambda: ((['ids', _ids()], 4), {}),
     TypeError, "categorical_column for tpu  shared_embedding_columns must be "
     "type CategoricalColumn, got <class 'str'>."),
    ('max_sequence_lengths_too_short',
     lambda: (([_ids('a'), _ids('b')], 4), dict(max_sequence_lengths=[0])),
     ValueError, 'max_sequence_lengths and categorical_columns must be of the '
     'same length. len(max_sequence_lengths)=1 len(categorical_columns)=2.'),
    ('max_sequence_lengths_too_long',
     lambda: (([_seq('a'), _seq('b')], 4), dict(max_sequence_lengths=[2, 2, 2])),
     ValueError, 'max_sequence_lengths and categorical_columns must be of the '
     'same length. len(max_sequence_lengths)=3 len(categorical_columns)=2.'),
    ('dimension_none', lambda: (([_ids('a'), _ids('b')], None), {}), ValueError,
     'Invalid dimension None.'),
    ('dimension_zero', lambda: (([_ids('a'), _ids('b')], 0), {}), ValueError,
     'Invalid dimension 0.'),
    ('dimension_negative', lambda: (([_ids('a'), _ids('b')], -1), {}),
     ValueError, 'Invalid dimension -1.'),
    ('tensor_core_shape_size',
     lambda: (([_ids('a'), _ids('b')], 4), dict(tensor_core_shape=[1, 2, 3])),
     ValueError, 'tensor_core_shape must be size 2. Got [1, 2, 3].'),
    ('initializer_not_callable',
     lambda: (([_ids('a'), _ids('b')], 4), dict(initializer='zeros')),
     ValueError, 'initializer must be callable if specified. '),
    ('bucket_mismatch', lambda: (([_ids('ids2', 20), _ids('ids', 10)], 4), {}),
     ValueError, _bucket_mismatch_text),
    ('bad_device',
     lambda: (([_ids('a'), _ids('b')], 4), dict(embedding_lookup_device='gpu')),
     ValueError, BAD_DEVICE),
    ('tensor_core_without_shape',
     lambda: (([_ids('a'), _ids('b')], 4),
              dict(embedding_lookup_device='tpu_tensor_core')),
     ValueError, TC_NEEDS_SHAPE),
    ('tensor_core_sequence',
     lambda: (([_ids('a'), _seq('b')], 4),
              dict(embedding_lookup_device='tpu_tensor_core',
                   tensor_core_shape=[None, 2], max_sequence_lengths=[0, 2])),
     ValueError, TC_NO_SEQUENCE),
    ('sequence_without_lengths', lambda: (([_ids('a'), _seq('b')], 4), {}),
     ValueError, 'max_sequence_length must be greater than 0 for sequence '
     'columns. Got max_sequence_length=0 for sequence column b.'),
    ('non_sequence_with_length',
     lambda: (([_ids('a'), _ids('b')], 4), dict(max_sequence_lengths=[3, 0])),
     ValueError,
     'Non zero max_seq_length=3 specified for non sequence column a.'),
    ('non_sequence_with_length_cpu',
     lambda: (([_ids('a'), _ids('b')], 4),
              dict(max_sequence_lengths=[0, 5], embedding_lookup_device='cpu')),
     ValueError,
     'Non zero max_seq_length=5 specified for non sequence column b.'),
    ('empty_list', lambda: (([], 4), {}), IndexError, 'list index out of range'),
    # Order of the checks.
    ('order_type_before_lengths',
     lambda: (([_ids(), fc.numeric_column('num')], 4),
              dict(max_sequence_lengths=[0])),
     TypeError, 'categorical_column for tpu  shared_embedding_columns must be '
     'type CategoricalColumn, got {}.'.format(NUMERIC_TYPE)),
    ('order_lengths_before_dimension',
     lambda: (([_ids('a'), _ids('b')], 0), dict(max_sequence_lengths=[0])),
     ValueError, 'max_sequence_lengths and categorical_columns must be of the '
     'same length. len(max_sequence_lengths)=1 len(categorical_columns)=2.'),
    ('order_initializer_before_buckets',
     lambda: (([_ids('a', 5), _ids('b', 6)], 4), dict(initializer='x')),
     ValueError, 'initializer must be callable if specified. '),
    ('order_buckets_before_device',
     lambda: (([_ids('ids2', 20), _ids('ids', 10)], 4),
              dict(embedding_lookup_device='gpu')),
     ValueError, _bucket_mismatch_text),
    ('order_device_before_sequence_lengths',
     lambda: (([_ids('a'), _seq('b')], 4), dict(embedding_lookup_device='gpu')),
     ValueError, BAD_DEVICE),
]


@pytest.mark.parametrize('build,error,text',
                         [pytest.param(*c[1:], id=c[0]) for c in EMBEDDING_CASES])
def test_embedding_column_validation_matches_tf(build, error, text):
  args, kwargs = build()
  expected = outcome(TF_EMBEDDING, *args, **kwargs)
  assert expected == (error, text)  # TF agrees with LEGACY_SEMANTICS §2
  assert outcome(tpu_fc.embedding_column, *args, **kwargs) == expected


@pytest.mark.parametrize('build,error,text',
                         [pytest.param(*c[1:], id=c[0]) for c in SHARED_CASES])
def test_shared_embedding_columns_validation_matches_tf(build, error, text):
  args, kwargs = build()
  if callable(text):  # the text embeds the columns' reprs
    text = text(args)
  expected = outcome(TF_SHARED, *args, **kwargs)
  assert expected == (error, text)
  assert outcome(tpu_fc.shared_embedding_columns, *args, **kwargs) == expected


@pytest.mark.parametrize('factory', ['single', 'shared'])
def test_combiner_is_not_validated_at_construction(factory):
  # LEGACY_SEMANTICS §2: a bad combiner only fails at lookup.
  if factory == 'single':
    tf_col = TF_EMBEDDING(_ids(), 4, combiner='max')
    col = tpu_fc.embedding_column(_ids(), 4, combiner='max')
  else:
    tf_col = TF_SHARED([_ids('a'), _ids('b')], 4, combiner='max')[0]
    col = tpu_fc.shared_embedding_columns([_ids('a'), _ids('b')], 4,
                                          combiner='max')[0]
  assert col.get_combiner() == tf_col.get_combiner() == 'max'


# --------------------------------------------------------------------------------
# Accessors, per categorical kind x lookup device.
# --------------------------------------------------------------------------------

VOCAB = ['x', 'y', 'z', 'w']


@pytest.fixture(scope='module')
def vocab_file(tmp_path_factory):
  path = tmp_path_factory.mktemp('vocab') / 'vocab.txt'
  path.write_text('\n'.join(VOCAB) + '\n')
  return str(path)


def _categorical(kind, vocab_file):
  """(categorical column, is sequence) for a kind."""
  if kind == 'identity':
    return fc.categorical_column_with_identity('a', 10), False
  if kind == 'vocabulary_list':
    return fc.categorical_column_with_vocabulary_list('b', VOCAB), False
  if kind == 'vocabulary_file':
    return fc.categorical_column_with_vocabulary_file(
        'f', vocab_file, vocabulary_size=len(VOCAB), num_oov_buckets=2), False
  if kind == 'hashed':
    return fc.categorical_column_with_hash_bucket('h', 7), False
  if kind == 'weighted':
    return fc.weighted_categorical_column(
        fc.categorical_column_with_identity('d', 10), 'd_weight'), False
  if kind == 'sequence_identity':
    return fc.sequence_categorical_column_with_identity('s', 10), True
  if kind == 'sequence_vocabulary_list':
    return fc.sequence_categorical_column_with_vocabulary_list('sv', VOCAB), True
  raise AssertionError(kind)


KINDS = ['identity', 'vocabulary_list', 'vocabulary_file', 'hashed', 'weighted',
         'sequence_identity', 'sequence_vocabulary_list']
DEVICES = [None, 'cpu', 'tpu_embedding_core', 'tpu_tensor_core']
KIND_DEVICES = [(k, d) for k in KINDS for d in DEVICES
                if not (k.startswith('sequence') and d == 'tpu_tensor_core')]


def _column_kwargs(is_sequence, device):
  kwargs = dict(max_sequence_length=3 if is_sequence else 0)
  if device:
    kwargs['embedding_lookup_device'] = device
  if device == 'tpu_tensor_core':
    kwargs['tensor_core_shape'] = [None, 4]
  return kwargs


def _learning_rate_fn(step):
  return 0.1 / (1 + step)


def _accessors(column):
  return dict(
      name=column.name,
      feature_key=column.get_feature_key_name(),
      weight_key=column.get_weight_key_name(),
      var_name=column.get_embedding_var_name(),
      table_size=column.get_embedding_table_size(),
      combiner=column.get_combiner(),
      max_sequence_length=column.get_max_sequence_length(),
      sequence_length_key=column.get_sequence_length_feature_key_name(),
      is_sequence=column.is_sequence_column(),
      is_weighted=column.is_categorical_column_weighted(),
      learning_rate_fn=column.get_learning_rate_fn(),
      initializer=column.get_initializer(),
      use_safe_embedding_lookup=column.use_safe_embedding_lookup,
      parse_example_spec=column.parse_example_spec,
  )


@pytest.mark.parametrize('kind,device', KIND_DEVICES)
def test_embedding_column_accessors_match_tf(kind, device, vocab_file):
  categorical, is_sequence = _categorical(kind, vocab_file)
  kwargs = _column_kwargs(is_sequence, device)
  init = tf.compat.v1.zeros_initializer()
  tf_col = TF_EMBEDDING(categorical, 6, combiner='sqrtn', initializer=init,
                        learning_rate_fn=_learning_rate_fn,
                        use_safe_embedding_lookup=False, **kwargs)
  col = tpu_fc.embedding_column(categorical, 6, combiner='sqrtn',
                                initializer=init,
                                learning_rate_fn=_learning_rate_fn,
                                use_safe_embedding_lookup=False, **kwargs)
  assert isinstance(col, type(tf_col))
  assert col.categorical_column is categorical
  assert col.dimension == tf_col.dimension == 6
  assert _accessors(col) == _accessors(tf_col)
  # LEGACY_SEMANTICS §2 accessors, spelled out.
  assert col.name == categorical.name + '_embedding'
  assert col.get_embedding_table_size() == (categorical.num_buckets, 6)
  assert col.get_sequence_length_feature_key_name() == (
      col.get_feature_key_name() + '_seq_length_')
  assert col.get_max_sequence_length() == (3 if is_sequence else 0)
  # Per-instance device and shape.
  assert col.embedding_lookup_device == device
  assert col.tensor_core_shape == kwargs.get('tensor_core_shape')
  assert lookup_device(col) == device
  assert lookup_device(tf_col) == device
  if device:
    assert col._embedding_lookup_device == tf_col._embedding_lookup_device  # pylint: disable=protected-access


@pytest.mark.parametrize('kind,device', KIND_DEVICES)
def test_shared_embedding_columns_accessors_match_tf(kind, device, vocab_file):
  categorical, is_sequence = _categorical(kind, vocab_file)
  partner = fc.categorical_column_with_identity('p', categorical.num_buckets)
  kwargs = _column_kwargs(is_sequence, device)
  kwargs['max_sequence_lengths'] = [kwargs.pop('max_sequence_length'), 0]
  tf_cols = TF_SHARED([categorical, partner], 5, combiner='sum',
                      learning_rate_fn=_learning_rate_fn,
                      use_safe_embedding_lookup=False, **kwargs)
  cols = tpu_fc.shared_embedding_columns([categorical, partner], 5,
                                         combiner='sum',
                                         learning_rate_fn=_learning_rate_fn,
                                         use_safe_embedding_lookup=False,
                                         **kwargs)
  assert len(cols) == len(tf_cols) == 2
  for col, tf_col in zip(cols, tf_cols):
    assert isinstance(col, type(tf_col))
    tf_acc, acc = _accessors(tf_col), _accessors(col)
    # Default initializers: same class and configuration (distinct objects).
    assert type(acc.pop('initializer')) is type(tf_acc['initializer'])
    assert col.get_initializer().get_config() == (
        tf_acc.pop('initializer').get_config())
    assert acc == tf_acc
    assert col.name == col.categorical_column.name + '_shared_embedding'
    assert col.embedding_lookup_device == device
    assert col.tensor_core_shape == kwargs.get('tensor_core_shape')
    assert col.shared_embedding_column_creator.dimension == 5


def test_default_initializer_matches_tf():
  tf_col = TF_EMBEDDING(_ids(), 9)
  col = tpu_fc.embedding_column(_ids(), 9)
  assert type(col.initializer) is type(tf_col.initializer)
  assert col.initializer.get_config() == tf_col.initializer.get_config()
  # LEGACY_SEMANTICS §2: truncated normal, mean 0, stddev 1/sqrt(dimension).
  assert col.initializer.get_config()['mean'] == 0.0
  assert col.initializer.get_config()['stddev'] == pytest.approx(1 / 3)


def test_device_is_kept_per_instance():
  tc = tpu_fc.embedding_column(_ids('a'), 4, embedding_lookup_device='tpu_tensor_core',
                               tensor_core_shape=[None, 3])
  cpu = tpu_fc.embedding_column(_ids('b'), 4, embedding_lookup_device='cpu')
  core = tpu_fc.embedding_column(_ids('c'), 4,
                                 embedding_lookup_device='tpu_embedding_core',
                                 tensor_core_shape=[8, 2])
  shared_tc = tpu_fc.shared_embedding_columns(
      [_ids('d'), _ids('e')], 4, embedding_lookup_device='tpu_tensor_core',
      tensor_core_shape=[None, 5])
  shared_cpu = tpu_fc.shared_embedding_columns(
      [_ids('f'), _ids('g')], 4, embedding_lookup_device='cpu')
  # TF's own columns built afterwards set TF's class attributes to other values.
  TF_EMBEDDING(_ids('z'), 4, embedding_lookup_device='tpu_embedding_core',
               tensor_core_shape=[1, 1])
  TF_SHARED([_ids('y'), _ids('x')], 4, embedding_lookup_device='tpu_embedding_core',
            tensor_core_shape=[2, 2])
  # TF's quirk: the device-specific classes now carry the last values built.
  assert (tf_tpu_fc._TPUDeviceSpecificEmbeddingColumnV2._embedding_lookup_device ==  # pylint: disable=protected-access
          tf_tpu_fc.EmbeddingDevice.TPU_EMBEDDING_CORE)
  assert tf_tpu_fc._TPUDeviceSpecificEmbeddingColumnV2._tensor_core_shape == [1, 1]  # pylint: disable=protected-access
  assert (tc.embedding_lookup_device, tc.tensor_core_shape) == (
      'tpu_tensor_core', [None, 3])
  assert (cpu.embedding_lookup_device, cpu.tensor_core_shape) == ('cpu', None)
  assert (core.embedding_lookup_device, core.tensor_core_shape) == (
      'tpu_embedding_core', [8, 2])
  for col in shared_tc:
    assert (col.embedding_lookup_device, col.tensor_core_shape) == (
        'tpu_tensor_core', [None, 5])
  for col in shared_cpu:
    assert (col.embedding_lookup_device, col.tensor_core_shape) == ('cpu', None)
  # TF's private attribute (read by TF 2.15's EmbeddingConfigSpec) is per instance too.
  assert tc._embedding_lookup_device == tf_tpu_fc.EmbeddingDevice.TPU_TENSOR_CORE  # pylint: disable=protected-access
  assert cpu._embedding_lookup_device == tf_tpu_fc.EmbeddingDevice.CPU  # pylint: disable=protected-access
  assert tc._tensor_core_shape == [None, 3]  # pylint: disable=protected-access
  assert cpu._tensor_core_shape is None  # pylint: disable=protected-access
  assert tpu_fc.embedding_column(_ids('n'), 4).embedding_lookup_device is None
  assert tpu_fc.embedding_column(_ids('n'), 4).tensor_core_shape is None


@pytest.mark.legacy_only
def test_tf_2_15_spec_reads_tpu_fc_columns_like_tf_columns():
  # TF 2.15's real EmbeddingConfigSpec / get_configs_from_feature_columns see the
  # same devices, tables and features in tpu_fc's columns as in TF's own.
  from tensorflow_estimator.python.estimator.tpu import _tpu_estimator_embedding as est  # pylint: disable=g-import-not-at-top

  def build(embedding, shared):
    return [
        embedding(_ids('a'), 4),
        embedding(_ids('b'), 4, embedding_lookup_device='tpu_tensor_core',
                  tensor_core_shape=[None, 2]),
        embedding(_ids('c'), 4, embedding_lookup_device='cpu'),
        embedding(_weighted(), 2, embedding_lookup_device='tpu_embedding_core'),
    ] + shared([_ids('ids2'), _ids('ids')], 3)

  def summary(columns):
    spec = est.EmbeddingConfigSpec(
        feature_columns=columns,
        optimization_parameters=tf.compat.v1.tpu.experimental.AdagradParameters(0.1))
    tables, features = est.get_configs_from_feature_columns(spec.feature_columns)
    return ([c.name for c in spec.feature_columns],
            [c.name for c in spec.tensor_core_feature_columns],
            {k: (t.vocabulary_size, t.dimension, t.combiner)
             for k, t in tables.items()},
            {k: tuple(f) for k, f in features.items()})

  expected = summary(build(TF_EMBEDDING, TF_SHARED))
  assert summary(build(tpu_fc.embedding_column,
                       tpu_fc.shared_embedding_columns)) == expected
  assert expected[1] == ['b_embedding']


# --------------------------------------------------------------------------------
# Shared columns: collection name, order, creator.
# --------------------------------------------------------------------------------

def test_shared_default_collection_order_and_creator():
  ids, ids2 = _ids('ids'), _ids('ids2')
  tf_cols = TF_SHARED([ids2, ids], 3)
  cols = tpu_fc.shared_embedding_columns([ids2, ids], 3)
  # Input order of the result.
  assert [c.categorical_column for c in cols] == [ids2, ids]
  assert [c.name for c in cols] == [c.name for c in tf_cols] == [
      'ids2_shared_embedding', 'ids_shared_embedding']
  # Default collection name from the sorted names.
  assert [c.get_embedding_var_name() for c in cols] == [
      'ids_ids2_shared_embedding'] * 2
  assert [c.get_embedding_var_name() for c in tf_cols] == [
      'ids_ids2_shared_embedding'] * 2
  # One creator, named after the collection.
  creator = cols[0].shared_embedding_column_creator
  assert cols[1].shared_embedding_column_creator is creator
  assert creator._name == tf_cols[0].shared_embedding_column_creator._name == (  # pylint: disable=protected-access
      'ids_ids2_shared_embedding')
  assert creator.dimension == 3
  assert creator._num_buckets == 10  # pylint: disable=protected-access


@pytest.mark.parametrize('device', DEVICES)
def test_shared_custom_collection_name(device):
  kwargs = _column_kwargs(False, device)
  del kwargs['max_sequence_length']
  cols = tpu_fc.shared_embedding_columns(
      [_ids('b'), _ids('a'), _ids('c')], 3,
      shared_embedding_collection_name='my_table', **kwargs)
  tf_cols = TF_SHARED([_ids('b'), _ids('a'), _ids('c')], 3,
                      shared_embedding_collection_name='my_table', **kwargs)
  assert [c.name for c in cols] == [c.name for c in tf_cols]
  assert [c.get_embedding_var_name() for c in cols] == ['my_table'] * 3
  assert len({id(c.shared_embedding_column_creator) for c in cols}) == 1
  assert cols[0].shared_embedding_column_creator._name == 'my_table'  # pylint: disable=protected-access


# --------------------------------------------------------------------------------
# Graph behaviour: same variables and outputs as TF's columns.
# --------------------------------------------------------------------------------

VOCAB_SIZE = 10
TABLE = np.arange(VOCAB_SIZE * 4, dtype=np.float32).reshape(VOCAB_SIZE, 4) / 8.


def _init(rows=VOCAB_SIZE, dim=4):
  return tf.compat.v1.constant_initializer(TABLE[:rows, :dim])


def _sparse(indices, values, shape, dtype=tf.int64):
  return tf.SparseTensor(indices, tf.constant(values, dtype=dtype), shape)


def _features():
  """Fresh feature tensors (built in the current graph)."""
  return {
      'a': _sparse([[0, 0], [0, 1], [1, 0], [2, 2]], [1, 3, 9, 0], [3, 3]),
      'b': _sparse([[0, 0], [1, 0], [1, 1]], ['y', 'w', 'nope'], [3, 2],
                   tf.string),
      'h': _sparse([[0, 0], [2, 0]], ['q', 'r'], [3, 1], tf.string),
      'd': _sparse([[0, 0], [0, 1], [2, 0]], [2, 5, 7], [3, 2]),
      'd_weight': _sparse([[0, 0], [0, 1], [2, 0]], [0.5, 2.0, 3.0], [3, 2],
                          tf.float32),
      'dense': tf.constant([[1, -1], [-1, -1], [0, 2]], tf.int64),
      'ids': _sparse([[0, 0], [1, 0], [1, 1]], [4, 5, 6], [3, 2]),
      'ids2': _sparse([[0, 0], [2, 0]], [7, 8], [3, 1]),
      's': _sparse([[0, 0], [0, 1], [0, 2], [1, 0]], [1, 2, 3, 4], [2, 4]),
      'sv': _sparse([[0, 0], [0, 1], [0, 2], [1, 0]], ['z', 'x', 'nope', 'w'],
                    [2, 4], tf.string),
  }


def _graph_columns(embedding, shared, device=None):
  """The same columns from `embedding`/`shared` (TF's factories or tpu_fc's)."""
  kw = {'embedding_lookup_device': device} if device else {}
  if device == 'tpu_tensor_core':
    kw['tensor_core_shape'] = [None, 3]
  return dict(
      a=embedding(fc.categorical_column_with_identity('a', VOCAB_SIZE), 4,
                  initializer=_init(), **kw),
      b=embedding(fc.categorical_column_with_vocabulary_list(
          'b', VOCAB, num_oov_buckets=1), 3, combiner='sum',
                  initializer=_init(5, 3), **kw),
      h=embedding(fc.categorical_column_with_hash_bucket('h', 6), 2,
                  initializer=_init(6, 2), **kw),
      d=embedding(fc.weighted_categorical_column(
          fc.categorical_column_with_identity('d', VOCAB_SIZE), 'd_weight'), 4,
                  combiner='sqrtn', initializer=_init(), **kw),
      dense=embedding(fc.categorical_column_with_identity('dense', VOCAB_SIZE),
                      4, initializer=_init(), use_safe_embedding_lookup=False,
                      **kw),
      shared=shared([fc.categorical_column_with_identity('ids2', VOCAB_SIZE),
                     fc.categorical_column_with_identity('ids', VOCAB_SIZE)], 4,
                    initializer=_init(), **kw),
  )


def _run_graph(build):
  """Builds `build()` in a fresh graph; returns (variables, output values)."""
  graph = tf.Graph()
  with graph.as_default():
    outputs = build(_features())
    variables = sorted((v.op.name, tuple(v.shape.as_list()))
                       for v in tf.compat.v1.global_variables())
    with tf.compat.v1.Session(graph=graph) as sess:
      sess.run([tf.compat.v1.global_variables_initializer(),
                tf.compat.v1.tables_initializer()])
      values = sess.run(outputs)
  return variables, values


def _assert_same_graph_result(tf_result, result):
  tf_variables, tf_values = tf_result
  variables, values = result
  assert variables == tf_variables
  tf.nest.assert_same_structure(tf_values, values)
  for tf_value, value in zip(tf.nest.flatten(tf_values), tf.nest.flatten(values)):
    np.testing.assert_array_equal(value, tf_value)


def _input_layer(columns):
  cols = [columns[k] for k in ('a', 'b', 'h', 'd', 'dense')]

  def build(features):
    return tf.compat.v1.feature_column.input_layer(features, cols)
  return build


def _dense_features(columns):
  cols = [columns[k] for k in ('a', 'b', 'h', 'd', 'dense')] + columns['shared']

  def build(features):
    layer = tf.keras.layers.DenseFeatures(cols)
    second = tf.keras.layers.DenseFeatures([columns['a']])
    return layer(features), second(features)
  return build


# 'tpu_embedding_core' (same class as 'tpu_tensor_core') is covered by
# test_non_cpu_devices_unchanged_when_building_inference.
@pytest.mark.parametrize('device', [None, 'tpu_tensor_core'])
def test_input_layer_matches_tf(device):
  tf_result = _run_graph(_input_layer(_graph_columns(TF_EMBEDDING, TF_SHARED, device)))
  result = _run_graph(_input_layer(_graph_columns(
      tpu_fc.embedding_column, tpu_fc.shared_embedding_columns, device)))
  _assert_same_graph_result(tf_result, result)
  # LEGACY_SEMANTICS §7 names.
  names = [name for name, _ in result[0]]
  assert names == sorted([
      'input_layer/a_embedding/embedding_weights',
      'input_layer/b_embedding/embedding_weights',
      'input_layer/h_embedding/embedding_weights',
      'input_layer/d_weighted_by_d_weight_embedding/embedding_weights',
      'input_layer/dense_embedding/embedding_weights'])
  assert ('input_layer/a_embedding/embedding_weights', (VOCAB_SIZE, 4)) in result[0]
  assert result[1].shape == (3, 4 + 3 + 2 + 4 + 4)


@pytest.mark.parametrize('device', [None, 'tpu_tensor_core'])
def test_dense_features_matches_tf(device):
  tf_result = _run_graph(_dense_features(_graph_columns(TF_EMBEDDING, TF_SHARED,
                                                        device)))
  result = _run_graph(_dense_features(_graph_columns(
      tpu_fc.embedding_column, tpu_fc.shared_embedding_columns, device)))
  _assert_same_graph_result(tf_result, result)
  names = [name for name, _ in result[0]]
  assert 'dense_features/a_embedding/embedding_weights' in names
  assert 'dense_features_1/a_embedding/embedding_weights' in names
  assert 'dense_features/d_weighted_by_d_weight_embedding/embedding_weights' in names
  assert ('ids_ids2_shared_embedding', (VOCAB_SIZE, 4)) in result[0]
  assert len(names) == 7


def test_dense_ids_drop_minus_one_only():
  # LEGACY_SEMANTICS §2: dense ids on CPU drop -1 only; 0 is a real id.
  def build(embedding):
    col = embedding(fc.categorical_column_with_identity('dense', VOCAB_SIZE), 4,
                    initializer=_init(), combiner='sum')
    return lambda features: tf.keras.layers.DenseFeatures([col])(features)
  tf_result = _run_graph(build(TF_EMBEDDING))
  result = _run_graph(build(tpu_fc.embedding_column))
  _assert_same_graph_result(tf_result, result)
  np.testing.assert_array_equal(
      result[1], np.stack([TABLE[1], np.zeros(4), TABLE[0] + TABLE[2]]))


def test_input_layer_rejects_shared_like_tf():
  def build(shared):
    cols = shared([_ids('ids2'), _ids('ids')], 4)
    return lambda features: tf.compat.v1.feature_column.input_layer(features, cols)
  expected = outcome(_run_graph, build(TF_SHARED))
  assert expected == (
      ValueError, 'SharedEmbeddingColumns are not supported in `linear_model` or '
      '`input_layer`. Please use `DenseFeatures` or `LinearModel` instead.')
  assert outcome(_run_graph, build(tpu_fc.shared_embedding_columns)) == expected


def _sequence_columns(embedding, device=None):
  kw = {'embedding_lookup_device': device} if device else {}
  return [
      embedding(fc.sequence_categorical_column_with_identity('s', VOCAB_SIZE), 4,
                max_sequence_length=2, initializer=_init(), **kw),
      embedding(fc.sequence_categorical_column_with_vocabulary_list('sv', VOCAB),
                3, max_sequence_length=5, initializer=_init(4, 3), **kw),
  ]


def _sequence_features(columns):
  def build(features):
    values, lengths = tf.keras.experimental.SequenceFeatures(columns)(features)
    return values, lengths
  return build


@pytest.mark.parametrize('device', [None, 'tpu_embedding_core'])
def test_sequence_features_matches_tf(device):
  tf_result = _run_graph(_sequence_features(_sequence_columns(
      TF_EMBEDDING, device)))
  result = _run_graph(_sequence_features(_sequence_columns(
      tpu_fc.embedding_column, device)))
  _assert_same_graph_result(tf_result, result)
  names = [name for name, _ in result[0]]
  assert names == ['sequence_features/s_embedding/embedding_weights',
                   'sequence_features/sv_embedding/embedding_weights']
  values, lengths = result[1]
  # LEGACY_SEMANTICS §5: on CPU no truncation at max_sequence_length.
  assert values.shape == (2, 4, 4 + 3)
  np.testing.assert_array_equal(lengths, [3, 1])


def test_shared_sequence_features_matches_tf():
  def build(shared):
    cols = shared([fc.sequence_categorical_column_with_identity('s', VOCAB_SIZE),
                   fc.sequence_categorical_column_with_identity('t', VOCAB_SIZE)],
                  2, initializer=_init(VOCAB_SIZE, 2), max_sequence_lengths=[3, 3])

    def run(features):
      features['t'] = _sparse([[0, 0], [0, 1], [0, 2], [1, 0]], [9, 8, 7, 6],
                              [2, 4])
      return tf.keras.experimental.SequenceFeatures(cols)(features)
    return run
  tf_result = _run_graph(build(TF_SHARED))
  result = _run_graph(build(tpu_fc.shared_embedding_columns))
  _assert_same_graph_result(tf_result, result)
  assert result[0] == [('s_t_shared_embedding', (VOCAB_SIZE, 2))]


# --------------------------------------------------------------------------------
# embedding_lookup_device='cpu': TF's training error, host lookup in eval/infer.
# --------------------------------------------------------------------------------

def _cpu_builders(embedding, shared, device):
  """Per layer kind: a function returning a fresh graph builder over new columns."""
  kw = {'embedding_lookup_device': device} if device else {}

  def single():
    return [
        embedding(fc.categorical_column_with_identity('a', VOCAB_SIZE), 4,
                  initializer=_init(), **kw),
        embedding(fc.weighted_categorical_column(
            fc.categorical_column_with_identity('d', VOCAB_SIZE), 'd_weight'), 4,
                  combiner='sum', initializer=_init(), **kw)]

  def shared_cols():
    return shared([fc.categorical_column_with_identity('ids2', VOCAB_SIZE),
                   fc.categorical_column_with_identity('ids', VOCAB_SIZE)], 4,
                  initializer=_init(), **kw)

  def sequence():
    return [embedding(
        fc.sequence_categorical_column_with_identity('s', VOCAB_SIZE), 4,
        max_sequence_length=3, initializer=_init(), **kw)]

  def input_layer():
    cols = single()
    return lambda f: tf.compat.v1.feature_column.input_layer(f, cols)

  def dense_features():
    cols = single()
    return lambda f: tf.keras.layers.DenseFeatures(cols)(f)

  def shared_dense_features():
    cols = shared_cols()
    return lambda f: tf.keras.layers.DenseFeatures(cols)(f)

  def sequence_features():
    return _sequence_features(sequence())

  return dict(input_layer=input_layer, dense_features=dense_features,
              shared_dense_features=shared_dense_features,
              sequence_features=sequence_features)


LAYERS = ['input_layer', 'dense_features', 'shared_dense_features',
          'sequence_features']


@pytest.mark.parametrize('layer', LAYERS)
def test_cpu_device_raises_in_plain_graph_like_tf(layer):
  tf_build = _cpu_builders(TF_EMBEDDING, TF_SHARED, 'cpu')[layer]()
  expected = outcome(_run_graph, tf_build)
  assert expected == (ValueError, CPU_TRAINING_ERROR)
  build = _cpu_builders(tpu_fc.embedding_column,
                        tpu_fc.shared_embedding_columns, 'cpu')[layer]()
  assert outcome(_run_graph, build) == expected


@pytest.mark.parametrize('layer', LAYERS)
def test_cpu_device_raises_when_building_train(layer):
  build = _cpu_builders(tpu_fc.embedding_column,
                        tpu_fc.shared_embedding_columns, 'cpu')[layer]()
  with build_context.building('train'):
    assert outcome(_run_graph, build) == (ValueError, CPU_TRAINING_ERROR)


@pytest.mark.parametrize('mode', ['eval', 'infer'])
@pytest.mark.parametrize('layer', LAYERS)
def test_cpu_device_looks_up_when_building_inference(mode, layer):
  # Expected: TF's device-None column with the same initializer, in a plain graph.
  expected = _run_graph(_cpu_builders(TF_EMBEDDING, TF_SHARED, None)[layer]())
  build = _cpu_builders(tpu_fc.embedding_column,
                        tpu_fc.shared_embedding_columns, 'cpu')[layer]()
  with build_context.building(mode):
    result = _run_graph(build)
  _assert_same_graph_result(expected, result)
  # Outside the context the training error is back.
  build = _cpu_builders(tpu_fc.embedding_column,
                        tpu_fc.shared_embedding_columns, 'cpu')[layer]()
  assert outcome(_run_graph, build) == (ValueError, CPU_TRAINING_ERROR)


@pytest.mark.parametrize('mode', ['infer'])
def test_non_cpu_devices_unchanged_when_building_inference(mode):
  expected = _run_graph(_dense_features(_graph_columns(TF_EMBEDDING, TF_SHARED,
                                                       'tpu_embedding_core')))
  with build_context.building(mode):
    result = _run_graph(_dense_features(_graph_columns(
        tpu_fc.embedding_column, tpu_fc.shared_embedding_columns,
        'tpu_embedding_core')))
  _assert_same_graph_result(expected, result)


# --------------------------------------------------------------------------------
# copy.deepcopy and pickle.
# --------------------------------------------------------------------------------

def _metadata(column):
  meta = _accessors(column)
  meta.pop('initializer')
  meta.pop('learning_rate_fn')
  meta.update(
      type=type(column),
      device=column.embedding_lookup_device,
      tensor_core_shape=column.tensor_core_shape,
      private_device=getattr(column, '_embedding_lookup_device', None),
      initializer_type=type(column.get_initializer()),
      initializer_config=column.get_initializer().get_config(),
      learning_rate_fn=getattr(column.get_learning_rate_fn(), '__qualname__', None),
      categorical_column=column.categorical_column)
  return meta


COPY_CASES = [(k, d) for k, d in KIND_DEVICES
              if (KINDS.index(k) + DEVICES.index(d)) % 2 == 0 or k == 'weighted']


@pytest.mark.parametrize('kind,device', COPY_CASES)
@pytest.mark.parametrize('how', ['deepcopy', 'pickle'])
def test_embedding_column_copy_round_trip(kind, device, how, vocab_file):
  categorical, is_sequence = _categorical(kind, vocab_file)
  col = tpu_fc.embedding_column(categorical, 3, learning_rate_fn=_learning_rate_fn,
                                **_column_kwargs(is_sequence, device))
  clone = (copy.deepcopy(col) if how == 'deepcopy'
           else pickle.loads(pickle.dumps(col)))
  assert clone is not col
  assert _metadata(clone) == _metadata(col)


@pytest.mark.parametrize('device,how', [
    (device, how) for how in ('deepcopy', 'pickle') for device in DEVICES])
def test_shared_columns_copy_round_trip(device, how):
  kwargs = _column_kwargs(False, device)
  del kwargs['max_sequence_length']
  cols = tpu_fc.shared_embedding_columns(
      [_ids('ids2'), fc.weighted_categorical_column(_ids('ids'), 'w')], 3,
      **kwargs)
  clones = (copy.deepcopy(cols) if how == 'deepcopy'
            else pickle.loads(pickle.dumps(cols)))
  for clone, col in zip(clones, cols):
    assert clone is not col
    assert _metadata(clone) == _metadata(col)
  creator = clones[0].shared_embedding_column_creator
  assert clones[1].shared_embedding_column_creator is creator
  assert creator._name == 'ids2_ids_weighted_by_w_shared_embedding'  # pylint: disable=protected-access
  assert creator.dimension == 3
  if how == 'deepcopy':
    # Each column copied on its own still reads the same one table.
    single = [copy.deepcopy(c) for c in cols]
    assert (single[0].shared_embedding_column_creator is
            single[1].shared_embedding_column_creator)


def test_deepcopied_columns_build_same_graph():
  def build(columns):
    cols = columns['shared'] + [columns['a'], columns['d']]
    return lambda f: tf.keras.layers.DenseFeatures(cols)(f)
  expected = _run_graph(build(_graph_columns(TF_EMBEDDING, TF_SHARED)))
  clones = copy.deepcopy(_graph_columns(tpu_fc.embedding_column,
                                        tpu_fc.shared_embedding_columns))
  _assert_same_graph_result(expected, _run_graph(build(clones)))


# Variable-scope validation in TPU mode (TF's `create_state`). ----------------------

def _create_state_in_scopes(column, scopes):
  """`create_state` of `column` in each variable scope, as on one TPU shard."""
  from tensorflow.python.tpu import tpu_function  # pylint: disable=g-import-not-at-top
  with tf.Graph().as_default(), tpu_function.tpu_shard_context(1):
    for scope in scopes:
      with tf.compat.v1.variable_scope(scope):
        column.create_state(None)


@pytest.mark.parametrize('cls', [
    tpu_fc.columns.EmbeddingColumn,
    pytest.param(tf_tpu_fc._TPUEmbeddingColumnV2, id='tf'),  # pylint: disable=protected-access
])
def test_a_column_in_two_variable_scopes_is_an_error(cls):
  ids = tf.feature_column.categorical_column_with_identity('aaa', 3)
  column = cls(categorical_column=ids, dimension=2)
  _create_state_in_scopes(column, ['tower1/scope1', 'tower1/scope1'])
  with pytest.raises(ValueError, match=(
      'For embedding var name aaa, the variable scope name is different, got '
      'tower2/scope2; expected tower1/scope1')):
    _create_state_in_scopes(column, ['tower1/scope1', 'tower2/scope2'])
  bypassing = cls(categorical_column=ids, dimension=2,
                  bypass_scope_validation=True)
  _create_state_in_scopes(bypassing, ['tower1/scope1', 'tower2/scope2'])
  _create_state_in_scopes(copy.deepcopy(bypassing),
                          ['tower1/scope1', 'tower2/scope2'])
  assert copy.deepcopy(bypassing)._bypass_scope_validation  # pylint: disable=protected-access


# --------------------------------------------------------------------------------
# The CPU lookup of inference graphs: TF's safe lookup, bit for bit, in fewer ops.
# --------------------------------------------------------------------------------

# Rows: two ids with one repeated, empty, a padding id (-1) only, one id, a
# padding id beside a real one; then two empty rows at the end of the batch.
HARD_IDS = tf.compat.v1.SparseTensorValue(
    indices=[[0, 0], [0, 1], [0, 2], [2, 0], [3, 0], [4, 0], [4, 1]],
    values=[3, 1, 3, -1, 6, -1, 2], dense_shape=[7, 3])


def _hard_lookup(embedding, shared, kind, combiner, mode=None):
  """Values of one column of `kind` on HARD_IDS, and its graph's op types."""
  start = np.random.RandomState(3).randn(VOCAB_SIZE, 2).astype(np.float32)
  kw = dict(combiner=combiner,
            initializer=tf.compat.v1.constant_initializer(start))
  if kind == 'cpu_device':
    kw['embedding_lookup_device'] = 'cpu'
  graph = tf.Graph()
  with graph.as_default():
    categorical = fc.categorical_column_with_identity('x', VOCAB_SIZE)
    if kind == 'shared':
      columns = shared([categorical], 2, **kw)
    else:
      columns = [embedding(categorical, 2, **kw)]
    ids = tf.compat.v1.sparse_placeholder(tf.int64, shape=[None, None])
    if mode is None:
      output = tf.keras.layers.DenseFeatures(columns)({'x': ids})
    else:
      with build_context.building(mode):
        output = tf.keras.layers.DenseFeatures(columns)({'x': ids})
    with tf.compat.v1.Session(graph=graph) as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      value = sess.run(output, {ids: HARD_IDS})
  return value, {op.type for op in graph.get_operations()}


@pytest.mark.parametrize('combiner', ['sum', 'mean', 'sqrtn', None])
@pytest.mark.parametrize('kind', ['single', 'shared', 'cpu_device'])
@pytest.mark.parametrize('mode', ['eval', 'infer'])
def test_inference_lookup_is_tfs_safe_lookup_bit_for_bit(mode, kind, combiner):
  # Expected: TF's own column (device None) in a plain graph: TF's safe lookup.
  expected, tf_ops = _hard_lookup(TF_EMBEDDING, TF_SHARED, kind.replace(
      'cpu_device', 'single'), combiner)
  value, ops = _hard_lookup(tpu_fc.embedding_column,
                            tpu_fc.shared_embedding_columns, kind, combiner,
                            mode)
  np.testing.assert_array_equal(value, expected)
  assert np.count_nonzero(value.any(axis=1)) == 3  # rows 1, 2, 5, 6 are zeros
  # The safe lookup's empty-row filling is gone from the inference graph
  # (combiner None, TF's 'mean' by default, keeps TF's own lookup).
  assert 'SparseFillEmptyRows' in tf_ops
  assert ('SparseFillEmptyRows' in ops) == (combiner is None)


def test_inference_lookup_is_tfs_for_a_table_on_a_parameter_server():
  """TF's own lookup there: it gathers the rows on the ps task (the segment
  reduction would read the whole table across)."""
  graph = tf.Graph()
  with graph.as_default(), tf.compat.v1.device(
      tf.compat.v1.train.replica_device_setter(ps_tasks=1)):
    column = tpu_fc.embedding_column(
        fc.categorical_column_with_identity('x', VOCAB_SIZE), 2)
    ids = tf.compat.v1.sparse_placeholder(tf.int64, shape=[None, None])
    with build_context.building('infer'):
      tf.keras.layers.DenseFeatures([column])({'x': ids})
  ops = {op.type for op in graph.get_operations()}
  assert 'SparseFillEmptyRows' in ops and 'SparseSegmentMeanWithNumSegments' not in ops
