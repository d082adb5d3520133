"""Step 3: convert the trained legacy checkpoint to the mid-level object layout.

    python step3_convert_checkpoint.py MODEL_DIR MID_LEVEL_DIR

does what these commands do (`migration_guide/step3_convert_checkpoint.md`):

    python -m tpu_fc inspect MODEL_DIR
    python -m tpu_fc convert-checkpoint --to mid-level \
        --spec step1_train.py:embedding_config_spec MODEL_DIR MID_LEVEL_DIR
    python -m tpu_fc inspect MID_LEVEL_DIR

The mid-level checkpoint holds `embedding` (the tables and Adagrad accumulators of
a `TPUEmbedding` built from `spec.to_mid_level()`), `dense` (every other variable,
under its legacy name), `global_step` and `legacy_table_names`.
"""
import argparse

import tpu_fc  # noqa: F401  (before tensorflow: selects tf-keras on TF >= 2.16)
from tpu_fc import checkpoint_conversion

import step1_train


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('model_dir', help='the legacy model_dir (its latest '
                      'checkpoint is converted) or a checkpoint prefix')
  parser.add_argument('destination', help='directory for the mid-level checkpoint')
  args = parser.parse_args(argv)
  spec = step1_train.embedding_config_spec()
  print(checkpoint_conversion.format_inspection(
      checkpoint_conversion.inspect_checkpoint(args.model_dir, spec)))
  prefix = checkpoint_conversion.to_mid_level_checkpoint(
      spec, args.model_dir, args.destination)
  print(checkpoint_conversion.format_inspection(
      checkpoint_conversion.inspect_checkpoint(prefix)))
  return prefix


if __name__ == '__main__':
  main()
