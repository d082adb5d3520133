"""`python -m benchmarks` end to end on a tiny workload: JSON, report and verdict lines."""
import json
import re

import pytest

from harness import scripts

pytestmark = pytest.mark.subprocess
VERDICT = re.compile(
    r'^target (\S+): (n/a|\d+\.\d+) \(goal (>=|<=) ([\d.]+)\) (met|not met)')


def test_tiny_run_writes_results_and_verdicts(tmp_path):
  command = [
      '-m', 'benchmarks', '--quick', '--dims', '16',
      '--paths', 'raw', 'tpu_fc_embedding_core', '--no-serving',
      '--vocabulary-cap', '50', '--batch-size', '16', '--num-batches', '2',
      '--iterations-per-loop', '2', '--warmup-steps', '2', '--steps-per-rep',
      '2', '--reps', '5', '--out', str(tmp_path)]
  finished = scripts.run_python(command, cwd=scripts.REPO, env=scripts.env())
  assert finished.returncode == 0, finished.stderr[-3000:]
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
  assert (tmp_path / 'results_quick.md').read_text().count('| raw |') == 1
  assert (tmp_path / 'results_quick.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


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
