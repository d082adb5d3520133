"""Step 8: scale out: the step-6 model on several devices and machines.

Step 6's Keras model on TFRS's TPUEmbedding, created under a `tf.distribute`
strategy (`migration_guide/step8_scale_out.md`): `MirroredStrategy` over
`--devices` devices of this machine (CPUs made logical devices here, GPUs as
they are), or with `--multi_worker` `MultiWorkerMirroredStrategy` over the
machines `TF_CONFIG` names.  Each replica is a TPU core: it looks up its share
of each global batch in the one copy of each table, and each step applies one
update per table from every replica's gradients (the TPU's rule of the
layer's Adagrad), so `--train_steps` steps of `model.fit` on N replicas end
where step 6 ends on one.  The tables come from the legacy model_dir, as in
step 6; `--save_dir` gets them in the mid-level layout.

    python step8_scale_out.py --model_dir LEGACY_MODEL_DIR --train_steps 5 \\
        --devices 2 --save_dir SCALED_DIR
"""
import argparse

import tpu_fc  # noqa: F401  before tensorflow: selects tf-keras on TF >= 2.16
import tensorflow as tf

import step6_tfrs


def strategy_of(devices, multi_worker):
  """The strategy: several machines from TF_CONFIG, or `devices` of this one
  (GPUs if it has that many, else the CPU split into logical devices)."""
  if multi_worker:
    return tf.distribute.MultiWorkerMirroredStrategy()
  gpus = tf.config.list_physical_devices('GPU')
  if len(gpus) >= devices:
    return tf.distribute.MirroredStrategy(
        ['/gpu:{}'.format(index) for index in range(devices)])
  cpu = tf.config.list_physical_devices('CPU')[0]
  if len(tf.config.get_logical_device_configuration(cpu) or ()) < devices:
    # (before TensorFlow makes its devices: at the program's start)
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * devices)
  return tf.distribute.MirroredStrategy(
      ['/cpu:{}'.format(index) for index in range(devices)])


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.split('\n')[0])
  parser.add_argument('--model_dir', required=True,
                      help='the legacy model_dir (or a checkpoint prefix)')
  parser.add_argument('--train_steps', type=int, default=5)
  parser.add_argument('--devices', type=int, default=2,
                      help='replicas on this machine (MirroredStrategy)')
  parser.add_argument('--multi_worker', action='store_true',
                      help='MultiWorkerMirroredStrategy over TF_CONFIG')
  parser.add_argument('--save_dir', help='where to save the tables and slots')
  args = parser.parse_args(argv)
  strategy = strategy_of(args.devices, args.multi_worker)
  print('replicas (TPU cores):', strategy.num_replicas_in_sync)
  with strategy.scope():
    model, global_step = step6_tfrs.restored_model(args.model_dir)
    step6_tfrs.compile_model(model)
  # Step 6's global batches; each replica gets its share of each.
  global_step = step6_tfrs.fit(model, global_step, args.train_steps)
  return step6_tfrs.save_and_predict(model, global_step, args.save_dir)


if __name__ == '__main__':
  main()
