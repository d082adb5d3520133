"""Step 7: the model on keras-rs (Keras 3), trained on the CPU as on a TPU.

The legacy model as a Keras 3 model around keras-rs's `DistributedEmbedding`
(`migration_guide/step7_keras_rs.md`), tpu_fc's drop-in for it, which trains
the tables on the CPU by their optimizer with the TPU's rules: its configs are
`spec.to_keras_rs()`, its tables and Adagrad accumulators are restored by name
from the legacy model_dir of step 0 (`tpu_fc.keras_rs.restore`), its dense
layers from the same checkpoint; `model.fit` trains `--train_steps` steps on
the training data of step 1 (the tables by the spec's Adagrad, the dense layers
by SGD(0.1), as the model_fn did), and `--save_dir` gets the tables in the
mid-level layout (`tpu_fc.keras_rs.save`), which `python -m tpu_fc
convert-checkpoint --to legacy` turns back into a TPUEstimator checkpoint, and
the dense layers (`dense.weights.h5`).  Needs keras-rs (Python >= 3.11).

    python step7_keras_rs.py --model_dir MODEL_DIR --train_steps 5 \
        --save_dir KERAS_RS_DIR
"""
import argparse
import os

import numpy as np

import tpu_fc  # before tensorflow: selects tf-keras on TF >= 2.16
import tensorflow as tf
import keras  # Keras 3, whatever tf.keras is
import tpu_fc.keras_rs

import step1_train

HIDDEN_UNITS = 8
DENSE_LEARNING_RATE = 0.1  # the model_fn's GradientDescentOptimizer
# DenseFeatures concatenates its columns sorted by column name: item_shared_embedding,
# query_shared_embedding, tag_weighted_by_tag_weight_embedding, user_embedding.
FEATURE_ORDER = ('item', 'query', 'tag', 'user')
WEIGHT_KEYS = {'tag': 'tag_weight'}


class RankingModel(keras.Model):
  """The model_fn in Keras: the spec's embeddings, Dense(8, relu), Dense(1)."""

  def __init__(self):
    super().__init__()
    self.embedding = tpu_fc.keras_rs.DistributedEmbedding(
        step1_train.embedding_config_spec().to_keras_rs())
    self.hidden = keras.layers.Dense(HIDDEN_UNITS, activation='relu')
    self.logits = keras.layers.Dense(1)

  def call(self, features):
    activations = self.embedding(
        {name: features[name] for name in FEATURE_ORDER},
        {name: features[WEIGHT_KEYS[name]] if name in WEIGHT_KEYS else None
         for name in FEATURE_ORDER})
    net = keras.ops.concatenate([activations[name] for name in FEATURE_ORDER],
                                axis=1)
    return self.logits(self.hidden(net))

  def legacy_variables(self):
    """The dense layers' variables by their TPUEstimator checkpoint names."""
    return {'hidden/kernel': self.hidden.kernel, 'hidden/bias': self.hidden.bias,
            'logits/kernel': self.logits.kernel, 'logits/bias': self.logits.bias}


def predict(model):
  """Click probabilities of step 1's PREDICT_DATA rows."""
  features = step1_train.to_sparse_features(step1_train.PREDICT_DATA[0])
  return tf.sigmoid(model(features))[:, 0].numpy()


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model_dir', required=True,
                      help='the legacy model_dir (its latest checkpoint)')
  parser.add_argument('--train_steps', type=int, default=0,
                      help='steps to train (0: only predict)')
  parser.add_argument('--save_dir', help='where to save the trained model')
  args = parser.parse_args(argv)
  model = RankingModel()
  predict(model)  # builds it
  global_step = tpu_fc.keras_rs.restore(model.embedding, args.model_dir)
  reader = tf.train.load_checkpoint(args.model_dir)
  for name, variable in model.legacy_variables().items():
    variable.assign(reader.get_tensor(name))
  if args.train_steps:
    model.compile(optimizer=keras.optimizers.SGD(DENSE_LEARNING_RATE),
                  loss=keras.losses.BinaryCrossentropy(from_logits=True))
    history = model.fit(
        step1_train.train_input_fn({'batch_size': step1_train.TRAIN_BATCH}),
        steps_per_epoch=args.train_steps, verbose=0)
    global_step += args.train_steps
    print('step {}  loss {:.4f}'.format(global_step, history.history['loss'][-1]))
  if args.save_dir:
    print('saved', tpu_fc.keras_rs.save(model.embedding, args.save_dir,
                                        global_step))
    model.save_weights(os.path.join(args.save_dir, 'dense.weights.h5'))
  predictions = predict(model)
  print('click probabilities:', np.round(predictions, 4))
  return predictions


if __name__ == '__main__':
  main()
