"""`EmbeddingConfigSpec`, its normalized tables and features, and the mid-level configs.

The spec keeps TF 2.15's constructor, validation and error texts.  Everything
downstream (lookup backends, checkpoint naming, `to_mid_level()`) reads one normalized
description of it, `EmbeddingLayout`: tables and features sorted by name, as the
legacy engine orders them, whichever way the spec was given (feature columns, legacy
v1 config dicts, or `tf.tpu.experimental.embedding` configs for migrated tables).
"""
from __future__ import annotations

import collections
import dataclasses
import functools
import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

from tpu_fc import _tf_internals as internals
from tpu_fc import columns as columns_lib
from tpu_fc import naming
from tpu_fc import optimizers
from tpu_fc._tf import tf


# The classes TF 2.15's spec accepts, in its order (they appear in its error text).
_SUPPORTED_FEATURE_COLUMNS = internals.EMBEDDING_AND_NUMERIC_COLUMN_TYPES


class TableConfig(collections.namedtuple('TableConfig', [
    'vocabulary_size', 'dimension', 'initializer', 'combiner',
    'hot_id_replication', 'learning_rate', 'learning_rate_fn',
    'optimization_parameters'])):
  """Legacy (v1) embedding table config, as `tensorflow.python.tpu.tpu_embedding`'s.

  A value of `EmbeddingConfigSpec(table_to_config_dict=...)`, whose key names
  the table (and its checkpoint variable).

  Args:
    vocabulary_size: the table's rows; an int >= 1.
    dimension: the table's columns (the embedding width); an int >= 1.
    initializer: the rows' initializer, a callable; None: truncated normal of
      mean 0 and standard deviation `1/sqrt(dimension)`.
    combiner: how one example's ids combine: 'mean', 'sum', 'sqrtn', or None
      for dense ids, one per example.
    hot_id_replication: kept for TF's signature; the emulated engine has no
      replicas to put hot rows on.
    learning_rate: this table's learning rate, in place of its optimizer's
      (taken when truthy).
    learning_rate_fn: `global_step -> learning rate` for this table, in place
      of its optimizer's; not with `learning_rate`.
    optimization_parameters: this table's optimizer (tpu_fc's or TF 2.15's
      `*Parameters`); None: the spec's.

  Raises:
    ValueError: `vocabulary_size` or `dimension` not an int >= 1,
      `initializer` not callable, another `combiner`, both `learning_rate` and
      `learning_rate_fn`, or `optimization_parameters` no `*Parameters`.
  """

  def __new__(cls, vocabulary_size: int, dimension: int,
              initializer: Callable[..., Any] | None = None,
              combiner: str | None = 'mean', hot_id_replication: bool = False,
              learning_rate: float | None = None,
              learning_rate_fn: Callable[[Any], Any] | None = None,
              optimization_parameters: Any = None):
    if not isinstance(vocabulary_size, int) or vocabulary_size < 1:
      raise ValueError(f'vocabulary_size must >= 1. '
                       f'Received: {vocabulary_size}.')
    if not isinstance(dimension, int) or dimension < 1:
      raise ValueError(
          f'dimension must be a positive int. Received: {dimension}.')
    if (initializer is not None) and (not callable(initializer)):
      raise ValueError(f'initializer must be callable if specified. '
                       f'Received: {initializer}.')
    if initializer is None:
      initializer = tf.compat.v1.truncated_normal_initializer(
          mean=0.0, stddev=1 / math.sqrt(dimension))
    if combiner not in ('mean', 'sum', 'sqrtn', None):
      raise ValueError(f'combiner must be "mean", "sum", "sqrtn" or None. '
                       f'Received: {combiner}.')
    if learning_rate is not None and learning_rate_fn is not None:
      raise ValueError('At most one of learning_rate and learning_rate_fn '
                       'can be None. Received: {} and {}'.format(
                           learning_rate, learning_rate_fn))
    if optimization_parameters is not None:
      optimization_parameters = optimizers.as_tpu_fc_parameters(
          optimization_parameters)
      if not isinstance(optimization_parameters,
                        optimizers._OptimizationParameters):  # pylint: disable=protected-access
        raise ValueError(f'`optimization_parameters` must inherit from '
                         f'`_OptimizationParameters`. '
                         f'Received: `type(optimization_parameters)`='
                         f'{type(optimization_parameters)}.')
    return super().__new__(cls, vocabulary_size, dimension, initializer,
                           combiner, hot_id_replication, learning_rate,
                           learning_rate_fn, optimization_parameters)


class FeatureConfig(collections.namedtuple(
    'FeatureConfig', ['table_id', 'max_sequence_length', 'weight_key'])):
  """Legacy (v1) feature config, as `tensorflow.python.tpu.tpu_embedding`'s.

  A value of `EmbeddingConfigSpec(feature_to_config_dict=...)`, whose key is
  the feature's key in the input features.

  Args:
    table_id: the key of the feature's table in `table_to_config_dict`.
    max_sequence_length: 0: one combined activation per example; N > 0: a
      sequence feature, each example's ids cut or padded to N positions.
    weight_key: the input feature holding the weights of this feature's ids
      (for the combiner); None: unweighted.

  Raises:
    ValueError: `max_sequence_length` not an int >= 0.
  """

  def __new__(cls, table_id: str, max_sequence_length: int = 0,
              weight_key: str | None = None):
    if not isinstance(max_sequence_length, int) or max_sequence_length < 0:
      raise ValueError(f'max_sequence_length must be zero or a positive int, '
                       f'got {max_sequence_length}.')
    return super().__new__(cls, table_id, max_sequence_length, weight_key)


def _is_config(config, cls):
  """True for tpu_fc's v1 config, TF 2.15's twin (same namedtuple fields) or
  the mid-level config of that name."""
  return (isinstance(config, cls) or _is_mid_level(config, cls.__name__) or
          (type(config).__name__ == cls.__name__ and
           getattr(config, '_fields', None) == cls._fields))


def _is_mid_level(config, name):
  return isinstance(config, getattr(tf.tpu.experimental.embedding, name))


@dataclasses.dataclass(frozen=True)
class TableSpec:
  """One embedding table, normalized.

  `optimizer` is a per-table override (tpu_fc legacy parameters) or None for the
  spec's; `learning_rate` / `learning_rate_fn` follow the legacy precedence: a truthy
  `learning_rate`, else `learning_rate_fn(global_step)`, else the optimizer's rate.
  `combiner` None means dense ids, one per example (legacy dict path only).
  `quantization` is a mid-level table's `QuantizationConfig` as `(num_buckets,
  lower, upper)`: the TPU clips and quantizes its looked-up rows before the
  combiner, and passes gradients through unchanged.
  """
  name: str
  vocabulary_size: int
  dimension: int
  initializer: Callable
  combiner: Optional[str] = 'mean'
  optimizer: Any = None
  learning_rate: Optional[float] = None
  learning_rate_fn: Optional[Callable] = None
  quantization: Optional[Tuple[int, float, float]] = None


@dataclasses.dataclass(frozen=True)
class FeatureSpec:
  """One input feature looked up in `table`; `column` is set on the columns path.

  `lookup_device` is its column's `embedding_lookup_device` ('cpu',
  'tpu_tensor_core', 'tpu_embedding_core'), or None: TF's default (every dict
  feature's); `tpu_fc.lookup.backends.backends_for` picks its path by it.
  """
  name: str
  table: str
  max_sequence_length: int = 0
  weight_key: Optional[str] = None
  column: Any = None
  lookup_device: Optional[str] = None

  @property
  def is_sequence(self):
    return self.max_sequence_length > 0

  @property
  def ids_column(self):
    """The categorical column giving the feature's ids (columns path), or None."""
    return columns_lib.ids_column(self.column)


@dataclasses.dataclass(frozen=True)
class EmbeddingLayout:
  """The tables and features of a spec, each sorted by name (or two such
  joined: `EmbeddingConfigSpec.layout()`)."""
  tables: Tuple[TableSpec, ...]
  features: Tuple[FeatureSpec, ...]

  def table(self, name):
    return next(t for t in self.tables if t.name == name)

  def features_of(self, table_name):
    return tuple(f for f in self.features if f.table == table_name)

  def where(self, keep: Callable[[FeatureSpec], bool]) -> EmbeddingLayout:
    """The features `keep` keeps, and the tables they read."""
    features = tuple(f for f in self.features if keep(f))
    read = {f.table for f in features}
    return EmbeddingLayout(tuple(t for t in self.tables if t.name in read),
                           features)


def _check_step_function(function, what):
  """Refuses a `global_step -> value` function that is no function (a TPU
  would fail calling it, far from the config)."""
  if function is not None and not callable(function):
    raise TypeError('{} must be a function of the global step (global_step -> '
                    'value), got {!r}.'.format(what, function))


def _layout_from_columns(feature_columns):
  """Legacy `get_configs_from_feature_columns`: TPU columns -> tables and features."""
  for column in feature_columns:
    if not isinstance(column, columns_lib.TPU_COLUMN_TYPES):
      raise TypeError(
          'Unsupported feature column {}. Supported types are {}.'.format(
              type(column), columns_lib.TPU_COLUMN_TYPES))
  tables, features = {}, {}
  for column in feature_columns:
    feature_name = column.get_feature_key_name()
    table_name = naming.table_of_column(column)
    if feature_name in features:
      raise ValueError(
          'Feature column {} is used with multiple embeddings and this is '
          'not supported.'.format(feature_name))
    features[feature_name] = FeatureSpec(
        name=feature_name, table=table_name,
        max_sequence_length=column.get_max_sequence_length(),
        weight_key=column.get_weight_key_name(), column=column,
        lookup_device=columns_lib.lookup_device(column))
    vocabulary_size, dimension = column.get_embedding_table_size()
    _check_step_function(column.get_learning_rate_fn(),
                         'Column {}: learning_rate_fn'.format(column.name))
    # TF 2.15's checks (its TPU builds a TableConfig per column).
    TableConfig(vocabulary_size, dimension, column.get_initializer(),
                column.get_combiner(),
                learning_rate_fn=column.get_learning_rate_fn())
    shared = tables.get(table_name)
    if shared is not None and (shared.vocabulary_size, shared.dimension) != (
        vocabulary_size, dimension):
      raise ValueError(
          'Columns of table {} differ: {} has {} rows of dimension {}, another '
          '{} of dimension {}. Give each group of shared columns its own '
          'shared_embedding_collection_name.'.format(
              table_name[len(naming.TABLE_PREFIX):], column.name,
              vocabulary_size, dimension,
              shared.vocabulary_size, shared.dimension))
    # Last writer wins for a shared table, as in the legacy engine.
    tables[table_name] = TableSpec(
        name=table_name, vocabulary_size=vocabulary_size, dimension=dimension,
        initializer=column.get_initializer(), combiner=column.get_combiner(),
        learning_rate_fn=column.get_learning_rate_fn())
  return _sorted_layout(tables, features)


def _table_spec_from_config(name, config):
  if _is_mid_level(config, 'TableConfig'):
    if config.combiner not in ('mean', 'sum', 'sqrtn'):
      raise NotImplementedError(
          'TableConfig {!r}: combiner {!r} is not supported by tpu_fc, whose '
          'lookups combine with "mean", "sum" or "sqrtn" (the combiners of '
          'TF\'s TPU embedding engine); use one of those.'.format(
              name, config.combiner))
    quantization = getattr(config, 'quantization_config', None)
    return TableSpec(
        name=name, vocabulary_size=config.vocabulary_size, dimension=config.dim,
        initializer=config.initializer, combiner=config.combiner,
        optimizer=(None if config.optimizer is None else
                   optimizers.from_mid_level(config.optimizer)),
        quantization=None if quantization is None else (
            quantization.num_buckets, quantization.lower, quantization.upper))
  return TableSpec(
      name=name, vocabulary_size=config.vocabulary_size,
      dimension=config.dimension, initializer=config.initializer,
      combiner=config.combiner,
      optimizer=(None if config.optimization_parameters is None else
                 optimizers.as_tpu_fc_parameters(
                     config.optimization_parameters)),
      learning_rate=config.learning_rate,
      learning_rate_fn=config.learning_rate_fn)


def _table_key_of(feature_config, table_to_config_dict):
  """The table key a (legacy or mid-level) feature config refers to, or None."""
  if not _is_mid_level(feature_config, 'FeatureConfig'):
    return feature_config.table_id
  for key, table in table_to_config_dict.items():
    if table is feature_config.table:
      return key
  name = feature_config.table.name
  return name if name in table_to_config_dict else None


def _check_dicts_as_a_tpu_does(feature_to_config_dict, table_to_config_dict,
                               optimization_parameters):
  """TF 2.15's checks of dict configs, made where a TPU builds its embedding
  (`tpu_embedding._validate_feature_to_config_dict` and
  `_validate_optimization_parameters`): the spec's constructor takes these."""
  used = {_table_key_of(config, table_to_config_dict)
          for config in feature_to_config_dict.values()}
  unused = set(table_to_config_dict) - used
  if unused:
    raise ValueError('`table_to_config_dict` specifies table that is not '
                     'used in `feature_to_config_dict`: {}.'.format(unused))
  if optimization_parameters:
    if not isinstance(optimization_parameters,
                      optimizers._OptimizationParameters):  # pylint: disable=protected-access
      raise ValueError('`optimization_parameters` must inherit from '
                       '`_OptimizationParameters`. '
                       '`type(optimization_parameters)`={}'.format(
                           type(optimization_parameters)))
  elif any(getattr(config, 'optimization_parameters',
                   getattr(config, 'optimizer', None)) is None
           for config in table_to_config_dict.values()):
    raise ValueError('`optimization_parameters` is missing.')


def _layout_from_dicts(feature_to_config_dict, table_to_config_dict):
  tables = {name: _table_spec_from_config(name, config)
            for name, config in table_to_config_dict.items()}
  features = {name: FeatureSpec(
      name=name, table=_table_key_of(config, table_to_config_dict),
      max_sequence_length=config.max_sequence_length,
      weight_key=(None if _is_mid_level(config, 'FeatureConfig') else
                  config.weight_key))
              for name, config in feature_to_config_dict.items()}
  return _sorted_layout(tables, features)


def layout_of_mid_level(features):
  """The layout of mid-level `FeatureConfig`s by feature name; tables keep
  their own (`TableConfig.name`) names."""
  return _layout_from_dicts(
      features, {config.table.name: config.table
                 for config in features.values()})


def _sorted_layout(tables, features):
  return EmbeddingLayout(
      tables=tuple(tables[k] for k in sorted(tables)),
      features=tuple(features[k] for k in sorted(features)))


class EmbeddingConfigSpec(collections.namedtuple('EmbeddingConfigSpec', [
    'feature_columns', 'tensor_core_feature_columns',
    'optimization_parameters', 'clipping_limit',
    'pipeline_execution_with_tensor_core',
    'experimental_gradient_multiplier_fn', 'feature_to_config_dict',
    'table_to_config_dict', 'partition_strategy', 'profile_data_directory'])):
  """TPU embedding specification for `TPUEstimator`, as TF 2.15's.

  The constructor makes TF 2.15's checks; those TF makes where a TPU builds
  its embedding (shared tables, unused tables, a missing optimizer) run when
  the spec is used: by `TPUEstimator`, `to_mid_level()`, the checkpoint
  conversion.

  Args:
    feature_columns: the `embedding_column` / `shared_embedding_columns`
      columns the model_fn uses (or give both dicts below instead).
    optimization_parameters: the tables' optimizer: `*Parameters` (tpu_fc's
      or TF 2.15's) whose class takes feature columns (TF 2.15's seven,
      `tpu_fc.optimizers.SUPPORTED_OPTIMIZERS`), or a mid-level optimizer
      with a twin there (SGD, Adagrad, Adam, FTRL, AdagradMomentum),
      converted to tpu_fc's `*Parameters`; with the dicts, as in TF 2.15,
      any `*Parameters` (also AdagradMomentum, ProximalYogi,
      FrequencyEstimator), and None when every table has its own.
    clipping_limit: accepted and ignored, as in TF 2.15.
    pipeline_execution_with_tensor_core: True: each step's lookup runs before
      the previous step's table update lands, as on a TPU that overlaps them
      (a checkpoint save applies the parked update first).
    experimental_gradient_multiplier_fn: `global_step -> factor` applied to
      every table gradient; None: none.
    feature_to_config_dict, table_to_config_dict: the legacy
      `FeatureConfig` / `TableConfig` dicts (or mid-level configs), in place
      of `feature_columns`.
    partition_strategy: 'div' or 'mod', as TF's; 'mod' is refused by a
      `TPUEstimator` that evaluates on the CPU, as in TF 2.15.
    profile_data_directory: a directory to write the lookups' id statistics
      to (TF's embedding profile; `tpu_fc.lookup.profile`); None: no profile.

  Attributes:
    feature_columns: the columns of the embedding core (not on
      'tpu_tensor_core'); None with the dicts.
    tensor_core_feature_columns: the columns on
      `embedding_lookup_device='tpu_tensor_core'`, moved out of
      `feature_columns`; None with the dicts.

  The other attributes are the arguments, `optimization_parameters` as
  tpu_fc's `*Parameters`.

  Raises:
    ValueError: not exactly one of `feature_columns` and the pair of dicts,
      another `partition_strategy`, an `optimization_parameters` the columns
      cannot take (the columns need one of the seven), or a feature whose
      `table_id` (or mid-level table) is not in `table_to_config_dict`.
    TypeError: a column of a type TF 2.15's spec refuses (it takes TPU
      embedding, embedding and numeric columns), a dict value of another
      config type, or an `experimental_gradient_multiplier_fn` that is not
      callable.
    NotImplementedError: a mid-level optimizer other than those five.
  """

  def __new__(cls,
              feature_columns: Sequence[Any] | None = None,
              optimization_parameters: Any = None,
              clipping_limit: Any = None,
              pipeline_execution_with_tensor_core: bool = False,
              experimental_gradient_multiplier_fn: (
                  Callable[[Any], Any] | None) = None,
              feature_to_config_dict: Mapping[str, Any] | None = None,
              table_to_config_dict: Mapping[str, Any] | None = None,
              partition_strategy: str = 'div',
              profile_data_directory: str | None = None):
    if (not feature_columns and
        not (feature_to_config_dict and table_to_config_dict) or
        (feature_columns and
         (feature_to_config_dict and table_to_config_dict))):
      raise ValueError('Exactly one of `feature_columns` and the pair '
                       '`feature_to_config_dict` and `table_to_config_dict` '
                       'must be be specified.')
    if partition_strategy not in ('div', 'mod'):
      raise ValueError('Invalid partition_strategy {}. Must be one of "mod" or '
                       '"div".'.format(partition_strategy))
    _check_step_function(experimental_gradient_multiplier_fn,
                         'experimental_gradient_multiplier_fn')
    given_optimizer = optimization_parameters
    # tpu_fc's parameters for TF 2.15's or mid-level optimizers; others unchanged.
    optimization_parameters = (
        optimizers.from_mid_level(optimization_parameters)
        if isinstance(optimization_parameters, internals.MidLevelOptimizer)
        else optimizers.as_tpu_fc_parameters(optimization_parameters))
    tensor_core_feature_columns = None
    if feature_columns:
      # TF's two fields, a view of the columns' devices (which `layout()` reads).
      split: Dict[bool, List[Any]] = {True: [], False: []}
      for column in feature_columns:
        split[columns_lib.lookup_device(column) ==
              columns_lib.TPU_TENSOR_CORE].append(column)
        if not isinstance(column, _SUPPORTED_FEATURE_COLUMNS):
          raise TypeError(
              'All feature columns must be supported types in {}. Got {}'
              .format(_SUPPORTED_FEATURE_COLUMNS, type(column)))
      tensor_core_feature_columns, feature_columns = split[True], split[False]
      if not (isinstance(optimization_parameters,
                         optimizers._OptimizationParameters) and  # pylint: disable=protected-access
              optimization_parameters.FEATURE_COLUMNS):
        raise ValueError('optimization_parameters must be an instance of type '
                         '{}. Got {}.'.format(optimizers.SUPPORTED_OPTIMIZERS,
                                              type(given_optimizer)))
    else:
      feature_columns = None
      for feature, config in feature_to_config_dict.items():
        if not _is_config(config, FeatureConfig):
          raise TypeError(
              'Config for feature {} must be of type `FeatureConfig`. Got {}'
              .format(feature, type(config)))
        table_id = _table_key_of(config, table_to_config_dict)
        if table_id not in table_to_config_dict:
          raise ValueError('Feature {} refers to table {} which is not in the '
                           'table_to_config_dict.'.format(
                               feature, table_id if table_id is not None
                               else config.table.name))
      for table, config in table_to_config_dict.items():
        if not _is_config(config, TableConfig):
          raise TypeError(
              'Config for table {} must be of type `TableConfig`. Got '
              '{}'.format(table, type(config)))
    return super().__new__(
        cls,
        feature_columns=feature_columns,
        tensor_core_feature_columns=tensor_core_feature_columns,
        optimization_parameters=optimization_parameters,
        clipping_limit=clipping_limit,
        pipeline_execution_with_tensor_core=pipeline_execution_with_tensor_core,
        experimental_gradient_multiplier_fn=experimental_gradient_multiplier_fn,
        feature_to_config_dict=feature_to_config_dict,
        table_to_config_dict=table_to_config_dict,
        partition_strategy=partition_strategy,
        profile_data_directory=profile_data_directory)

  def embedding_layout(self) -> EmbeddingLayout:
    """Embedding-core tables and features (the ones the TPU embedding engine owns)."""
    if self.feature_columns is not None:
      return _layout_from_columns(self.feature_columns)
    _check_dicts_as_a_tpu_does(self.feature_to_config_dict,
                               self.table_to_config_dict,
                               self.optimization_parameters)
    layout = _layout_from_dicts(self.feature_to_config_dict,
                                self.table_to_config_dict)
    for table in layout.tables:  # (checked where TF 2.15's engine creates it)
      (table.optimizer or self.optimization_parameters).check_table(
          table.name, table.dimension)
    return layout

  def tensor_core_layout(self) -> EmbeddingLayout:
    """Tables and features looked up on the tensor core, trained by the model."""
    return _layout_from_columns(self.tensor_core_feature_columns or [])

  def layout(self) -> EmbeddingLayout:
    """Every table and feature, each feature with its lookup device: the two
    layouts above, one after the other (TF's two fields, two namespaces)."""
    first, second = self.embedding_layout(), self.tensor_core_layout()
    return EmbeddingLayout(first.tables + second.tables,
                           first.features + second.features)

  def to_mid_level(self, global_step: tf.Variable | None = None
                   ) -> MidLevelConfig:
    """The spec as `tf.tpu.experimental.embedding` configs (see `MidLevelConfig`).

    Tables are named after the legacy engine (`tbl_` + the embedding variable
    name, or the dict keys); every table's optimizer is set explicitly, and a
    column's `learning_rate_fn(global_step)` becomes a per-table copy of the
    optimizer whose learning rate is a zero-argument callable reading the
    global step.  `experimental_gradient_multiplier_fn` has no mid-level
    setting: it becomes `MidLevelConfig.gradient_multiplier` (logged once).

    Args:
      global_step: the step variable that per-table `learning_rate_fn`s and
        `experimental_gradient_multiplier_fn` read; by default, in eager code the
        global step when this is called (created if there is none: a traced
        tf.function cannot create it), in a graph the graph's global step.

    Returns:
      A `MidLevelConfig`.

    Raises:
      NotImplementedError: the spec's or a table's optimizer has no mid-level
        twin (its message names the closest one), or a mid-level table's
        combiner is not 'mean', 'sum' or 'sqrtn'.
      ValueError: `FtrlParameters(initial_accumulator_value=0)`; or TF 2.15's
        checks where a TPU builds its embedding: one feature in two columns,
        shared columns of different table shapes, a table no feature uses, no
        optimizer for a table, a FrequencyEstimator table of dimension other
        than 1; or a column's `TableConfig` checks.
      TypeError: a column that is no TPU embedding column (the constructor,
        as TF 2.15's, also takes embedding and numeric columns), or a
        column's `learning_rate_fn` that is not callable.
    """
    parameters = self.optimization_parameters
    layout = self.embedding_layout()  # (without parameters, every table has its own)
    optimizer = None if parameters is None else parameters.to_mid_level()
    tensor_core = self.tensor_core_layout()
    multiplier_fn = self.experimental_gradient_multiplier_fn
    tables = _mid_level_tables(layout, parameters, optimizer, global_step)
    tensor_core_tables = _mid_level_tables(tensor_core, parameters, optimizer,
                                           global_step)
    if multiplier_fn is not None:
      _warn_once(
          'experimental_gradient_multiplier_fn has no mid-level setting: pass '
          'the activation gradients through MidLevelConfig.scale_gradients '
          'before TPUEmbedding.apply_gradients to keep it.')
    return MidLevelConfig(
        feature_config=_mid_level_features(layout, tables),
        optimizer=optimizer,
        tensor_core_feature_config=_mid_level_features(tensor_core,
                                                       tensor_core_tables),
        tables=[t for _, t in sorted({**tables, **tensor_core_tables}.items())],
        weight_keys={f.name: f.weight_key for f in layout.features
                     if f.weight_key},
        gradient_multiplier=(None if multiplier_fn is None else
                             GlobalStepFunction(multiplier_fn, global_step)))

  def to_keras_rs(self, batch_size: int | None = None,
                  global_step: Any = None) -> dict[str, Any]:
    """The spec as keras-rs configs, for `tpu_fc.keras_rs.DistributedEmbedding`.

    Tables are named as `to_mid_level()` names them, one `TableConfig` per
    table (shared ones too), with its vocabulary, dimension, initializer,
    combiner ('sum' for a dict table's `combiner=None`), placement 'auto' and
    its optimizer as the Keras 3 optimizer keras-rs converts to the TPU's
    (SGD, Adagrad, Adam, FTRL; weight decay as `weight_decay`, symmetric
    gradient clipping as `clipvalue`, a table's `learning_rate_fn` as a
    callable learning rate).  A feature's `input_shape` is `(batch_size,
    None)`, its `output_shape` `(batch_size, dimension)`; a sequence feature
    (`max_sequence_length` N) has `(batch_size, N)` and `(batch_size, N,
    dimension)`: fed a RaggedTensor, each example's first N ids are looked up
    (TF's TPU rule for such an output shape), as the legacy sequence column
    did.  What keras-rs cannot carry is refused (docs/keras_rs.md lists it);
    `clipping_limit`, `partition_strategy` and `profile_data_directory` change
    no number and are left behind.

    Args:
      batch_size: the batch of the layer's input (keras-rs's shapes are the
        global batch's); None: any, except for sequence features, which need
        it.
      global_step: the step variable the tables' `learning_rate_fn`s read
        when the gradients are computed (under `model.fit`: the model
        optimizer's `iterations`, which counts the steps before; needed if a
        table has a `learning_rate_fn`).

    Returns:
      {feature name: `keras_rs.layers.FeatureConfig`}.

    Raises:
      ValueError: what keras-rs cannot carry, naming the table (or feature)
        and the field: an optimizer other than SGD, Adagrad, Adam and FTRL,
        `use_gradient_accumulation=False`, `clip_weight_min` / `max`,
        asymmetric gradient clipping,
        `multiply_weight_decay_factor_by_learning_rate`, Adam's
        `lazy_adam=False` or `sum_inside_sqrt=False`, FTRL's
        `multiply_linear_by_learning_rate`, `allow_zero_accumulator` or
        `initial_accumulator_value=0`, a table's `quantization_config`,
        `experimental_gradient_multiplier_fn`,
        `pipeline_execution_with_tensor_core=True` (a layer argument),
        tensor-core columns; a sequence feature without `batch_size`, a
        `learning_rate_fn` without `global_step`; and `to_mid_level`'s checks
        of the spec.
      TypeError: `to_mid_level`'s.
      ImportError: keras-rs is not installed (it needs Python >= 3.11).
    """
    import keras_rs  # pylint: disable=g-import-not-at-top  (Keras 3: only here)
    _check_keras_rs_carries_the_spec(self)
    layout = self.embedding_layout()
    tables = {}
    for table in layout.tables:
      if table.quantization is not None:
        raise _keras_rs_refusal('Table ' + table.name, 'quantization_config',
                                table.quantization,
                                'keras-rs tables have no quantization')
      if (table.learning_rate_fn is not None and not table.learning_rate and
          global_step is None):
        raise ValueError(
            'Table {}: its learning_rate_fn reads the global step, which '
            'nothing counts in keras-rs: pass to_keras_rs(global_step=...), the '
            'counter your training increments (under model.fit the model '
            'optimizer\'s iterations).'.format(table.name))
      parameters = table.optimizer or self.optimization_parameters
      learning_rate = table_learning_rate(table, global_step)
      tables[table.name] = keras_rs.layers.TableConfig(
          name=table.name, vocabulary_size=table.vocabulary_size,
          embedding_dim=table.dimension,
          initializer=_keras_initializer(table.initializer),
          optimizer=_keras_optimizer(
              table.name, parameters, parameters.learning_rate
              if learning_rate is None else learning_rate),
          combiner=table.combiner or 'sum', placement='auto')
    configs = {}
    for feature in layout.features:
      dimension = tables[feature.table].embedding_dim
      if feature.is_sequence and batch_size is None:
        raise ValueError(
            'Feature {}: max_sequence_length={} needs the batch size in '
            'keras-rs, whose output shape [batch, {}, {}] reads a RaggedTensor '
            'as a sequence per example only against a known batch: pass '
            'to_keras_rs(batch_size=...).'.format(
                feature.name, feature.max_sequence_length,
                feature.max_sequence_length, dimension))
      positions = ((feature.max_sequence_length,) if feature.is_sequence
                   else ())
      configs[feature.name] = keras_rs.layers.FeatureConfig(
          name=feature.name, table=tables[feature.table],
          input_shape=(batch_size,) + (positions or (None,)),
          output_shape=(batch_size,) + positions + (dimension,))
    return configs


class GlobalStepFunction:
  """A legacy `function(global_step)` (a `learning_rate_fn`, the gradient
  multiplier) as the mid-level zero-argument callable."""

  def __init__(self, function, global_step=None):
    self.function = function
    if global_step is None and tf.executing_eagerly():
      # Bound now: a traced tf.function cannot create it when it is called.
      global_step = tf.compat.v1.train.get_or_create_global_step()
    self._global_step = global_step

  def __call__(self):
    step = self._global_step
    if step is None:
      if tf.inside_function():
        raise ValueError(
            '{!r} needs the global step, and a tf.function cannot create it: '
            'call to_mid_level() in eager code, or pass it the step variable '
            '(to_mid_level(global_step=...)).'.format(self.function))
      step = tf.compat.v1.train.get_or_create_global_step()
    return tf.cast(self.function(step), tf.float32)

  def __repr__(self):
    return 'GlobalStepFunction({!r})'.format(self.function)


@dataclasses.dataclass(frozen=True)
class MidLevelConfig:
  """An `EmbeddingConfigSpec` in `tf.tpu.experimental.embedding` terms.

  What `EmbeddingConfigSpec.to_mid_level()` returns; frozen.

  Attributes:
    feature_config: feature name -> `FeatureConfig` for the embedding-core features
      (for `TPUEmbedding`, `TPUEmbeddingForServing`, `serving_embedding_lookup`).
    optimizer: the spec's optimizer, as a mid-level optimizer (None when
      every table has its own).
    tensor_core_feature_config: feature name -> `FeatureConfig` for the tensor-core
      features (for `TPUEmbeddingV0`).
    tables: every `TableConfig`, sorted by name; names are the legacy table names
      (`tbl_` + the legacy embedding variable name, or the dict keys).
    weight_keys: feature name -> the feature holding its weights.
    gradient_multiplier: the spec's `experimental_gradient_multiplier_fn` as a
      zero-argument callable, or None.  TF's `TPUEmbedding` has no such
      setting: pass the activation gradients through `scale_gradients` before
      `apply_gradients`, as TPUEstimator scaled them.
  """
  feature_config: Dict[str, Any]
  optimizer: Any
  tensor_core_feature_config: Dict[str, Any]
  tables: List[Any]
  weight_keys: Dict[str, str]
  gradient_multiplier: Any = None

  def scale_gradients(self, gradients: Any) -> Any:
    """`gradients` times the spec's gradient multiplier, as TPUEstimator scaled them.

    Args:
      gradients: activation gradients (d(loss)/d(activations)), any nest of
        tensors; None entries stay None.

    Returns:
      The same structure, each gradient times `gradient_multiplier()`;
      `gradients` itself when the spec has no multiplier.
    """
    if self.gradient_multiplier is None:
      return gradients
    multiplier = self.gradient_multiplier()
    return tf.nest.map_structure(
        lambda gradient: None if gradient is None else gradient * multiplier,
        gradients)

  def serving_feature_config(self) -> dict[str, Any]:
    """`feature_config` on copies of the tables without optimizers (no slots).

    Returns:
      Feature name -> `tf.tpu.experimental.embedding.FeatureConfig`, for
      `TPUEmbeddingForServing` (which then creates no slot variables).
    """
    embedding = tf.tpu.experimental.embedding
    tables = {id(table): embedding.TableConfig(
        vocabulary_size=table.vocabulary_size, dim=table.dim,
        initializer=table.initializer, combiner=table.combiner, name=table.name)
              for table in self.tables}
    return {name: embedding.FeatureConfig(
        table=tables[id(feature.table)],
        max_sequence_length=feature.max_sequence_length,
        output_shape=feature.output_shape, name=feature.name)
            for name, feature in self.feature_config.items()}

  def split_features(self, features: Mapping[str, Any]
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(inputs, weights) structured like `feature_config`, from an estimator-style dict.

    Args:
      features: an input_fn's features dict: the embedding-core features' ids
        by feature name, and their weights under their `weight_key`s.

    Returns:
      `(inputs, weights)`: dicts by the names of `feature_config`, what
      `TPUEmbedding.enqueue` takes; a feature without weights has None.

    Raises:
      KeyError: `features` lacks an embedding-core feature or its weights.
    """
    inputs = {name: features[name] for name in self.feature_config}
    weights = {name: (features[self.weight_keys[name]]
                      if name in self.weight_keys else None)
               for name in self.feature_config}
    return inputs, weights


def table_learning_rate(table: TableSpec, global_step: Any = None) -> Any:
  """A table's own learning rate by the legacy precedence: a truthy
  `learning_rate`, else `learning_rate_fn(global_step)` as a zero-argument
  callable (`GlobalStepFunction`); None: its optimizer's."""
  if table.learning_rate:
    return table.learning_rate
  if table.learning_rate_fn is not None:
    return GlobalStepFunction(table.learning_rate_fn, global_step)
  return None


def _mid_level_optimizer(table, default_parameters, global_step):
  """Per-table mid-level optimizer, honouring the legacy learning-rate precedence."""
  learning_rate = table_learning_rate(table, global_step)
  if learning_rate is None and table.optimizer is None:
    return None
  return (table.optimizer or default_parameters).to_mid_level(
      learning_rate=learning_rate)


def _mid_level_tables(layout, default_parameters, default_optimizer,
                      global_step):
  return {
      table.name: tf.tpu.experimental.embedding.TableConfig(
          vocabulary_size=table.vocabulary_size, dim=table.dimension,
          initializer=table.initializer,
          optimizer=(_mid_level_optimizer(table, default_parameters,
                                          global_step) or default_optimizer),
          combiner=table.combiner or 'sum', name=table.name)
      for table in layout.tables}


def _mid_level_features(layout, tables):
  return {
      feature.name: tf.tpu.experimental.embedding.FeatureConfig(
          table=tables[feature.table],
          max_sequence_length=feature.max_sequence_length, name=feature.name)
      for feature in layout.features}


# keras-rs (`EmbeddingConfigSpec.to_keras_rs`) ------------------------------------

# What keras-rs cannot carry of any legacy optimizer (each class's `KERAS_RS`
# twin adds its own): (field, whether a value is lost, why and what to do).
# keras-rs builds a table's TPU optimizer from a Keras optimizer's learning
# rate, `weight_decay`, `clipvalue` and the fields its `config_conversion`
# maps; the TPU optimizer's defaults fill the rest.
_KERAS_RS_LOSSES = (
    ('use_gradient_accumulation', lambda value: not value,
     'keras-rs always sums a step\'s gradients of a row, from every core, into '
     'one update (its TPU optimizers\' default); set it True, which on one '
     'core changes nothing'),
    ('clip_weight_min', lambda value: value is not None,
     'Keras optimizers have no weight clipping; drop it'),
    ('clip_weight_max', lambda value: value is not None,
     'Keras optimizers have no weight clipping; drop it'),
    ('multiply_weight_decay_factor_by_learning_rate', bool,
     'keras-rs passes a Keras weight_decay as the TPU\'s weight_decay_factor, '
     'never multiplied by the learning rate; multiply the factor by a '
     'constant learning rate yourself, or drop it'),
)


def _keras_rs_refusal(what, field, value, why):
  return ValueError('{}: {}={!r} cannot be carried to keras-rs: {}.'.format(
      what, field, value, why))


def _check_keras_rs_carries_the_spec(spec):
  """Refuses the spec's settings keras-rs has no place for."""
  if spec.experimental_gradient_multiplier_fn is not None:
    raise _keras_rs_refusal(
        'Every table', 'experimental_gradient_multiplier_fn',
        spec.experimental_gradient_multiplier_fn,
        'keras-rs has no gradient multiplier; scale the loss instead if it is '
        'constant, or stay on tpu_fc.mid_level (MidLevelConfig.scale_gradients)')
  if spec.pipeline_execution_with_tensor_core:
    raise _keras_rs_refusal(
        'Every table', 'pipeline_execution_with_tensor_core', True,
        'it is an argument of the layer, not of its FeatureConfigs; convert '
        'spec._replace(pipeline_execution_with_tensor_core=False) and pass '
        'DistributedEmbedding(..., pipeline_execution_with_tensor_core=True)')
  for feature in spec.tensor_core_layout().features:
    raise _keras_rs_refusal(
        'Feature ' + feature.name, 'embedding_lookup_device', 'tpu_tensor_core',
        'its keras-rs counterpart is a TableConfig with placement='
        '\'default_device\', trained by the model\'s optimizer as the tensor '
        'core\'s tables were; write that TableConfig yourself')


def _keras_optimizer(table, parameters, learning_rate):
  """The Keras 3 optimizer keras-rs converts to the TPU optimizer of
  `parameters` (tpu_fc's, its class's `KERAS_RS` twin) with `learning_rate`;
  refused (naming `table` and the field) where keras-rs cannot carry it."""
  import keras  # pylint: disable=g-import-not-at-top  (Keras 3: only here)
  what = 'Table ' + table
  twin = parameters.KERAS_RS
  if twin is None:
    names = optimizers.twin_names(cls for cls in optimizers.optimizer_classes()
                                  if cls.KERAS_RS)
    raise _keras_rs_refusal(
        what, 'optimization_parameters', parameters,
        'keras-rs trains tables with {} and {} only (as Keras optimizers); '
        'choose one of those, or keep the table on tpu_fc.TPUEstimator or '
        'tpu_fc.mid_level'.format(', '.join(names[:-1]), names[-1]))
  for field, lost, why in _KERAS_RS_LOSSES + twin.losses:
    if lost(getattr(parameters, field)):
      raise _keras_rs_refusal(what, field, getattr(parameters, field), why)
  low, high = parameters.clip_gradient_min, parameters.clip_gradient_max
  if (low, high) != (None, None) and (high is None or low != -high):
    raise _keras_rs_refusal(
        what, 'clip_gradient_min, clip_gradient_max', (low, high),
        'keras-rs passes a Keras clipvalue c as the TPU\'s gradient clipping '
        'to [-c, c]; make the bounds symmetric')
  return getattr(keras.optimizers, twin.name)(
      learning_rate=(learning_rate if callable(learning_rate)
                     else float(learning_rate)),  # (Keras takes no int)
      weight_decay=parameters.weight_decay_factor, clipvalue=high,
      **twin.arguments(parameters))


def _keras_initializer(initializer):
  """TF's truncated normal (the legacy default) as Keras' of the same mean,
  standard deviation and seed, which `model.save` writes and reads back;
  another initializer as given."""
  import keras  # pylint: disable=g-import-not-at-top  (Keras 3: only here)
  if not isinstance(initializer, tf.compat.v1.truncated_normal_initializer):
    return initializer
  return keras.initializers.TruncatedNormal(
      mean=initializer.mean, stddev=initializer.stddev, seed=initializer.seed)


@functools.lru_cache(maxsize=None)
def _warn_once(message):
  tf.compat.v1.logging.warning(message)

