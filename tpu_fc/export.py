"""What `tf.estimator.export` gave legacy export code, on every TF version.

Serving input receivers and their builders keep tensorflow_estimator's contract; the
export output classes are TF core's own (`tensorflow.python.saved_model.model_utils`).
`tpu_fc.install()` binds this module as `tf.estimator.export` and
`tf.compat.v1.estimator.export`.

`ClassificationOutput`, `EvalOutput`, `ExportOutput`, `PredictOutput` and
`RegressionOutput` here are TF core's classes (what `tf.estimator.export` held):
an `EstimatorSpec`'s `export_outputs` values.
"""
from __future__ import annotations

import collections
from typing import Any, Callable, Mapping

from tpu_fc import _tf_internals as internals
from tpu_fc._tf import tf

ClassificationOutput = internals.ClassificationOutput
EvalOutput = internals.EvalOutput
ExportOutput = internals.ExportOutput
PredictOutput = internals.PredictOutput
RegressionOutput = internals.RegressionOutput
# Each mode's SavedModel tags (TF core's map; TF's export_lib, which its tests
# read it from, has it too).
EXPORT_TAG_MAP = internals.EXPORT_TAG_MAP

_SINGLE_FEATURE = internals.SINGLE_FEATURE_DEFAULT_NAME
_SINGLE_LABEL = internals.SINGLE_LABEL_DEFAULT_NAME
_SINGLE_RECEIVER = internals.SINGLE_RECEIVER_DEFAULT_NAME


# The key a single tensor of each kind is wrapped under (TF's).
_SINGLE_TENSOR_NAMES = {
    'feature': _SINGLE_FEATURE,
    'label': _SINGLE_LABEL,
    'receiver_tensor': _SINGLE_RECEIVER,
    'receiver_tensors_alternative': _SINGLE_RECEIVER,
}


def _check_tensor(tensor, name, error_label):
  """TF's check: a Tensor, SparseTensor or RaggedTensor, or (TF's carve-out
  for LabeledTensor) an object with a `.tensor` that converts to a Tensor."""
  if isinstance(tensor, (tf.Tensor, tf.SparseTensor, tf.RaggedTensor)):
    return
  error = ValueError('{} must be a Tensor, SparseTensor, or RaggedTensor.'.format(
      '{} {}'.format(error_label, name) if name else error_label))
  if not hasattr(tensor, 'tensor'):
    raise error
  try:
    tf.convert_to_tensor(tensor)
  except TypeError:
    raise error from None


def _check_tensor_key(name, error_label, allow_ints):
  if isinstance(name, str):
    return
  if not allow_ints:
    raise ValueError('{} keys must be strings: {}.'.format(error_label, name))
  if not isinstance(name, int):
    raise ValueError('{} keys must be strings or ints: {}.'.format(
        error_label, name))


def wrap_and_check_input_tensors(tensors, field_name, allow_int_keys=False):
  """`tensors` as a dict of str (or int) to tensors, checked; a tensor is wrapped."""
  if tensors is None:
    raise ValueError('{}s must be defined.'.format(field_name))
  if not isinstance(tensors, dict):
    tensors = {_SINGLE_TENSOR_NAMES[field_name]: tensors}
  for name, tensor in tensors.items():
    _check_tensor_key(name, field_name, allow_int_keys)
    _check_tensor(tensor, name, field_name)
  return tensors


def _checked_alternatives(alternatives):
  if alternatives is None:
    return None
  if not isinstance(alternatives, dict):
    raise ValueError('receiver_tensors_alternatives must be a dict: {}.'.format(
        alternatives))
  return {name: wrap_and_check_input_tensors(tensors,
                                             'receiver_tensors_alternative')
          for name, tensors in alternatives.items()}


class ServingInputReceiver(collections.namedtuple(
    'ServingInputReceiver',
    ['features', 'receiver_tensors', 'receiver_tensors_alternatives'])):
  """What a serving_input_receiver_fn returns: features for the model, inputs to feed.

  Args:
    features: what the model_fn gets as `features`: a tensor (`SparseTensor`,
      `RaggedTensor`), wrapped into `{'feature': tensor}`, or a dict of them
      by string or int key.
    receiver_tensors: the tensors a request feeds (the signature's inputs): a
      tensor, wrapped into `{'input': tensor}`, or a dict of them by string.
    receiver_tensors_alternatives: None, or signature name -> receiver
      tensors (a tensor or dict), each an extra signature feeding the same
      features.

  Raises:
    ValueError: `features` or `receiver_tensors` None, a value that is no
      tensor, a key of another type, or alternatives that are no dict.
  """

  def __new__(cls, features: Any, receiver_tensors: Any,
              receiver_tensors_alternatives: Mapping[str, Any] | None = None):
    return super().__new__(
        cls,
        features=wrap_and_check_input_tensors(features, 'feature',
                                              allow_int_keys=True),
        receiver_tensors=wrap_and_check_input_tensors(receiver_tensors,
                                                      'receiver_tensor'),
        receiver_tensors_alternatives=_checked_alternatives(
            receiver_tensors_alternatives))


class TensorServingInputReceiver(collections.namedtuple(
    'TensorServingInputReceiver',
    ['features', 'receiver_tensors', 'receiver_tensors_alternatives'])):
  """A receiver whose single feature goes to the model as is, not in a dict.

  Args:
    features: one tensor (`SparseTensor`, `RaggedTensor`), the model_fn's
      `features`.
    receiver_tensors, receiver_tensors_alternatives: as in
      `ServingInputReceiver`.

  Raises:
    ValueError: `features` None or no tensor, and `ServingInputReceiver`'s
      checks.
  """

  def __new__(cls, features: Any, receiver_tensors: Any,
              receiver_tensors_alternatives: Mapping[str, Any] | None = None):
    if features is None:
      raise ValueError('features must be defined.')
    _check_tensor(features, None, 'feature')
    receiver = ServingInputReceiver(features, receiver_tensors,
                                    receiver_tensors_alternatives)
    return super().__new__(
        cls, features=receiver.features[_SINGLE_FEATURE],
        receiver_tensors=receiver.receiver_tensors,
        receiver_tensors_alternatives=receiver.receiver_tensors_alternatives)


class UnsupervisedInputReceiver(ServingInputReceiver):
  """What a TRAIN or EVAL input_receiver_fn without labels returns (TF's
  export module's): a `ServingInputReceiver` without alternatives.

  Args:
    features, receiver_tensors: as in `ServingInputReceiver`.
  """

  def __new__(cls, features: Any, receiver_tensors: Any):
    return super().__new__(cls, features, receiver_tensors)


class SupervisedInputReceiver(collections.namedtuple(
    'SupervisedInputReceiver', ['features', 'labels', 'receiver_tensors'])):
  """What a TRAIN or EVAL input_receiver_fn returns (for
  `experimental_export_all_saved_models`): features and labels for the
  model, inputs to feed.

  Args:
    features: the model_fn's `features`, kept as given: a tensor or a dict of
      tensors by string or int key.
    labels: the model_fn's `labels`, likewise.
    receiver_tensors: the tensors a request feeds, as in
      `ServingInputReceiver`.

  Raises:
    ValueError: a field None, a value that is no tensor, or a key of another
      type.
  """

  def __new__(cls, features: Any, labels: Any, receiver_tensors: Any):
    # (features and labels are checked, and kept as given: a tensor or dict)
    wrap_and_check_input_tensors(features, 'feature', allow_int_keys=True)
    wrap_and_check_input_tensors(labels, 'label', allow_int_keys=True)
    return super().__new__(
        cls, features=features, labels=labels,
        receiver_tensors=wrap_and_check_input_tensors(receiver_tensors,
                                                      'receiver_tensor'))


def build_parsing_serving_input_receiver_fn(
    feature_spec: Mapping[str, Any], default_batch_size: int | None = None
) -> Callable[[], ServingInputReceiver]:
  """A receiver_fn parsing serialized `tf.Example`s with `feature_spec`.

  Args:
    feature_spec: feature key -> `tf.io.FixedLenFeature`, `VarLenFeature`,
      ... (e.g. `tf.feature_column.make_parse_example_spec(columns)`).
    default_batch_size: the batch size of the placeholder; None: any.

  Returns:
    A serving_input_receiver_fn whose `ServingInputReceiver` feeds a string
    tensor `examples` (named `input_example_tensor`) of serialized
    `tf.Example`s and gives the model the parsed features.
  """

  def serving_input_receiver_fn():
    serialized = tf.compat.v1.placeholder(
        dtype=tf.string, shape=[default_batch_size],
        name='input_example_tensor')
    features = tf.compat.v1.io.parse_example(serialized, feature_spec)
    return ServingInputReceiver(features, {'examples': serialized})

  return serving_input_receiver_fn


def _placeholder_like(value, default_batch_size):
  """A placeholder (sparse or dense) shaped like `value`, batch left open."""
  if isinstance(value, tf.SparseTensor):
    shape = value.get_shape().as_list()
    shape[0] = default_batch_size
    return tf.compat.v1.sparse.placeholder(value.dtype, shape=shape)
  shape = tf.TensorShape([default_batch_size]).concatenate(value.shape[1:])
  name = value.op.name if hasattr(value, 'op') else None
  return tf.compat.v1.placeholder(value.dtype, shape=shape, name=name)


def build_raw_serving_input_receiver_fn(
    features: Any, default_batch_size: int | None = None
) -> Callable[[], Any]:
  """A receiver_fn feeding raw tensors shaped like `features` (a dict or a tensor).

  Args:
    features: a tensor (dense or sparse) or a dict of them by name; each
      receiver is a placeholder of its dtype and shape, the batch dimension
      open.
    default_batch_size: the placeholders' batch size; None: any.

  Returns:
    A serving_input_receiver_fn: for a dict, its `ServingInputReceiver` feeds
    and gives the placeholders by the same names; for a tensor, a
    `TensorServingInputReceiver` gives the model the one placeholder.
  """

  def serving_input_receiver_fn():
    if isinstance(features, dict):
      receivers = {name: _placeholder_like(value, default_batch_size)
                   for name, value in features.items()}
      return ServingInputReceiver(receivers, receivers.copy())
    receiver = _placeholder_like(features, default_batch_size)
    return TensorServingInputReceiver(receiver, receiver)

  return serving_input_receiver_fn


def build_raw_supervised_input_receiver_fn(
    features: Any, labels: Any, default_batch_size: int | None = None
) -> Callable[[], SupervisedInputReceiver]:
  """A TRAIN or EVAL receiver_fn feeding raw features and labels shaped like
  `features` and `labels` (each a dict or a tensor), which the model_fn gets
  as they are (tf.estimator.experimental's).

  Args:
    features: a tensor or a dict of tensors, as in
      `build_raw_serving_input_receiver_fn`; a tensor is fed as `input`.
    labels: likewise; a tensor is fed as `label`.
    default_batch_size: the placeholders' batch size; None: any.

  Returns:
    An input_receiver_fn returning a `SupervisedInputReceiver`, for
    `experimental_export_all_saved_models`.

  Raises:
    ValueError: `features` and `labels` share a key.
  """
  feature_keys = (list(features) if isinstance(features, dict) else
                  [_SINGLE_RECEIVER])
  label_keys = list(labels) if isinstance(labels, dict) else [_SINGLE_LABEL]
  overlap_keys = set(feature_keys) & set(label_keys)
  if overlap_keys:
    raise ValueError('Features and labels must have distinct keys. '
                     'Found overlapping keys: {}'.format(overlap_keys))

  def receivers(values, single_name):
    """(what the model gets, the receivers by name) of `values`."""
    if isinstance(values, dict):
      placeholders = {name: _placeholder_like(value, default_batch_size)
                      for name, value in values.items()}
      return placeholders, placeholders
    placeholder = _placeholder_like(values, default_batch_size)
    return placeholder, {single_name: placeholder}

  def supervised_input_receiver_fn():
    model_features, feature_receivers = receivers(features, _SINGLE_RECEIVER)
    model_labels, label_receivers = receivers(labels, _SINGLE_LABEL)
    return SupervisedInputReceiver(
        model_features, model_labels,
        {**feature_receivers, **label_receivers})

  return supervised_input_receiver_fn


def build_supervised_input_receiver_fn_from_input_fn(
    input_fn: Callable[..., Any], **input_fn_args: Any
) -> Callable[[], SupervisedInputReceiver]:
  """`build_raw_supervised_input_receiver_fn` of the features and labels
  `input_fn(**input_fn_args)` gives (TF's export module's).

  Args:
    input_fn: an Estimator input_fn returning (features, labels) or a Dataset
      of them; called now, in a graph of its own, for their dtypes and shapes.
    **input_fn_args: its arguments.

  Returns:
    An input_receiver_fn returning a `SupervisedInputReceiver`, for
    `experimental_export_all_saved_models`.

  Raises:
    ValueError: the input_fn gave no (features, labels) pair.
  """
  with tf.Graph().as_default():
    result = input_fn(**input_fn_args)
    if isinstance(result, tf.data.Dataset):
      result = tf.compat.v1.data.make_one_shot_iterator(result).get_next()
    if not (isinstance(result, (tuple, list)) and len(result) == 2):
      raise ValueError(
          'input_fn should return (features, labels) as a len 2 tuple.')
    features, labels = result
  return build_raw_supervised_input_receiver_fn(features, labels)
