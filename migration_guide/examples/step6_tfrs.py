"""Step 6: the model as a Keras model on tensorflow-recommenders' TPUEmbedding layer.

The route of TF's own migration guide (`tfrs.layers.embedding.TPUEmbedding`,
`model.fit`), run here on the CPU (`migration_guide/step6_tfrs.md`): after
`tpu_fc.install()`, TFRS's layer trains its tables by its embedding optimizer
(the step-2 configs' Adagrad) with the TPU's rule, whatever optimizer the Keras
model compiles with (here the model_fn's SGD for the dense layers).  The tables
and their Adagrad slots come straight from the legacy model_dir
(`tpu_fc.tfrs.restore`, by table name), the dense layers by their legacy names;
`--train_steps` steps of `model.fit` on the training data of step 1 continue
training as the estimator would, and `--save_dir` gets the tables and slots in
the mid-level layout (`tpu_fc.tfrs.save`), which `python -m tpu_fc
convert-checkpoint --to legacy` turns back into a TPUEstimator checkpoint.

    python step6_tfrs.py --model_dir LEGACY_MODEL_DIR --train_steps 5 \
        --save_dir TFRS_DIR
"""
import argparse

import numpy as np

import tpu_fc  # before tensorflow: selects tf-keras on TF >= 2.16
import tensorflow as tf
import tensorflow_recommenders as tfrs

import step1_train
import step2_mid_level_config
# The model_fn's layers and SGD rate, DenseFeatures' order, the weighted feature.
from step4_tf2_loop import (DENSE_LEARNING_RATE, FEATURE_ORDER, HIDDEN_UNITS,
                            WEIGHT_KEYS)

# Outside a TPUStrategy, tfrs.layers.embedding.TPUEmbedding is now tpu_fc's:
# TFRS's layer, trained on the CPU by its embedding optimizer's TPU rule (under
# a TPUStrategy it stays TFRS's own).
tpu_fc.install()


class RankingModel(tf.keras.Model):
  """The model_fn as a Keras model: TFRS's TPUEmbedding (tables, Adagrad
  slots), Dense(8, relu), Dense(1) on the activations in DenseFeatures' order;
  its `call` returns the logits."""

  def __init__(self):
    super().__init__()
    feature_config, optimizer = step2_mid_level_config.mid_level_configs()
    self.features = sorted(feature_config)
    self.embedding = tfrs.layers.embedding.TPUEmbedding(feature_config,
                                                        optimizer)
    self.hidden = tf.keras.layers.Dense(HIDDEN_UNITS, activation=tf.nn.relu,
                                        name='hidden')
    self.logits = tf.keras.layers.Dense(1, name='logits')

  def call(self, features):
    activations = self.embedding(
        {name: features[name] for name in self.features},
        {name: features[WEIGHT_KEYS[name]] if name in WEIGHT_KEYS else None
         for name in self.features})
    net = tf.concat([activations[name] for name in FEATURE_ORDER], axis=1)
    return self.logits(self.hidden(net))


def predict_features():
  return step1_train.to_sparse_features(step1_train.PREDICT_DATA[0])


def restored_model(model_dir):
  """(model, global step): the tables and slots by table name, the dense
  layers by their legacy names, from the legacy model_dir."""
  model = RankingModel()
  model(predict_features())  # creates the variables (a lookup, no update)
  global_step = tpu_fc.tfrs.restore(model.embedding, model_dir)
  reader = tf.train.load_checkpoint(model_dir)
  for layer in (model.hidden, model.logits):
    layer.kernel.assign(reader.get_tensor(layer.name + '/kernel'))
    layer.bias.assign(reader.get_tensor(layer.name + '/bias'))
  return model, global_step


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model_dir', required=True,
                      help='the legacy model_dir (or a checkpoint prefix)')
  parser.add_argument('--train_steps', type=int, default=0,
                      help='steps to train (0: only predict)')
  parser.add_argument('--save_dir', help='where to save the tables and slots')
  args = parser.parse_args(argv)
  model, global_step = restored_model(args.model_dir)
  print('restored global step', global_step)
  if args.train_steps:
    compile_model(model)
    global_step = fit(model, global_step, args.train_steps)
  return save_and_predict(model, global_step, args.save_dir)


def compile_model(model):
  """The model_fn's SGD for the dense layers, its loss."""
  model.compile(optimizer=tf.keras.optimizers.SGD(DENSE_LEARNING_RATE),
                loss=tf.keras.losses.BinaryCrossentropy(from_logits=True))


def fit(model, global_step, steps):
  """`steps` of `model.fit` on step 1's training batches; the global step
  after them."""
  batches = step1_train.train_input_fn({'batch_size': step1_train.TRAIN_BATCH})
  model.fit(batches, epochs=1, steps_per_epoch=steps, verbose=0)
  return global_step + steps


def save_and_predict(model, global_step, save_dir):
  """Saves the tables and slots into `save_dir` (if any); the click
  probabilities of the prediction examples."""
  if save_dir:
    print('saved', tpu_fc.tfrs.save(model.embedding, save_dir, global_step))
  predictions = tf.sigmoid(model(predict_features()))[:, 0].numpy()
  print('click probabilities:', np.round(predictions, 4))
  return predictions


if __name__ == '__main__':
  main()
