"""Targets, the markdown report, the chart and the verdict lines, from the results dict."""
import os

from benchmarks.run import TRAINING_PATHS

_GIB = 2**30
_EMULATED = 'tpu_fc_embedding_core'
_TENSOR_CORE = 'tpu_fc_tensor_core'


def _training_entry(results, dim, distribution='zipf', ids_per_feature=1):
  for entry in results.get('training', []):
    params = entry['params']
    if (params['dim'] == dim and params['distribution'] == distribution and
        params['ids_per_feature'] == ids_per_feature):
      return entry
  return None


def _rate(entry, path):
  if entry is None:
    return None
  return entry['paths'].get(path, {}).get('examples_per_s')


def _ratio(numerator, denominator):
  if numerator is None or not denominator:
    return None
  return numerator / denominator


def _missing(*named_values):
  missing = [name for name, value in named_values if value is None]
  return 'not measured: ' + ', '.join(missing) if missing else ''


def targets(results):
  """The targets (issues 5, 12, 14, 15) as [dict(name, ratio, op, goal, what,
  note)]."""
  found = []

  def add(name, ratio, op, goal, what, note=''):
    met = ratio is not None and (ratio >= goal if op == '>=' else ratio <= goal)
    found.append(dict(name=name, ratio=ratio, op=op, goal=goal, met=met,
                      what=what, note=note))

  for dim, goal in ((16, 2.5), (64, 3.0)):
    entry = _training_entry(results, dim)
    emulated, legacy = _rate(entry, _EMULATED), _rate(entry, 'legacy_cpu')
    add('emulated_vs_legacy_dim{}'.format(dim), _ratio(emulated, legacy), '>=',
        goal, 'examples/s: tpu_fc emulated embedding core / TF 2.15 '
        'TPUEstimator(use_tpu=False)',
        _missing((_EMULATED, emulated), ('legacy_cpu', legacy)))
  for dim in (16, 64):
    entry = _training_entry(results, dim)
    emulated, raw = _rate(entry, _EMULATED), _rate(entry, 'raw')
    add('emulated_vs_raw_dim{}'.format(dim), _ratio(emulated, raw), '>=', 1.5,
        'examples/s: tpu_fc emulated embedding core / raw TF lower bound',
        _missing((_EMULATED, emulated), ('raw', raw)))
  for dim in (16, 64):
    entry = _training_entry(results, dim)
    no_mlp = _rate(entry, _EMULATED + '_no_mlp')
    roofline = entry['roofline_examples_per_s'] if entry else None
    add('embedding_roofline_fraction_dim{}'.format(dim),
        _ratio(no_mlp, roofline), '>=', 0.15,
        'examples/s of the emulated embedding core without MLP / bandwidth '
        'roofline examples/s', _missing((_EMULATED + '_no_mlp', no_mlp)))
  for dim in (16, 64):
    entry = _training_entry(results, dim)
    emulated = _rate(entry, _EMULATED)
    tensor_core = _rate(entry, _TENSOR_CORE)
    add('emulated_vs_tensor_core_dim{}'.format(dim),
        _ratio(emulated, tensor_core), '>=', 0.8,
        'examples/s: tpu_fc emulated embedding core / the same model on '
        'tpu_tensor_core', _missing((_EMULATED, emulated),
                                    (_TENSOR_CORE, tensor_core)))
  for ids_per_feature in (1, 4):  # tensor_core_shape [None, 1] and [None, 7]
    entry = _training_entry(results, 16, ids_per_feature=ids_per_feature)
    tensor_core, legacy = _rate(entry, _TENSOR_CORE), _rate(entry, 'legacy_cpu')
    add('tensor_core_vs_legacy_width{}'.format(2 * ids_per_feature - 1),
        _ratio(tensor_core, legacy), '>=', 2.0,
        'examples/s: tpu_fc tpu_tensor_core (tensor_core_shape [None, max ids]) '
        '/ TF 2.15 TPUEstimator(use_tpu=False), {} dim 16'.format(
            'one-hot' if ids_per_feature == 1 else 'multi-hot'),
        _missing((_TENSOR_CORE, tensor_core), ('legacy_cpu', legacy)))
  for dim in (16, 64):
    entry = _training_entry(results, dim)
    one, eight = _rate(entry, _EMULATED), _rate(entry, _EMULATED + '_8_shards')
    add('shards8_vs_1_dim{}'.format(dim), _ratio(one, eight), '<=', 1.2,
        'step time: tpu_fc emulated embedding core on 8 emulated TPU cores / '
        'on 1', _missing((_EMULATED, one), (_EMULATED + '_8_shards', eight)))
  for dim in (16, 64):
    entry = _training_entry(results, dim)
    emulated, host = _rate(entry, _EMULATED), _rate(entry, 'tpu_fc_mid_level')
    add('host_tpu_embedding_vs_emulated_dim{}'.format(dim),
        _ratio(emulated, host), '<=', 1.2,
        'step time: the migrated TF2 loop on tpu_fc.mid_level.TPUEmbedding / '
        'the emulated TPUEstimator',
        _missing((_EMULATED, emulated), ('tpu_fc_mid_level', host)))
  models = results.get('serving', {}).get('models', {})
  ours, legacy = models.get(_EMULATED, {}), models.get('legacy_cpu', {})
  add('serving_throughput_vs_legacy',
      _ratio(ours.get('throughput_examples_per_s'),
             legacy.get('throughput_examples_per_s')), '>=', 1.3,
      'batch-512 examples/s: tpu_fc export / TF 2.15 TPUEstimator export',
      _missing(('tpu_fc export', ours or None), ('legacy export', legacy or None)))
  add('serving_p50_latency_vs_legacy',
      _ratio(ours.get('p50_latency_ms'), legacy.get('p50_latency_ms')), '<=',
      1.0, 'batch-1 p50 latency: tpu_fc export / TF 2.15 TPUEstimator export',
      _missing(('tpu_fc export', ours or None), ('legacy export', legacy or None)))
  for dim in (16, 64):
    entry = _training_entry(results, dim)
    emulated, mid_level = _rate(entry, _EMULATED), _rate(entry, 'mid_level')
    add('driver_vs_mid_level_dim{}'.format(dim), _ratio(mid_level, emulated),
        '<=', 1.10, 'step time: tpu_fc emulated TPUEstimator / hand-migrated '
        'mid-level loop', _missing((_EMULATED, emulated), ('mid_level', mid_level)))
  scale = results.get('scale') or results.get('scale_recorded') or {}
  scaled = scale.get('paths', {}).get(_EMULATED, {})
  note = _missing(('--scale run', scaled.get('peak_rss_over_table_and_slot')))
  if 'recorded_date' in scale and not note:
    note = 'recorded by `{}` on {}'.format(scale['recorded_command'],
                                           scale['recorded_date'])
  add('scale_peak_rss_vs_table_and_slot',
      scaled.get('peak_rss_over_table_and_slot'), '<=', 1.10,
      'peak RSS / (table + Adagrad slot bytes), tpu_fc emulated, {} x 64'.format(
          scale.get('rows', '10M')), note)
  return found


def verdict_lines(found):
  lines = []
  for target in found:
    measured = 'n/a' if target['ratio'] is None else '{:.3f}'.format(
        target['ratio'])
    line = 'target {}: {} (goal {} {}) {}'.format(
        target['name'], measured, target['op'], target['goal'],
        'met' if target['met'] else 'not met')
    if target['ratio'] is None:
      line += ' ({})'.format(target['note'])
    lines.append(line)
  return lines


def _k(rate):
  return '{:.1f}k'.format(rate / 1e3)


MATPLOTLIB_MISSING = (
    'no chart: matplotlib is not installed (scripts/lane.sh installs it; '
    'elsewhere pip install -e ".[bench]")')


def _machine(machine):
  return '{}, {} usable CPUs of {}, {:.1f} GiB'.format(
      machine['cpu'], machine['usable_cpus'], machine['cpus'],
      machine['memory_bytes'] / _GIB)


def _lanes(machine):
  """The lane and versions the paths ran on (legacy_cpu's after a ';' where
  it ran on an interpreter of its own)."""
  lanes = {role: '{lane} lane, TensorFlow {tensorflow}, Python {python}'.format(
      **info) for role, info in machine['interpreters'].items()}
  legacy = lanes.get('legacy_python', lanes['python'])
  return lanes['python'] + ('' if legacy == lanes['python'] else
                            '; legacy_cpu: ' + legacy)


def markdown(results, found, chart):
  """The report; `chart`: the chart's file name, None if none was drawn."""
  machine = results['machine']
  settings = results['settings']
  bandwidth = results['bandwidth']
  out = ['# tpu_fc benchmarks: {} run'.format(results['mode']), '']
  out.append('- command: `{}`'.format(results['command']))
  uncommitted = machine.get('uncommitted_sources')
  out.append('- date: {}, {:.0f} s, sources of git {}{}'.format(
      results['date'], results['seconds'], machine['git_commit'],
      '' if uncommitted is None else ' (copied at the start; uncommitted: {})'
      .format(', '.join(uncommitted) or 'none')))
  out.append('- machine: {}; load average {:.2f} at start, {:.2f} at end'
             .format(_machine(machine), machine['load_average_start'][0],
                     machine['load_average_end'][0]))
  out.append('- lane: ' + _lanes(machine))
  out.append(
      '- every path: batch {}, {} threads (intra and inter op), warm-up {} '
      'steps, then {} repetitions of {} steps, interleaved path by path (a '
      'slow path ends warm-up after 3 calls once it took {:g} s, and a '
      'repetition after whole calls once it took {:g} s); examples/s is the '
      'median over repetitions, step times are per step (a loop call divided '
      'by its steps)'.format(
          settings['batch_size'], settings['threads'], settings['warmup_steps'],
          settings['reps'], settings['steps_per_rep'],
          settings['max_warmup_seconds'], settings['max_rep_seconds']))
  out.append(
      '- iterations_per_loop = {} for every estimator path and the TF2 loops: '
      'the emulated TPU paths and the TF2 paths run that many steps per call '
      'in an in-graph loop; `use_tpu=False` paths run one step per '
      'session.run, as TF 2.15 does on CPU'.format(
          settings['iterations_per_loop']))
  out.append('- memory copy bandwidth (numpy, read + write): {:.1f} GB/s on '
             '{} threads, {:.1f} GB/s on 1 thread'.format(
                 bandwidth['multi_thread_bytes_per_s'] / 1e9,
                 bandwidth['threads'],
                 bandwidth['single_thread_bytes_per_s'] / 1e9))
  out.append('')
  out.append(MATPLOTLIB_MISSING if chart is None else
             '![throughput per path beside the anchors]({})'.format(chart))
  out.append('')
  for entry in results['training']:
    traffic = entry['traffic']
    out.append('## Training: {}'.format(entry['workload']))
    out.append('')
    out.append(
        '{} tables, {:.2f}M rows ({:.0f} MiB of table), {:.0f} lookups and '
        '{:.0f} unique rows per step; at least {:.2f} KB per example moved '
        '(roofline {} examples/s). Groups (built together, then interleaved): '
        '{}.'.format(
            entry['tables'],
            entry['table_rows'] / 1e6, entry['table_bytes'] / 2**20,
            traffic['lookups_per_step'], traffic['unique_rows_per_step'],
            traffic['bytes_per_example'] / 1e3,
            _k(entry['roofline_examples_per_s']),
            ' | '.join(', '.join(g) for g in entry['groups'])))
    out.append('')
    out.append('| path | examples/s | vs legacy | vs raw | p50 step ms | '
               'p90 step ms | peak RSS GiB | % of roofline |')
    out.append('|---|---:|---:|---:|---:|---:|---:|---:|')
    legacy, raw = _rate(entry, 'legacy_cpu'), _rate(entry, 'raw')
    for path, result in entry['paths'].items():
      if 'examples_per_s' not in result:
        out.append('| {} | failed: {} | | | | | | |'.format(
            path, result.get('error', '').strip().splitlines()[-1:]))
        continue
      rate = result['examples_per_s']
      out.append('| {} | {:.0f} | {} | {} | {:.1f} | {:.1f} | {:.2f} | {:.2f} |'
                 .format(path, rate,
                         '{:.2f}x'.format(rate / legacy) if legacy else '',
                         '{:.2f}x'.format(rate / raw) if raw else '',
                         result['p50_step_ms'], result['p90_step_ms'],
                         result['peak_rss_bytes'] / _GIB,
                         100 * rate / entry['roofline_examples_per_s']))
    out.append('')
  serving = results.get('serving')
  if serving:
    out.append('## Serving ({})'.format(serving.get('workload', '')))
    out.append('')
    if 'error' in serving:
      out.append('failed: {}'.format(serving['error'].strip().splitlines()[-1:]))
    else:
      out.append('Exported SavedModels, tf.Example input, loaded with the TF1 '
                 'loader in one process, calls alternating between exports.')
      out.append('')
      out.append('| export | p50 latency ms (batch 1) | p99 latency ms | '
                 'examples/s (batch {}) |'.format(settings['throughput_batch']))
      out.append('|---|---:|---:|---:|')
      for name, model in serving['models'].items():
        out.append('| {} | {:.2f} | {:.2f} | {:.0f} |'.format(
            name, model['p50_latency_ms'], model['p99_latency_ms'],
            model['throughput_examples_per_s']))
    out.append('')
  scale = results.get('scale') or results.get('scale_recorded')
  if scale:
    out.append('## Scale: one {} x 64 table, Adagrad'.format(scale['rows']))
    out.append('')
    if 'recorded_date' in scale:
      out.append('Recorded by `{}` on {}.'.format(scale['recorded_command'],
                                                  scale['recorded_date']))
      out.append('')
    out.append('| path | peak RSS GiB | table + slot GiB | ratio |')
    out.append('|---|---:|---:|---:|')
    for path, result in scale['paths'].items():
      if 'peak_rss_bytes' in result:
        out.append('| {} | {:.2f} | {:.2f} | {:.2f} |'.format(
            path, result['peak_rss_bytes'] / _GIB,
            scale['table_and_slot_bytes'] / _GIB,
            result['peak_rss_over_table_and_slot']))
      else:
        out.append('| {} | failed | | |'.format(path))
    out.append('')
    if scale.get('sweep'):
      out.append("Step time against table size and batch (the chart's last "
                 'panel):')
      out.append('')
      out.append('| path | batch | table rows | p50 step ms | examples/s | '
                 'peak RSS GiB |')
      out.append('|---|---:|---:|---:|---:|---:|')
      for path, points in scale['sweep'].items():
        for point in points:
          out.append('| {} | {} | {} | {} |'.format(
              path, point['batch_size'], point['rows'],
              'failed | | |' if 'p50_step_ms' not in point else
              '{:.1f} | {:.0f} | {:.2f}'.format(
                  point['p50_step_ms'], point['examples_per_s'],
                  point['peak_rss_bytes'] / _GIB)))
      out.append('')
  out.append('## Targets')
  out.append('')
  out.append('| target | measured | goal | verdict | what |')
  out.append('|---|---:|---|---|---|')
  for target in found:
    out.append('| {} | {} | {} {} | {} | {}{} |'.format(
        target['name'],
        'n/a' if target['ratio'] is None else '{:.3f}'.format(target['ratio']),
        target['op'], target['goal'], 'met' if target['met'] else 'not met',
        target['what'], ' ({})'.format(target['note']) if target['note'] else ''))
  out.append('')
  out.append('Paths: ' + '; '.join('`{}`: {}'.format(name, description)
                                  for name, description in TRAINING_PATHS.items()))
  out.append('')
  return '\n'.join(out)


def _draw_chart(results, path):
  """Draws the chart at `path`: None, or where matplotlib is missing the
  one-line hint instead."""
  try:
    from benchmarks import charts  # pylint: disable=g-import-not-at-top
  except ModuleNotFoundError as missing:
    if missing.name.partition('.')[0] != 'matplotlib':
      raise
    return MATPLOTLIB_MISSING
  machine = results['machine']
  charts.draw(results, path, 'tpu_fc benchmarks, {} run of {}\n{}; {}'.format(
      results['mode'], results['date'], _machine(machine), _lanes(machine)))
  return None


def write(results, out_dir):
  """results_<mode>.json / .md / .png in out_dir; returns the lines to print:
  the files, the hint where matplotlib is missing, the verdicts."""
  import json  # pylint: disable=g-import-not-at-top
  found = targets(results)
  results['targets'] = found
  os.makedirs(out_dir, exist_ok=True)
  stem = os.path.join(out_dir, 'results_' + results['mode'])
  with open(stem + '.json', 'w') as out:
    json.dump(results, out, indent=1, default=float)
  hint = _draw_chart(results, stem + '.png')
  with open(stem + '.md', 'w') as out:
    out.write(markdown(results, found, None if hint else
                       os.path.basename(stem) + '.png'))
  files = 'results: {}.{{json,md{}}} ({:.0f} s)'.format(
      stem, '' if hint else ',png', results['seconds'])
  return [files] + ([hint] if hint else []) + verdict_lines(found)
