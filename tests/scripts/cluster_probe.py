"""A cluster task that only starts its TF server, for tests/test_cluster.py.

`cluster_probe.py OUT_DIR`: each task starts the server of its TF_CONFIG task,
writes `OUT_DIR/<job>-<index>.json` (its pid, its port, whether it reaches its
own server on 127.0.0.1); a ps task then serves, the chief waits for
`OUT_DIR/release` and exits.
"""
import json
import os
import socket
import sys
import time

import tensorflow as tf


def main(out_dir):
  config = json.loads(os.environ['TF_CONFIG'])
  job, index = config['task']['type'], config['task']['index']
  server = tf.distribute.Server(tf.train.ClusterSpec(config['cluster']),
                                job_name=job, task_index=index, start=True)
  port = int(config['cluster'][job][index].rsplit(':', 1)[1])
  with socket.create_connection(('127.0.0.1', port), timeout=10):
    pass
  path = os.path.join(out_dir, '{}-{}.json'.format(job, index))
  with open(path + '.tmp', 'w') as f:
    json.dump({'pid': os.getpid(), 'port': port}, f)
  os.rename(path + '.tmp', path)
  if job == 'ps':
    server.join()
  while not os.path.exists(os.path.join(out_dir, 'release')):
    time.sleep(0.1)


if __name__ == '__main__':
  main(sys.argv[1])
