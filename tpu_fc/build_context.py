"""Which kind of graph tpu_fc is building, for columns whose lookup depends on it.

The driver enters `building(mode)` around each model_fn call.  Columns pinned to
`embedding_lookup_device='cpu'` may look up on the host only in inference graphs
(evaluation, prediction, export); outside any tpu_fc graph they keep TF's behaviour.
Around the CPU graphs of a `use_tpu=True` model (its prediction and export, an
evaluation with `eval_on_tpu=False`) the driver also enters
`tables_named_as_on_tpu()`: the columns then name their tables as its TPU
training recorded them, so those graphs restore its checkpoints.
"""
import contextlib
import threading

TRAIN = 'train'
EVAL = 'eval'
PREDICT = 'infer'
_MODES = (TRAIN, EVAL, PREDICT)

_state = threading.local()


@contextlib.contextmanager
def _setting(name, value):
  """Sets this thread's `name` to `value` inside the block."""
  previous = getattr(_state, name, None)
  setattr(_state, name, value)
  try:
    yield
  finally:
    setattr(_state, name, previous)


def building(mode):
  """Marks the graph built inside as one for `mode` (a ModeKeys value)."""
  if mode not in _MODES:
    raise ValueError('mode must be one of {}, got {!r}.'.format(_MODES, mode))
  return _setting('mode', mode)


def is_inference():
  """Whether tpu_fc is building an evaluation or prediction graph (None, the
  mode outside tpu_fc, is not)."""
  return getattr(_state, 'mode', None) in (EVAL, PREDICT)


def tables_named_as_on_tpu():
  """Marks the graph built inside as a CPU graph of a model trained on the TPU."""
  return _setting('tpu_table_names', True)


def names_tables_as_on_tpu():
  return bool(getattr(_state, 'tpu_table_names', False))
