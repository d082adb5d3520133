"""`python -m benchmarks` end to end on a tiny workload: JSON, report, chart and
verdict lines."""
import json
import re

import pytest

from harness import scripts

pytestmark = pytest.mark.subprocess
VERDICT = re.compile(
    r'^target (\S+): (n/a|\d+\.\d+) \(goal (>=|<=) ([\d.]+)\) (met|not met)')
# `python -m benchmarks` with matplotlib unimportable, as a plain
# `pip install -e .` leaves it.
WITHOUT_MATPLOTLIB = ('import runpy, sys; sys.modules["matplotlib"] = None; '
                      'runpy.run_module("benchmarks", run_name="__main__", '
                      'alter_sys=True)')


def _tiny_run(out, paths, reps, launch=('-m', 'benchmarks')):
  """The benchmark's --quick run of `paths` on 50-row tables and batches of
  16, written to `out`: the finished process."""
  finished = scripts.run_python(
      list(launch) + [
          '--quick', '--dims', '16', '--paths', *paths, '--no-serving',
          '--vocabulary-cap', '50', '--batch-size', '16', '--num-batches', '2',
          '--iterations-per-loop', '2', '--warmup-steps', '2',
          '--steps-per-rep', '2', '--reps', str(reps), '--out', str(out)],
      cwd=scripts.REPO, env=scripts.env())
  assert finished.returncode == 0, finished.stderr[-3000:]
  return finished


def test_tiny_run_writes_results_verdicts_and_a_chart_where_matplotlib_is(
    tmp_path):
  """One run without matplotlib (as a plain `pip install -e .` leaves it):
  its JSON, verdicts and report, with the one-line hint instead of a chart;
  then the same results written here, where matplotlib is: the chart, linked
  from the report."""
  finished = _tiny_run(tmp_path, ['raw', 'tpu_fc_embedding_core'], reps=5,
                       launch=('-c', WITHOUT_MATPLOTLIB))
  with open(tmp_path / 'results_quick.json') as results_file:
    results = json.load(results_file)
  (entry,) = results['training']
  assert entry['workload'] == 'zipf/one-hot/dim16'
  rates = {}
  for path in ('raw', 'tpu_fc_embedding_core'):
    result = entry['paths'][path]
    assert len(result['examples_per_s_reps']) == 5, result
    assert result['p90_step_ms'] >= result['p50_step_ms'] > 0
    assert result['peak_rss_bytes'] > 0
    rates[path] = result['examples_per_s']
  # Emulated steps run in an in-graph loop of iterations_per_loop steps.
  assert entry['paths']['tpu_fc_embedding_core']['steps_per_run'] == [2]

  lines = [l for l in finished.stdout.splitlines() if l.startswith('target ')]
  verdicts = {}
  for line in lines:
    match = VERDICT.match(line)
    assert match, line
    verdicts[match.group(1)] = match.groups()[1:]
  assert [t['name'] for t in results['targets']] == list(verdicts)
  measured, _, goal, verdict = verdicts['emulated_vs_raw_dim16']
  ratio = rates['tpu_fc_embedding_core'] / rates['raw']
  assert abs(float(measured) - ratio) <= 5e-4
  assert verdict == ('met' if ratio >= float(goal) else 'not met')
  assert verdicts['emulated_vs_legacy_dim16'][0] == 'n/a'  # legacy not run
  report = (tmp_path / 'results_quick.md').read_text()
  assert report.count('| raw |') == 1
  hints = [line for line in finished.stdout.splitlines() if '[bench]' in line]
  assert len(hints) == 1 and 'matplotlib' in hints[0], finished.stdout
  assert hints[0] in report
  assert not (tmp_path / 'results_quick.png').exists()

  from benchmarks import report as report_writer  # pylint: disable=g-import-not-at-top
  charted = tmp_path / 'charted'
  assert report_writer.write(results, str(charted))[1:] == lines
  assert '](results_quick.png)' in (charted / 'results_quick.md').read_text()
  from matplotlib import image  # pylint: disable=g-import-not-at-top
  height, width, _ = image.imread(charted / 'results_quick.png').shape
  assert width == 1200 and 200 < height < 400, (height, width)


def test_stacking_measurement_runs_and_every_layout_trains_alike():
  """`python -m benchmarks.stacking` (its own check: the stacked tables equal
  the per-table ones after the first steps) on a tiny workload."""
  finished = scripts.run_python(
      ['-m', 'benchmarks.stacking', '--reps', '1', '--vocabulary-cap', '50',
       '--batch-size', '16'], cwd=scripts.REPO, env=scripts.env())
  assert finished.returncode == 0, finished.stderr[-3000:]
  for layout in ('stacked', 'stacked_per_core'):
    assert re.search(r'^{} / per_table speed: \d+\.\d\d$'.format(layout),
                     finished.stdout, re.MULTILINE), finished.stdout
