"""What the emulated TPU refuses, as TF 2.15's TPUEstimator on a TPU does, with
TF's texts (or, where TF had none, one naming the feature and the fix)."""
import re

import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf

from harness import estimators
from harness import inputs
from harness import models

pytestmark = pytest.mark.filterwarnings('ignore::UserWarning')
fc = tf.feature_column


@pytest.mark.parametrize('steps,error,text', [
    (None, ValueError, 'Evaluate `steps` must be set on TPU. Cannot be `None`.'),
    (12.3, TypeError, "Eval steps must be int, got <class 'float'>"),
    (-321, ValueError, 'Eval steps must be positive, got -321'),
])
def test_tpu_evaluation_steps_are_checked(tmp_path, steps, error, text):
  """`test_error_out_if_steps_is_float` and `..._is_invalid`."""
  estimator = tpu_fc.TPUEstimator(
      model_fn=models.dense_x_model_fn(tpu_fc, cross_shard=True),
      train_batch_size=4,
      eval_batch_size=4, config=tpu_fc.RunConfig(model_dir=str(tmp_path)))
  with pytest.raises(error) as raised:
    estimator.evaluate(inputs.dense_x, steps=steps)
  assert str(raised.value) == text


@pytest.mark.parametrize('mode', ['evaluate', 'predict'])
def test_tpu_evaluate_and_predict_need_their_batch_size(mode, tmp_path):
  """TF 2.15's `_InternalTPUContext._validate_tpu_configuration` (its text),
  checked before input_fn, whose params['batch_size'] would be missing.  (TF's
  own class fails earlier without a TPU: 'Cannot find any TPU cores'.)"""
  def input_fn(params):
    raise AssertionError('input_fn called with {}'.format(params))

  estimator = tpu_fc.TPUEstimator(
      model_fn=models.columns_model_fn([]), use_tpu=True, train_batch_size=2,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path)))
  name, method = (('eval_batch_size', 'evaluate') if mode == 'evaluate' else
                  ('predict_batch_size', 'predict'))
  with pytest.raises(ValueError, match=re.escape(
      '{} in TPUEstimator constructor cannot be `None` if .{} is running on '
      'TPU.'.format(name, method))):
    if mode == 'evaluate':
      estimator.evaluate(input_fn, steps=1)
    else:
      next(estimator.predict(input_fn))


def test_num_shards_1_with_a_spec_is_refused(tmp_path):
  feat = inputs.Feature('a', inputs.A_SP)

  column_fn, spec = estimators.one_column(feat, models.init_table(0),
                                          tpu_fc.AdagradParameters(0.1))
  with pytest.raises(ValueError) as error:
    estimators.user_estimator(tmp_path, models.user_model_fn(column_fn), spec,
                              num_shards=1)
  assert str(error.value) == ('Setting TPUConfig.num_shards==1 is unsupported '
                              'when embedding_config_spec is not None.')


@pytest.mark.parametrize('static', [True, False])
def test_embedding_ids_of_another_batch_than_configured_fail(tmp_path, static):
  """The configured batch fixes the activations' shape (a TPU's embedding
  config fixes it): ids of another batch fail, naming the feature, at build
  time when their batch is static, else when the step runs."""
  user = tpu_fc.embedding_column(fc.categorical_column_with_identity('u', 10), 4)

  model_fn = models.embedding_model_fn(
      [user], lambda net, features, labels: tf.reduce_sum(net))

  def input_fn(params):
    del params
    ids = tf.SparseTensor([[0, 0], [1, 0]], tf.constant([1, 2], tf.int64),
                          [2, 1])
    if not static:
      ids = tf.SparseTensor(ids.indices, ids.values,
                            tf.compat.v1.placeholder_with_default(
                                ids.dense_shape, [2]))
    return tf.data.Dataset.from_tensors({'u': ids}).repeat()

  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn, train_batch_size=4,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=[user],
          optimization_parameters=tpu_fc.AdagradParameters(0.1)))
  message = ('Feature u: input_fn gave the embedding features a batch of 2 '
             r'examples, but the configured batch size \(train_batch_size / '
             r'eval_batch_size\) is 4')
  with pytest.raises(ValueError if static else tf.errors.InvalidArgumentError,
                     match=message):
    estimator.train(input_fn, steps=1)


@pytest.mark.parametrize('pipeline', ['PER_HOST_V1', 'PER_HOST_V2'])
@pytest.mark.parametrize('columns,error,text', [
    (lambda: [tpu_fc.embedding_column(fc.categorical_column_with_identity('x', 10), 2),
              fc.embedding_column(fc.categorical_column_with_identity('y', 10), 4)],
     TypeError, 'Unsupported feature column'),
    (lambda: [tpu_fc.embedding_column(fc.categorical_column_with_identity('x', 10), 2),
              tpu_fc.embedding_column(fc.categorical_column_with_identity('x', 10), 4)],
     ValueError, 'Feature column x is used with multiple embeddings'),
], ids=['non_tpu_column', 'feature_in_two_embeddings'])
def test_a_column_error_comes_before_input_fn_in_training(tmp_path, pipeline,
                                                          columns, error, text):
  """TF builds the embedding config before its input pipeline calls input_fn
  when training (`tpu_estimator_embedding_test.test_non_tpu_embedding_column`,
  `test_feature_in_two_embeddings`: an input_fn returning 'Not used'), so the
  column error wins over PER_HOST_V2's 'must return a Dataset'."""
  called = []

  def input_fn(params):
    called.append(params)
    return 'Not used'

  estimator = tpu_fc.TPUEstimator(
      model_fn=models.columns_model_fn([]), train_batch_size=8,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path), tpu_config=tpu_fc.TPUConfig(
          iterations_per_loop=2, num_shards=2,
          per_host_input_for_training=getattr(tpu_fc.InputPipelineConfig,
                                              pipeline))),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=columns(),
          optimization_parameters=tpu_fc.AdagradParameters(0.01)))
  with pytest.raises(error, match=text):
    estimator.train(input_fn, steps=1)
  assert not called


def _dense_x_estimator(model_dir, num_shards=2, **options):
  """TPUEstimator of `models.dense_x_model_fn` on `num_shards` cores, batches
  of 4 in every mode (`options`: TPUConfig's)."""
  return tpu_fc.TPUEstimator(
      model_fn=models.dense_x_model_fn(), train_batch_size=4,
      eval_batch_size=4, predict_batch_size=4,
      config=tpu_fc.RunConfig(model_dir=str(model_dir), tpu_config=(
          tpu_fc.TPUConfig(num_shards=num_shards, **options))))


def _endless_input_of_unknown_width(where):
  """input_fn: an endless Dataset whose features' (or labels') second
  dimension is unknown, its batch static."""
  def input_fn(params):
    x = np.ones([4, 2], np.float32)
    dataset = tf.data.Dataset.from_tensor_slices(
        ({'x': x}, x.sum(1, keepdims=True)))

    def unknown_width(features, labels):
      if where == 'features':
        return {'x': tf.compat.v1.placeholder_with_default(
            features['x'], [None])}, labels
      return features, tf.compat.v1.placeholder_with_default(labels, [None])

    return dataset.map(unknown_width).repeat().batch(params['batch_size'],
                                                     drop_remainder=True)
  return input_fn


@pytest.mark.parametrize('where', ['features', 'labels'])
@pytest.mark.parametrize('mode', ['predict', 'evaluate'])
def test_inputs_of_unknown_shape_fail_at_once_over_an_endless_input(
    tmp_path, mode, where):
  """A TPU refuses features and labels of a shape not fully known, in every
  mode (TF 2.15's `_validate_model_features_and_labels`, `tpu_estimator.py`
  1975-2011, called on the TPU's dequeued inputs before model_fn, prediction's
  padded ones included: 1929-1936): predict over an endless input raises
  when the graph is built, rather than predicting forever."""
  estimator = _dense_x_estimator(tmp_path)
  input_fn = _endless_input_of_unknown_width(where)
  with pytest.raises(ValueError, match=re.escape(
      'The {} to the model returned by input_fn must have static '
      'shape.'.format(where))):
    if mode == 'predict':  # (one prediction, were it not refused)
      next(estimator.predict(input_fn))
    else:
      estimator.evaluate(input_fn, steps=1)


@pytest.mark.parametrize('returned,error,text', [
    ('tensor', TypeError,
     'TPUEstimatorSpec.predictions must be dict of Tensors.'),
    ('unknown_batch', ValueError,
     r'The tensor with key \(x\) in TPUEstimatorSpec.predictions has dynamic '
     r'shape \(should be static\).'),
])
def test_tpu_predictions_are_checked(tmp_path, returned, error, text):
  """What a TPU's prediction takes of a TPUEstimatorSpec
  (`_verify_tpu_spec_predictions`, `tpu_estimator.py` 1960-1972): a dict of
  tensors with a static batch."""
  def model_fn(features, labels, mode, params):
    del labels, params
    x = features['x']
    if returned == 'tensor':
      return tpu_fc.TPUEstimatorSpec(mode, predictions=x)
    return tpu_fc.TPUEstimatorSpec(mode, predictions={
        'x': tf.compat.v1.placeholder_with_default(x, [None, 2])})

  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn, train_batch_size=4, predict_batch_size=4,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path)))
  with pytest.raises(error, match=text):
    next(estimator.predict(inputs.dense_x))


@pytest.mark.parametrize('steps,max_steps,error,text', [
    (12.3, None, TypeError, "Train steps must be int, got <class 'float'>"),
    (None, 12.3, TypeError, "Train max_steps must be int, got <class 'float'>"),
    (None, None, ValueError, 'For TPU training, one of `steps` or `max_steps` '
     'must be set. Cannot be both `None`.'),
])
def test_tpu_training_steps_are_checked_before_input_fn(tmp_path, steps,
                                                         max_steps, error,
                                                         text):
  """TPUEstimator's `_convert_train_steps_to_hooks` (`tpu_estimator.py`
  2967-2987), which Estimator.train calls before input_fn."""
  def input_fn(params):
    raise AssertionError('input_fn called with {}'.format(params))

  with pytest.raises(error, match=re.escape(text)):
    _dense_x_estimator(tmp_path).train(input_fn, steps=steps,
                                       max_steps=max_steps)


@pytest.mark.parametrize('mode', ['train', 'evaluate'])
def test_a_batch_the_cores_cannot_split_is_refused_before_input_fn(
    tmp_path, mode):
  """TF's `_validate_tpu_configuration` (`tpu_context.py` 738-755) runs where
  the steps are converted to hooks, before input_fn: an input_fn without
  `params` (which TF's test passes) is not even looked at."""
  def input_fn():
    raise AssertionError('input_fn called')

  estimator = _dense_x_estimator(tmp_path, num_shards=3)
  with pytest.raises(ValueError, match=re.escape(
      '{} batch size 4 must be divisible by number of replicas 3'.format(
          'train' if mode == 'train' else 'eval'))):
    if mode == 'train':
      estimator.train(input_fn, steps=1)
    else:
      estimator.evaluate(input_fn, steps=1)


@pytest.fixture
def tf1_control_flow():
  """TF1 control flow, as under `tf.compat.v1.disable_v2_behavior()` (which
  TF's TPU test files call); control flow v2 again after the test."""
  tf.compat.v1.disable_control_flow_v2()
  try:
    yield
  finally:
    tf.compat.v1.enable_control_flow_v2()


def test_training_without_a_cross_replica_sum_is_refused_in_tf1_control_flow(
    tmp_path, tf1_control_flow):
  """TF 2.15 validates a TF1 control-flow training graph of several replicas
  (`tpu_estimator.py`, `_validate_tpu_training_graph`, 3775-3796): a plain
  optimizer builds no `CrossReplicaSum`.  (Under control flow v2 TF skips the
  check; tpu_fc warns.)"""
  del tf1_control_flow
  estimator = tpu_fc.TPUEstimator(
      model_fn=models.dense_x_model_fn(cross_shard=False), train_batch_size=4,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path), tpu_config=(
          tpu_fc.TPUConfig(num_shards=2))))
  with pytest.raises(ValueError, match=re.escape(
      'CrossShardOptimizer must be used for model training on TPUs.')):
    estimator.train(inputs.dense_x, steps=1)


def test_a_tf1_loop_refuses_model_summaries_as_a_tpu_does(tmp_path,
                                                          tf1_control_flow):
  """In TF 2.15's TF1 training loop on a TPU a v1 summary of the model_fn
  stays in the graph's collection, where the Scaffold's summary op cannot take
  a tensor of the loop (TF's ValueError; TF's TPU tests expect it)."""
  del tf1_control_flow

  def model_fn(features, labels, mode, params):
    spec = models.dense_x_model_fn()(features, labels, mode, params)
    tf.compat.v1.summary.scalar('loss_', spec.loss)
    return spec

  estimator = tpu_fc.TPUEstimator(
      model_fn=model_fn, train_batch_size=4,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path), tpu_config=(
          tpu_fc.TPUConfig(num_shards=2, iterations_per_loop=2))))
  with pytest.raises(ValueError, match='while loop'):
    estimator.train(inputs.dense_x, steps=2)


def _queue_input_fn(params):
  """Features and labels dequeued from a queue its runner fills."""
  queue = tf.queue.FIFOQueue(8, [tf.float32], shapes=[[2]])
  tf.compat.v1.train.add_queue_runner(tf.compat.v1.train.QueueRunner(
      queue, [queue.enqueue_many([np.ones([4, 2], np.float32)])]))
  x = queue.dequeue_many(params['batch_size'])
  return {'x': x}, tf.reduce_sum(x, 1, keepdims=True)


@pytest.mark.parametrize('in_loop', [False, True])
def test_queue_runners_in_the_input_pipeline(tmp_path, caplog, monkeypatch,
                                             in_loop):
  """TF 2.15's `_validate_input_pipeline` (`tpu_estimator.py` 1614-1636):
  queue runners are warned of, or refused when TF's switch
  `_WRAP_INPUT_FN_INTO_WHILE_LOOP` builds the infeed in a while loop."""
  message = ('Input pipeline contains one or more QueueRunners. It could be '
             'slow and not scalable.')
  from tpu_fc.estimator.tpu import tpu_estimator  # pylint: disable=g-import-not-at-top
  monkeypatch.setattr(tpu_estimator, '_WRAP_INPUT_FN_INTO_WHILE_LOOP', in_loop)
  estimator = _dense_x_estimator(tmp_path)
  if in_loop:
    with pytest.raises(RuntimeError, match=re.escape(message)):
      estimator.train(_queue_input_fn, steps=1)
  else:
    estimator.train(_queue_input_fn, steps=1)
    assert any(message in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize('dims,text', [
    ([{'x': [1, 2, 0]}, None], 'All input partition dims must be >= 1.'),
    ([{'x': [1, 4, 1]}, None], 'The product of each input partition dim should '
     'equal to num_cores_per_replica. (dim = [1 4 1], num_cores_per_replica '
     '= 2)'),
    ([{'x': [1, 2]}, None], 'Input partition dims must have the same number '
     'of dimensions as the `Tensor` to be partitioned. (tensor shape = '
     '[2, 3, 2], input partition dims = [1 2]).'),
    ([{'y': [1, 2, 1]}, None], "TPUConfig.input_partition_dims[0] mismatched "
     "feature keys. Expected ['x'], got ['y']"),
    ([{'x': [1, 2, 1]}, {'y': None}], 'TPUConfig.input_partition_dims[1] '
     "mismatched label keys. Expected [], got ['y']"),
    ([{'x': [1, 2, 1]}, None], 'TPUConfig(num_cores_per_replica=2) asks for '
     'model parallelism, which tpu_fc does not emulate'),
])
def test_input_partition_dims_are_checked_then_model_parallelism_refused(
    tmp_path, dims, text):
  """TF 2.15's checks of `input_partition_dims` after input_fn
  (`tpu_estimator.py` 1324-1398, `tpu_feed.py` 905-943), in its words; dims
  that pass ask for model parallelism, which is refused."""
  def input_fn(params):
    x = np.ones([2, 3, 2], np.float32)
    return tf.data.Dataset.from_tensors(({'x': x}, x[:, :1, 0])).repeat()

  estimator = tpu_fc.TPUEstimator(
      model_fn=models.dense_x_model_fn(), train_batch_size=2,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path), tpu_config=(
          tpu_fc.TPUConfig(
              num_shards=1, num_cores_per_replica=2, input_partition_dims=dims,
              per_host_input_for_training=(
                  tpu_fc.InputPipelineConfig.PER_HOST_V2)))))
  with pytest.raises((ValueError, NotImplementedError),
                     match=re.escape(text)):
    estimator.train(input_fn, steps=1)
