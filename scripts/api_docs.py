"""Writes docs/api.md, tpu_fc's API reference, from the public names' docstrings and signatures.

TF 2.16 and newer ship no docs for the legacy API, so this reference is the one its
users have; it is generated, so it says what the code says.  Every name of
`tpu_fc.__all__` must be placed in a section below (a new public name without one
fails the run).  Importing the names loads TensorFlow, so run it under a lane:

    scripts/lane.sh latest python scripts/api_docs.py           # writes docs/api.md
    scripts/lane.sh latest python scripts/api_docs.py --check   # exit 1 if stale

`tests/test_api_docs.py` checks that the committed file is what this writes (a
section whose module needs a package the lane lacks, `NEEDS`, as committed).
Standard library only.
"""
import argparse
import difflib
import importlib
import importlib.util
import inspect
import os
import re
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUTPUT = os.path.join(ROOT, 'docs', 'api.md')

ESTIMATOR_MEMBERS = (
    'train', 'evaluate', 'predict', 'export_saved_model',
    'experimental_export_all_saved_models', 'model_fn', 'latest_checkpoint',
    'get_variable_names', 'get_variable_value', 'model_dir', 'config',
    'params', 'eval_dir')
# Every optimizer class, in tpu_fc.optimizers' order (loads TensorFlow).
_OPTIMIZERS = [cls.__name__ for cls in importlib.import_module(
    'tpu_fc.optimizers').ALL_OPTIMIZERS]

# (section title, the module whose docstring introduces it, its entries:
# (a public name's dotted path, the members documented below it[, the name
# shown for a base class whose members every public class shares])).
SECTIONS = (
    ('Feature columns', 'tpu_fc.columns', (
        ('tpu_fc.embedding_column', ()),
        ('tpu_fc.shared_embedding_columns', ()))),
    ('Optimizer parameters', 'tpu_fc.optimizers', (
        ('tpu_fc.optimizers._OptimizationParameters',
         ('to_mid_level', 'replace'), '*Parameters'),) + tuple(
             ('tpu_fc.' + name, ()) for name in _OPTIMIZERS)),
    ('The embedding spec', 'tpu_fc.spec', (
        ('tpu_fc.EmbeddingConfigSpec', ('to_mid_level', 'to_keras_rs')),
        ('tpu_fc.MidLevelConfig', ('scale_gradients', 'serving_feature_config',
                                   'split_features')),
        ('tpu_fc.TableConfig', ()),
        ('tpu_fc.FeatureConfig', ()))),
    ('TPUEstimator', 'tpu_fc.estimator', (
        ('tpu_fc.TPUEstimator', ESTIMATOR_MEMBERS),
        ('tpu_fc.TPUEstimatorSpec', ()),
        ('tpu_fc.EstimatorSpec', ()),
        ('tpu_fc.ModeKeys', ()),
        ('tpu_fc.RunConfig', ('replace',)),
        ('tpu_fc.estimator.run_config.RunConfig', ()),
        ('tpu_fc.TPUConfig', ()),
        ('tpu_fc.InputPipelineConfig', ()))),
    ('train_and_evaluate', 'tpu_fc.estimator.training', (
        ('tpu_fc.train_and_evaluate', ()),
        ('tpu_fc.TrainSpec', ()),
        ('tpu_fc.EvalSpec', ()),
        ('tpu_fc.Exporter', ('name', 'export')),
        ('tpu_fc.LatestExporter', ()),
        ('tpu_fc.FinalExporter', ()),
        ('tpu_fc.BestExporter', ()))),
    ('Legacy scripts unchanged', 'tpu_fc.legacy_names', (
        ('tpu_fc.install', ()),
        ('tpu_fc.uninstall', ()))),
    ('tpu_fc.mid_level', 'tpu_fc.mid_level', (
        ('tpu_fc.mid_level.TPUEmbedding', (
            'build', 'enqueue', 'dequeue', 'apply_gradients',
            'embedding_tables')),
        ('tpu_fc.mid_level.TPUEmbeddingV0', ()))),
    ('tpu_fc.export', 'tpu_fc.export', (
        ('tpu_fc.export.ServingInputReceiver', ()),
        ('tpu_fc.export.TensorServingInputReceiver', ()),
        ('tpu_fc.export.SupervisedInputReceiver', ()),
        ('tpu_fc.export.UnsupervisedInputReceiver', ()),
        ('tpu_fc.export.build_parsing_serving_input_receiver_fn', ()),
        ('tpu_fc.export.build_raw_serving_input_receiver_fn', ()),
        ('tpu_fc.export.build_raw_supervised_input_receiver_fn', ()),
        ('tpu_fc.export.build_supervised_input_receiver_fn_from_input_fn',
         ()))),
    ('tpu_fc.checkpoint_conversion', 'tpu_fc.checkpoint_conversion', (
        ('tpu_fc.checkpoint_conversion.to_mid_level_checkpoint', ()),
        ('tpu_fc.checkpoint_conversion.to_legacy_checkpoint', ()),
        ('tpu_fc.checkpoint_conversion.inspect_checkpoint', ()),
        ('tpu_fc.checkpoint_conversion.restore_embedding', ()),
        ('tpu_fc.checkpoint_conversion.save_embedding', ()),
        ('tpu_fc.checkpoint_conversion.CheckpointConversionError', ()))),
    ('tpu_fc.serving', 'tpu_fc.serving', (
        ('tpu_fc.serving.export_mid_level_saved_model', ()),)),
    ('tpu_fc.tfrs', 'tpu_fc.tfrs', (
        ('tpu_fc.tfrs.restore', ()),
        ('tpu_fc.tfrs.save', ()))),
    ('tpu_fc.keras_rs', 'tpu_fc.keras_rs', (
        ('tpu_fc.keras_rs.DistributedEmbedding', ()),
        ('tpu_fc.keras_rs.restore', ()),
        ('tpu_fc.keras_rs.save', ()))),
)
# The package a section's module needs that not every lane has (keras-rs:
# Keras 3 and Python >= 3.11, the latest lane's).  Without it, the section is
# kept as committed; the lanes with it check it.
NEEDS = {'tpu_fc.keras_rs': 'keras_rs'}

_SECTION_HEADER = re.compile(
    r'^(Args|Returns|Yields|Raises|Attributes)( \([^)]*\))?:$')
_LISTED_SECTIONS = ('Args', 'Raises', 'Attributes')
_MAX_LINE = 80


def resolve(path):
  """The object a dotted path names (a module, then attributes)."""
  parts = path.split('.')
  for split in range(len(parts), 0, -1):
    try:
      value = importlib.import_module('.'.join(parts[:split]))
    except ImportError:
      continue
    for name in parts[split:]:
      value = getattr(value, name)
    return value
  raise ImportError(path)


def documented_callables():
  """(shown name, object) of every entry and member shown with its signature
  (the members, not the class, of an entry shared by its subclasses), of the
  sections this lane can import."""
  for _, module, entries in SECTIONS:
    if not importable(module):
      continue
    for path, members, *shared_by in entries:
      owner = resolve(path)
      if not shared_by:
        yield path, owner
      for member in members:
        yield '{}.{}'.format(path, member), inspect.getattr_static(owner,
                                                                   member)


def has_constructor(value):
  """Whether `value` is called with arguments: a function, or a class whose
  tpu_fc code defines `__init__` or `__new__` (not a class of constants, nor
  an exception of TF's or Python's signature)."""
  return not inspect.isclass(value) or any(
      name in vars(base) for base in value.__mro__
      if base.__module__.startswith('tpu_fc')
      for name in ('__init__', '__new__'))


def _check_every_public_name_placed():
  import tpu_fc  # pylint: disable=g-import-not-at-top
  placed = {entry[0] for _, _, entries in SECTIONS for entry in entries}
  modules = {module for _, module, _ in SECTIONS}
  missing = [name for name in tpu_fc.__all__
             if 'tpu_fc.' + name not in placed | modules]
  if missing:
    raise SystemExit('scripts/api_docs.py places no section for the public '
                     'name(s) {}: add them to SECTIONS.'.format(missing))


class _Shown:
  """A value whose repr is `text` (a signature's annotation or default)."""

  def __init__(self, text):
    self.text = text

  def __repr__(self):
    return self.text


def _default_text(value, module):
  """A default as the code spells it, never a memory address."""
  if inspect.isfunction(value) or inspect.isclass(value):
    return value.__qualname__
  text = repr(value)
  if ' at 0x' not in text:
    return text
  names = [name for name, member in vars(module).items() if member is value]
  return names[0] if names else '<{}>'.format(type(value).__name__)


def _shown_signature(function, module):
  """`function`'s signature, annotations as written and defaults as spelled."""
  signature = inspect.signature(function)
  parameters = []
  for parameter in signature.parameters.values():
    changes = {}
    if parameter.annotation is not inspect.Parameter.empty:
      changes['annotation'] = _Shown(str(parameter.annotation))
    if parameter.default is not inspect.Parameter.empty:
      changes['default'] = _Shown(_default_text(parameter.default, module))
    parameters.append(parameter.replace(**changes))
  returns = signature.return_annotation
  return signature.replace(
      parameters=parameters,
      return_annotation=(returns if returns is inspect.Signature.empty
                         else _Shown(str(returns))))


def _format_signature(name, signature):
  """`name(...)`, one parameter a line when one line would be too long."""
  text = '{}{}'.format(name, signature)
  if len(text) <= _MAX_LINE:
    return text
  parameters = str(signature.replace(
      return_annotation=inspect.Signature.empty))[1:-1]
  returns = ('' if signature.return_annotation is inspect.Signature.empty
             else ' -> {}'.format(signature.return_annotation))
  return '{}(\n{}\n){}'.format(
      name, '\n'.join('    {},'.format(part)
                      for part in _top_level_parts(parameters)), returns)


def _top_level_parts(text):
  """`text` split at the commas outside brackets and quotes."""
  parts, depth, quote, current = [], 0, None, ''
  for character in text:
    if quote:
      quote = None if character == quote else quote
    elif character in '\'"':
      quote = character
    elif character in '([{':
      depth += 1
    elif character in ')]}':
      depth -= 1
    elif character == ',' and depth == 0:
      parts.append(current.strip())
      current = ''
      continue
    current += character
  return parts + [current.strip()]


def _indent(line):
  return len(line) - len(line.lstrip())


def _joined(lines):
  return ' '.join(line.strip() for line in lines)


def section_items(body):
  """The items of an Args-like section body: lines joined per item."""
  item_indent = min(_indent(line) for line in body if line.strip())
  items = []
  for line in body:
    if not line.strip():
      continue
    if _indent(line) == item_indent:
      items.append([line])
    else:
      items[-1].append(line)
  return [_joined(item) for item in items]


def _item_markdown(item):
  """'a, b: text' -> '- `a`, `b`: text'."""
  names, _, text = item.partition(': ')
  return '- {}: {}'.format(
      ', '.join('`{}`'.format(name.strip()) for name in names.split(',')),
      text)


def _paragraphs(body):
  """A section body's paragraphs, each one line."""
  paragraphs, current = [], []
  for line in body + ['']:
    if line.strip():
      current.append(line)
    elif current:
      paragraphs.append(_joined(current))
      current = []
  return paragraphs


def docstring_sections(doc):
  """[(header or None, its lines)] of a cleaned docstring: the text outside
  the Google-style sections (header None) and each section's body."""
  lines = doc.splitlines()
  sections, index = [], 0
  while index < len(lines):
    header = lines[index]
    index += 1
    if not _SECTION_HEADER.match(header):
      if sections and sections[-1][0] is None:
        sections[-1][1].append(header)
      else:
        sections.append((None, [header]))
      continue
    body = []  # indented lines, and blank ones followed by an indented one
    while index < len(lines) and (
        _indent(lines[index]) > 0 if lines[index].strip() else
        index + 1 < len(lines) and _indent(lines[index + 1]) > 0):
      body.append(lines[index])
      index += 1
    sections.append((header, body))
  return sections


def docstring_markdown(doc):
  """A Google-style docstring as Markdown: sections as bold headers and lists."""
  out = []
  for header, body in docstring_sections(doc):
    if header is None:
      out.extend(body)
      continue
    out.extend(['', '**{}**'.format(header), ''])
    if _SECTION_HEADER.match(header).group(1) in _LISTED_SECTIONS:
      out.extend(_item_markdown(item) for item in section_items(body))
    else:
      for paragraph in _paragraphs(body):
        out.extend([paragraph, ''])
    out.append('')
  return re.sub(r'\n{3,}', '\n\n', '\n'.join(out)).strip()


def _doc(value):
  return inspect.getdoc(value) or ''


def _constants(cls):
  """`NAME = value` lines of a class of constants (no constructor of its own)."""
  return ['{} = {!r}'.format(name, value) for name, value in vars(cls).items()
          if name.isupper()]


def _base_name(base):
  """How a class's base is shown: its public dotted name, 'namedtuple', or
  None (a private base, or `object`)."""
  if base is object or base.__qualname__.startswith('_'):
    return None
  if tuple in base.__bases__ and hasattr(base, '_fields'):
    return 'namedtuple'
  if base.__module__ == 'builtins':
    return base.__qualname__
  return '{}.{}'.format(base.__module__, base.__qualname__)


def _entry(path, members, shared_by=None):
  """The Markdown of one public name and its members; with `shared_by`, of
  the members a base class gives every class shown as `shared_by`."""
  value = resolve(path)
  module = sys.modules[getattr(value, '__module__', None) or
                       value.__name__.rpartition('.')[0]]
  if shared_by:
    out = ['### Every `{}`'.format(shared_by), '',
           docstring_markdown(_doc(value)), '']
    for member in members:
      out += _member(shared_by, value, member, module)
    return out
  out = ['### `{}`'.format(path), '']
  if inspect.isclass(value):
    bases = [name for name in map(_base_name, value.__bases__) if name]
    kind = 'class' + (' ({})'.format(', '.join(bases)) if bases else '')
    code = (_format_signature(path, _shown_signature(value, module).replace(
        return_annotation=inspect.Signature.empty))
            if has_constructor(value) else '\n'.join(_constants(value)))
  else:
    kind = 'function'
    code = _format_signature(path, _shown_signature(value, module))
  out += ['*{}*'.format(kind), '']
  if code:
    out += ['```python', code, '```', '']
  out += [docstring_markdown(_doc(value)), '']
  for member in members:
    out += _member(path.rpartition('.')[2], value, member, module)
  return out


def _member(owner_name, owner, name, module):
  static = inspect.getattr_static(owner, name)
  shown = '{}.{}'.format(owner_name, name)
  out = ['#### `{}`'.format(shown), '']
  if isinstance(static, property):
    returns = inspect.signature(static.fget).return_annotation
    out += ['*property*' + ('' if returns is inspect.Signature.empty
                            else ' -> `{}`'.format(returns)), '',
            docstring_markdown(_doc(static)), '']
    return out
  function = getattr(owner, name)
  signature = _shown_signature(function, module)
  if inspect.isfunction(inspect.getattr_static(owner, name)):
    signature = signature.replace(parameters=list(
        signature.parameters.values())[1:])  # (self)
  out += ['```python', _format_signature(shown, signature), '```', '',
          docstring_markdown(_doc(function)), '']
  return out


def _anchor(title):
  return re.sub(r'[^a-z0-9_ -]', '', title.lower()).replace(' ', '-')


def render():
  """The text of docs/api.md."""
  _check_every_public_name_placed()
  out = [
      '<!-- Generated by scripts/api_docs.py from the docstrings and '
      'signatures: do not edit; run',
      '     scripts/lane.sh latest python scripts/api_docs.py -->',
      '# tpu_fc API reference', '',
      'The public API of tpu_fc (the "Public API" of `DESIGN.md` in the '
      'shared project folder), as its docstrings and signatures say; errors '
      'whose texts are TF 2.15\'s are described by their condition. '
      'Annotations are as written in the code (`Any` where an argument is '
      'duck-typed).', '']
  out += ['- [{}](#{})'.format(title, _anchor(title))
          for title, _, _ in SECTIONS]
  out.append('')
  for title, module, entries in SECTIONS:
    if not importable(module):
      out += [_committed_section(title), '']
      continue
    out += ['## {}'.format(title), '',
            docstring_markdown(_doc(importlib.import_module(module))), '']
    for entry in entries:
      out += _entry(*entry)
  return re.sub(r'\n{3,}', '\n\n', '\n'.join(out)).rstrip() + '\n'


def importable(module):
  """Whether this lane has the package `module` needs (`NEEDS`)."""
  return module not in NEEDS or importlib.util.find_spec(NEEDS[module]) is not None


def _committed_section(title):
  """Section `title` of the committed docs/api.md, its heading to the next
  one's."""
  with open(OUTPUT) as f:
    found = re.search(r'^## {}\n.*?(?=^## |\Z)'.format(re.escape(title)),
                      f.read(), re.M | re.S)
  if found is None:
    raise SystemExit('docs/api.md has no section {!r} to keep: write it on a '
                     'lane with {}.'.format(title, NEEDS))
  return found.group(0).rstrip()


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument('--check', action='store_true',
                      help='exit 1 if docs/api.md is not what would be written')
  text = render()
  if parser.parse_args().check:
    with open(OUTPUT) as f:
      committed = f.read()
    if committed != text:
      sys.stdout.writelines(difflib.unified_diff(
          committed.splitlines(True), text.splitlines(True), 'docs/api.md',
          'generated'))
      return 1
    return 0
  with open(OUTPUT, 'w') as f:
    f.write(text)
  return 0


if __name__ == '__main__':
  sys.exit(main())
