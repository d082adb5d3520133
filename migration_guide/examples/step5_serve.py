"""Step 5: serve the trained model, embeddings looked up on the CPU.

Two SavedModels of the same model, both answering `serving_default` with
serialized `tf.Example`s (`examples`) -> `probability`:

* `legacy/<timestamp>`: `TPUEstimator.export_saved_model` of the step-1
  estimator (the PREDICT graph, every embedding looked up on the CPU from the
  trained tables of `--model_dir`);
* `mid_level`: `tpu_fc.serving.export_mid_level_saved_model`, a TF2 object
  SavedModel of `TPUEmbeddingForServing` + the step-4 `DenseModel`, restored from
  the mid-level checkpoint `--checkpoint` (step 3's, or step 4's after training).

`main` loads both with `tf.saved_model.load` and prints their answers for the
prediction rows of step 1.

    python step5_serve.py --model_dir MODEL_DIR --checkpoint MID_LEVEL_DIR \
        --export_dir EXPORT_DIR
"""
import argparse
import os

import numpy as np

import tpu_fc.serving  # tpu_fc before tensorflow: selects tf-keras on TF >= 2.16
import tensorflow as tf

import step1_train
import step4_tf2_loop

ID_KEYS = ('user', 'item', 'query', 'tag')


def serialized_examples(features):
  """One tf.Example per row: the ids without padding, tag weights beside their tags."""
  examples = []
  for row in range(len(features['user'])):
    ids = {key: features[key][row][features[key][row] >= 0] for key in ID_KEYS}
    example = tf.train.Example(features=tf.train.Features(feature=dict(
        {key: tf.train.Feature(int64_list=tf.train.Int64List(value=value))
         for key, value in ids.items()},
        tag_weight=tf.train.Feature(float_list=tf.train.FloatList(
            value=features['tag_weight'][row][features['tag'][row] >= 0])))))
    examples.append(example.SerializeToString())
  return examples


def serve(export_dir, examples):
  """What a server does: load the SavedModel, call its default signature."""
  serving_default = tf.saved_model.load(export_dir).signatures['serving_default']
  return serving_default(examples=tf.constant(examples))['probability'][:, 0].numpy()


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model_dir', required=True, help='legacy model_dir')
  parser.add_argument('--checkpoint', required=True,
                      help='mid-level checkpoint (directory or prefix)')
  parser.add_argument('--export_dir', required=True)
  args = parser.parse_args(argv)
  feature_spec = tf.feature_column.make_parse_example_spec(
      step1_train.feature_columns())

  estimator = step1_train.build_estimator(args.model_dir)
  legacy_dir = estimator.export_saved_model(
      os.path.join(args.export_dir, 'legacy'),
      tpu_fc.export.build_parsing_serving_input_receiver_fn(feature_spec))

  mid_level_dir = os.path.join(args.export_dir, 'mid_level')
  migrated = step4_tf2_loop.MigratedModel(args.checkpoint)
  tpu_fc.serving.export_mid_level_saved_model(
      mid_level_dir, step1_train.embedding_config_spec(), migrated.dense,
      feature_spec, args.checkpoint)

  examples = serialized_examples(step1_train.PREDICT_DATA[0])
  predictions = {'legacy': serve(legacy_dir, examples),
                 'mid_level': serve(mid_level_dir, examples)}
  for name, values in predictions.items():
    print('{:<9} click probabilities: {}'.format(name, np.round(values, 4)))
  return predictions


if __name__ == '__main__':
  main()
