"""The seams type-check: mypy (pinned in setup.cfg's `test` extra) on the
modules its `[mypy]` section lists, the values that cross layers
(`EmbeddingBackend`, the host engine, `Enqueued`, `BuiltGraph`, `Deployment`)
and the code that makes and reads them."""
import os

from mypy import api

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _mypy(monkeypatch, *arguments):
  """mypy's report and exit status, run as `mypy` in the repository root."""
  monkeypatch.chdir(ROOT)
  report, errors, status = api.run(['--config-file', 'setup.cfg', *arguments])
  return report + errors, status


def test_the_seams_type_check(monkeypatch):
  report, status = _mypy(monkeypatch)
  assert (status, report) == (0, 'Success: no issues found in 13 source files\n')


# Code misusing two seams: a BuiltGraph's before_save as a list, and an
# Enqueued field by a wrong name.
MISUSE = '''
from tpu_fc.estimator import model_fn
from tpu_fc.lookup import inputs

def build(spec):
  return model_fn.BuiltGraph(spec, before_save=[lambda: None])

def ids_checked(enqueued: inputs.Enqueued):
  return enqueued.checked
'''


def test_the_checker_sees_a_seam_misused(monkeypatch, tmp_path):
  """The configuration reaches the seams' types (no library or import
  setting turns them into Any)."""
  (tmp_path / 'misuse.py').write_text(MISUSE)
  report, status = _mypy(monkeypatch, str(tmp_path / 'misuse.py'))
  assert status == 1
  assert [line.split(': error: ')[1] for line in report.splitlines()
          if ': error: ' in line] == [
              'Argument "before_save" to "BuiltGraph" has incompatible type '
              '"list[Callable[[], None]]"; expected "tuple[Callable[[], Any], '
              '...]"  [arg-type]',
              '"Enqueued" has no attribute "checked"  [attr-defined]']
