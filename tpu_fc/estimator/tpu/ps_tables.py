"""The spec's tables split over the ps tasks of a parameter-server cluster.

Every embedding table of the spec (the host engine's and, with use_tpu=False,
the feature columns') is split row-wise into one part per ps task with
`fixed_size_partitioner`: the legacy `div` layout and the `<table>/part_N`
variables TPUEstimator created, part N (and its optimizer slots) on ps N
(`distributed`'s ps strategy), so each ps applies the updates of its own rows.
Checkpoints hold each table as one variable saved in slices: they restore on
one host.
"""
import contextlib

from tpu_fc import _tf_internals as internals
from tpu_fc import naming
from tpu_fc._tf import tf


def _table_initializers(layout):
  """`initializer_of(variable name)`: a table's initializer if the name is one
  of the spec's tables, else None.

  Those are the host engine's tables (`tpu_embedding/<table>`), and the tables
  the feature columns create on the CPU path, under any scope
  (`naming.is_column_variable`).
  """
  by_name = {naming.engine_table(table.name): table.initializer
             for table in layout.tables}
  by_column = [(feature.column, layout.table(feature.table).initializer)
               for feature in layout.features if feature.column is not None]

  def initializer_of(name):
    if name in by_name:
      return by_name[name]
    for column, initializer in by_column:
      if naming.is_column_variable(name, column):
        return initializer
    return None

  return initializer_of


@contextlib.contextmanager
def partitioned(embedding_config_spec, num_parts):
  """Creates the spec's tables inside as `num_parts` row-wise parts (div layout).

  Only the tables are split; a table the model_fn already partitions keeps its
  partitioner.  Tables made with `get_variable` (the host engine, `input_layer`,
  shared columns) get the partitioner through a custom getter on the root
  variable scope, as Estimator users put one on their scope; those of Keras's
  `DenseFeatures`, which bypasses variable scopes, through a variable creator
  that builds them with `get_variable` instead.
  """
  initializer_of = _table_initializers(embedding_config_spec.embedding_layout())
  partitioner = tf.compat.v1.fixed_size_partitioner(num_parts)
  graph = tf.compat.v1.get_default_graph()

  def partitioning_getter(getter, name, *args, **kwargs):
    if initializer_of(name) is not None and kwargs.get('partitioner') is None:
      kwargs['partitioner'] = partitioner
    return getter(name, *args, **kwargs)

  def partitioning_creator(next_creator, **kwargs):
    name = '/'.join(part for part in (graph.get_name_scope(),
                                      kwargs.get('name')) if part)
    initializer = initializer_of(name) if kwargs.get('name') else None
    if initializer is None:
      return next_creator(**kwargs)
    with graph.name_scope(None):
      return internals.default_variable_store().get_variable(
          name, shape=kwargs['shape'], dtype=kwargs.get('dtype'),
          initializer=initializer, trainable=kwargs.get('trainable', True),
          partitioner=partitioner, use_resource=True)

  with tf.compat.v1.variable_scope(tf.compat.v1.get_variable_scope(),
                                   custom_getter=partitioning_getter), \
      tf.compat.v1.variable_creator_scope(partitioning_creator):
    yield
