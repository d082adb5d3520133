"""A step's bad input, reported by what is wrong with it rather than where it failed.

TF reports a failing op of `session.run` as `Graph execution error:`, the Python
stack that defined the op, then the op's own text.  For an id outside a feature
column's table (a gather or segment reduction of its lookup) the driver
re-raises the same error class with a message that starts with the feature, the
column, the id and the range and says what to do, then TF's text and node (no
chained traceback); a layer above may explain its own errors the same way
(`explained(explanation)`).  Other errors pass unchanged.
"""
import contextlib
import re

from tpu_fc._tf import tf

# TF's gather error in a column's lookup (`<column>_weights/embedding_lookup`,
# `.../embedding_lookup_sparse/embedding_lookup` for safe lookups), or its
# segment reduction's (the inference lookup, `columns._inference_lookup`, and
# a training lookup that Grappler's arithmetic rewrite made read the whole
# table: `.../embedding_lookup_sparse`), and the node.
_ID_OUT_OF_RANGE = re.compile(
    r'^(?:indices\[\d+\] = (-?\d+) is not in|'
    r'Bad: indices\[\d+\] == (-?\d+) out of range) \[0, (\d+)\)\n'
    r'\s*\[\[\{\{node (?:[^{}]*/)?([^/{}]+)_weights/'
    r'(?:embedding_lookup_sparse/embedding_lookup|embedding_lookup_sparse|'
    r'embedding_lookup)\}\}\]\]', re.MULTILINE)
_EMBEDDING_COLUMN_NAME = re.compile(
    r'^(.+?)(?:_weighted_by_.+)?_(?:shared_)?embedding$')


@contextlib.contextmanager
def explained(explanation=None):
  """Re-raises an input error of the steps run inside with the message above,
  or with `explanation(TF's message)` where that is not None."""
  try:
    yield
  except tf.errors.InvalidArgumentError as error:
    message = (explanation or _explanation)(error.message)
    if message is None:
      raise
    # Without the op, whose definition stack str(error) would list after it.
    raise type(error)(error.node_def, None, message) from None


def _explanation(message):
  """The message to show for TF's `message`, or None to keep TF's."""
  gather = _ID_OUT_OF_RANGE.search(message)
  if not gather:
    return None
  gathered, reduced, size, column = gather.groups()
  value = gathered or reduced
  # Out-of-range ids come from identity columns, whose name is the feature's.
  name = _EMBEDDING_COLUMN_NAME.match(column)
  if not name:
    return None
  return ('Feature {} (column {}): id {} is out of range [0, {}); use a '
          'num_buckets above the largest id in its identity column (or a '
          'default_value for such ids), or hash or clip the ids in input_fn.'
          '\n{}'.format(name.group(1), column, value, size, gather.group(0)))
