"""Step 4: the model as a TF2 program on the mid-level API, without TPUEstimator.

The migrated model as it runs on a TPU, run here on the CPU
(`migration_guide/step4_tf2_training_loop.md` shows what changes on a TPU):
`tf.tpu.experimental.embedding.TPUEmbedding` holds the tables and their Adagrad
slots, `DenseModel` the layers the model_fn built after `DenseFeatures`.  Both
are restored from the checkpoint converted in step 3 (`embedding` and the
`dense` dict, keyed by legacy variable names), trained for `--train_steps`
steps on the training data of step 1 (enqueue, dequeue, `tf.GradientTape`,
`apply_gradients`: the tables with the configs' Adagrad, the dense layers with
plain SGD, as the legacy model_fn and spec did) and saved in the same layout
(`--save_dir`), which `python -m tpu_fc convert-checkpoint --to legacy` turns
back into a TPUEstimator checkpoint.

    python step4_tf2_loop.py --checkpoint MID_LEVEL_DIR --train_steps 10 \
        --save_dir TF2_DIR
"""
import argparse

import numpy as np

import tpu_fc  # before tensorflow: selects tf-keras on TF >= 2.16
import tensorflow as tf

import step1_train
import step2_mid_level_config

# Outside a TPUStrategy, tf.tpu.experimental.embedding.TPUEmbedding is now
# tpu_fc's: TF's class with the TPU's lookup and update rules, trained on the
# CPU (`python -m tpu_fc run` does the same).  On a TPU, drop this line and
# create the objects under `TPUStrategy.scope()`.
tpu_fc.install()

HIDDEN_UNITS = 8
DENSE_LEARNING_RATE = 0.1  # the model_fn's GradientDescentOptimizer
# DenseFeatures concatenates its columns sorted by column name: item_shared_embedding,
# query_shared_embedding, tag_weighted_by_tag_weight_embedding, user_embedding.
FEATURE_ORDER = ('item', 'query', 'tag', 'user')
WEIGHT_KEYS = {'tag': 'tag_weight'}


class DenseModel(tf.Module):
  """The model_fn's layers after DenseFeatures: Dense(8, relu) -> Dense(1)."""

  def __init__(self, feature_config):
    super().__init__()
    width = sum(feature_config[name].table.dim for name in FEATURE_ORDER)
    self.hidden_kernel = tf.Variable(tf.zeros([width, HIDDEN_UNITS]))
    self.hidden_bias = tf.Variable(tf.zeros([HIDDEN_UNITS]))
    self.logits_kernel = tf.Variable(tf.zeros([HIDDEN_UNITS, 1]))
    self.logits_bias = tf.Variable(tf.zeros([1]))

  def legacy_variables(self):
    """The variables by their TPUEstimator checkpoint names (the `dense` dict)."""
    return {'hidden/kernel': self.hidden_kernel, 'hidden/bias': self.hidden_bias,
            'logits/kernel': self.logits_kernel, 'logits/bias': self.logits_bias}

  def logits(self, activations):
    net = tf.concat([activations[name] for name in FEATURE_ORDER], axis=1)
    net = tf.nn.relu(tf.matmul(net, self.hidden_kernel) + self.hidden_bias)
    return tf.matmul(net, self.logits_kernel) + self.logits_bias

  def __call__(self, activations, features=None):
    """The model_fn's predictions (the signature `export_mid_level_saved_model` serves)."""
    return {'probability': tf.sigmoid(self.logits(activations))}


class MigratedModel:
  """Embedding (tables + Adagrad slots) and dense model, restored from a checkpoint."""

  def __init__(self, checkpoint):
    self.feature_config, optimizer = step2_mid_level_config.mid_level_configs()
    self.embedding = tf.tpu.experimental.embedding.TPUEmbedding(
        self.feature_config, optimizer)
    self.dense = DenseModel(self.feature_config)
    self.global_step = tf.Variable(0, dtype=tf.int64)
    self.checkpoint = tf.train.Checkpoint(
        embedding=self.embedding, dense=self.dense.legacy_variables(),
        global_step=self.global_step,
        # carried along so `convert-checkpoint --to legacy` restores the names
        legacy_table_names=tf.Variable(''))
    restore = self.checkpoint.read(
        tf.train.latest_checkpoint(checkpoint) or checkpoint)
    # Builds the tables and slots, which restore from the checkpoint read above
    # (deferred restoration, as TF's class); only then can all be asserted.
    self.tables = self.embedding.embedding_tables  # {TableConfig: variable}
    restore.assert_existing_objects_matched()

  def enqueue(self, features, training):
    """Sends the ids (and the tag weights beside them) to the embedding."""
    self.embedding.enqueue(
        {name: features[name] for name in self.feature_config},
        {name: features[WEIGHT_KEYS[name]] if name in WEIGHT_KEYS else None
         for name in self.feature_config},
        training=training)

  def predict(self, features):
    self.enqueue(features, training=False)
    return self.dense(self.embedding.dequeue())['probability']

  @tf.function
  def train_step(self, features, labels):
    self.enqueue(features, training=True)
    with tf.GradientTape() as tape:
      activations = self.embedding.dequeue()
      tape.watch(activations)  # the tables are not on the tape, as on a TPU
      logits = self.dense.logits(activations)
      loss = tf.reduce_mean(
          tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits))
    dense_gradients, activation_gradients = tape.gradient(
        loss, (self.dense.trainable_variables, activations))
    for variable, gradient in zip(self.dense.trainable_variables,
                                  dense_gradients):
      variable.assign_sub(DENSE_LEARNING_RATE * gradient)
    self.embedding.apply_gradients(activation_gradients)  # the configs' Adagrad
    self.global_step.assign_add(1)
    return loss


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--checkpoint', required=True,
                      help='mid-level checkpoint (directory or prefix), step 3')
  parser.add_argument('--train_steps', type=int, default=0,
                      help='steps to train (0: only predict)')
  parser.add_argument('--save_dir', help='where to save the trained model')
  args = parser.parse_args(argv)
  model = MigratedModel(args.checkpoint)
  batches = step1_train.train_input_fn({'batch_size': step1_train.TRAIN_BATCH})
  for features, labels in batches.take(args.train_steps):
    loss = model.train_step(features, labels)
    print('step {}  loss {:.4f}'.format(int(model.global_step), float(loss)))
  if args.save_dir:
    print('saved', tf.train.CheckpointManager(
        model.checkpoint, args.save_dir, max_to_keep=None).save(
            checkpoint_number=model.global_step))
  predictions = model.predict(
      step1_train.to_sparse_features(step1_train.PREDICT_DATA[0]))[:, 0].numpy()
  print('click probabilities:', np.round(predictions, 4))
  return predictions


if __name__ == '__main__':
  main()
