"""One worker of the migration guide's TFRS model under
`MultiWorkerMirroredStrategy` (tests/test_tfrs.py starts two, each with its
TF_CONFIG, on a loopback of their own).

usage: multi_worker_tfrs.py OPTIMIZER STEPS

Trains STEPS steps of `model.fit` on the guide's batch, this worker's replica
taking its share (one example), and prints its table, slots and dense kernel
as one JSON line, with the number of copies of each table variable.
"""
import json
import sys

import tpu_fc

tpu_fc.install()

from tpu_fc._tf import tf  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position

from harness import tfrs as guide  # noqa: E402  pylint: disable=g-import-not-at-top,wrong-import-position


def main(name, steps):
  strategy = tf.distribute.MultiWorkerMirroredStrategy()
  optimizer, args = guide.OPTIMIZER_ARGS[name]
  with strategy.scope():
    model, layer = guide.guide_model(optimizer(**args), batch_size=None)
  options = tf.data.Options()
  options.experimental_distribute.auto_shard_policy = (
      tf.data.experimental.AutoShardPolicy.DATA)
  model.fit(tf.data.Dataset.from_tensors(guide.guide_data()).repeat(
      steps).with_options(options), epochs=1, steps_per_epoch=steps, verbose=0)
  variables = layer._tpu_embedding._variables['table']  # pylint: disable=protected-access
  state = {('table' if key == 'parameters' else key): value.numpy().tolist()
           for key, value in variables.items()}
  state['kernel'] = model.layers[-1].kernel.numpy().tolist()
  state['copies'] = sorted({len(strategy.experimental_local_results(value))
                            for value in variables.values()})
  print(json.dumps(state))


if __name__ == '__main__':
  main(sys.argv[1], int(sys.argv[2]))
