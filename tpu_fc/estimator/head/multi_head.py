"""`MultiHead`: TF 2.15's `tf.estimator.MultiHead`."""
from __future__ import annotations

from tpu_fc import export as export_lib
from tpu_fc._tf import tf
from tpu_fc.estimator import model_fn
from tpu_fc.estimator.head import base_head
from tpu_fc.estimator.model_fn import ModeKeys


class MultiHead(base_head.Head):
  """A head of several named heads, for multi-objective learning.

  The loss is the (`head_weights`-weighted) sum of the heads' losses;
  metrics are every head's (keys suffixed `/<head name>`) plus `loss/<head
  name>`; predictions are keyed `(head name, prediction key)`.  Logits are a
  dict by head name, or one tensor split along its last dimension among the
  heads in order; labels a dict by head name.  Export outputs: the first
  head's default output by default, each head's outputs as `<head name>`
  (its default) and `<head name>/<key>`, and `predict` with every head's
  predictions as `<head name>/<key>`.

  Args:
    heads: the heads (list or tuple), each with a name; the first one is
      served by default.
    head_weights: one weight per head for the loss; None: all 1.
  """

  def __init__(self, heads, head_weights=None):
    if not heads:
      raise ValueError('Must specify heads. Given: {}'.format(heads))
    if head_weights and len(head_weights) != len(heads):
      raise ValueError(
          'heads and head_weights must have the same size. '
          'Given len(heads): {}. Given len(head_weights): {}.'.format(
              len(heads), len(head_weights)))
    for head in heads:
      if head.name is None:
        raise ValueError(
            'All given heads must have name specified. Given: {}'.format(head))
    self._heads = tuple(heads)
    self._head_weights = tuple(head_weights) if head_weights else ()
    self._logits_dimension = sum(head.logits_dimension for head in heads)

  @property
  def name(self):
    return '_'.join(head.name for head in self._heads)

  @property
  def logits_dimension(self):
    return self._logits_dimension

  @property
  def loss_reduction(self):
    """The heads' one loss reduction (ValueError where they differ)."""
    loss_reductions = [head.loss_reduction for head in self._heads]
    if len(set(loss_reductions)) > 1:
      raise ValueError(
          'The loss_reduction must be the same for different heads. '
          'Given: {}'.format(loss_reductions))
    return loss_reductions[0]

  def _split_logits(self, logits):
    """Head name -> its slice of the last dimension of `logits`."""
    with tf.compat.v1.name_scope('split_logits', values=[logits]):
      logits = tf.convert_to_tensor(logits)
      logits_dimensions = [head.logits_dimension for head in self._heads]
      shape = logits.shape.as_list()
      if shape[-1] is not None and shape[-1] != self._logits_dimension:
        raise ValueError(
            'Could not split logits of shape %r among the heads with '
            'individual logits dimensions: %r. The last dimension of the '
            'logits tensor should equal %d but is %d.' %
            (shape, logits_dimensions, shape[-1], self._logits_dimension))
      batch_rank = len(shape) - 1
      logits_dict = {}
      begin = 0
      for head in self._heads:
        logits_dict[head.name] = tf.slice(
            logits, begin=[0] * batch_rank + [begin],
            size=[-1] * batch_rank + [head.logits_dimension])
        begin += head.logits_dimension
      return logits_dict

  def _check_logits_and_labels(self, logits, labels=None):
    """Logits by head name; checks every head has logits (and labels)."""
    if isinstance(logits, dict):
      self._check_every_head_in(logits, 'logits')
      logits_dict = logits
    else:
      logits_dict = self._split_logits(logits)
    if labels is not None:
      if not isinstance(labels, dict):
        raise ValueError('labels must be a dict. Given: {}'.format(labels))
      self._check_every_head_in(labels, 'labels')
    return logits_dict

  def _check_every_head_in(self, values, what):
    missing = list({head.name for head in self._heads} - set(values))
    if missing:
      raise ValueError(
          '{} has missing values for head(s): {}'.format(what, missing))

  def loss(self, labels, logits, features=None, mode=None,
           regularization_losses=None):
    """The weighted sum of the heads' losses, plus `regularization_losses`."""
    logits_dict = self._check_logits_and_labels(logits, labels)
    training_losses = tuple(
        head.loss(logits=logits_dict[head.name], labels=labels[head.name],
                  features=features, mode=mode) for head in self._heads)
    with tf.compat.v1.name_scope('merge_losses',
                                 values=training_losses + self._head_weights):
      if self._head_weights:
        training_losses = [tf.math.multiply(loss, weight) for loss, weight in
                           zip(training_losses, self._head_weights)]
      return base_head.plus_regularization(tf.math.add_n(training_losses),
                                           regularization_losses)

  def predictions(self, logits, keys=None):
    """Every head's predictions, keyed `(head name, key)`; `keys` unused."""
    logits_dict = self._check_logits_and_labels(logits)
    predictions = {}
    with tf.compat.v1.name_scope('merge_pred'):
      for head in self._heads:
        for key, value in head.predictions(
            logits=logits_dict[head.name]).items():
          predictions[(head.name, key)] = value
    return predictions

  def metrics(self, regularization_losses=None):
    """New `loss/<head name>` means (and the regularization loss's); the
    heads' own metrics are made by `update_metrics`."""
    eval_metrics = self._regularization_metric(regularization_losses)
    with tf.compat.v1.name_scope('merge_eval'):
      for key in self._loss_keys():
        eval_metrics[key] = tf.keras.metrics.Mean(name=key)
    return eval_metrics

  def _loss_keys(self):
    return ['{}/{}'.format(base_head.MetricKeys.LOSS, head.name)
            for head in self._heads]

  def update_metrics(self, eval_metrics, features, logits, labels,
                     regularization_losses=None):
    """`eval_metrics` updated, with every head's metrics made and updated."""
    logits_dict = self._check_logits_and_labels(logits, labels)
    self._update_regularization_metric(eval_metrics, regularization_losses)
    for head, loss_key in zip(self._heads, self._loss_keys()):
      head_logits, head_labels = logits_dict[head.name], labels[head.name]
      eval_metrics[loss_key].update_state(values=head.loss(
          logits=head_logits, labels=head_labels, features=features))
      eval_metrics.update(head.update_metrics(
          head.metrics(), features, head_logits, head_labels) or {})
    return eval_metrics

  def create_estimator_spec(self, features, mode, logits, labels=None,
                            optimizer=None, trainable_variables=None,
                            train_op_fn=None, update_ops=None,
                            regularization_losses=None):
    """The `EstimatorSpec` of `mode` (arguments as `Head`'s; `logits` and
    `labels` as the class doc says; `regularization_losses` regularize the
    merged loss).  Each head's own spec is built too (its train op a no-op):
    its export outputs, summaries and TRAIN metrics are the merged spec's."""
    with tf.compat.v1.name_scope(self.name, 'multi_head'):
      logits_dict = self._check_logits_and_labels(logits, labels)
      head_specs = [
          head.create_estimator_spec(
              features=features, mode=mode, logits=logits_dict[head.name],
              labels=labels[head.name] if labels else None,
              train_op_fn=lambda unused_loss: tf.no_op())
          for head in self._heads]
      predictions = self.predictions(logits)
      if mode == ModeKeys.PREDICT:
        return model_fn.EstimatorSpec(
            mode=ModeKeys.PREDICT, predictions=predictions,
            export_outputs=self._merged_export_outputs(head_specs))
      loss = self.loss(labels, logits, features, mode, regularization_losses)
      if mode == ModeKeys.EVAL:
        return model_fn.EstimatorSpec(
            mode=ModeKeys.EVAL, predictions=predictions, loss=loss,
            eval_metric_ops=self.update_metrics(
                self.metrics(regularization_losses=regularization_losses),
                features, logits, labels,
                regularization_losses=regularization_losses))
      if mode == ModeKeys.TRAIN:
        train_op = base_head.create_train_op(
            optimizer, trainable_variables, train_op_fn, update_ops, loss,
            self.loss_reduction)
        base_head.create_loss_summaries(loss, regularization_losses,
                                        lambda key: key)
        eval_metric_ops = {}
        for spec in head_specs:
          eval_metric_ops.update(spec.eval_metric_ops or {})
        return model_fn.EstimatorSpec(
            mode=ModeKeys.TRAIN, loss=loss, train_op=train_op,
            predictions=predictions, eval_metric_ops=eval_metric_ops)
      raise ValueError('mode={} unrecognized'.format(mode))

  def _merged_export_outputs(self, head_specs):
    """PREDICT's export outputs of the heads' specs (see the class doc)."""
    first_outputs = head_specs[0].export_outputs
    if len(first_outputs) == 1:
      default_output = next(iter(first_outputs.values()))
    elif base_head.DEFAULT_SERVING_KEY in first_outputs:
      default_output = first_outputs[base_head.DEFAULT_SERVING_KEY]
    else:
      raise ValueError(
          '{} did not specify default export_outputs. Given: {} Suggested '
          'fix: Use one of the heads in tf.estimator, or include key {} in '
          'export_outputs.'.format(self._heads[0].name, first_outputs,
                                   base_head.DEFAULT_SERVING_KEY))
    export_outputs = {base_head.DEFAULT_SERVING_KEY: default_output}
    merged_predictions = {}
    for head, spec in zip(self._heads, head_specs):
      for key, output in spec.export_outputs.items():
        export_outputs[head.name if key == base_head.DEFAULT_SERVING_KEY else
                       '{}/{}'.format(head.name, key)] = output
        if (key == base_head.PREDICT_SERVING_KEY and
            isinstance(output, export_lib.PredictOutput)):
          for name, tensor in output.outputs.items():
            merged_predictions['{}/{}'.format(head.name, name)] = tensor
    export_outputs[base_head.PREDICT_SERVING_KEY] = export_lib.PredictOutput(
        merged_predictions)
    return export_outputs
