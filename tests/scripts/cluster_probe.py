"""A cluster task that only listens where its TF server would, for
tests/test_cluster.py.

`cluster_probe.py OUT_DIR`: each task listens on its TF_CONFIG task's port on
every interface, as TF's server does (`tf.distribute.Server` binds `[::]` or
`0.0.0.0`), without importing TensorFlow: what the tests check is the
launcher's network and its signals, not TF's server.  It writes
`OUT_DIR/<job>-<index>.json` (its pid, its port) once it reaches its own
port on 127.0.0.1, then serves until the launcher stops it.
"""
import json
import os
import socket
import sys


def main(out_dir):
  config = json.loads(os.environ['TF_CONFIG'])
  job, index = config['task']['type'], config['task']['index']
  port = int(config['cluster'][job][index].rsplit(':', 1)[1])
  server = socket.create_server(('', port))
  with socket.create_connection(('127.0.0.1', port), timeout=10):
    pass
  path = os.path.join(out_dir, '{}-{}.json'.format(job, index))
  with open(path + '.tmp', 'w') as f:
    json.dump({'pid': os.getpid(), 'port': port}, f)
  os.rename(path + '.tmp', path)
  while True:
    server.accept()[0].close()


if __name__ == '__main__':
  main(sys.argv[1])
