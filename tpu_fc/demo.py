"""`python -m tpu_fc demo`: a legacy-style ranking model on synthetic click data.

The model_fn is written the way TPUEstimator users wrote them: TPU embedding columns
(shared, weighted, sequence, tensor-core), `DenseFeatures`, a small MLP,
`CrossShardOptimizer`, a `TPUEstimatorSpec` with `eval_metrics`.  The demo prints
what the spec becomes in mid-level API terms, trains the model with `use_tpu=True`
(emulated on this host: tables trained by the spec's Adagrad with the TPU update
rule), evaluates it before and after, exports a SavedModel (CPU lookup) and serves
held-out tf.Examples from it with plain TensorFlow, as a client would.
"""
import itertools
import os
import tempfile
import time

import numpy as np

import tpu_fc
from tpu_fc._tf import tf

fc = tf.feature_column

USERS, ITEMS, TAGS = 200, 100, 30
HISTORY, TAGS_PER_EXAMPLE, DENSE = 5, 3, 4
BATCH = 64


def feature_columns():
  """The demo's columns: every kind a legacy model typically mixes."""
  item, query_item = tpu_fc.shared_embedding_columns(
      [fc.categorical_column_with_identity('item', ITEMS),
       fc.categorical_column_with_identity('query_item', ITEMS)], 8)
  user = tpu_fc.embedding_column(
      fc.categorical_column_with_identity('user', USERS), 8)
  tags = tpu_fc.embedding_column(
      fc.weighted_categorical_column(
          fc.categorical_column_with_identity('tags', TAGS), 'tags_weight'),
      4, combiner='sqrtn')
  country = tpu_fc.embedding_column(
      fc.categorical_column_with_identity('country', 20), 4,
      embedding_lookup_device='tpu_tensor_core', tensor_core_shape=[None, 1])
  history = tpu_fc.embedding_column(
      fc.sequence_categorical_column_with_identity('history', ITEMS), 8,
      max_sequence_length=HISTORY)
  return [user, item, query_item, tags, country], [history]


def synthetic_data(num_examples, seed):
  """Click data with a hidden rule, so the model has something to learn."""
  rng = np.random.RandomState(seed)
  user = rng.randint(0, USERS, size=(num_examples, 1))
  item = rng.randint(0, ITEMS, size=(num_examples, 1))
  query_item = rng.randint(0, ITEMS, size=(num_examples, 1))
  tags = rng.randint(0, TAGS, size=(num_examples, TAGS_PER_EXAMPLE))
  tags_weight = rng.uniform(0.1, 1.0, size=tags.shape).astype(np.float32)
  country = rng.randint(0, 20, size=(num_examples, 1))
  history = rng.randint(0, ITEMS, size=(num_examples, HISTORY))
  lengths = rng.randint(1, HISTORY + 1, size=(num_examples, 1))
  history[np.arange(HISTORY)[None, :] >= lengths] = -1  # variable-length rows
  dense = rng.normal(size=(num_examples, DENSE)).astype(np.float32)
  item_quality = np.random.RandomState(0).normal(size=ITEMS) * 1.5
  user_taste = np.random.RandomState(1).normal(size=USERS)
  score = (item_quality[item[:, 0]] + user_taste[user[:, 0]] +
           0.5 * dense[:, 0] + 0.5 * (tags[:, 0] % 3 == 0) - 0.5)
  clicks = (rng.uniform(size=num_examples) < 1 / (1 + np.exp(-score)))
  features = dict(user=user, item=item, query_item=query_item, tags=tags,
                  tags_weight=tags_weight, country=country, history=history,
                  dense=dense)
  return features, clicks.astype(np.float32)[:, None]


def _to_sparse(features):
  """Id features as SparseTensors, as TPU embedding inputs expect (-1 = padding)."""
  out = dict(features)
  for key in ('user', 'item', 'query_item', 'tags', 'country', 'history'):
    out[key] = tf.RaggedTensor.from_tensor(features[key], padding=-1).to_sparse()
  out['tags_weight'] = tf.sparse.from_dense(features['tags_weight'])
  return out


def make_input_fn(features, labels, repeat):
  def input_fn(params):
    dataset = tf.data.Dataset.from_tensor_slices((features, labels))
    if repeat:
      dataset = dataset.shuffle(1024, seed=0).repeat()
    dataset = dataset.batch(params['batch_size'], drop_remainder=True)
    return dataset.map(lambda f, l: (_to_sparse(f), l))
  return input_fn


def model_fn(features, labels, mode, params):
  """A legacy TPUEstimator model_fn, unchanged from what ran on TPUs."""
  columns, sequence_columns = feature_columns()
  embedded = tf.keras.layers.DenseFeatures(columns)(features)
  history, lengths = tf.keras.experimental.SequenceFeatures(sequence_columns)(
      features)
  mask = tf.sequence_mask(lengths, tf.shape(history)[1], dtype=tf.float32)
  history = tf.reduce_sum(history * mask[:, :, None], 1) / tf.maximum(
      tf.reduce_sum(mask, 1, keepdims=True), 1.0)
  net = tf.concat([embedded, history, features['dense']], axis=1)
  for units in (32, 16):
    net = tf.keras.layers.Dense(units, activation=tf.nn.relu)(net)
  logits = tf.keras.layers.Dense(1)(net)
  probabilities = tf.sigmoid(logits)
  if mode == tpu_fc.ModeKeys.PREDICT:
    return tpu_fc.TPUEstimatorSpec(
        mode, predictions={'probability': probabilities})
  loss = tf.compat.v1.losses.sigmoid_cross_entropy(labels, logits)
  optimizer = tf.compat.v1.train.AdagradOptimizer(0.1)
  if params['use_tpu']:
    optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
  train_op = optimizer.minimize(
      loss, global_step=tf.compat.v1.train.get_global_step())

  def metric_fn(labels, probabilities):
    return {
        'auc': tf.compat.v1.metrics.auc(labels, probabilities),
        'accuracy': tf.compat.v1.metrics.accuracy(
            labels, tf.cast(probabilities > 0.5, tf.float32)),
    }
  return tpu_fc.TPUEstimatorSpec(
      mode, loss=loss, train_op=train_op,
      eval_metrics=(metric_fn, [labels, probabilities]))


class _ProgressHook(tf.compat.v1.train.SessionRunHook):
  """Prints the training loss every `every` steps.

  Like Estimator, the driver adds the spec's loss to the LOSSES collection last.
  The step is read after each run: on the emulated TPU one run is a loop of
  iterations_per_loop steps.
  """

  def __init__(self, every):
    self._every = every
    self._printed = None

  def begin(self):
    self._global_step = tf.compat.v1.train.get_global_step()

  def before_run(self, run_context):
    return tf.compat.v1.train.SessionRunArgs(
        tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.LOSSES)[-1])

  def after_run(self, run_context, run_values):
    step = run_context.session.run(self._global_step)
    if self._printed is None or step // self._every > self._printed:
      self._printed = step // self._every
      print('  step {:>5}  loss {:.4f}'.format(step, run_values.results))


def build_estimator(model_dir, use_tpu=True):
  columns, sequence_columns = feature_columns()
  spec = tpu_fc.EmbeddingConfigSpec(
      feature_columns=columns + sequence_columns,
      optimization_parameters=tpu_fc.AdagradParameters(0.1))
  config = tpu_fc.RunConfig(
      model_dir=model_dir, tf_random_seed=0, save_checkpoints_steps=100,
      log_step_count_steps=50,
      tpu_config=tpu_fc.TPUConfig(iterations_per_loop=10, num_shards=2))
  return tpu_fc.TPUEstimator(
      model_fn=model_fn, config=config, use_tpu=use_tpu,
      train_batch_size=BATCH, eval_batch_size=BATCH, predict_batch_size=BATCH,
      embedding_config_spec=spec), spec


def serving_feature_spec():
  """What the exported model parses from a serialized tf.Example."""
  columns, sequence_columns = feature_columns()
  spec = fc.make_parse_example_spec(columns + sequence_columns)
  spec['dense'] = tf.io.FixedLenFeature([DENSE], tf.float32)
  return spec


def serialized_examples(features, rows):
  """`rows` of `features` as serialized tf.Examples (-1 padding ids dropped)."""
  examples = []
  for row in rows:
    example = tf.train.Example()
    for key, values in features.items():
      values = values[row]
      if values.dtype.kind == 'f':
        example.features.feature[key].float_list.value.extend(values)
      else:
        example.features.feature[key].int64_list.value.extend(
            values[values >= 0])
    examples.append(example.SerializeToString())
  return examples


def main(model_dir=None, steps=300):
  """Runs the demo in `model_dir`, or in a temporary dir removed at the end.

  TF's logger shows errors only meanwhile (its deprecation chatter hides the
  demo); its level is the caller's again afterwards.
  """
  logger = tf.get_logger()
  level = logger.level
  logger.setLevel('ERROR')
  try:
    if model_dir:
      _run(model_dir, steps, temporary=False)
    else:
      with tempfile.TemporaryDirectory(prefix='tpu_fc_demo_') as temporary_dir:
        _run(temporary_dir, steps, temporary=True)
  finally:
    logger.setLevel(level)


def _print_metrics(when, metrics):
  """One line; the step tells a resumed --model_dir run's 'before' apart."""
  print('{:<27} eval loss {:.4f}  AUC {:.3f}  accuracy {:.3f}'.format(
      '{} (step {}):'.format(when, metrics['global_step']), metrics['loss'],
      metrics['auc'], metrics['accuracy']))


def _run(model_dir, steps, temporary):
  """Trains `steps` more steps in `model_dir`, exports and serves."""
  estimator, spec = build_estimator(model_dir)
  print('tpu_fc demo, TensorFlow {}: the TPU embedding engine emulated on 2 '
        'shards (use_tpu=True, no TPU).'.format(tf.__version__))
  print('model_dir: {}'.format(
      'a temporary dir, removed at the end (--model_dir keeps it)'
      if temporary else model_dir))
  print('Embedding tables (mid-level TableConfigs from spec.to_mid_level()):')
  for table in spec.to_mid_level().tables:
    print('  {:<38} {:>5} x {:<3} combiner={:<6} optimizer={}'.format(
        table.name, table.vocabulary_size, table.dim, table.combiner,
        type(table.optimizer).__name__))
  train_features, train_labels = synthetic_data(BATCH * 200, seed=1)
  eval_batches = 16  # TPUEstimator's evaluate() on a TPU needs its steps
  eval_features, eval_labels = synthetic_data(BATCH * eval_batches, seed=2)
  eval_input_fn = make_input_fn(eval_features, eval_labels, False)

  _print_metrics('Before training',
                 estimator.evaluate(eval_input_fn, steps=eval_batches))
  start = time.time()
  estimator.train(make_input_fn(train_features, train_labels, True),
                  steps=steps, hooks=[_ProgressHook(every=100)])
  seconds = time.time() - start
  print('Trained {} steps of {} examples in {:.1f}s: {:.0f} examples/s (graph '
        'building and checkpoints included)'.format(
            steps, BATCH, seconds, BATCH * steps / seconds))
  _print_metrics('After training',
                 estimator.evaluate(eval_input_fn, steps=eval_batches))

  export_dir = estimator.export_saved_model(
      os.path.join(model_dir, 'export'),
      tpu_fc.export.build_parsing_serving_input_receiver_fn(
          serving_feature_spec())).decode()
  print('Exported a SavedModel (CPU lookup){}'.format(
      ' into the temporary dir' if temporary else ': ' + export_dir))
  _serve(estimator, export_dir, eval_input_fn, eval_features,
         eval_labels[:, 0])


def _serve(estimator, export_dir, input_fn, features, labels):
  """Serves held-out rows of both labels as a client would, with plain TF,
  and prints how far that is from estimator.predict."""
  rows = np.concatenate([np.flatnonzero(labels == label)[:3]
                         for label in (0, 1)])
  signature = tf.saved_model.load(export_dir).signatures['serving_default']
  served = signature(examples=tf.constant(
      serialized_examples(features, rows)))['probability'].numpy()[:, 0]
  # predict() reads its input only as far as the last sampled row.
  predictions = itertools.islice(estimator.predict(input_fn), rows.max() + 1)
  predicted = np.array([p['probability'][0] for p in predictions])[rows]
  print("Served with tf.saved_model.load(...).signatures['serving_default'] "
        'from held-out tf.Examples:')
  print('  label  click probability')
  for label, probability in zip(labels[rows], served):
    print('  {:>5}  {:.3f}'.format(int(label), probability))
  print('Same as estimator.predict: max difference {:.1g}'.format(
      np.max(np.abs(served - predicted))))
