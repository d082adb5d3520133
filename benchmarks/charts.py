"""The report's chart, drawn with matplotlib (headless, Agg): throughput per path
beside the anchors, per training workload and for serving; the --scale sweep's
step time against table size and batch.

Only the report imports this module, to draw: matplotlib comes with the `bench`
extra (scripts/lane.sh installs it), and tpu_fc itself never needs it.
"""
from matplotlib import ticker
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

_WIDTH_INCHES = 12
_DPI = 100
_BAR_INCHES = 0.34
_PANEL_INCHES = 1.2   # a bar panel's title and axis
_SCALE_INCHES = 4.5
# The anchors of a training workload: what users run today, and raw TF's
# lower bound; of serving: the legacy export.
_TRAINING_ANCHORS = ('legacy_cpu', 'raw')
_SERVING_ANCHORS = ('legacy_cpu',)
_ANCHOR_COLOR = '0.6'
_TPU_FC_COLOR = 'tab:blue'
_OTHER_COLOR = 'tab:orange'


def _color(path, anchors):
  if path in anchors:
    return _ANCHOR_COLOR
  return _TPU_FC_COLOR if path.startswith('tpu_fc') else _OTHER_COLOR


def _throughput(axes, rates, anchors, notes, title, xlabel):
  """Horizontal bars of `rates` ({path: examples/s, None if it failed}), in
  the measured order; the anchors' bars grey with their level dashed across
  the panel, and beside every bar its rate, its ratio to each anchor and its
  note (`notes`: {path: text})."""
  anchors = [a for a in anchors if rates.get(a)]
  paths = list(rates)
  axes.barh(range(len(paths)), [rates[p] or 0 for p in paths],
            color=[_color(p, anchors) for p in paths])
  largest = max([rate for rate in rates.values() if rate] or [1])
  for row, path in enumerate(paths):
    rate = rates[path]
    text = 'failed' if rate is None else '{:,.0f}/s'.format(rate) + ''.join(
        ', {:.2f}× {}'.format(rate / rates[a], a)
        for a in anchors if a != path)
    if notes.get(path):
      text += ', ' + notes[path]
    axes.text((rate or 0) + 0.01 * largest, row, text, va='center',
              fontsize=8.5, bbox=dict(facecolor='white', edgecolor='none',
                                      alpha=0.8, pad=1))
  for anchor in anchors:
    axes.axvline(rates[anchor], color='0.3', linestyle='--', linewidth=1,
                 zorder=0)
  axes.set_yticks(range(len(paths)), paths, fontsize=9)
  axes.invert_yaxis()
  axes.set_xlim(0, 1.7 * largest)  # room for the text beside the bars
  axes.xaxis.set_major_formatter(ticker.FuncFormatter(
      lambda value, _: '{:g}k'.format(value / 1e3)))
  axes.grid(axis='x', alpha=0.3)
  axes.set_xlabel(xlabel)
  axes.set_ylabel('path')
  axes.set_title(title, loc='left', fontsize=10)


def _scale(axes, scale):
  """Step time (p50) against table rows, a line per path and batch."""
  batches = sorted({p['batch_size'] for points in scale['sweep'].values()
                    for p in points})
  styles = dict(zip(reversed(batches), ('-', '--', ':', '-.')))
  for path, points in scale['sweep'].items():
    for batch in batches:
      measured = [p for p in points
                  if p['batch_size'] == batch and 'p50_step_ms' in p]
      axes.plot([p['rows'] for p in measured],
                [p['p50_step_ms'] for p in measured], marker='o',
                color=_color(path, _TRAINING_ANCHORS),
                linestyle=styles[batch],
                label='{}, batch {}'.format(path, batch))
  axes.set_xscale('log')
  axes.xaxis.set_major_formatter(ticker.EngFormatter(sep=''))
  axes.set_yscale('log')
  axes.yaxis.set_major_formatter(ticker.LogFormatter())  # 20, not 2 x 10^1
  axes.yaxis.set_minor_formatter(ticker.LogFormatter(labelOnlyBase=False))
  axes.grid(True, which='both', alpha=0.3)
  axes.set_xlabel('table rows (one table, dim {}, Adagrad)'.format(
      scale['dim']))
  axes.set_ylabel('step time, p50 (ms)')
  recorded = ('' if 'recorded_date' not in scale else
              ', recorded on {} by {}'.format(scale['recorded_date'],
                                             scale['recorded_command']))
  axes.set_title('--scale: step time against table size and batch' + recorded,
                 loc='left', fontsize=10)
  axes.legend(fontsize=8)


def draw(results, path, title):
  """Writes the chart of `results` (the benchmark's results dict) as a PNG at
  `path`, `title` above it: a panel per training workload, serving, and the
  scale sweep where there is one."""
  panels = []  # (height in inches, panel function, its arguments but the axes)
  for entry in results['training']:
    rates = {p: r.get('examples_per_s') for p, r in entry['paths'].items()}
    panels.append((_PANEL_INCHES + _BAR_INCHES * len(rates), _throughput, (
        rates, _TRAINING_ANCHORS, {}, 'training: {}, batch {}'.format(
            entry['workload'], entry['params']['batch_size']),
        'training throughput (examples/s)')))
  models = results.get('serving', {}).get('models', {})
  if models:
    panels.append((_PANEL_INCHES + _BAR_INCHES * len(models), _throughput, (
        {name: model['throughput_examples_per_s']
         for name, model in models.items()}, _SERVING_ANCHORS,
        {name: 'batch-1 p50 {:.2f} ms'.format(model['p50_latency_ms'])
         for name, model in models.items()},
        'serving: the exported SavedModels ({})'.format(
            results['serving']['workload']),
        'serving throughput at batch {} (examples/s)'.format(
            results['settings']['throughput_batch']))))
  scale = results.get('scale') or results.get('scale_recorded') or {}
  if scale.get('sweep'):
    panels.append((_SCALE_INCHES, _scale, (scale,)))
  figure = Figure(figsize=(_WIDTH_INCHES,
                           0.8 + sum(height for height, _, _ in panels)),
                  layout='constrained')
  FigureCanvasAgg(figure)
  figure.suptitle(title, fontsize=11)
  figure.legend(handles=[
      Patch(color=_TPU_FC_COLOR, label='tpu_fc'),
      Patch(color=_OTHER_COLOR, label='TF without tpu_fc'),
      Patch(color=_ANCHOR_COLOR, label='anchor'),
      Line2D([], [], color='0.3', linestyle='--', linewidth=1,
             label="anchor's level")], loc='outside lower center', ncols=4,
                fontsize=9)
  if panels:
    grid = figure.subplots(len(panels), 1, squeeze=False, height_ratios=[
        height for height, _, _ in panels])
    for axes, (_, fill, arguments) in zip(grid[:, 0], panels):
      fill(axes, *arguments)
  figure.savefig(path, dpi=_DPI)
