"""What the emulated TPU refuses, as TF 2.15's TPUEstimator on a TPU does, with
TF's texts (or, where TF had none, one naming the feature and the fix)."""
import re

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
