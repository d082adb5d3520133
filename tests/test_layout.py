"""The package layout docs/layout.md describes: no import cycle between
tpu_fc's parts; the tests share only tests/harness/.

A part is a top-level module (`tpu_fc/columns.py`) or subpackage
(`tpu_fc/lookup/`); configs (columns, spec, optimizers) know no backend.  Inside
`lookup/`, the input module and the engine stand below their users: the engine
is math over variables its owners create and name.
"""
import ast
import collections
import functools
import os
import re
import textwrap

import tpu_fc

PACKAGE = os.path.dirname(tpu_fc.__file__)


def _part(module):
  """'tpu_fc.lookup.host_engine' -> 'tpu_fc.lookup'."""
  return '.'.join(module.split('.')[:2])


def _imported(node):
  """The tpu_fc modules an import statement names."""
  if isinstance(node, ast.Import):
    return [alias.name for alias in node.names if alias.name.startswith('tpu_fc')]
  if isinstance(node, ast.ImportFrom) and (node.module or '').startswith('tpu_fc'):
    modules = []
    for alias in node.names:
      full = node.module + '.' + alias.name
      path = os.path.join(PACKAGE, *full.split('.')[1:])
      modules.append(full if os.path.exists(path + '.py') or os.path.isdir(path)
                     else node.module)
    return modules
  return []


@functools.lru_cache(maxsize=None)  # the sources hold still while tests run
def _modules():
  """{module name: its syntax tree} of every tpu_fc module (parsed once)."""
  modules = {}
  for folder, _, files in os.walk(PACKAGE):
    for name in files:
      if not name.endswith('.py'):
        continue
      relative = os.path.relpath(os.path.join(folder, name), PACKAGE)
      with open(os.path.join(folder, name)) as f:
        modules['tpu_fc.' + relative[:-3].replace(os.sep, '.')] = ast.parse(
            f.read())
  return modules


def _is_type_checking(node):
  return isinstance(node, ast.If) and ast.unparse(node.test).endswith(
      'TYPE_CHECKING')


def _run_time_nodes(tree):
  """`ast.walk(tree)` without annotations and `if TYPE_CHECKING:` blocks
  (tpu_fc's annotations are strings, `from __future__ import annotations`):
  they name types for the type checker and run nothing."""
  pending = [tree]
  while pending:
    node = pending.pop()
    yield node
    for field, value in ast.iter_fields(node):
      for child in value if isinstance(value, list) else [value]:
        if (isinstance(child, ast.AST) and field not in ('annotation', 'returns')
            and not _is_type_checking(child)):
          pending.append(child)


def _module_imports(module):
  """The tpu_fc modules `module` imports."""
  return {imported for node in _run_time_nodes(_modules()[module])
          for imported in _imported(node)}


def _part_imports():
  """{part: the other parts it imports} (the package itself left out)."""
  imports = collections.defaultdict(set)
  for module, tree in _modules().items():
    for node in _run_time_nodes(tree):
      for imported in _imported(node):
        if _part(imported) not in (_part(module), 'tpu_fc'):
          imports[_part(module)].add(_part(imported))
  return imports


def test_no_part_imports_itself_back():
  imports = _part_imports()

  def reachable(part):
    seen, pending = set(), list(imports[part])
    while pending:
      other = pending.pop()
      if other not in seen:
        seen.add(other)
        pending.extend(imports[other])
    return seen

  assert not [part for part in list(imports) if part in reachable(part)]


def test_configs_know_no_backend():
  imports = _part_imports()
  for config in ('tpu_fc.columns', 'tpu_fc.spec', 'tpu_fc.optimizers'):
    assert not imports[config] & {'tpu_fc.lookup', 'tpu_fc.estimator'}, config


def test_backends_know_no_driver():
  """Backends get what the driver has for them as arguments (`aggregate_rows`),
  and the mode flag they read lives in a module that imports no part."""
  imports = _part_imports()
  assert 'tpu_fc.estimator' not in imports['tpu_fc.lookup']
  assert not imports['tpu_fc.build_context']


def test_the_estimator_core_knows_no_tpu():
  """`tpu_fc/estimator/` apart from `tpu/` is the TPU-agnostic Estimator, as
  tensorflow_estimator laid it out; the TPU layer builds on it (the package's
  `__init__` only re-exports the public names of both)."""
  folder = os.path.join(PACKAGE, 'estimator')
  for name in sorted(os.listdir(folder)):
    if not name.endswith('.py') or name == '__init__.py':
      continue
    with open(os.path.join(folder, name)) as f:
      tree = ast.parse(f.read())
    imported = [module for node in _run_time_nodes(tree)
                for module in _imported(node)]
    assert not [m for m in imported
                if m.startswith('tpu_fc.estimator.tpu')], name


def test_the_estimator_core_knows_no_embedding():
  """The core (`tpu_fc/estimator/` but `tpu/` and `head/`) imports none of
  the embedding's parts: the TPU layer partitions its tables itself and hands
  down what it needs of the core (its row updates through
  `SyncReplicas.aggregate_rows`, the explanation of its failed input checks)."""
  embedding = {'tpu_fc.lookup', 'tpu_fc.naming', 'tpu_fc.spec',
               'tpu_fc.columns', 'tpu_fc.mid_level'}
  core = {module: tree for module, tree in _modules().items()
          if module.startswith('tpu_fc.estimator.') and not module.startswith(
              ('tpu_fc.estimator.tpu.', 'tpu_fc.estimator.head.'))}
  assert 'tpu_fc.estimator.distributed' in core
  for module, tree in core.items():
    imported = {_part(name) for node in _run_time_nodes(tree)
                for name in _imported(node)}
    assert not imported & embedding, (module, sorted(imported & embedding))


def test_inputs_and_the_engine_stand_below_their_users():
  """`inputs` needs only TensorFlow (its internals through their one
  module); the engine only the inputs, the update rules and their reference;
  naming and variables are the owners' (the estimator's backend, the
  mid-level class)."""
  assert _module_imports('tpu_fc.lookup.inputs') <= {'tpu_fc._tf',
                                                     'tpu_fc._tf_internals'}
  assert _module_imports('tpu_fc.lookup.host_engine') <= {
      'tpu_fc._tf', 'tpu_fc._tf_internals', 'tpu_fc.reference',
      'tpu_fc.lookup.inputs',
      'tpu_fc.lookup.sparse_update'}
  for owner in ('tpu_fc.lookup.backends', 'tpu_fc.mid_level'):
    assert 'tpu_fc.lookup.host_engine' in _module_imports(owner), owner


def test_annotations_name_only_configs_and_the_seam():
  """What a module imports for its annotations alone (`if TYPE_CHECKING:`)
  is TensorFlow, a config or the backend seam: the values that cross layers,
  never the layer above."""
  typed = {imported for tree in _modules().values()
           for block in ast.walk(tree) if _is_type_checking(block)
           for node in ast.walk(block) for imported in _imported(node)}
  assert typed and typed <= {'tpu_fc._tf', 'tpu_fc.spec', 'tpu_fc.optimizers',
                             'tpu_fc.lookup.base'}


def test_the_engine_creates_no_variables():
  names = {node.attr if isinstance(node, ast.Attribute) else node.id
           for node in _run_time_nodes(_modules()['tpu_fc.lookup.host_engine'])
           if isinstance(node, (ast.Attribute, ast.Name))}
  assert not names & {'get_variable', 'Variable', 'VarHandleOp',
                      'create_slot_variables', 'naming'}


TESTS = os.path.dirname(os.path.abspath(__file__))


@functools.lru_cache(maxsize=None)
def _test_modules(folder=TESTS, prefix='test_'):
  """{path: syntax tree} of every test module, tests/test_*.py (or another
  `folder`'s `prefix`*.py), parsed once."""
  modules = {}
  for name in sorted(os.listdir(folder)):
    if name.startswith(prefix) and name.endswith('.py'):
      with open(os.path.join(folder, name)) as f:
        modules[os.path.join(folder, name)] = ast.parse(f.read())
  return modules


def _imported_modules(tree):
  """The top-level modules a syntax tree imports, in its statements or in
  the source of a script it runs (a string with an import line)."""
  imported = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      imported.update(alias.name.split('.')[0] for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.module:
      imported.add(node.module.split('.')[0])
    elif isinstance(node, ast.Constant) and isinstance(node.value, str):
      imported.update(re.findall(r'^\s*(?:import|from)\s+(\w+)', node.value,
                                 re.M))
  return imported


def test_imports_are_found_in_statements_and_in_script_sources():
  """What `test_no_test_module_imports_another` reads, on the two ways a test
  module imported another (a statement, and a script run in a process)."""
  tree = ast.parse(textwrap.dedent('''
      import numpy as np
      from test_peer import BATCH
      def f():
        import test_other.sub as t
      SCRIPT = """
      import tpu_fc
        from test_script import run
      """
      TEXT = 'not an import test_text'
      '''))
  assert _imported_modules(tree) == {'numpy', 'test_peer', 'test_other',
                                     'tpu_fc', 'test_script'}


def test_the_library_never_imports_the_benchmarks_plotting_library():
  """matplotlib is the benchmarks' (the `bench` extra), not tpu_fc's."""
  assert not [module for module, tree in _modules().items()
              if 'matplotlib' in _imported_modules(tree)]


def test_no_test_module_imports_another():
  """What tests share is in tests/harness/; a test module imports none of
  its peers, nor do the scripts tests run (tests/scripts/, and the scripts
  test modules write: they import the harness)."""
  peers = {os.path.basename(path)[:-3] for path in _test_modules()}
  sources = dict(_test_modules(),
                 **_test_modules(os.path.join(TESTS, 'scripts'), prefix=''))
  for name, tree in sources.items():
    imported = _imported_modules(tree)
    assert not imported & peers, (name, sorted(imported & peers))


def test_test_modules_run_processes_through_the_harness():
  """`harness.scripts` runs them, checking the test's `subprocess` marker."""
  spawning = {'run', 'Popen', 'call', 'check_call', 'check_output', 'system'}
  for name, tree in _test_modules().items():
    calls = [node.func for node in ast.walk(tree)
             if isinstance(node, ast.Call) and
             isinstance(node.func, ast.Attribute) and
             isinstance(node.func.value, ast.Name) and
             node.func.value.id in ('subprocess', 'os')]
    assert not [f'{call.value.id}.{call.attr}' for call in calls
                if call.attr in spawning], name
