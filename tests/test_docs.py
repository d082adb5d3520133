"""The docs say what the code is: docs/layout.md names every module, and the
README keeps to what a new user needs."""
import os
import re

import tpu_fc

PACKAGE = os.path.dirname(tpu_fc.__file__)
REPO = os.path.dirname(PACKAGE)


def _modules():
  """Every module of tpu_fc, as 'tpu_fc/a/b.py' (package `__init__`s aside)."""
  found = set()
  for folder, _, files in os.walk(PACKAGE):
    for name in files:
      if name.endswith('.py') and name != '__init__.py':
        found.add(os.path.relpath(os.path.join(folder, name), REPO))
  return found


def _documented():
  """The modules docs/layout.md's table names: a full path, or a file name in
  a row whose first cell names its package ('tpu_fc/lookup/')."""
  with open(os.path.join(REPO, 'docs', 'layout.md')) as f:
    rows = [line for line in f if line.startswith('| `')]
  named = set()
  for row in rows:
    cells = row.split('|')
    paths = re.findall(r'`([\w/.]+)`', row)
    packages = re.findall(r'`(tpu_fc/[\w/]*/)`', cells[1])
    for path in paths:
      if path.startswith('tpu_fc/') and path.endswith('.py'):
        named.add(path)
      elif path.endswith('.py'):
        named.update(package + path for package in packages)
  return named


def test_the_layout_page_names_every_module_and_no_other():
  modules, documented = _modules(), _documented()
  assert not sorted(modules - documented), 'undocumented'
  assert not sorted(documented - modules), 'documented but absent'


def test_the_readme_is_short():
  assert os.path.getsize(os.path.join(REPO, 'README.md')) <= 6 * 1024
