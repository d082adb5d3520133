"""The exported SavedModel refuses a bad request and serves the next one.

tests/test_export.py covers out-of-range and negative ids, malformed tf.Examples and
wrong dtypes on its mixed model; this file adds empty strings (an empty serialized
example, an empty vocabulary word), requests of the wrong dtype into a string
column, and a batch larger than a fixed-batch signature takes, each followed by a
good request whose outputs must equal the model's own lookup (numpy, from the
exported table).
"""
import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf

fc = tf.feature_column
VOCABULARY = ['a', 'b', 'c']
V_IDS, D, BATCH = 4, 2, 2
IDS_TABLE = np.arange(V_IDS * D, dtype=np.float32).reshape(V_IDS, D) / 10
WORDS_TABLE = -np.arange(len(VOCABULARY) * D, dtype=np.float32).reshape(-1, D)


def columns():
  ids = tpu_fc.embedding_column(
      fc.categorical_column_with_identity('ids', V_IDS), D, combiner='sum',
      initializer=tf.compat.v1.constant_initializer(IDS_TABLE))
  words = tpu_fc.embedding_column(
      fc.categorical_column_with_vocabulary_list('word', VOCABULARY), D,
      combiner='sum', initializer=tf.compat.v1.constant_initializer(WORDS_TABLE))
  return [ids, words]


def model_fn(features, labels, mode, params):
  del labels, params
  net = tf.keras.layers.DenseFeatures(columns())(features)
  global_step = tf.compat.v1.train.get_global_step()
  return tpu_fc.TPUEstimatorSpec(
      mode, predictions={'net': net}, loss=tf.constant(0.0),
      train_op=tf.compat.v1.assign_add(global_step, 1))


FEATURE_SPEC = fc.make_parse_example_spec(columns())


def example(ids, words):
  return tf.train.Example(features=tf.train.Features(feature={
      'ids': tf.train.Feature(int64_list=tf.train.Int64List(value=ids)),
      'word': tf.train.Feature(bytes_list=tf.train.BytesList(
          value=[w.encode() for w in words])),
  })).SerializeToString()


GOOD = [([1, 2], ['a']), ([3], ['c', 'b'])]


def expected(rows):
  """[ids, word] embeddings summed per row; unknown words and no ids give zeros."""
  return np.stack([np.concatenate([
      IDS_TABLE[ids].sum(0),
      WORDS_TABLE[[VOCABULARY.index(w) for w in words if w in VOCABULARY]].sum(0),
  ]) for ids, words in rows])


@pytest.fixture(name='model_dir', scope='module')
def _model_dir(tmp_path_factory):
  model_dir = tmp_path_factory.mktemp('model')
  estimator = tpu_fc.TPUEstimator(model_fn=model_fn, use_tpu=False,
                                  train_batch_size=BATCH,
                                  config=tpu_fc.RunConfig(model_dir=str(model_dir)))
  estimator.train(lambda params: ({'ids': tf.sparse.from_dense([[1], [2]]),
                                   'word': tf.sparse.from_dense([['a'], ['b']])},
                                  None), max_steps=1)
  return model_dir


def _signature(model_dir, tmp_path, receiver_fn):
  estimator = tpu_fc.TPUEstimator(model_fn=model_fn, use_tpu=False,
                                  config=tpu_fc.RunConfig(model_dir=str(model_dir)))
  export_dir = estimator.export_saved_model(str(tmp_path), receiver_fn)
  return tf.saved_model.load(export_dir.decode()).signatures['serving_default']


@pytest.fixture(name='parsing', scope='module')
def _parsing(model_dir, tmp_path_factory):
  return _signature(model_dir, tmp_path_factory.mktemp('parsing'),
                    tpu_fc.export.build_parsing_serving_input_receiver_fn(
                        FEATURE_SPEC))


def _serves_good_after(signature, **good):
  """The good request right after a bad one gives the exact lookups."""
  served = signature(**good)['net'].numpy()
  np.testing.assert_allclose(served, expected(GOOD), rtol=0, atol=1e-6)


def test_good_requests_and_empty_strings_serve_exactly(parsing):
  """An empty serialized example and an empty word are rows with no ids."""
  rows = GOOD + [([], []), ([2], [''])]
  requests = [example(*row) for row in GOOD] + [b'', example([2], [''])]
  served = parsing(examples=tf.constant(requests))['net'].numpy()
  np.testing.assert_allclose(served, expected(rows), rtol=0, atol=1e-6)


@pytest.mark.parametrize('bad', [
    pytest.param(lambda: tf.constant([example([V_IDS], ['a'])]),
                 id='id_out_of_range'),
    pytest.param(lambda: tf.constant([b'\x0a\x03not an example']),
                 id='not_an_example'),
    pytest.param(lambda: tf.constant([1, 2], tf.int64), id='ints_for_strings'),
    pytest.param(lambda: tf.constant([[example([1], ['a'])]]), id='rank_2'),
    pytest.param(lambda: tf.constant([b'\xff\xfe\x80']), id='not_utf_8'),
])
def test_parsing_signature_bad_request_then_good(parsing, bad):
  with pytest.raises((tf.errors.InvalidArgumentError, TypeError, ValueError)):
    parsing(examples=bad())
  _serves_good_after(parsing, examples=tf.constant(
      [example(*row) for row in GOOD]))


def test_a_str_that_is_not_unicode_text_is_refused_before_the_model(parsing):
  """Bytes are served whatever they hold; a Python str with lone surrogates
  (e.g. bytes decoded with 'surrogateescape') cannot become a string tensor:
  TF's Python binding refuses it before the model runs."""
  with pytest.raises(ValueError, match='Error converting unicode string'):
    parsing(examples=tf.constant(['\udcff']))
  _serves_good_after(parsing, examples=tf.constant(
      [example(*row) for row in GOOD]))
  _serves_good_after(parsing, examples=tf.constant(
      [example(*row) for row in GOOD]))


def test_fixed_batch_signature_refuses_an_oversize_batch(model_dir, tmp_path):
  """A raw receiver with default_batch_size=2 refuses 3 rows, then serves 2."""
  with tf.Graph().as_default():
    features = {'ids': tf.sparse.from_dense(tf.constant([[1]], tf.int64)),
                'word': tf.sparse.from_dense(tf.constant([['a']]))}
  signature = _signature(
      model_dir, tmp_path, tpu_fc.export.build_raw_serving_input_receiver_fn(
          features, default_batch_size=BATCH))
  good = {'ids_indices': [[0, 0], [0, 1], [1, 0]], 'ids_values': [1, 2, 3],
          'ids_dense_shape': [BATCH, 2], 'word_indices': [[0, 0], [1, 0], [1, 1]],
          'word_values': ['a', 'c', 'b'], 'word_dense_shape': [BATCH, 2]}
  good = {k: tf.constant(v, tf.int64 if k != 'word_values' else tf.string)
          for k, v in good.items()}
  oversize = dict(good, ids_dense_shape=tf.constant([BATCH + 1, 2], tf.int64))
  with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
    signature(**oversize)
  _serves_good_after(signature, **good)
  # Words that are not UTF-8 are words like any other: unknown ones, no ids.
  not_utf_8 = dict(good, word_values=tf.constant([b'\xff\xfe', b'c', b'b']))
  np.testing.assert_allclose(
      signature(**not_utf_8)['net'].numpy(),
      expected([([1, 2], []), ([3], ['c', 'b'])]), rtol=0, atol=1e-6)
