"""Checkpoint conversion between legacy TPUEstimator names and mid-level objects.

Legacy (name-based `tf.compat.v1.train.Saver`) checkpoints hold each table under
the name its feature column gave it (`dense_features/a_embedding/embedding_weights`,
a shared collection's name, a dict-path table's name) and the embedding
optimizer's slots under legacy suffixes (`<table>/Adagrad`, `<table>/Adam/m`, ...).
Mid-level (object-based `tf.train.Checkpoint(embedding=TPUEmbedding)`) checkpoints
hold `embedding/<table>/.ATTRIBUTES/VARIABLE_VALUE` and
`embedding/<table>.S<slot>/.ATTRIBUTES/VARIABLE_VALUE` for the tables of
`spec.to_mid_level()`. Every other variable (the dense model, its optimizer
slots) is carried under its legacy name in a `dense` dict, the global step as
`global_step`, and the legacy table names as `legacy_table_names`, so converting
back reproduces the original checkpoint's names and values bit for bit.

The command line's `convert-checkpoint` and `inspect` call these functions.
`restore_embedding` and `save_embedding` read and write the same layouts into
and out of a live mid-level API object (the tables of tpu_fc's layers for
tensorflow-recommenders and keras-rs), by table name.
"""
from __future__ import annotations

import json
import os
import re
from typing import Any, Mapping

import numpy as np

from tpu_fc import _tf_internals as internals
from tpu_fc import mid_level as mid_level_lib
from tpu_fc import naming
from tpu_fc import optimizers
from tpu_fc import spec as spec_lib
from tpu_fc.estimator import checkpoints
from tpu_fc._tf import tf

EMBEDDING_KEY = 'embedding'
TENSOR_CORE_KEY = 'tensor_core'
DENSE_KEY = 'dense'
GLOBAL_STEP_KEY = 'global_step'
LEGACY_NAMES_KEY = 'legacy_table_names'
_ATTRIBUTE_SUFFIX = '/.ATTRIBUTES/VARIABLE_VALUE'
_OBJECT_GRAPH_KEY = '_CHECKPOINTABLE_OBJECT_GRAPH'
_GLOBAL_STEP_NAME = 'global_step'
_MID_LEVEL_PREFIX = 'ckpt'
_LEGACY_PREFIX = 'model.ckpt'


class CheckpointConversionError(ValueError):
  """A checkpoint that does not map onto the spec; nothing was written.

  Raised by the conversions for what cannot map (its message names the table,
  the variable and what to do), never silently dropped; a `ValueError`.
  """


def _check_destination(source, destination, kind):
  """Refuses a destination whose `checkpoint` state file the conversion (or a
  save: `source` None) would repoint: the directory the source is read from,
  or, for a mid-level checkpoint, any directory that holds legacy checkpoints
  (a model_dir whose next `train()` would then fail)."""
  if tf.io.gfile.exists(destination) and not tf.io.gfile.isdir(destination):
    raise CheckpointConversionError(
        'Refusing to write the {} checkpoint into {}: it is a file. Choose a '
        'directory.'.format(kind, destination))
  same = source is not None and os.path.abspath(destination) == os.path.abspath(
      (source if tf.io.gfile.isdir(source) else os.path.dirname(source)) or '.')
  latest = (checkpoints.latest_checkpoint(destination)
            if tf.io.gfile.isdir(destination) else None)
  legacy_model_dir = (kind == 'mid-level' and latest is not None and not
                      _is_mid_level(n for n, _ in tf.train.list_variables(latest)))
  if same or legacy_model_dir:
    raise CheckpointConversionError(
        'Refusing to write the {} checkpoint into {}: it is {}. Choose a new '
        'directory.'.format(
            kind, destination, 'the directory {} is read from'.format(source)
            if same else 'a legacy model_dir (its checkpoint {})'.format(latest)))


# Reading -----------------------------------------------------------------------


def checkpoint_prefix(path):
  """The checkpoint prefix for a model_dir (its latest) or a prefix."""
  if tf.io.gfile.isdir(path):
    latest = checkpoints.latest_checkpoint(path)
    if latest is None:
      raise CheckpointConversionError(
          'No checkpoint found in directory {}.'.format(path))
    return latest
  if not tf.io.gfile.exists(path + '.index'):
    raise CheckpointConversionError(
        'No checkpoint at {} (expected {}.index).'.format(path, path))
  return path


def _read(path):
  """(prefix, {name: numpy value}) of every tensor in the checkpoint."""
  prefix = checkpoint_prefix(path)
  reader = tf.train.load_checkpoint(prefix)
  names = sorted(reader.get_variable_to_shape_map())
  return prefix, {name: reader.get_tensor(name) for name in names
                  if name != _OBJECT_GRAPH_KEY}


def is_mid_level_checkpoint(prefix):
  """Whether the checkpoint at `prefix` holds mid-level `embedding/...` objects."""
  return _is_mid_level(
      tf.train.load_checkpoint(prefix).get_variable_to_shape_map())


def _is_object_based(path):
  """Whether the checkpoint at `path` was written by `tf.train.Checkpoint`."""
  return _OBJECT_GRAPH_KEY in tf.train.load_checkpoint(
      checkpoint_prefix(path)).get_variable_to_shape_map()


def _is_mid_level(names):
  return any(name.startswith(EMBEDDING_KEY + '/') and
             name.endswith(_ATTRIBUTE_SUFFIX) for name in names)


def _object_key(*path):
  """`tf.train.Checkpoint` key of a variable reached by `path` of child names."""
  return '/'.join(internals.escape_checkpoint_name(part)
                  for part in path) + _ATTRIBUTE_SUFFIX


def _children(values, parent):
  """{child name: value} of the variables directly below object `parent`.

  Names are unescaped as TF escapes them in keys ('.' as '..', '/' as '.S').
  """
  prefix = parent + '/'
  return {re.sub(r'\.([.S])', lambda m: '.' if m.group(1) == '.' else '/',
                 key[len(prefix):-len(_ATTRIBUTE_SUFFIX)]): value
          for key, value in values.items()
          if key.startswith(prefix) and key.endswith(_ATTRIBUTE_SUFFIX)
          and '/' not in key[len(prefix):-len(_ATTRIBUTE_SUFFIX)]}


def _legacy_name(table, layout, recorded):
  """`table`'s legacy name: `recorded`'s, else the name TPUEstimator gave it in
  a `DenseFeatures` model."""
  if recorded.get(table.name):
    return recorded[table.name]
  column = layout.features_of(table.name)[0].column
  return table.name if column is None else naming.default_legacy_table_name(
      column)


def _name_matches(name, table, layout):
  """Whether checkpoint variable `name` can be `table` (any enclosing scope)."""
  column = layout.features_of(table.name)[0].column
  if column is None:
    return naming.is_table_variable(name, table.name)
  return naming.is_column_variable(name, column)


def _check_table_names(table_names, tables, owner='the spec'):
  """Refuses `table_names` keys that are not `tables` (a misspelling would
  otherwise leave its table to the default name)."""
  unknown = sorted(set(table_names or {}) - set(tables))
  if unknown:
    raise CheckpointConversionError(
        'table_names (--table-name) names {}, which {} has no table of; '
        'its tables are {}.'.format(unknown, owner, sorted(tables)))


def _find_legacy_names(values, layout, table_names):
  """Table name -> its legacy variable name in `values` (exactly one match)."""
  found = {}
  for table in layout.tables:
    if table.name in table_names:
      if table_names[table.name] not in values:
        raise CheckpointConversionError(
            'Table {}: table_names (--table-name) gives it the checkpoint '
            'variable {!r}, which the checkpoint does not hold; its variables of '
            'rank 2 are {}.'.format(
                table.name, table_names[table.name],
                sorted(n for n, v in values.items() if np.ndim(v) == 2)))
      candidates = [table_names[table.name]]
    else:
      candidates = [name for name, value in values.items()
                    if np.ndim(value) == 2 and _name_matches(name, table, layout)]
    if len(candidates) != 1:
      raise CheckpointConversionError(
          'Table {} (feature(s) {}): expected one checkpoint variable for it, '
          'found {}. Name it with table_names={{{!r}: <checkpoint name>}} '
          '(--table-name {}=<checkpoint name>).'.format(
              table.name, [f.name for f in layout.features_of(table.name)],
              candidates or 'none', table.name, table.name))
    found[table.name] = candidates[0]
  return found


def _check_shape(table, name, value):
  expected = (table.vocabulary_size, table.dimension)
  if tuple(np.shape(value)) != expected:
    raise CheckpointConversionError(
        'Table {}: checkpoint variable {} has shape {}, but the table is '
        '[vocabulary_size, dimension] = {} (vocabulary or dimension '
        'changed?).'.format(table.name, name, list(np.shape(value)),
                            list(expected)))


def _table_variable_names(values, legacy_name):
  """Checkpoint names below a table (its slots, whichever optimizer made them)."""
  return sorted(name for name in values if name.startswith(legacy_name + '/'))


# Legacy -> mid-level -------------------------------------------------------------


def legacy_table_values(spec, source):
  """{table name: value} of the spec's embedding-core tables in a legacy checkpoint
  (what serving needs of it: no slots, nothing written)."""
  _, values = _read(source)
  layout = spec.embedding_layout()
  names = _find_legacy_names(values, layout, {})
  for table in layout.tables:
    _check_shape(table, names[table.name], values[names[table.name]])
  return {table: values[name] for table, name in names.items()}


def _built(embedding):
  """`embedding` (a mid-level API object), built; its tables and slots by
  checkpoint child name."""
  embedding.embedding_tables  # pylint: disable=pointless-statement  (builds them)
  children = tf.train.TrackableView(embedding).children(embedding)
  return embedding, {name: child for name, child in children.items()
                     if isinstance(child, tf.Variable)}


def _mid_level_table_values(table, parameters, values, legacy_name, fresh_slots):
  """({mid-level child name: value}, legacy names used) of one table and its
  slots (`parameters` None: none restored)."""
  _check_shape(table, legacy_name, values[legacy_name])
  if parameters is None:
    return {table.name: values[legacy_name]}, [legacy_name]
  below = _table_variable_names(values, legacy_name)
  expected = {'{}/{}'.format(legacy_name, suffix): slot
              for suffix, slot in parameters.SLOTS}
  missing = sorted(set(expected) - set(values))
  if missing and not (fresh_slots and len(missing) == len(expected)):
    raise CheckpointConversionError(
        'Table {}: the checkpoint lacks the {} slot variable(s) {} (it has {}).'
        ' Convert it with fresh_slots=True (convert-checkpoint --fresh-slots) '
        'to start the optimizer state anew.'.format(
            table.name, type(parameters).__name__, missing, below))
  unexpected = sorted(set(below) - set(expected))
  if unexpected and not missing:
    raise CheckpointConversionError(
        'Table {}: the checkpoint holds {}, which {} has no slot for.'.format(
            table.name, unexpected, type(parameters).__name__))
  initial = parameters.slot_initial_values()
  table_values = {table.name: values[legacy_name]}
  for name, slot in expected.items():
    table_values['{}/{}'.format(table.name, slot)] = (
        values[name] if name in values else
        np.full_like(values[legacy_name], initial[slot]))
  return table_values, [legacy_name] + list(expected)


def to_mid_level_checkpoint(spec: spec_lib.EmbeddingConfigSpec, source: str,
                            destination: str,
                            table_names: Mapping[str, str] | None = None,
                            fresh_slots: bool = False) -> str:
  """Converts a legacy checkpoint into a mid-level object checkpoint.

  What `tf.train.Checkpoint(embedding=TPUEmbedding(...))` reads:
  `embedding/<table>` and its slots for the embedding-core tables of
  `spec.to_mid_level()`, `tensor_core/<table>` for its tensor-core tables;
  every other variable under its legacy name in `dense`, with `global_step`
  and the legacy table names, so `to_legacy_checkpoint` gives the original
  back bit for bit.

  Args:
    spec: the model's `EmbeddingConfigSpec`.
    source: a legacy checkpoint prefix, or a model_dir (its latest checkpoint).
    destination: directory for the mid-level checkpoint (`ckpt-<global step>`).
    table_names: optional {table name: legacy variable name}, for tables whose
      legacy name cannot be found unambiguously.
    fresh_slots: start the embedding optimizer's slots at their initial values
      when the source has none of them (e.g. a `use_tpu=False` checkpoint, whose
      tables were trained by the model's optimizer); other variables under the
      table are then carried as dense variables.

  Returns:
    The written checkpoint prefix.

  Raises:
    CheckpointConversionError: no checkpoint at `source`, a source that is
      already mid-level, a destination that is a file, the directory read
      from or a legacy model_dir, a `table_names` key that is no table of the
      spec, a table missing, ambiguous or of another shape, a slot of the
      target optimizer missing (without `fresh_slots`), or slots the target
      optimizer lacks.
    NotImplementedError: an optimizer without a mid-level twin
      (`EmbeddingConfigSpec.to_mid_level`).
  """
  _check_destination(source, destination, 'mid-level')
  _, values = _read(source)
  if _is_mid_level(values):
    raise CheckpointConversionError(
        '{} is already a mid-level (object-based) checkpoint.'.format(source))
  config = spec.to_mid_level()  # fails first if no twin
  embedding, variables = _built(tf.tpu.experimental.embedding.TPUEmbedding(
      config.feature_config, config.optimizer))
  layout = spec.embedding_layout()
  _check_table_names(table_names, [t.name for t in spec.layout().tables])
  table_names = dict(table_names or {})
  legacy_names = _find_legacy_names(values, layout, table_names)
  new_values, carried = {}, set()
  for table in layout.tables:
    table_values, sources = _mid_level_table_values(
        table, table.optimizer or spec.optimization_parameters, values,
        legacy_names[table.name], fresh_slots)
    new_values.update(table_values)
    carried.update(sources)
  tensor_core = spec.tensor_core_layout()
  if tensor_core.tables:
    # Tables the model's optimizer trains: their slots (legacy `<table>/...`)
    # stay dense; `TPUEmbeddingV0`'s own slots keep their initial values.
    tensor_core_embedding, tensor_core_variables = _built(
        mid_level_lib.TPUEmbeddingV0(config.tensor_core_feature_config,
                                     config.optimizer))
    tensor_core_names = _find_legacy_names(values, tensor_core, table_names)
    for table in tensor_core.tables:
      name = tensor_core_names[table.name]
      _check_shape(table, name, values[name])
      tensor_core_variables[table.name].assign(values[name])
      carried.add(name)
    legacy_names.update(tensor_core_names)
  dense = {name: value for name, value in values.items()
           if name not in carried and name != _GLOBAL_STEP_NAME
           and not naming.is_dummy(name)}
  global_step = values.get(_GLOBAL_STEP_NAME, np.int64(0))
  for name, variable in variables.items():
    variable.assign(new_values[name])
  objects = {TENSOR_CORE_KEY: tensor_core_embedding} if tensor_core.tables else {}
  return _save_mid_level(destination, global_step, **objects, **{
      EMBEDDING_KEY: embedding,
      DENSE_KEY: {name: tf.Variable(value, name=name.replace('/', '_'))
                  for name, value in dense.items()},  # legacy names as keys
      LEGACY_NAMES_KEY: tf.Variable(json.dumps(legacy_names, sort_keys=True)),
  })


def _save_mid_level(destination, global_step, **objects):
  """`objects` and `global_step` in `destination/ckpt-<global step>`."""
  checkpoint = tf.train.Checkpoint(**objects, **{
      GLOBAL_STEP_KEY: tf.Variable(global_step, dtype=tf.int64)})
  manager = tf.train.CheckpointManager(
      checkpoint, destination, max_to_keep=None,
      checkpoint_name=_MID_LEVEL_PREFIX)
  return manager.save(checkpoint_number=int(global_step))


# Mid-level -> legacy -------------------------------------------------------------


def _checked_mid_level_table(embedded, table, parameters, tables, source):
  """{mid-level child name: value} of `table` and its `parameters`' slots
  (None: no slots read) among the `embedding/` children of a mid-level
  checkpoint; refused if missing, of another shape, or with slots of another
  optimizer (children `<table>/<slot>` that are no table of `tables`)."""
  if table.name not in embedded:
    raise CheckpointConversionError(
        'Table {} is not in the mid-level checkpoint {} (it has {}).'.format(
            table.name, source, sorted(embedded)))
  _check_shape(table, _object_key(EMBEDDING_KEY, table.name),
               embedded[table.name])
  table_values = {table.name: embedded[table.name]}
  if parameters is None:
    return table_values
  expected = ['{}/{}'.format(table.name, slot) for _, slot in parameters.SLOTS]
  missing = [name for name in expected if name not in embedded]
  if missing:
    raise CheckpointConversionError(
        'Table {}: the mid-level checkpoint lacks the {} slot {!r}.'.format(
            table.name, type(parameters).__name__,
            missing[0][len(table.name) + 1:]))
  others = {t.name for t in tables}
  unexpected = sorted(name for name in embedded
                      if name.startswith(table.name + '/') and
                      name not in expected and name not in others)
  if unexpected:
    raise CheckpointConversionError(
        'Table {}: the mid-level checkpoint holds the slot(s) {}, which {} has '
        'no slot for.'.format(table.name, unexpected,
                              type(parameters).__name__))
  table_values.update((name, embedded[name]) for name in expected)
  return table_values


def to_legacy_checkpoint(spec: spec_lib.EmbeddingConfigSpec, source: str,
                         destination: str,
                         table_names: Mapping[str, str] | None = None) -> str:
  """Converts a mid-level object checkpoint into a legacy (TPUEstimator) one.

  Table names are those recorded when the checkpoint was converted from legacy,
  else `table_names`, else the names a `DenseFeatures` model gives them.
  Returns the written prefix `destination/model.ckpt-<global step>`, with a
  `checkpoint` file so `TPUEstimator(model_dir=destination)` resumes from it.

  Args:
    spec: the model's `EmbeddingConfigSpec`.
    source: a mid-level checkpoint prefix, or a directory (its latest
      checkpoint), holding the tables under the root key `embedding`.
    destination: the model_dir to write to; its earlier checkpoints stay
      listed.
    table_names: optional {table name: legacy variable name}, taking
      precedence over the recorded names.

  Returns:
    The written checkpoint prefix.

  Raises:
    CheckpointConversionError: no checkpoint at `source`, a source that is
      not mid-level (also an object-based one without the `embedding` key), a
      destination that is a file or the directory read from, one holding a
      checkpoint of this global step or later, a `table_names` key that is no
      table of the spec, or a table, slot or tensor-core table missing or of
      another shape.
  """
  _check_destination(source, destination, 'legacy')
  _, values = _read(source)
  if not _is_mid_level(values):
    if _is_object_based(source):
      raise CheckpointConversionError(
          '{} is an object-based checkpoint, but its tables are not under the '
          'root key {!r} (its keys begin {}): save the TPUEmbedding as '
          'tf.train.Checkpoint({}=<the TPUEmbedding>, ...) to convert it.'.format(
              source, EMBEDDING_KEY, sorted({k.split('/')[0] for k in values}),
              EMBEDDING_KEY))
    raise CheckpointConversionError(
        '{} is not a mid-level (object-based) checkpoint: no {}/... '
        'variables.'.format(source, EMBEDDING_KEY))
  layout = spec.embedding_layout()
  recorded_key = _object_key(LEGACY_NAMES_KEY)
  recorded = (json.loads(values[recorded_key].decode())
              if recorded_key in values else {})
  _check_table_names(table_names, [t.name for t in spec.layout().tables])
  recorded.update(table_names or {})
  embedded = _children(values, EMBEDDING_KEY)
  legacy = {}
  for table in layout.tables:
    parameters = table.optimizer or spec.optimization_parameters
    table_values = _checked_mid_level_table(embedded, table, parameters,
                                            layout.tables, source)
    legacy_name = _legacy_name(table, layout, recorded)
    legacy[legacy_name] = table_values[table.name]
    for suffix, slot in parameters.SLOTS:
      legacy['{}/{}'.format(legacy_name, suffix)] = table_values[
          '{}/{}'.format(table.name, slot)]
  dense = _children(values, DENSE_KEY)
  tensor_core = spec.tensor_core_layout()
  for table in tensor_core.tables:
    key = _object_key(TENSOR_CORE_KEY, table.name)
    legacy_name = _legacy_name(table, tensor_core, recorded)
    if key in values:
      _check_shape(table, key, values[key])
      legacy[legacy_name] = values[key]
    elif legacy_name not in dense:  # (converted before tensor_core/ existed)
      raise CheckpointConversionError(
          'Tensor-core table {} is not in the mid-level checkpoint {} (it has '
          '{}).'.format(table.name, source,
                        sorted(_children(values, TENSOR_CORE_KEY))))
  legacy.update(dense)
  global_step = values.get(_object_key(GLOBAL_STEP_KEY), np.int64(0))
  legacy[_GLOBAL_STEP_NAME] = np.int64(global_step)
  return _write_legacy(legacy, destination, int(global_step))


def _unwritten_prefix(destination, name, global_step):
  """(`destination/<name>-<global step>`, the checkpoints its `checkpoint`
  file lists), refused if the directory holds a checkpoint of this global
  step or later, which the write or the next training from it would
  overwrite."""
  prefix = os.path.join(destination, '{}-{}'.format(name, global_step))
  state = tf.train.get_checkpoint_state(destination)
  listed = list(state.all_model_checkpoint_paths) if state else []
  later = [path for path in sorted(set(listed + [prefix]))
           if tf.io.gfile.exists(path + '.index') and
           int(re.search(r'(\d*)$', path).group(1) or -1) >= global_step]
  if later:
    raise CheckpointConversionError(
        'Refusing to write {}: {} holds {}, of global step {} or later, which '
        'the write or the next training from it would overwrite. Choose a '
        'new directory.'.format(prefix, destination, later, global_step))
  return prefix, listed


def _write_legacy(values, destination, global_step):
  """A name-based checkpoint of `values`, as `Saver.save` writes it.

  The destination's earlier checkpoints stay listed in its `checkpoint` file;
  one of this global step or later is never overwritten (nor would training
  from the new one overwrite it).
  """
  tf.io.gfile.makedirs(destination)
  prefix, listed = _unwritten_prefix(destination, _LEGACY_PREFIX, global_step)
  with tf.Graph().as_default(), tf.device('/cpu:0'):
    placeholders = {name: tf.compat.v1.placeholder(
        tf.as_dtype(value.dtype), np.shape(value))
                    for name, value in values.items()}
    variables = {name: tf.compat.v1.Variable(placeholder, trainable=False,
                                             use_resource=True)
                 for name, placeholder in placeholders.items()}
    saver = tf.compat.v1.train.Saver(variables, max_to_keep=None,
                                     save_relative_paths=True)
    saver.recover_last_checkpoints(listed)
    with tf.compat.v1.Session() as session:
      session.run([v.initializer for v in variables.values()],
                  {placeholders[name]: value for name, value in values.items()})
      return saver.save(session, prefix, write_meta_graph=False)


# A mid-level API object's tables and slots -------------------------------------------


def _embedding_layout(embedding):
  """(layout, {mid-level child name: variable}) of a mid-level API object,
  built: its tables by their own names, each with the legacy parameters of
  its optimizer (None: it has none), and its tables and slots (`<table>`,
  `<table>/<slot>`), wherever a `slot_variable_creation_fn` put them."""
  _built(embedding)
  named = internals.flatten_with_joined_string_paths(
      internals.mid_level_feature_config(embedding))
  variables = {}
  for table, table_variables in internals.mid_level_variables(
      embedding).items():
    for slot, variable in table_variables.items():
      variables[table if slot == 'parameters' else '{}/{}'.format(
          table, slot)] = variable
  return spec_lib.layout_of_mid_level(dict(named)), variables


def _legacy_embedding_values(values, layout, spec, table_names):
  """{mid-level child name: value} of the tables of `layout` (an embedding's)
  and their slots in legacy checkpoint `values`, found by the naming rules
  or, with it, by `spec`."""
  legacy_names = _find_legacy_names(
      values, layout if spec is None else spec.embedding_layout(), table_names)
  new_values = {}
  for table in layout.tables:
    if table.name not in legacy_names:
      raise CheckpointConversionError(
          'Table {} of the embedding is not a table of the spec, whose tables '
          'are {}: give the spec that trained the checkpoint.'.format(
              table.name, sorted(legacy_names)))
    new_values.update(_mid_level_table_values(
        table, table.optimizer, values, legacy_names[table.name],
        fresh_slots=False)[0])
  return new_values


def restore_embedding(embedding: Any, checkpoint: str,
                      spec: spec_lib.EmbeddingConfigSpec | None = None,
                      table_names: Mapping[str, str] | None = None) -> int:
  """Loads a mid-level API object's tables and slots, by table name.

  From a legacy TPUEstimator checkpoint (tables found by tpu_fc's naming
  rules: `tbl_<embedding var name>`, as `spec.to_mid_level()` names them, is
  its column's table or its shared collection's, a dict-configured table is
  its own name; or by `spec` where those are ambiguous; slots by the legacy
  suffixes of the table's optimizer), or from a mid-level one (as
  `to_mid_level_checkpoint` or `save_embedding` write it).  All or nothing:
  every table and slot is checked before any is assigned.

  Args:
    embedding: a mid-level API object: `tpu_fc.mid_level.TPUEmbedding`, or
      TF's own class (e.g. `TPUEmbeddingForServing`); built if it is not.
      A table without an optimizer (a serving object's) takes its table
      alone.
    checkpoint: a checkpoint prefix, or a directory (its latest checkpoint).
    spec: the `EmbeddingConfigSpec` that trained a legacy checkpoint, which
      names its tables where the naming rules find none or several.
    table_names: optional {table name: legacy variable name}, for tables of
      a legacy checkpoint that neither finds.

  Returns:
    The checkpoint's global step (0 if it has none).

  Raises:
    CheckpointConversionError: no checkpoint at `checkpoint`; a table of the
      embedding missing from the checkpoint (or from the spec), ambiguous,
      of another shape or vocabulary; slots of another optimizer, or a slot
      missing; a `table_names` key that is no table of the embedding.  The
      message names the table (and variable); nothing was assigned.
  """
  _, values = _read(checkpoint)
  layout, variables = _embedding_layout(embedding)
  _check_table_names(table_names, [t.name for t in layout.tables],
                     owner='the embedding')
  if _is_mid_level(values):
    embedded = _children(values, EMBEDDING_KEY)
    new_values = {}
    for table in layout.tables:
      new_values.update(_checked_mid_level_table(
          embedded, table, table.optimizer, layout.tables, checkpoint))
    global_step = values.get(_object_key(GLOBAL_STEP_KEY), 0)
  else:
    new_values = _legacy_embedding_values(values, layout, spec,
                                          dict(table_names or {}))
    global_step = values.get(_GLOBAL_STEP_NAME, 0)
  for name, variable in variables.items():
    variable.assign(new_values[name])
  return int(global_step)


def save_embedding(embedding: Any, directory: str,
                   global_step: int | None = None) -> str:
  """Writes a mid-level API object's tables and slots in the mid-level layout.

  `embedding/<table>`, `embedding/<table>/<slot>` and `global_step`, as
  `to_mid_level_checkpoint` writes them (what `tf.train.Checkpoint(
  embedding=<a TPUEmbedding>)` reads, slots a Keras optimizer holds
  included), so `to_legacy_checkpoint` (`convert-checkpoint --to legacy`)
  turns it into a TPUEstimator checkpoint and `restore_embedding` reads it.

  Args:
    embedding: a mid-level API object (`tpu_fc.mid_level.TPUEmbedding`, or
      TF's own class); built if it is not (a pipelined step's parked update
      is applied first, as a checkpoint of it would).
    directory: where to write `ckpt-<global step>`.
    global_step: the global step to record (None: 0).

  Returns:
    The written checkpoint prefix.

  Raises:
    CheckpointConversionError: `directory` is a file, a legacy model_dir, or
      holds a checkpoint of this global step or later (never overwritten).
  """
  global_step = 0 if global_step is None else int(global_step)
  _check_destination(None, directory, 'mid-level')
  _unwritten_prefix(directory, _MID_LEVEL_PREFIX, global_step)
  _, variables = _embedding_layout(embedding)
  # (TF's mid-level child names as keys)
  return _save_mid_level(directory, global_step, **{EMBEDDING_KEY: variables})


# Inspection ------------------------------------------------------------------------


def _slot_signatures():
  """Slot suffixes (legacy) and slot names (mid-level) -> optimizer description,
  of every optimizer class (the first of those with one signature)."""
  legacy, mid_level = {}, {}
  for parameters in optimizers.optimizer_classes():
    name = parameters.__name__[:-len('Parameters')]
    legacy.setdefault(frozenset(s for s, _ in parameters.SLOTS),
                      name + ' (TPU embedding)')
    if parameters.MID_LEVEL is not None:
      # Only optimizers with a mid-level twin write mid-level checkpoints
      # (ProximalAdagrad's accumulators alone would read as Adagrad's).
      mid_level.setdefault(frozenset(m for _, m in parameters.SLOTS), name)
  legacy.update({
      # (the TPU's SGD has no slots, nor has a model-trained table's SGD)
      frozenset(): 'no slots: StochasticGradientDescent (TPU embedding, or '
                   'the model optimizer with use_tpu=False)',
      frozenset({'Adam', 'Adam_1'}): 'Adam (model optimizer, use_tpu=False)',
      frozenset({'RMSProp', 'RMSProp_1'}): 'RMSProp (model optimizer, use_tpu=False)',
  })
  return legacy, mid_level


def _file_size(prefix):
  directory, base = os.path.split(prefix)
  return sum(tf.io.gfile.stat(os.path.join(directory, name)).length
             for name in tf.io.gfile.listdir(directory or '.')
             if name.startswith(base + '.'))


def inspect_checkpoint(path: str,
                       spec: spec_lib.EmbeddingConfigSpec | None = None
                       ) -> dict[str, Any]:
  """What a checkpoint holds: format, global step, tables with slots, dense variables.

  Without a spec, tables are the rank-2 variables named like feature-column tables
  (`.../embedding_weights`, `..._shared_embedding`) or owning TPU-only slots
  (of an optimizer class with `TPU_ONLY_SLOTS`: `Adam/m`, `RMSProp/ms`, ...);
  with one, exactly the spec's tables.

  Args:
    path: a checkpoint prefix, or a model_dir (its latest checkpoint); legacy
      or mid-level.
    spec: the model's `EmbeddingConfigSpec`, which names the tables of a
      legacy checkpoint; None: found by their names, as above.

  Returns:
    A dict (what `tpu-fc inspect --json` prints): `checkpoint` (the prefix),
    `format` ('legacy', 'mid-level' or 'object-based, no embedding/ key'),
    `global_step` (None if absent), `tables` (each `name`, `shape`, `slots`:
    slot name -> shape, and `optimizer`: the one whose slots these are, or
    'unknown (...)'), `dense_variables` (each `name`, `shape`, `dtype`) and
    `size_bytes` (of the checkpoint's files).

  Raises:
    CheckpointConversionError: no checkpoint at `path`, or, with a spec, a
      table of it missing or ambiguous in the checkpoint.
  """
  prefix, values = _read(path)
  mid_level = _is_mid_level(values)
  legacy_signatures, mid_level_signatures = _slot_signatures()
  tables, table_variables = [], set()
  if mid_level:
    for key in (EMBEDDING_KEY, TENSOR_CORE_KEY):
      children = _children(values, key)
      # A table's slots are its children `<table>/<slot>`; names may hold '/'.
      slot_names = {c for c in children for t in children
                    if c.startswith(t + '/')}
      for name in sorted(set(children) - slot_names):
        slots = {c[len(name) + 1:]: list(np.shape(children[c]))
                 for c in slot_names if c.startswith(name + '/')}
        tables.append(_table_entry(name, children[name], slots,
                                   mid_level_signatures))
      table_variables.update(k for k in values if k.startswith(key + '/'))
    dense = _children(values, DENSE_KEY)
    global_step = values.get(_object_key(GLOBAL_STEP_KEY))
  else:
    if spec is not None:
      layout = spec.embedding_layout()
      names = list(_find_legacy_names(values, layout, {}).values())
    else:
      names = [n for n, v in values.items() if np.ndim(v) == 2 and
               not naming.is_dummy(n) and _looks_like_table(n, values)]
    for name in sorted(names):
      below = _table_variable_names(values, name)
      slots = {n[len(name) + 1:]: list(np.shape(values[n])) for n in below}
      tables.append(_table_entry(name, values[name], slots, legacy_signatures))
      table_variables.update([name] + below)
    dense = {n: v for n, v in values.items() if n not in table_variables
             and n != _GLOBAL_STEP_NAME}
    global_step = values.get(_GLOBAL_STEP_NAME)
  return {
      'checkpoint': prefix,
      'format': ('mid-level' if mid_level else
                 'object-based, no embedding/ key' if _is_object_based(prefix)
                 else 'legacy'),
      'global_step': None if global_step is None else int(global_step),
      'tables': tables,
      'dense_variables': [
          {'name': n, 'shape': list(np.shape(v)), 'dtype': str(np.asarray(v).dtype)}
          for n, v in sorted(dense.items())],
      'size_bytes': _file_size(prefix),
  }


def _looks_like_table(name, values):
  """A feature-column table name, or a variable with slot suffixes only TPU
  embedding optimizers write (`TPU_ONLY_SLOTS`: model optimizers differ, or
  have no such optimizer)."""
  return naming.is_column_table(name) or any(
      name + '/' + suffix in values
      for parameters in optimizers.optimizer_classes()
      if parameters.TPU_ONLY_SLOTS for suffix, _ in parameters.SLOTS)


def _table_entry(name, value, slots, signatures):
  return {
      'name': name,
      'shape': list(np.shape(value)),
      'slots': slots,
      'optimizer': signatures.get(frozenset(slots),
                                  'unknown (slots {})'.format(sorted(slots))),
  }


def format_inspection(report):
  """Human-readable lines of `inspect_checkpoint`'s report."""
  lines = ['checkpoint:  {}'.format(report['checkpoint']),
           'format:      {}'.format(report['format']),
           'global step: {}'.format(report['global_step']),
           'size:        {} bytes'.format(report['size_bytes']),
           'tables ({}):'.format(len(report['tables']))]
  for table in report['tables']:
    lines.append('  {}  {}  optimizer: {}'.format(
        table['name'], table['shape'], table['optimizer']))
    lines.extend('    slot {}  {}'.format(slot, shape)
                 for slot, shape in sorted(table['slots'].items()))
  lines.append('dense variables ({}):'.format(len(report['dense_variables'])))
  lines.extend('  {}  {}  {}'.format(v['name'], v['shape'], v['dtype'])
               for v in report['dense_variables'])
  return '\n'.join(lines)
