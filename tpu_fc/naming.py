"""The legacy names tpu_fc keeps, in one place: what users' checkpoints hold.

Checkpoint compatibility rests on these rules; every module that names, finds
or converts an embedding table asks here.

- A column's table is `tbl_<embedding var name>` in the spec (TF's table name);
  the embedding var name is the categorical column's name, or a shared
  collection's.
- Its variable is `<scope>/<layer>/<column>/embedding_weights` (a shared
  collection's: the collection's name), on the CPU path and, as the columns
  record it while the model_fn runs, on the emulated TPU (`COLUMN_SCOPES`).
- Tables of a dict-configured spec, and partitioned parameter-server tables,
  are the host engine's own: `tpu_embedding/<table>`.
- The engine's per-table dummy variables carry activation gradients only;
  they are never saved.
"""
from tpu_fc import _tf_internals as internals

TABLE_PREFIX = 'tbl_'
ENGINE_SCOPE = 'tpu_embedding'
DUMMY_VARIABLE_PREFIX = 'tpu_embedding_dummy_table_variable_'
# TF's collection where TPU columns record, per embedding var name, the
# (scope, name) of their table.
COLUMN_SCOPES = internals.TPU_FC_TO_SCOPE
COLUMN_TABLE = 'embedding_weights'
SHARED_TABLE_SUFFIX = '_shared_embedding'


def table_of_column(column):
  """The spec's table name of a TPU embedding column."""
  return TABLE_PREFIX + column.get_embedding_var_name()


def column_variable(column):
  """A TPU column's table variable below any enclosing scope: a shared
  collection's name (no layer scope either), else `<column>/embedding_weights`
  (below its layer's scope)."""
  if getattr(column, 'shared_embedding_column_creator', None) is not None:
    return column.get_embedding_var_name()
  return '{}/{}'.format(column.name, COLUMN_TABLE)


def tf_tpu_layer_table_name(name):
  """The name TF 2.15's TPU gave what tpu_fc names `name`, if they differ.

  TF2's `tf.keras.layers.DenseFeatures` builds its columns outside any
  variable scope of its own, so a TPU named such a table (and its slots) by
  the enclosing variable scope alone: `<scope>/embedding_weights[/<slot>]`
  where tpu_fc says `<scope>/<layer>/<column>/embedding_weights[/<slot>]`
  (`docs/emulation.md`).  None for a name of no column's table (a column is
  `<key>_embedding`).
  """
  parts = name.split('/')
  if COLUMN_TABLE not in parts:
    return None
  table = parts.index(COLUMN_TABLE)
  if table < 2 or not parts[table - 1].endswith('_embedding'):
    return None
  return '/'.join(parts[:table - 2] + parts[table:])


def _below_any_scope(name, suffix):
  return name == suffix or name.endswith('/' + suffix)


def is_column_variable(name, column):
  """Whether variable `name` (under any enclosing scope) is `column`'s table."""
  return _below_any_scope(name, column_variable(column))


def is_table_variable(name, table_name):
  """Whether variable `name` can be the table `table_name` of a spec (or of
  `spec.to_mid_level()`) whose columns are not at hand: the table's own name,
  and for a column's `tbl_<embedding var name>` its column's table
  (`<var name>_embedding/embedding_weights`) or its shared collection's
  (`<var name>`), under any enclosing scope."""
  if name == table_name:
    return True
  if not table_name.startswith(TABLE_PREFIX):
    return False
  var_name = table_name[len(TABLE_PREFIX):]
  return any(_below_any_scope(name, suffix) for suffix in (
      '{}_embedding/{}'.format(var_name, COLUMN_TABLE), var_name))


def default_legacy_table_name(column):
  """The name TPUEstimator gave a column's table in a model whose
  `DenseFeatures` layer is at the top (what a checkpoint holds when no graph
  recorded the column's scope)."""
  name = column_variable(column)
  if getattr(column, 'shared_embedding_column_creator', None) is not None:
    return name
  return 'dense_features/' + name


def engine_table(table_name):
  """The host engine's own variable of a table."""
  return '{}/{}'.format(ENGINE_SCOPE, table_name)


def is_dummy(name):
  """Whether a variable is a dummy variable (or one of its optimizer slots)."""
  return name.split('/')[0].startswith(DUMMY_VARIABLE_PREFIX)


def is_column_table(name):
  """Whether a variable name is a feature column's table."""
  return (name.split('/')[-1] == COLUMN_TABLE or
          name.endswith(SHARED_TABLE_SUFFIX))


def recorded_table_names(layout, graph):
  """Table name -> its legacy name, from the scopes the columns recorded in
  `graph` while the model_fn ran; a dict-configured table keeps its own name."""
  recorded = graph.get_collection(COLUMN_SCOPES)
  scopes = recorded[0] if recorded else {}
  names = {}
  for table in layout.tables:
    names[table.name] = table.name
    if layout.features_of(table.name)[0].column is not None:
      var_name = table.name[len(TABLE_PREFIX):]
      if var_name not in scopes:
        raise RuntimeError(
            'Embedding feature column did not capture any thing. Make sure '
            'the feature columns passed to TPUEstimator constructor is '
            'properly used in model_fn.')
      scope, name = scopes[var_name]
      names[table.name] = '{}/{}'.format(scope, name) if scope else name
  return names


def forget_recorded_scopes(graph):
  """Drops the columns' record of their tables' scopes from `graph`, once read.

  It holds a Python dict, which every checkpoint's meta graph would fail to
  serialize, with a warning per save.
  """
  graph.clear_collection(COLUMN_SCOPES)
