"""export_saved_model / export_savedmodel and tpu_fc.export, on both lanes.

A small model mixing every lookup device (embedding core, tensor core, 'cpu'),
shared, weighted and sequence columns is trained with the emulated TPU and with
use_tpu=False; its SavedModel must serve exactly what `predict()` gives on the
same rows, through `tf.saved_model.load` and through `saved_model_cli`.  On the
legacy lane the export of a checkpoint written by TF 2.15's real TPUEstimator
is compared with that estimator's own export, and the receivers' validation
with tensorflow_estimator's.
"""
import json
import os
import sys

import numpy as np
import pytest
from tensorflow.core.protobuf import saved_model_pb2

import tpu_fc
from tpu_fc._tf import tf

from harness import estimators
from harness import inputs
from harness import lanes
from harness import scripts
from harness.oracle import outcome

fc = tf.feature_column
PREDICT = tpu_fc.ModeKeys.PREDICT

N = 8
BATCH = 4
ATOL = 1e-5
SAVED_MODEL_CLI = os.path.join(os.path.dirname(sys.executable),
                               'saved_model_cli')
TIMEOUT = 120

# --------------------------------------------------------------------------------
# The model: every lookup device and column kind, constant initial values.
# --------------------------------------------------------------------------------

VOCAB = dict(a=10, tc=6, c=7, sa=8, sb=8, w=5, seq=9)
INT_KEYS = ['a', 'tc', 'c', 'sa', 'sb', 'w', 'seq']
WIDTH = 3 + 2 + 2 + 3 + 3 + 2 + 2 + 2  # DenseFeatures + pooled seq + x


def _const(vocab, dim, seed):
  values = np.random.RandomState(seed).uniform(-1, 1, (vocab, dim))
  return tf.compat.v1.constant_initializer(values.astype(np.float32))


def _ids(key):
  return fc.categorical_column_with_identity(key, VOCAB[key])


def columns(c_device=None):
  """(DenseFeatures columns, sequence columns); `c` on `c_device`."""
  a = tpu_fc.embedding_column(_ids('a'), 3, initializer=_const(10, 3, 1))
  tc = tpu_fc.embedding_column(
      _ids('tc'), 2, initializer=_const(6, 2, 2),
      embedding_lookup_device='tpu_tensor_core', tensor_core_shape=[None, 2])
  c = tpu_fc.embedding_column(_ids('c'), 2, initializer=_const(7, 2, 3),
                              embedding_lookup_device=c_device)
  sa, sb = tpu_fc.shared_embedding_columns(
      [_ids('sa'), _ids('sb')], 3, initializer=_const(8, 3, 4))
  w = tpu_fc.embedding_column(
      fc.weighted_categorical_column(_ids('w'), 'w_weight'), 2,
      combiner='sqrtn', initializer=_const(5, 2, 5))
  seq = tpu_fc.embedding_column(
      fc.sequence_categorical_column_with_identity('seq', VOCAB['seq']), 2,
      max_sequence_length=3, initializer=_const(9, 2, 6))
  return [a, tc, c, sa, sb, w], [seq]


FEATURE_SPEC = {k: tf.io.VarLenFeature(tf.int64) for k in INT_KEYS}
FEATURE_SPEC['w_weight'] = tf.io.VarLenFeature(tf.float32)
FEATURE_SPEC['x'] = tf.io.FixedLenFeature([2], tf.float32)


def model_fn(features, labels, mode, params):
  """Legacy-style model_fn.

  params: 'c_device' (the PREDICT lookup device of column `c`, default 'cpu';
  it trains on the default device), 'export_outputs' (add custom signatures).
  A bare tensor of serialized tf.Examples is parsed here
  (TensorServingInputReceiver).
  """
  if not isinstance(features, dict):
    features = tf.compat.v1.io.parse_example(features, FEATURE_SPEC)
  c_device = params.get('c_device', 'cpu') if mode == PREDICT else None
  dense_columns, sequence_columns = columns(c_device)
  embedded = tf.keras.layers.DenseFeatures(dense_columns)(features)
  sequence, lengths = tf.keras.experimental.SequenceFeatures(
      sequence_columns)(features)
  mask = tf.sequence_mask(lengths, tf.shape(sequence)[1], dtype=tf.float32)
  pooled = tf.reduce_sum(sequence * mask[:, :, None], 1)
  net = tf.concat([embedded, pooled, features['x']], 1)
  logits = tf.keras.layers.Dense(
      1, kernel_initializer=tf.compat.v1.constant_initializer(
          np.linspace(-1, 1, WIDTH).reshape(WIDTH, 1)))(net)
  if mode == PREDICT:
    if params.get('bare_predictions'):
      return tpu_fc.TPUEstimatorSpec(mode, predictions=logits)
    export_outputs = None
    if params.get('export_outputs'):
      probability = tf.sigmoid(logits)
      export_outputs = {
          'serving_default': tpu_fc.export.PredictOutput(
              {'score': logits, 'net': net}),
          'classify': tpu_fc.export.ClassificationOutput(
              scores=tf.concat([1 - probability, probability], 1),
              classes=tf.tile(tf.constant([['no', 'yes']]),
                              [tf.shape(logits)[0], 1])),
          'regress': tpu_fc.export.RegressionOutput(value=logits),
      }
    return tpu_fc.TPUEstimatorSpec(
        mode, predictions={'logits': logits, 'embedded': net},
        export_outputs=export_outputs)
  loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
  optimizer = tf.compat.v1.train.AdagradOptimizer(0.5)
  if params['use_tpu']:
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
  return tpu_fc.TPUEstimatorSpec(
      mode, loss=loss, train_op=optimizer.minimize(
          loss, tf.compat.v1.train.get_global_step()))


# --------------------------------------------------------------------------------
# Data: N rows, as input_fn tensors and as serialized tf.Examples.
# --------------------------------------------------------------------------------

def _make_rows():
  rng = np.random.RandomState(0)
  lengths = dict(a=(0, 3), tc=(1, 2), c=(0, 2), sa=(1, 3), sb=(0, 2),
                 w=(1, 3), seq=(1, 3))
  rows = {}
  for key in INT_KEYS:
    low, high = lengths[key]
    rows[key] = [[int(i) for i in rng.randint(0, VOCAB[key],
                                              rng.randint(low, high + 1))]
                 for _ in range(N)]
  rows['w_weight'] = [[float(v) for v in rng.uniform(0.5, 2, len(ids)).round(3)]
                      for ids in rows['w']]
  rows['x'] = [[float(v) for v in rng.normal(size=2).round(3)]
               for _ in range(N)]
  return rows


ROWS = _make_rows()
LABELS = (np.arange(N) % 2).astype(np.float32).reshape(N, 1)


def feature_tensors(rows=None):
  rows = rows or ROWS
  features = {k: tf.ragged.constant(rows[k], dtype=tf.int64, ragged_rank=1,
                                    inner_shape=()).to_sparse()
              for k in INT_KEYS}
  features['w_weight'] = tf.ragged.constant(
      rows['w_weight'], dtype=tf.float32, ragged_rank=1).to_sparse()
  features['x'] = tf.constant(rows['x'], tf.float32)
  return features


def input_fn(params, mode):
  features = feature_tensors()
  if mode == PREDICT:
    dataset = tf.data.Dataset.from_tensor_slices(features)
  else:
    dataset = tf.data.Dataset.from_tensor_slices((features, LABELS)).repeat()
  return dataset.batch(params['batch_size'], drop_remainder=True)


def example_dict(i, rows=None):
  rows = rows or ROWS
  return {k: rows[k][i] for k in INT_KEYS + ['w_weight', 'x']}


def serialize(example):
  """A feature dict (lists of ints or floats) as a serialized tf.Example."""
  feature = {}
  for key, values in example.items():
    if key in ('w_weight', 'x'):
      feature[key] = tf.train.Feature(
          float_list=tf.train.FloatList(value=values))
    else:
      feature[key] = tf.train.Feature(
          int64_list=tf.train.Int64List(value=values))
  return tf.train.Example(
      features=tf.train.Features(feature=feature)).SerializeToString()


EXAMPLES = [serialize(example_dict(i)) for i in range(N)]


def make_estimator(model_dir, use_tpu, **kwargs):
  params = kwargs.pop('params', {})
  dense_columns, sequence_columns = columns()
  spec = tpu_fc.EmbeddingConfigSpec(
      feature_columns=dense_columns + sequence_columns,
      optimization_parameters=tpu_fc.AdagradParameters(0.5))
  config = tpu_fc.RunConfig(
      model_dir=str(model_dir), tf_random_seed=0, save_checkpoints_steps=1,
      tpu_config=tpu_fc.TPUConfig(iterations_per_loop=1, num_shards=2))
  return tpu_fc.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=use_tpu, params=params,
      train_batch_size=BATCH, predict_batch_size=BATCH,
      embedding_config_spec=spec if use_tpu else None, **kwargs)


def predictions_of(estimator, **kwargs):
  rows = list(estimator.predict(input_fn, **kwargs))
  assert len(rows) == N
  return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def serve(export_dir, signature='serving_default', **inputs):
  loaded = tf.saved_model.load(_str(export_dir))
  result = loaded.signatures[signature](**inputs)
  return {k: v.numpy() for k, v in result.items()}


def serve_examples(export_dir, examples=None):
  return serve(export_dir, examples=tf.constant(examples or EXAMPLES))


def _str(path):
  return path.decode() if isinstance(path, bytes) else str(path)


def assert_close(actual, expected, keys=('logits', 'embedded')):
  for key in keys:
    np.testing.assert_allclose(actual[key], expected[key], rtol=0, atol=ATOL,
                               err_msg=key)


# --------------------------------------------------------------------------------
# Fixtures: one trained model per use_tpu value, one parsing export of each.
# --------------------------------------------------------------------------------

@pytest.fixture(scope='module', params=[True, False],
                ids=['use_tpu', 'use_tpu_false'])
def trained(request, tmp_path_factory):
  """(use_tpu, model_dir) of a model trained 3 steps (checkpoints every step)."""
  model_dir = tmp_path_factory.mktemp('model_tpu{}'.format(int(request.param)))
  make_estimator(model_dir, request.param).train(input_fn, max_steps=3)
  return request.param, model_dir


@pytest.fixture(scope='module')
def exported(trained, tmp_path_factory):
  """(base, export dir) of the parsing-receiver export of `trained`."""
  use_tpu, model_dir = trained
  base = tmp_path_factory.mktemp('export_tpu{}'.format(int(use_tpu)))
  export_dir = make_estimator(model_dir, use_tpu).export_saved_model(
      str(base), tpu_fc.export.build_parsing_serving_input_receiver_fn(
          FEATURE_SPEC))
  return base, export_dir


@pytest.fixture(scope='module')
def signature(exported):
  """The loaded serving_default signature of `exported`."""
  return tf.saved_model.load(_str(exported[1])).signatures['serving_default']


@pytest.fixture(scope='module')
def expected(trained):
  """predict() of the trained model with `c` looked up as a plain column.

  The export looks `c` up on 'cpu'; that must equal TF's plain lookup of the
  same table (device None), which predict() can run with either use_tpu.
  """
  use_tpu, model_dir = trained
  return predictions_of(make_estimator(model_dir, use_tpu,
                                       params={'c_device': None}))


# --------------------------------------------------------------------------------
# 1. export_saved_model: layout, served outputs, saved_model_cli.
# --------------------------------------------------------------------------------

def test_export_dir_is_timestamped_under_base(exported):
  base, export_dir = exported
  assert isinstance(export_dir, bytes)  # as Estimator returns it
  assert os.path.dirname(_str(export_dir)) == str(base)
  assert os.path.basename(_str(export_dir)).isdigit()
  assert os.listdir(str(base)) == [os.path.basename(_str(export_dir))]  # no temp dir left
  assert os.path.isfile(os.path.join(_str(export_dir), 'saved_model.pb'))
  assert os.path.isdir(os.path.join(_str(export_dir), 'variables'))


def test_served_equals_predict(trained, signature, expected):
  use_tpu, model_dir = trained
  served = {k: v.numpy()
            for k, v in signature(examples=tf.constant(EXAMPLES)).items()}
  assert sorted(served) == ['embedded', 'logits']
  assert_close(served, expected)
  if use_tpu:  # predict() with the 'cpu' column itself, as exported
    assert_close(served, predictions_of(make_estimator(model_dir, True)))


def test_use_tpu_false_predict_with_cpu_column_equals_served(tmp_path):
  make_estimator(tmp_path, False).train(input_fn, max_steps=1)
  estimator = make_estimator(tmp_path, False)
  export_dir = estimator.export_saved_model(
      str(tmp_path / 'export'),
      tpu_fc.export.build_parsing_serving_input_receiver_fn(FEATURE_SPEC))
  assert_close(serve_examples(export_dir), predictions_of(estimator))


def test_served_rows_do_not_depend_on_the_batch(trained, signature, expected):
  """One row at a time (its own sparse widths) gives the same outputs."""
  if not trained[0]:
    pytest.skip('one use_tpu variant is enough')
  for i in (0, 5):
    served = signature(examples=tf.constant([EXAMPLES[i]]))
    assert_close({k: v.numpy() for k, v in served.items()},
                 {k: v[i:i + 1] for k, v in expected.items()})


def test_exported_tables_are_the_trained_ones(trained, exported):
  """The SavedModel's variables are the checkpoint's, legacy names kept."""
  use_tpu, model_dir = trained
  variables = os.path.join(_str(exported[1]), 'variables', 'variables')
  saved = dict(tf.train.list_variables(variables))
  names = [
      'dense_features/a_embedding/embedding_weights',
      'dense_features/c_embedding/embedding_weights',
      'dense_features/tc_embedding/embedding_weights',
      'dense_features/w_weighted_by_w_weight_embedding/embedding_weights',
      'sa_sb_shared_embedding',
      'sequence_features/seq_embedding/embedding_weights',
  ]
  checkpoint = tf.train.latest_checkpoint(str(model_dir))
  for name in names:
    assert name in saved, sorted(saved)
    np.testing.assert_array_equal(tf.train.load_variable(variables, name),
                                  tf.train.load_variable(checkpoint, name))
  # Training moved the tables away from their constant initial values.
  initial = np.random.RandomState(1).uniform(-1, 1, (10, 3)).astype(np.float32)
  assert not np.allclose(
      tf.train.load_variable(variables, names[0]), initial)


@pytest.mark.subprocess
def test_saved_model_cli_show_all(trained, exported):
  if not trained[0]:
    pytest.skip('one use_tpu variant is enough')
  result = scripts.run(
      [SAVED_MODEL_CLI, 'show', '--dir', _str(exported[1]), '--all'],
      timeout=TIMEOUT)
  assert result.returncode == 0, result.stderr[-3000:]
  assert "signature_def['serving_default']" in result.stdout
  assert "inputs['examples']" in result.stdout
  assert "outputs['logits']" in result.stdout
  assert 'tensorflow/serving/predict' in result.stdout


@pytest.mark.subprocess
def test_saved_model_cli_run_input_examples(trained, exported, signature,
                                           tmp_path):
  """`saved_model_cli run --input_examples` (both lanes' syntax) serves a row."""
  if not trained[0]:
    pytest.skip('one use_tpu variant is enough')
  # The CLI cannot type an empty list: empty VarLen features are left out.
  example = {k: v for k, v in example_dict(1).items() if v}
  assert 'c' not in example and 'sb' not in example
  outdir = tmp_path / 'cli_out'
  result = scripts.run(
      [SAVED_MODEL_CLI, 'run', '--dir', _str(exported[1]), '--tag_set', 'serve',
       '--signature_def', 'serving_default', '--input_examples',
       'examples=[{}]'.format(json.dumps(example)), '--outdir', str(outdir)],
      timeout=TIMEOUT)
  assert result.returncode == 0, result.stderr[-3000:]
  assert 'Result for output key logits' in result.stdout
  served = signature(examples=tf.constant([serialize(example)]))
  for key in ('logits', 'embedded'):
    np.testing.assert_allclose(np.load(str(outdir / (key + '.npy'))),
                               served[key], rtol=0, atol=ATOL)


def test_raw_serving_input_receiver(trained, expected, tmp_path):
  use_tpu, model_dir = trained
  with tf.Graph().as_default():
    features = feature_tensors()
  export_dir = make_estimator(model_dir, use_tpu).export_saved_model(
      str(tmp_path), tpu_fc.export.build_raw_serving_input_receiver_fn(
          features))
  inputs = {}
  for key, value in feature_tensors().items():
    if isinstance(value, tf.SparseTensor):
      inputs.update({key + '_indices': value.indices,
                     key + '_values': value.values,
                     key + '_dense_shape': value.dense_shape})
    else:
      inputs[key] = value
  assert_close(serve(export_dir, **inputs), expected)


def test_tensor_serving_input_receiver(trained, expected, tmp_path):
  """The model_fn receives the bare tensor of a TensorServingInputReceiver."""
  use_tpu, model_dir = trained
  if not use_tpu:
    pytest.skip('one use_tpu variant is enough')

  def receiver_fn():
    serialized = tf.compat.v1.placeholder(tf.string, [None], name='examples')
    return tpu_fc.export.TensorServingInputReceiver(
        serialized, {'examples': serialized})

  export_dir = make_estimator(model_dir, use_tpu).export_saved_model(
      str(tmp_path), receiver_fn)
  assert_close(serve_examples(export_dir), expected)


def test_custom_export_outputs_give_their_signatures(trained, expected,
                                                     tmp_path):
  use_tpu, model_dir = trained
  estimator = make_estimator(model_dir, use_tpu, params={'export_outputs': 1})
  export_dir = estimator.export_saved_model(
      str(tmp_path), tpu_fc.export.build_parsing_serving_input_receiver_fn(
          FEATURE_SPEC))
  loaded = tf.saved_model.load(_str(export_dir))
  assert sorted(loaded.signatures) == ['classify', 'regress',
                                       'serving_default']
  examples = tf.constant(EXAMPLES)
  default = loaded.signatures['serving_default'](examples=examples)
  assert sorted(default) == ['net', 'score']
  np.testing.assert_allclose(default['score'], expected['logits'], atol=ATOL,
                             rtol=0)
  np.testing.assert_allclose(default['net'], expected['embedded'], atol=ATOL,
                             rtol=0)
  classify = loaded.signatures['classify'](inputs=examples)
  probability = 1 / (1 + np.exp(-expected['logits']))
  np.testing.assert_allclose(
      classify['scores'], np.concatenate([1 - probability, probability], 1),
      atol=ATOL, rtol=0)
  assert classify['classes'].numpy().tolist() == [[b'no', b'yes']] * N
  regress = loaded.signatures['regress'](inputs=examples)
  np.testing.assert_allclose(np.reshape(regress['outputs'], (N, 1)),
                             expected['logits'], atol=ATOL, rtol=0)
  # The signatures' method names.
  saved_model = saved_model_pb2.SavedModel()
  with open(os.path.join(_str(export_dir), 'saved_model.pb'), 'rb') as f:
    saved_model.ParseFromString(f.read())
  (meta_graph,) = saved_model.meta_graphs
  assert list(meta_graph.meta_info_def.tags) == ['serve']
  methods = {k: v.method_name for k, v in meta_graph.signature_def.items()}
  assert methods == {'serving_default': 'tensorflow/serving/predict',
                     'classify': 'tensorflow/serving/classify',
                     'regress': 'tensorflow/serving/regress'}


def test_assets_extra_as_text_and_export_savedmodel(trained, expected,
                                                    tmp_path):
  use_tpu, model_dir = trained
  source = tmp_path / 'vocab.txt'
  source.write_text('yes\nno\n')
  estimator = make_estimator(model_dir, use_tpu)
  receiver_fn = tpu_fc.export.build_parsing_serving_input_receiver_fn(
      FEATURE_SPEC)
  export_dir = _str(estimator.export_saved_model(
      str(tmp_path / 'a'), receiver_fn,
      assets_extra={'vocab.txt': str(source), 'deep/dir/copy.txt': str(source)},
      as_text=True))
  for relative in ('vocab.txt', 'deep/dir/copy.txt'):
    with open(os.path.join(export_dir, 'assets.extra', relative)) as f:
      assert f.read() == 'yes\nno\n'
  assert os.path.isfile(os.path.join(export_dir, 'saved_model.pbtxt'))
  assert not os.path.exists(os.path.join(export_dir, 'saved_model.pb'))
  assert_close(serve_examples(export_dir), expected)
  # The TF1 name, with its strip_default_attrs argument.
  kwargs = {'strip_default_attrs': True} if use_tpu else {}
  export_dir = estimator.export_savedmodel(str(tmp_path / 'tf1'), receiver_fn,
                                           **kwargs)
  assert os.path.dirname(_str(export_dir)) == str(tmp_path / 'tf1')
  assert_close(serve_examples(export_dir), expected)


def test_a_failed_export_leaves_no_temp_directory(trained, tmp_path):
  """A failure after the SavedModel was written (a missing assets_extra source;
  a full disk alike) removes `temp-<timestamp>`: an export retried in the same
  second would find it and fail."""
  use_tpu, model_dir = trained
  base = tmp_path / 'export'
  estimator = make_estimator(model_dir, use_tpu)
  receiver_fn = tpu_fc.export.build_parsing_serving_input_receiver_fn(
      FEATURE_SPEC)
  with pytest.raises(tf.errors.NotFoundError):
    estimator.export_saved_model(
        str(base), receiver_fn,
        assets_extra={'vocab.txt': str(tmp_path / 'missing.txt')})
  assert os.listdir(base) == []
  export_dir = estimator.export_saved_model(str(base), receiver_fn)
  assert os.listdir(base) == [os.path.basename(_str(export_dir))]


def test_checkpoint_path_selects_the_exported_values(trained, tmp_path):
  use_tpu, model_dir = trained
  state = tf.train.get_checkpoint_state(str(model_dir))
  first, last = (state.all_model_checkpoint_paths[0],
                 state.all_model_checkpoint_paths[-1])
  assert first != last
  estimator = make_estimator(model_dir, use_tpu, params={'c_device': None})
  old = predictions_of(estimator, checkpoint_path=first)
  new = predictions_of(estimator, checkpoint_path=last)
  assert np.abs(old['logits'] - new['logits']).max() > 1e-3
  export_dir = make_estimator(model_dir, use_tpu).export_saved_model(
      str(tmp_path), tpu_fc.export.build_parsing_serving_input_receiver_fn(
          FEATURE_SPEC), checkpoint_path=first)
  assert_close(serve_examples(export_dir), old)


def test_no_checkpoint_raises(tmp_path):
  estimator = make_estimator(tmp_path / 'empty', True)
  base = tmp_path / 'export'
  with pytest.raises(ValueError) as raised:
    estimator.export_saved_model(
        str(base), tpu_fc.export.build_parsing_serving_input_receiver_fn(
            FEATURE_SPEC))
  assert str(raised.value) == "Couldn't find trained model at {}.".format(
      tmp_path / 'empty')
  assert not base.exists() or not os.listdir(str(base))


def test_export_to_neither_cpu_nor_tpu_raises(trained, tmp_path):
  use_tpu, model_dir = trained
  estimator = make_estimator(model_dir, use_tpu, export_to_cpu=False,
                             export_to_tpu=False)
  with pytest.raises(ValueError) as raised:
    estimator.export_saved_model(
        str(tmp_path), tpu_fc.export.build_parsing_serving_input_receiver_fn(
            FEATURE_SPEC))
  assert str(raised.value) == 'One of export_to_cpu and export_to_tpu must be true.'


def test_export_to_cpu_only_and_to_tpu_only_export_the_cpu_graph(
    trained, expected, tmp_path):
  use_tpu, model_dir = trained
  if not use_tpu:
    pytest.skip('one use_tpu variant is enough')
  export_dirs = []
  for flags in (dict(export_to_tpu=False), dict(export_to_cpu=False)):
    # Both into one base within a second: Estimator's distinct timestamps.
    export_dirs.append(make_estimator(
        model_dir, use_tpu, **flags).export_saved_model(
            str(tmp_path), tpu_fc.export.build_parsing_serving_input_receiver_fn(
                FEATURE_SPEC)))
    assert_close(serve_examples(export_dirs[-1]), expected)
  assert sorted(os.listdir(str(tmp_path))) == sorted(
      os.path.basename(_str(d)) for d in export_dirs)
  assert len(set(export_dirs)) == 2


def test_bare_predictions_are_served_as_output(trained, expected, tmp_path):
  """A non-dict `predictions` is PredictOutput's single 'output'."""
  use_tpu, model_dir = trained
  if not use_tpu:
    pytest.skip('one use_tpu variant is enough')
  export_dir = make_estimator(
      model_dir, use_tpu, params={'bare_predictions': 1}).export_saved_model(
          str(tmp_path), tpu_fc.export.build_parsing_serving_input_receiver_fn(
              FEATURE_SPEC))
  served = serve_examples(export_dir)
  assert list(served) == ['output']
  np.testing.assert_allclose(served['output'], expected['logits'], atol=ATOL,
                             rtol=0)


def test_receiver_tensors_alternatives_give_servable_signatures(
    trained, expected, tmp_path):
  use_tpu, model_dir = trained
  if not use_tpu:
    pytest.skip('one use_tpu variant is enough')

  def receiver_fn():
    serialized = tf.compat.v1.placeholder(tf.string, [None],
                                          name='input_example_tensor')
    features = tf.compat.v1.io.parse_example(serialized, FEATURE_SPEC)
    return tpu_fc.export.ServingInputReceiver(
        features, {'examples': serialized},
        # 'x_only' cannot compute the outputs: TF leaves it out.
        {'parsed': dict(features), 'x_only': features['x']})

  export_dir = make_estimator(model_dir, use_tpu).export_saved_model(
      str(tmp_path), receiver_fn)
  loaded = tf.saved_model.load(_str(export_dir))
  assert sorted(loaded.signatures) == ['parsed:serving_default',
                                       'serving_default']
  inputs = {}
  for key, value in feature_tensors().items():
    if isinstance(value, tf.SparseTensor):
      inputs.update({key + '_indices': value.indices,
                     key + '_values': value.values,
                     key + '_dense_shape': value.dense_shape})
    else:
      inputs[key] = value
  served = loaded.signatures['parsed:serving_default'](**inputs)
  assert_close({k: v.numpy() for k, v in served.items()}, expected)


def _recording_model_fn(seen, spec_cls):
  """model_fn recording the params each call gets (export: PREDICT only)."""

  def recording_model_fn(features, labels, mode, params):
    seen.append(dict(params))
    spec = model_fn(features, labels, mode, dict(params, c_device=None))
    return spec_cls(mode, predictions=spec.predictions)

  return recording_model_fn


def test_export_model_fn_params_like_tf(trained, expected, tmp_path):
  use_tpu, model_dir = trained
  seen = []
  estimator = tpu_fc.TPUEstimator(
      model_fn=_recording_model_fn(seen, tpu_fc.TPUEstimatorSpec),
      model_dir=str(model_dir), use_tpu=use_tpu, params={'p': 1},
      train_batch_size=BATCH, predict_batch_size=BATCH,
      config=tpu_fc.RunConfig(tpu_config=tpu_fc.TPUConfig(num_shards=2)))
  export_dir = estimator.export_saved_model(
      str(tmp_path), tpu_fc.export.build_parsing_serving_input_receiver_fn(
          FEATURE_SPEC))
  assert_close(serve_examples(export_dir), expected)
  assert seen == [{'p': 1, 'use_tpu': False}]


@pytest.mark.legacy_only
def test_tf_export_model_fn_params(trained, expected, tmp_path):
  """Pins the test above to TF 2.15's real TPUEstimator (either use_tpu)."""
  use_tpu, model_dir = trained
  seen = []
  estimator = tf.compat.v1.estimator.tpu.TPUEstimator(
      model_fn=_recording_model_fn(
          seen, tf.compat.v1.estimator.tpu.TPUEstimatorSpec),
      model_dir=str(model_dir), use_tpu=use_tpu, params={'p': 1},
      train_batch_size=BATCH, predict_batch_size=BATCH, export_to_tpu=False,
      config=tf.compat.v1.estimator.tpu.RunConfig(
          tpu_config=tf.compat.v1.estimator.tpu.TPUConfig(num_shards=2)))
  export_dir = estimator.export_saved_model(
      str(tmp_path), tf.estimator.export.build_parsing_serving_input_receiver_fn(
          FEATURE_SPEC))
  assert_close(serve_examples(export_dir), expected)
  assert seen == [{'p': 1, 'use_tpu': False}]


# --------------------------------------------------------------------------------
# 2. Bad requests fail that call only.
# --------------------------------------------------------------------------------

SERVING_ERRORS = (tf.errors.InvalidArgumentError, TypeError, ValueError)


def _with(i, **changes):
  example = example_dict(i)
  example.update(changes)
  return example


@pytest.mark.parametrize('key', INT_KEYS)
def test_out_of_range_id_fails_that_call_only(trained, signature, expected,
                                              key):
  if not trained[0]:
    pytest.skip('one use_tpu variant is enough')
  value = VOCAB[key] + 3
  changes = {key: example_dict(2)[key][:-1] + [value]}
  bad = [EXAMPLES[0], serialize(_with(2, **changes))]
  with pytest.raises(tf.errors.InvalidArgumentError) as raised:
    signature(examples=tf.constant(bad))
  message = str(raised.value)
  assert str(value) in message and '/{}_'.format(key) in message, message
  good = {k: v.numpy()
          for k, v in signature(examples=tf.constant(EXAMPLES)).items()}
  assert_close(good, expected)


@pytest.mark.parametrize('key', INT_KEYS)
def test_negative_ids_are_padding(trained, signature, expected, key):
  """As in TF's safe lookups, negative ids (and their weights) are dropped."""
  if not trained[0]:
    pytest.skip('one use_tpu variant is enough')
  changes = {key: example_dict(2)[key] + [-2]}
  if key == 'w':
    changes['w_weight'] = example_dict(2)['w_weight'] + [1.5]
  served = signature(examples=tf.constant(
      [EXAMPLES[0], serialize(_with(2, **changes))]))
  assert_close({k: v.numpy() for k, v in served.items()},
               {k: v[[0, 2]] for k, v in expected.items()})


@pytest.mark.parametrize('request_kind', [
    'float_ids', 'int_weights', 'string_dense', 'not_an_example',
    'wrong_dense_length'])
def test_malformed_example_fails_that_call_only(trained, signature, expected,
                                                request_kind):
  if not trained[0]:
    pytest.skip('one use_tpu variant is enough')
  if request_kind == 'not_an_example':
    bad = b'\x12\x34 definitely not a tf.Example'
  elif request_kind == 'float_ids':
    example = tf.train.Example.FromString(EXAMPLES[3])
    example.features.feature['a'].Clear()
    example.features.feature['a'].float_list.value.extend([1.0, 2.0])
    bad = example.SerializeToString()
  elif request_kind == 'int_weights':
    example = tf.train.Example.FromString(EXAMPLES[3])
    example.features.feature['w_weight'].Clear()
    example.features.feature['w_weight'].int64_list.value.extend([1])
    bad = example.SerializeToString()
  elif request_kind == 'string_dense':
    example = tf.train.Example.FromString(EXAMPLES[3])
    example.features.feature['x'].Clear()
    example.features.feature['x'].bytes_list.value.extend([b'1', b'2'])
    bad = example.SerializeToString()
  else:
    bad = serialize(_with(3, x=[1.0, 2.0, 3.0]))
  with pytest.raises(tf.errors.InvalidArgumentError):
    signature(examples=tf.constant([EXAMPLES[0], bad]))
  good = {k: v.numpy() for k, v in signature(examples=tf.constant(EXAMPLES)).items()}
  assert_close(good, expected)


def test_raw_signature_bad_requests_fail_that_call_only(trained, expected,
                                                        tmp_path):
  use_tpu, model_dir = trained
  if not use_tpu:
    pytest.skip('one use_tpu variant is enough')
  with tf.Graph().as_default():
    features = feature_tensors()
  export_dir = make_estimator(model_dir, use_tpu).export_saved_model(
      str(tmp_path), tpu_fc.export.build_raw_serving_input_receiver_fn(
          features))
  signature = tf.saved_model.load(_str(export_dir)).signatures[
      'serving_default']

  def inputs(rows=None, **overrides):
    result = {}
    for key, value in feature_tensors(rows).items():
      if isinstance(value, tf.SparseTensor):
        result.update({key + '_indices': value.indices,
                       key + '_values': value.values,
                       key + '_dense_shape': value.dense_shape})
      else:
        result[key] = value
    result.update(overrides)
    return result

  good = inputs()
  bad_rows = dict(ROWS, c=[list(r) for r in ROWS['c']])
  bad_rows['c'][4] = [VOCAB['c']]  # one past the end of the 'cpu' table
  bad_requests = [
      inputs(bad_rows),
      inputs(a_values=tf.cast(good['a_values'], tf.float32)),  # wrong dtype
      inputs(x=tf.constant([['1', '2']] * N)),  # wrong dtype
      inputs(x=tf.ones([N, 3])),  # wrong width
  ]
  for bad in bad_requests:
    with pytest.raises(SERVING_ERRORS):
      signature(**bad)
    assert_close({k: v.numpy() for k, v in signature(**good).items()},
                 expected)


# --------------------------------------------------------------------------------
# Estimator's error texts around export (legacy lane: TF 2.15's own).
# --------------------------------------------------------------------------------

def _export_with_extra_variable(estimator_cls, spec_cls, config_cls, model_dir,
                                base, receiver_fn, **kwargs):
  """Exports a model_fn whose PREDICT graph has a variable no checkpoint has."""

  def extra_model_fn(features, labels, mode, params):
    spec = model_fn(features, labels, mode, params)
    if mode != PREDICT:
      return spec
    extra = tf.compat.v1.get_variable('not_in_checkpoint', [], tf.float32)
    return spec_cls(mode, predictions={'logits': spec.predictions['logits'] +
                                       extra})

  estimator = estimator_cls(
      model_fn=extra_model_fn, model_dir=str(model_dir), use_tpu=False,
      predict_batch_size=BATCH, config=config_cls(), **kwargs)
  return estimator.export_saved_model(str(base), receiver_fn)


MISSING_VARIABLE_PREFIX = (
    'Could not load all requested variables from checkpoint. Please make sure '
    'your model_fn does not expect variables that were not saved in the '
    'checkpoint.\n\nEncountered error with mode `infer` while restoring '
    'checkpoint from: `')


def test_variable_missing_from_checkpoint_error_text(trained, tmp_path):
  use_tpu, model_dir = trained
  if use_tpu:
    pytest.skip('one use_tpu variant is enough')
  with pytest.raises(ValueError) as raised:
    _export_with_extra_variable(
        tpu_fc.TPUEstimator, tpu_fc.TPUEstimatorSpec, tpu_fc.RunConfig,
        model_dir, tmp_path,
        tpu_fc.export.build_parsing_serving_input_receiver_fn(FEATURE_SPEC),
        params={'c_device': None})
  assert str(raised.value).startswith(MISSING_VARIABLE_PREFIX)


@pytest.mark.legacy_only
def test_tf_variable_missing_from_checkpoint_error_text(trained, tmp_path):
  """Pins the text of the test above to TF 2.15's real TPUEstimator."""
  use_tpu, model_dir = trained
  if use_tpu:
    pytest.skip('one use_tpu variant is enough')
  with pytest.raises(ValueError) as raised:
    _export_with_extra_variable(
        tf.compat.v1.estimator.tpu.TPUEstimator,
        tf.compat.v1.estimator.tpu.TPUEstimatorSpec,
        tf.compat.v1.estimator.tpu.RunConfig, model_dir, tmp_path,
        tf.estimator.export.build_parsing_serving_input_receiver_fn(
            FEATURE_SPEC), params={'c_device': None}, export_to_tpu=False)
  assert str(raised.value).startswith(MISSING_VARIABLE_PREFIX)


def test_no_checkpoint_exports_the_warm_start_checkpoint(trained, expected,
                                                         tmp_path):
  use_tpu, model_dir = trained
  if use_tpu:
    pytest.skip('one use_tpu variant is enough')
  estimator = make_estimator(tmp_path / 'fresh', use_tpu,
                             warm_start_from=str(model_dir))
  export_dir = estimator.export_saved_model(
      str(tmp_path / 'export'),
      tpu_fc.export.build_parsing_serving_input_receiver_fn(FEATURE_SPEC))
  assert_close(serve_examples(export_dir), expected)


@pytest.mark.legacy_only
def test_tf_exports_the_warm_start_checkpoint(trained, expected, tmp_path):
  """Pins the behaviour of the test above to TF 2.15's real TPUEstimator."""
  use_tpu, model_dir = trained
  if use_tpu:
    pytest.skip('one use_tpu variant is enough')

  def tf_model_fn(features, labels, mode, params):
    spec = model_fn(features, labels, mode, dict(params, c_device=None))
    return tf.compat.v1.estimator.tpu.TPUEstimatorSpec(
        mode, predictions=spec.predictions)

  estimator = tf.compat.v1.estimator.tpu.TPUEstimator(
      model_fn=tf_model_fn, model_dir=str(tmp_path / 'fresh'), use_tpu=False,
      predict_batch_size=BATCH, export_to_tpu=False,
      config=tf.compat.v1.estimator.tpu.RunConfig(),
      warm_start_from=str(model_dir))
  export_dir = estimator.export_saved_model(
      str(tmp_path / 'export'),
      tf.estimator.export.build_parsing_serving_input_receiver_fn(FEATURE_SPEC))
  assert_close(serve_examples(export_dir), expected)


@pytest.mark.legacy_only
def test_error_order_without_checkpoint_and_export_flags_like_tf(tmp_path):
  def run(estimator_cls, config_cls, receiver_fn, model_dir):
    estimator = estimator_cls(
        model_fn=model_fn, model_dir=str(model_dir), use_tpu=False,
        predict_batch_size=BATCH, export_to_cpu=False, export_to_tpu=False,
        config=config_cls())
    return outcome(estimator.export_saved_model, str(tmp_path / 'export'),
                   receiver_fn)

  expected_outcome = run(
      tf.compat.v1.estimator.tpu.TPUEstimator,
      tf.compat.v1.estimator.tpu.RunConfig,
      tf.estimator.export.build_parsing_serving_input_receiver_fn(
          FEATURE_SPEC), tmp_path / 'tf')
  assert expected_outcome[0] is ValueError
  assert run(tpu_fc.TPUEstimator, tpu_fc.RunConfig,
             tpu_fc.export.build_parsing_serving_input_receiver_fn(
                 FEATURE_SPEC), tmp_path / 'tf') == expected_outcome


# --------------------------------------------------------------------------------
# 3. Legacy lane: a checkpoint of TF 2.15's real TPUEstimator(use_tpu=False).
# --------------------------------------------------------------------------------

def _tf_columns():
  """TF 2.15's own TPU columns (tf.compat.v1.tpu.experimental.*)."""
  tpu = tf.compat.v1.tpu.experimental
  a = tpu.embedding_column(_ids('a'), 3, initializer=_const(10, 3, 1))
  tc = tpu.embedding_column(
      _ids('tc'), 2, initializer=_const(6, 2, 2),
      embedding_lookup_device='tpu_tensor_core', tensor_core_shape=[None, 2])
  sa, sb = tpu.shared_embedding_columns(
      [_ids('sa'), _ids('sb')], 3, initializer=_const(8, 3, 4))
  w = tpu.embedding_column(
      fc.weighted_categorical_column(_ids('w'), 'w_weight'), 2,
      combiner='sqrtn', initializer=_const(5, 2, 5))
  seq = tpu.embedding_column(
      fc.sequence_categorical_column_with_identity('seq', VOCAB['seq']), 2,
      max_sequence_length=3, initializer=_const(9, 2, 6))
  return [a, tc, sa, sb, w], [seq]


def tf_model_fn(features, labels, mode, params):
  """A model_fn written against TF 2.15's API only."""
  del params
  dense_columns, sequence_columns = _tf_columns()
  embedded = tf.keras.layers.DenseFeatures(dense_columns)(features)
  sequence, lengths = tf.keras.experimental.SequenceFeatures(
      sequence_columns)(features)
  mask = tf.sequence_mask(lengths, tf.shape(sequence)[1], dtype=tf.float32)
  net = tf.concat([embedded, tf.reduce_sum(sequence * mask[:, :, None], 1),
                   features['x']], 1)
  logits = tf.compat.v1.layers.dense(net, 1, name='logits')
  spec_cls = tf.compat.v1.estimator.tpu.TPUEstimatorSpec
  if mode == tf.estimator.ModeKeys.PREDICT:
    return spec_cls(mode, predictions={'logits': logits, 'embedded': net})
  loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
  train_op = tf.compat.v1.train.AdagradOptimizer(0.5).minimize(
      loss, tf.compat.v1.train.get_global_step())
  return spec_cls(mode, loss=loss, train_op=train_op)


@pytest.mark.legacy_only
def test_real_tpu_estimator_checkpoint_exports_like_tf(tmp_path):
  assert not tpu_fc.legacy_names.is_installed()
  assert (tf.estimator.export.build_parsing_serving_input_receiver_fn is not
          tpu_fc.export.build_parsing_serving_input_receiver_fn)
  model_dir = tmp_path / 'model'
  real = tf.compat.v1.estimator.tpu.TPUEstimator(
      model_fn=tf_model_fn, model_dir=str(model_dir), use_tpu=False,
      train_batch_size=BATCH, predict_batch_size=BATCH, export_to_tpu=False,
      config=tf.compat.v1.estimator.tpu.RunConfig(tf_random_seed=3))
  real.train(input_fn, max_steps=3)
  real_predictions = predictions_of(real)
  real_dir = real.export_saved_model(
      str(tmp_path / 'tf'),
      tf.estimator.export.build_parsing_serving_input_receiver_fn(
          FEATURE_SPEC))
  ours = tpu_fc.TPUEstimator(
      model_fn=tf_model_fn, model_dir=str(model_dir), use_tpu=False,
      predict_batch_size=BATCH, config=tpu_fc.RunConfig(tf_random_seed=3))
  ours_dir = ours.export_saved_model(
      str(tmp_path / 'ours'),
      tpu_fc.export.build_parsing_serving_input_receiver_fn(FEATURE_SPEC))
  assert type(ours_dir) is type(real_dir)  # pylint: disable=unidiomatic-typecheck
  served_real = serve_examples(real_dir)
  assert_close(served_real, real_predictions)  # the reference is sane
  assert_close(serve_examples(ours_dir), served_real)
  # tensorflow_estimator's own receiver fn works with tpu_fc's export too.
  ours_tf_receiver = ours.export_saved_model(
      str(tmp_path / 'ours_tf'),
      tf.estimator.export.build_parsing_serving_input_receiver_fn(
          FEATURE_SPEC))
  assert_close(serve_examples(ours_tf_receiver), served_real)
  # Same signature inputs and outputs as TF's export.
  real_sig = tf.saved_model.load(_str(real_dir)).signatures['serving_default']
  ours_sig = tf.saved_model.load(_str(ours_dir)).signatures['serving_default']
  assert (real_sig.structured_input_signature ==
          ours_sig.structured_input_signature)
  assert (sorted(real_sig.structured_outputs) ==
          sorted(ours_sig.structured_outputs))


# --------------------------------------------------------------------------------
# 4. install() binds tf.estimator.export; receivers' validation.
# --------------------------------------------------------------------------------

@pytest.fixture
def installed():
  tpu_fc.install()
  try:
    yield
  finally:
    tpu_fc.uninstall()


EXPORT_NAMES = ['ServingInputReceiver', 'TensorServingInputReceiver',
                'build_parsing_serving_input_receiver_fn',
                'build_raw_serving_input_receiver_fn', 'PredictOutput',
                'ClassificationOutput', 'RegressionOutput', 'ExportOutput']


def test_install_binds_estimator_export(installed):
  assert (tf.estimator.export.build_parsing_serving_input_receiver_fn is
          tpu_fc.export.build_parsing_serving_input_receiver_fn)
  assert (tf.compat.v1.estimator.export.ServingInputReceiver is
          tpu_fc.export.ServingInputReceiver)
  for namespace in (tf.estimator.export, tf.compat.v1.estimator.export,
                    tf.compat.v2.estimator.export):
    for name in EXPORT_NAMES:
      assert getattr(namespace, name) is getattr(tpu_fc.export, name), name


def test_uninstall_restores_estimator_export():
  before = tf.__dict__.get('estimator')
  tpu_fc.install()
  try:
    assert tf.estimator.export.ServingInputReceiver is (
        tpu_fc.export.ServingInputReceiver)
  finally:
    tpu_fc.uninstall()
  assert tf.__dict__.get('estimator') is before
  if lanes.LEGACY:
    from tensorflow_estimator.python.estimator.export import export as tfe_export  # pylint: disable=g-import-not-at-top
    assert (tf.estimator.export.build_parsing_serving_input_receiver_fn is
            tfe_export.build_parsing_serving_input_receiver_fn)
  else:
    assert not hasattr(tf, 'estimator')


def test_legacy_export_script_runs_after_install(installed, trained, expected,
                                                 tmp_path):
  """Legacy export code, unchanged, through the installed names."""
  use_tpu, model_dir = trained
  if not use_tpu:
    pytest.skip('one use_tpu variant is enough')
  estimator = tf.compat.v1.estimator.tpu.TPUEstimator(
      model_fn=model_fn, model_dir=str(model_dir), use_tpu=False,
      predict_batch_size=BATCH,
      config=tf.compat.v1.estimator.tpu.RunConfig(tf_random_seed=0))
  assert isinstance(estimator, tpu_fc.TPUEstimator)
  export_dir = estimator.export_saved_model(
      str(tmp_path), tf.estimator.export.build_parsing_serving_input_receiver_fn(
          FEATURE_SPEC))
  assert_close(serve_examples(export_dir), expected)


class _ConvertibleLabeled(object):
  """Like a LabeledTensor: holds `.tensor` and converts to it."""

  def __init__(self, tensor):
    self.tensor = tensor


tf.register_tensor_conversion_function(
    _ConvertibleLabeled,
    lambda value, dtype=None, name=None, as_ref=False: tf.convert_to_tensor(
        value.tensor, dtype=dtype, name=name))


def _receiver_cases():
  """(label, constructor name, args builder) of valid and invalid receivers."""
  def t():
    return tf.compat.v1.placeholder(tf.float32, [None], name='t')

  def sp():
    return tf.compat.v1.sparse.placeholder(tf.int64, [None, None])

  def ragged():
    return tf.RaggedTensor.from_row_lengths(tf.constant([1, 2, 3]), [2, 1])

  class Labeled(object):
    def __init__(self):
      self.tensor = tf.constant(1.0)

  def convertible():
    """TF's carve-out: a LabeledTensor-like object that converts to a Tensor."""
    return _ConvertibleLabeled(tf.constant([1.0]))

  return [
      ('int_feature_key', 'ServingInputReceiver',
       lambda: ({1: t()}, {'x': t()})),
      ('float_feature_key', 'ServingInputReceiver',
       lambda: ({1.5: t()}, {'x': t()})),
      ('int_receiver_key', 'ServingInputReceiver',
       lambda: ({'f': t()}, {1: t()})),
      ('non_tensor_feature', 'ServingInputReceiver',
       lambda: ({'f': 3}, {'x': t()})),
      ('numpy_feature', 'ServingInputReceiver',
       lambda: ({'f': np.ones(2)}, {'x': t()})),
      ('labeled_feature', 'ServingInputReceiver',
       lambda: ({'f': Labeled()}, {'x': t()})),
      ('convertible_labeled_feature', 'ServingInputReceiver',
       lambda: ({'f': convertible()}, {'x': t()})),
      ('convertible_single_feature', 'TensorServingInputReceiver',
       lambda: (convertible(), {'x': t()})),
      ('supervised_bad_single_label', 'SupervisedInputReceiver',
       lambda: ({'f': t()}, 'not a tensor', {'x': t()})),
      ('supervised_convertible_label', 'SupervisedInputReceiver',
       lambda: ({'f': t()}, convertible(), {'x': t()})),
      ('non_tensor_receiver', 'ServingInputReceiver',
       lambda: ({'f': t()}, {'x': 'serialized'})),
      ('unsupervised', 'UnsupervisedInputReceiver',
       lambda: ({'f': t(), 3: sp()}, t())),
      ('unsupervised_no_features', 'UnsupervisedInputReceiver',
       lambda: (None, {'x': t()})),
      ('bare_tensors', 'ServingInputReceiver', lambda: (t(), t())),
      ('sparse_and_ragged', 'ServingInputReceiver',
       lambda: ({'s': sp(), 'r': ragged()}, {'s': sp()})),
      ('no_features', 'ServingInputReceiver', lambda: (None, {'x': t()})),
      ('no_receivers', 'ServingInputReceiver', lambda: ({'f': t()}, None)),
      ('alternatives_not_dict', 'ServingInputReceiver',
       lambda: ({'f': t()}, {'x': t()}, [t()])),
      ('alternatives_bad_key', 'ServingInputReceiver',
       lambda: ({'f': t()}, {'x': t()}, {'alt': {2: t()}})),
      ('alternatives_bad_value', 'ServingInputReceiver',
       lambda: ({'f': t()}, {'x': t()}, {'alt': {'a': 'no'}})),
      ('alternatives_bare_tensor', 'ServingInputReceiver',
       lambda: ({'f': t()}, {'x': t()}, {'alt': t()})),
      ('tensor_receiver', 'TensorServingInputReceiver',
       lambda: (t(), {'x': t()})),
      ('tensor_receiver_none', 'TensorServingInputReceiver',
       lambda: (None, {'x': t()})),
      ('tensor_receiver_dict', 'TensorServingInputReceiver',
       lambda: ({'f': t()}, {'x': t()})),
      ('tensor_receiver_not_tensor', 'TensorServingInputReceiver',
       lambda: (3, {'x': t()})),
      ('tensor_receiver_bad_receiver', 'TensorServingInputReceiver',
       lambda: (t(), {1: t()})),
  ]


RECEIVER_CASES = _receiver_cases()

# TF 2.15's texts, for the lane without tensorflow_estimator (pinned to
# tensorflow_estimator on the legacy lane by the next test).
TF215_RECEIVER_ERRORS = {
    'float_feature_key': 'feature keys must be strings or ints: 1.5.',
    'int_receiver_key': 'receiver_tensor keys must be strings: 1.',
    'non_tensor_feature':
        'feature f must be a Tensor, SparseTensor, or RaggedTensor.',
    'numpy_feature':
        'feature f must be a Tensor, SparseTensor, or RaggedTensor.',
    'non_tensor_receiver':
        'receiver_tensor x must be a Tensor, SparseTensor, or RaggedTensor.',
    'no_features': 'features must be defined.',
    'unsupervised_no_features': 'features must be defined.',
    'no_receivers': 'receiver_tensors must be defined.',
    'alternatives_bad_key':
        'receiver_tensors_alternative keys must be strings: 2.',
    'alternatives_bad_value': 'receiver_tensors_alternative a must be a '
                              'Tensor, SparseTensor, or RaggedTensor.',
    'tensor_receiver_none': 'features must be defined.',
    'tensor_receiver_dict':
        'feature must be a Tensor, SparseTensor, or RaggedTensor.',
    'tensor_receiver_not_tensor':
        'feature must be a Tensor, SparseTensor, or RaggedTensor.',
    'tensor_receiver_bad_receiver': 'receiver_tensor keys must be strings: 1.',
    'supervised_bad_single_label':
        'label label must be a Tensor, SparseTensor, or RaggedTensor.',
}


def _receiver_outcome(module, name, make_args):
  """(error type, text) or the receiver's structure (keys and tensor names)."""
  with tf.Graph().as_default():
    args = make_args()
    try:
      receiver = getattr(module, name)(*args)
    except Exception as e:  # pylint: disable=broad-except
      return type(e), str(e)

  def describe(value):
    if isinstance(value, dict):
      return {k: describe(v) for k, v in value.items()}
    if value is None:
      return None
    return type(value).__name__
  return type(receiver).__name__, tuple(describe(v) for v in receiver)


@pytest.mark.parametrize('label,name,make_args', RECEIVER_CASES,
                         ids=[c[0] for c in RECEIVER_CASES])
def test_receiver_validation_texts(label, name, make_args):
  result = _receiver_outcome(tpu_fc.export, name, make_args)
  if label in TF215_RECEIVER_ERRORS:
    assert result == (ValueError, TF215_RECEIVER_ERRORS[label])
  elif label == 'alternatives_not_dict':
    assert result[0] is ValueError
    assert result[1].startswith('receiver_tensors_alternatives must be a dict: ')
  elif label == 'labeled_feature':
    pass  # compared with TF on the legacy lane only
  else:
    assert result[0] == name, result


@pytest.mark.legacy_only
@pytest.mark.parametrize('label,name,make_args', RECEIVER_CASES,
                         ids=[c[0] for c in RECEIVER_CASES])
def test_receivers_match_tensorflow_estimator(label, name, make_args):
  from tensorflow_estimator.python.estimator.export import export as tfe_export  # pylint: disable=g-import-not-at-top
  expected_outcome = _receiver_outcome(tfe_export, name, make_args)
  if label in TF215_RECEIVER_ERRORS:
    assert expected_outcome == (ValueError, TF215_RECEIVER_ERRORS[label])
  assert _receiver_outcome(tpu_fc.export, name, make_args) == expected_outcome


def test_each_modes_saved_model_tags_under_tf_export_libs_name():
  """`EXPORT_TAG_MAP` (TF's export_lib's, which its tests read): the tags
  an export gives each mode's meta graph."""
  modules = [tpu_fc.export]
  if lanes.LEGACY:
    from tensorflow_estimator.python.estimator.export import export_lib  # pylint: disable=g-import-not-at-top
    modules.append(export_lib)
  for module in modules:
    assert [module.EXPORT_TAG_MAP[mode] for mode in ('train', 'eval', 'infer')
           ] == [['train'], ['eval'], ['serve']]


def test_single_tensors_are_wrapped_under_tf_default_names():
  with tf.Graph().as_default():
    t = tf.compat.v1.placeholder(tf.float32, [None])
    receiver = tpu_fc.export.ServingInputReceiver(t, t, {'alt': t})
    assert receiver.features == {'feature': t}
    assert receiver.receiver_tensors == {'input': t}
    assert receiver.receiver_tensors_alternatives == {'alt': {'input': t}}
    tensor_receiver = tpu_fc.export.TensorServingInputReceiver(t, t)
    assert tensor_receiver.features is t
    assert tensor_receiver.receiver_tensors == {'input': t}


def test_parsing_receiver_fn_like_tf():
  """Same placeholder, receiver key and parsed features as TF 2.15's builder."""
  with tf.Graph().as_default():
    receiver = tpu_fc.export.build_parsing_serving_input_receiver_fn(
        FEATURE_SPEC, default_batch_size=5)()
    placeholder = receiver.receiver_tensors['examples']
    assert list(receiver.receiver_tensors) == ['examples']
    assert placeholder.op.name == 'input_example_tensor'
    assert placeholder.shape.as_list() == [5]
    assert placeholder.dtype == tf.string
    assert sorted(receiver.features) == sorted(FEATURE_SPEC)
    assert isinstance(receiver.features['a'], tf.SparseTensor)
    assert receiver.features['x'].shape.as_list() == [5, 2]
    assert receiver.receiver_tensors_alternatives is None


def test_raw_receiver_fn_placeholders():
  with tf.Graph().as_default():
    features = {'dense': tf.constant([[1.0, 2.0]], name='dense_in'),
                'ids': tf.SparseTensor([[0, 0]], tf.constant([1], tf.int64),
                                       [1, 4])}
    receiver = tpu_fc.export.build_raw_serving_input_receiver_fn(
        features, default_batch_size=3)()
    assert receiver.features.keys() == receiver.receiver_tensors.keys()
    dense = receiver.features['dense']
    assert dense.op.type == 'Placeholder'
    assert dense.op.name == 'dense_in_1'  # TF reuses the op name
    assert dense.shape.as_list() == [3, 2] and dense.dtype == tf.float32
    ids = receiver.features['ids']
    assert isinstance(ids, tf.SparseTensor) and ids.dtype == tf.int64


def _int_pair(key='x'):
  """An input_fn's (features, labels) of two examples."""
  return ({key: tf.constant([[1], [1]]), 'y': tf.constant(['a', 'b'])},
          tf.constant([[1.0], [1.0]]))


@pytest.mark.parametrize('input_fn,args,want', [
    (_int_pair, {}, ({'x': ('int32', [None, 1]), 'y': ('string', [None])},
                     ('float32', [None, 1]), ['label', 'x', 'y'])),
    (_int_pair, {'key': 'z'}, (
        {'z': ('int32', [None, 1]), 'y': ('string', [None])},
        ('float32', [None, 1]), ['label', 'y', 'z'])),
    (lambda: tf.data.Dataset.from_tensors(
        ({'x': tf.constant([[1.0, 2.0]])}, {'l': tf.constant([2])})), {}, (
            {'x': ('float32', [None, 2])}, {'l': ('int32', [None])},
            ['l', 'x'])),
], ids=['pair', 'pair_with_args', 'dataset_of_dicts'])
def test_supervised_receiver_fn_from_an_input_fn(input_fn, args, want):
  """Placeholders like the features and labels the input_fn (called with
  `args`) gives, the batch left open; a single label fed as `label`."""
  modules = [tpu_fc.export]
  if lanes.LEGACY:
    from tensorflow_estimator.python.estimator.export import export as tfe_export  # pylint: disable=g-import-not-at-top
    modules.append(tfe_export)

  def described(value):
    if isinstance(value, dict):
      return {key: described(tensor) for key, tensor in value.items()}
    return value.dtype.name, value.shape.as_list()

  for module in modules:
    receiver_fn = module.build_supervised_input_receiver_fn_from_input_fn(
        input_fn, **args)
    with tf.Graph().as_default():
      receiver = receiver_fn()
      assert (described(receiver.features), described(receiver.labels),
              sorted(receiver.receiver_tensors)) == want, module.__name__


RAW_DENSE_CASES = [
    # (tensor maker, expected placeholder shape for batch b), id = label
    pytest.param(lambda: tf.zeros([2, 3], name='m'), lambda b: [b, 3],
                 id='matrix'),
    pytest.param(lambda: tf.zeros([2, 3, 4], tf.int64, name='r3'),
                 lambda b: [b, 3, 4], id='rank3'),
    pytest.param(lambda: tf.constant([1, 2, 3], name='v'), lambda b: [b],
                 id='vector'),
    pytest.param(lambda: tf.compat.v1.placeholder(tf.float32, None, name='u'),
                 lambda b: None, id='unknown_rank'),
    pytest.param(lambda: tf.constant(1.0, name='s'), lambda b: [b],
                 id='scalar'),
]


@pytest.mark.parametrize('make,shape', RAW_DENSE_CASES)
@pytest.mark.parametrize('batch', [None, 7])
def test_raw_receiver_placeholder_shapes_like_tf(make, shape, batch):
  modules = [tpu_fc.export]
  if lanes.LEGACY:
    from tensorflow_estimator.python.estimator.export import export as tfe_export  # pylint: disable=g-import-not-at-top
    modules.insert(0, tfe_export)  # TF first: pins the expected shape
  for module in modules:
    with tf.Graph().as_default():
      tensor = make()
      receiver = module.build_raw_serving_input_receiver_fn(
          {'f': tensor}, default_batch_size=batch)()
      placeholder = receiver.features['f']
      assert placeholder is receiver.receiver_tensors['f']
      assert placeholder.op.type == 'Placeholder'
      assert placeholder.dtype == tensor.dtype
      actual = (placeholder.shape.as_list()
                if placeholder.shape.rank is not None else None)
      assert actual == shape(batch), module.__name__


# tf.estimator's export names around a TPUEstimator: the model_fn as exported
# (`add_metrics` builds on it) and a meta graph per mode.


def _auc(labels, predictions):
  """add_metrics' metric_fn: a Keras metric, as TF's docstring has it."""
  auc = tf.keras.metrics.AUC()
  auc.update_state(labels, tf.sigmoid(predictions['logit']))
  return {'auc': auc}


def _drivers():
  """tpu_fc, and on the legacy lane TF 2.15's TPUEstimator."""
  return [tpu_fc] + ([tf.compat.v1.estimator.tpu] if lanes.LEGACY else [])


@pytest.mark.filterwarnings('ignore:`tf.layers.dense` is deprecated')
def test_model_fn_is_the_model_as_exported_and_add_metrics_builds_on_it(
    tmp_path):
  """`estimator.model_fn(features, labels, mode, config)` calls the model_fn
  as TF's TPUEstimator exports it: on the CPU, params['use_tpu'] False, no
  batch size, an EstimatorSpec back.  `tf.estimator.add_metrics` (TF 2.15's
  raised "config must be an instance of RunConfig" for tpu_fc's) evaluates
  the trained model on the CPU with its metrics and metric_fn's."""
  seen = {}
  for driver in _drivers():
    records = []
    estimator = estimators.linear_estimator(
        tmp_path / driver.__name__, use_tpu=driver is tpu_fc, driver=driver,
        record=lambda params, records=records: records.append(
            {key: value for key, value in params.items()
             if key in ('use_tpu', 'batch_size', 'context')}))
    with tf.Graph().as_default():
      batch = estimators.LINEAR_BATCH
      spec = estimator.model_fn(
          tf.constant(inputs.X[:batch]), tf.constant(inputs.Y[:batch]),
          tpu_fc.ModeKeys.EVAL, estimator.config)
      assert type(spec).__name__ == 'EstimatorSpec'
      assert set(spec.eval_metric_ops) == {'mean_logit'}
    estimator.train(inputs.linear, max_steps=2)
    with tpu_fc.legacy_names.installed():
      extended = tf.estimator.add_metrics(estimator, _auc)
    # (a plain Estimator, whose input_fn gets no batch size, as in TF)
    seen[driver] = records[0], extended.evaluate(
        lambda: estimators.linear_eval_input_fn({'batch_size': estimators.LINEAR_BATCH}),
        steps=estimators.LINEAR_EVAL_STEPS)
  params, metrics = seen[tpu_fc]
  assert params == {'use_tpu': False}
  assert set(metrics) == {'loss', 'mean_logit', 'auc', 'global_step'}
  cpu = estimators.linear_estimator(tmp_path / 'tpu_fc',
                                    use_tpu=False).evaluate(
                                        estimators.linear_eval_input_fn,
                                        steps=estimators.LINEAR_EVAL_STEPS)
  for name in ('loss', 'mean_logit'):
    assert metrics[name] == pytest.approx(cpu[name], rel=1e-6), name
  if lanes.LEGACY:  # (trained on the emulated TPU's 2 shards; TF's on the CPU)
    legacy_params, legacy = seen[tf.compat.v1.estimator.tpu]
    assert legacy_params == params
    for name in metrics:
      assert metrics[name] == pytest.approx(legacy[name], rel=1e-5), name


def _receivers():
  """TRAIN and EVAL receivers of raw features and labels, PREDICT's of
  features."""
  features = tf.zeros([estimators.LINEAR_BATCH, 2])
  supervised = tf.estimator.experimental.build_raw_supervised_input_receiver_fn(
      features, tf.zeros([estimators.LINEAR_BATCH, 1]))
  return {tpu_fc.ModeKeys.TRAIN: supervised, tpu_fc.ModeKeys.EVAL: supervised,
          tpu_fc.ModeKeys.PREDICT: tf.estimator.export.build_raw_serving_input_receiver_fn(
              features)}


def _meta_graphs(export_dir):
  """{tags: {signature: (inputs, outputs)}} of a SavedModel, and the kernel
  each meta graph restores."""
  found = {}
  for tags in (['train'], ['eval'], ['serve']):
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
      loaded = tf.compat.v1.saved_model.load(session, tags, export_dir)
      kernel, = [session.run(variable)
                 for variable in tf.compat.v1.global_variables()
                 if variable.op.name == 'dense/kernel']
      found[tags[0]] = ({name: (sorted(signature.inputs),
                                sorted(signature.outputs))
                         for name, signature in loaded.signature_def.items()},
                        kernel)
  return found


@pytest.mark.filterwarnings('ignore:`tf.layers.dense` is deprecated')
def test_experimental_export_all_saved_models_writes_a_meta_graph_per_mode(
    tmp_path, tf_log):
  """One SavedModel: TRAIN, EVAL and PREDICT meta graphs with TF's tags and
  signatures, one set of variables; with export_to_tpu, TF's warning for the
  modes a TPU does not export (no TPU meta graph without a TPU)."""
  exported = {}
  for driver in _drivers():
    estimator = estimators.linear_estimator(
        tmp_path / driver.__name__, use_tpu=driver is tpu_fc, driver=driver)
    estimator.train(inputs.linear, max_steps=2)
    with tpu_fc.legacy_names.installed():
      export_dir = estimator.experimental_export_all_saved_models(
          str(tmp_path / ('export_' + driver.__name__)), _receivers())
    exported[driver] = (_meta_graphs(export_dir.decode()),
                        estimator.get_variable_value('dense/kernel'))
  meta_graphs, kernel = exported[tpu_fc]
  assert {tags: signatures for tags, (signatures, _) in meta_graphs.items()} == {
      'train': {'train': (['input', 'label'], ['loss'])},
      'eval': {'eval': (['input', 'label'],
                        ['loss', 'metrics/mean_logit/update_op',
                         'metrics/mean_logit/value', 'predictions/logit'])},
      'serve': {'serving_default': (['input'], ['logit'])},
  }
  for tags, (_, restored) in meta_graphs.items():
    np.testing.assert_array_equal(restored, kernel, err_msg=tags)
  ignored = ['TPUEstimator only handles mode PREDICT for exporting when '
             '`export_to_tpu` is `True`; Mode {} will be ignored for TPU.'.format(
                 mode) for mode in ('train', 'eval')]
  assert [m for m in tf_log if m in ignored] == ignored * len(_drivers())
  if lanes.LEGACY:
    legacy_meta_graphs, _ = exported[tf.compat.v1.estimator.tpu]
    assert ({tags: signatures for tags, (signatures, _) in
             legacy_meta_graphs.items()} ==
            {tags: signatures for tags, (signatures, _) in meta_graphs.items()})
