"""tf.estimator's names that legacy scripts use around a TPUEstimator, as TF 2.15
runs them: `model_fn`, `add_metrics`, `experimental_export_all_saved_models`,
`InMemoryEvaluatorHook`, `make_stop_at_checkpoint_step_hook`, `VocabInfo` warm
starts, `numpy_input_fn` and `pandas_input_fn`; on the legacy lane against TF's
own, also TF's own functions given tpu_fc's estimators."""
import os
import sys

import numpy as np
import pandas as pd
import pytest

import tpu_fc
from tpu_fc._tf import tf
from tpu_fc.estimator import hooks as hooks_lib
from tpu_fc.estimator import inputs as estimator_inputs

from harness import estimators
from harness import inputs
from harness import lanes
from harness import models
from harness import oracle

# The linear model's data and batch (`estimators.linear_estimator`).
N, BATCH = inputs.N, estimators.LINEAR_BATCH
X, Y = inputs.X, inputs.Y

pytestmark = pytest.mark.filterwarnings('ignore:`tf.layers.dense` is deprecated')


def _eval_input_fn(params):
  return inputs.linear(params).take(N // BATCH)


def _auc(labels, predictions):
  """add_metrics' metric_fn: a Keras metric, as TF's docstring has it."""
  auc = tf.keras.metrics.AUC()
  auc.update_state(labels, tf.sigmoid(predictions['logit']))
  return {'auc': auc}


def _drivers():
  """tpu_fc, and on the legacy lane TF 2.15's TPUEstimator."""
  return [tpu_fc] + ([tf.compat.v1.estimator.tpu] if lanes.LEGACY else [])


def test_model_fn_is_the_model_as_exported_and_add_metrics_builds_on_it(
    tmp_path):
  """`estimator.model_fn(features, labels, mode, config)` calls the model_fn
  as TF's TPUEstimator exports it: on the CPU, params['use_tpu'] False, no
  batch size, an EstimatorSpec back.  `tf.estimator.add_metrics` (TF 2.15's
  raised "config must be an instance of RunConfig" for tpu_fc's) evaluates
  the trained model on the CPU with its metrics and metric_fn's."""
  seen = {}
  for driver in _drivers():
    records = []
    estimator = estimators.linear_estimator(
        tmp_path / driver.__name__, use_tpu=driver is tpu_fc, driver=driver,
        record=lambda params, records=records: records.append(
            {key: value for key, value in params.items()
             if key in ('use_tpu', 'batch_size', 'context')}))
    with tf.Graph().as_default():
      spec = estimator.model_fn(tf.constant(X[:BATCH]), tf.constant(Y[:BATCH]),
                                tpu_fc.ModeKeys.EVAL, estimator.config)
      assert type(spec).__name__ == 'EstimatorSpec'
      assert set(spec.eval_metric_ops) == {'mean_logit'}
    estimator.train(inputs.linear, max_steps=2)
    with tpu_fc.legacy_names.installed():
      extended = tf.estimator.add_metrics(estimator, _auc)
    # (a plain Estimator, whose input_fn gets no batch size, as in TF)
    seen[driver] = records[0], extended.evaluate(
        lambda: _eval_input_fn({'batch_size': BATCH}), steps=N // BATCH)
  params, metrics = seen[tpu_fc]
  assert params == {'use_tpu': False}
  assert set(metrics) == {'loss', 'mean_logit', 'auc', 'global_step'}
  cpu = estimators.linear_estimator(tmp_path / 'tpu_fc',
                                    use_tpu=False).evaluate(
                                        _eval_input_fn, steps=N // BATCH)
  for name in ('loss', 'mean_logit'):
    assert metrics[name] == pytest.approx(cpu[name], rel=1e-6), name
  if lanes.LEGACY:  # (trained on the emulated TPU's 2 shards; TF's on the CPU)
    legacy_params, legacy = seen[tf.compat.v1.estimator.tpu]
    assert legacy_params == params
    for name in metrics:
      assert metrics[name] == pytest.approx(legacy[name], rel=1e-5), name


def _receivers():
  """TRAIN and EVAL receivers of raw features and labels, PREDICT's of
  features."""
  features = tf.zeros([BATCH, 2])
  supervised = tf.estimator.experimental.build_raw_supervised_input_receiver_fn(
      features, tf.zeros([BATCH, 1]))
  return {tpu_fc.ModeKeys.TRAIN: supervised, tpu_fc.ModeKeys.EVAL: supervised,
          tpu_fc.ModeKeys.PREDICT: tf.estimator.export.build_raw_serving_input_receiver_fn(
              features)}


def _meta_graphs(export_dir):
  """{tags: {signature: (inputs, outputs)}} of a SavedModel, and the kernel
  each meta graph restores."""
  found = {}
  for tags in (['train'], ['eval'], ['serve']):
    with tf.Graph().as_default(), tf.compat.v1.Session() as session:
      loaded = tf.compat.v1.saved_model.load(session, tags, export_dir)
      kernel, = [session.run(variable)
                 for variable in tf.compat.v1.global_variables()
                 if variable.op.name == 'dense/kernel']
      found[tags[0]] = ({name: (sorted(signature.inputs),
                                sorted(signature.outputs))
                         for name, signature in loaded.signature_def.items()},
                        kernel)
  return found


def test_experimental_export_all_saved_models_writes_a_meta_graph_per_mode(
    tmp_path, tf_log):
  """One SavedModel: TRAIN, EVAL and PREDICT meta graphs with TF's tags and
  signatures, one set of variables; with export_to_tpu, TF's warning for the
  modes a TPU does not export (no TPU meta graph without a TPU)."""
  exported = {}
  for driver in _drivers():
    estimator = estimators.linear_estimator(
        tmp_path / driver.__name__, use_tpu=driver is tpu_fc, driver=driver)
    estimator.train(inputs.linear, max_steps=2)
    with tpu_fc.legacy_names.installed():
      export_dir = estimator.experimental_export_all_saved_models(
          str(tmp_path / ('export_' + driver.__name__)), _receivers())
    exported[driver] = (_meta_graphs(export_dir.decode()),
                        estimator.get_variable_value('dense/kernel'))
  meta_graphs, kernel = exported[tpu_fc]
  assert {tags: signatures for tags, (signatures, _) in meta_graphs.items()} == {
      'train': {'train': (['input', 'label'], ['loss'])},
      'eval': {'eval': (['input', 'label'],
                        ['loss', 'metrics/mean_logit/update_op',
                         'metrics/mean_logit/value', 'predictions/logit'])},
      'serve': {'serving_default': (['input'], ['logit'])},
  }
  for tags, (_, restored) in meta_graphs.items():
    np.testing.assert_array_equal(restored, kernel, err_msg=tags)
  ignored = ['TPUEstimator only handles mode PREDICT for exporting when '
             '`export_to_tpu` is `True`; Mode {} will be ignored for TPU.'.format(
                 mode) for mode in ('train', 'eval')]
  assert [m for m in tf_log if m in ignored] == ignored * len(_drivers())
  if lanes.LEGACY:
    legacy_meta_graphs, _ = exported[tf.compat.v1.estimator.tpu]
    assert ({tags: signatures for tags, (signatures, _) in
             legacy_meta_graphs.items()} ==
            {tags: signatures for tags, (signatures, _) in meta_graphs.items()})


def _evaluations(eval_dir):
  """[(step, loss, mean_logit)] of the evaluations written to `eval_dir`."""
  found = []
  for path in sorted(tf.io.gfile.glob(os.path.join(eval_dir, 'events*'))):
    for event in tf.compat.v1.train.summary_iterator(path):
      values = {value.tag: value.simple_value for value in event.summary.value}
      if 'loss' in values:
        found.append((event.step, values['loss'], values['mean_logit']))
  return found


@pytest.mark.parametrize('use_tpu', [False, True], ids=['cpu', 'tpu'])
def test_in_memory_evaluator_hook_evaluates_the_variables_being_trained(
    tmp_path, use_tpu):
  """At the start, every 2 session runs (an emulated TPU loop of 2 steps is
  one) and at the end; its last evaluation is the final checkpoint's.  On
  the legacy lane TF 2.15's own hook, given tpu_fc's estimator, evaluates
  the same."""
  hook_classes = [hooks_lib.InMemoryEvaluatorHook]
  if lanes.LEGACY:
    hook_classes.append(tf.estimator.experimental.InMemoryEvaluatorHook)
  evaluations = []
  for number, hook_class in enumerate(hook_classes):
    estimator = estimators.linear_estimator(tmp_path / str(number), use_tpu)
    estimator.train(inputs.linear, max_steps=4, hooks=[hook_class(
        estimator, _eval_input_fn, steps=N // BATCH, every_n_iter=2)])
    evaluations.append(_evaluations(estimator.eval_dir()))
    final = estimator.evaluate(_eval_input_fn, steps=N // BATCH,
                               name='checkpoint')
    step, loss, mean_logit = evaluations[-1][-1]
    assert (step, loss, mean_logit) == (4, pytest.approx(final['loss']),
                                        pytest.approx(final['mean_logit']))
  assert [step for step, _, _ in evaluations[0]] == (
      [0, 4, 4] if use_tpu else [0, 2, 4, 4])
  assert all(theirs == ours for theirs, ours in zip(evaluations[1:],
                                                    evaluations[:1]))


def test_make_stop_at_checkpoint_step_hook(tmp_path, monkeypatch):
  """The chief's is a StopAtStepHook; a worker's stops once the latest
  checkpoint holds the last step (here the chief's, saving every step, in
  the same model_dir), as TF 2.15's does given tpu_fc's estimator."""
  makers = [hooks_lib.make_stop_at_checkpoint_step_hook]
  if lanes.LEGACY:
    makers.append(tf.estimator.experimental.make_stop_at_checkpoint_step_hook)
  for number, make in enumerate(makers):
    model_dir = str(tmp_path / str(number))

    def estimator(**config):
      return tpu_fc.TPUEstimator(
          model_fn=models.linear_model_fn, use_tpu=False,
          train_batch_size=BATCH,
          params={'hook_on_loss': None, 'spec': tpu_fc.TPUEstimatorSpec},
          config=tpu_fc.RunConfig(model_dir=model_dir, **config))

    chief = estimator(save_checkpoints_steps=1)
    assert isinstance(make(chief, 3), tf.compat.v1.train.StopAtStepHook)
    with monkeypatch.context() as patch:
      patch.setenv('TF_CONFIG', '{"cluster": {"chief": ["localhost:1"], '
                   '"worker": ["localhost:2"]}, "task": {"type": "worker", '
                   '"index": 0}}')
      worker = estimator()
    hook = make(worker, 3, wait_after_file_check_secs=0)
    assert not isinstance(hook, tf.compat.v1.train.StopAtStepHook)
    chief.train(inputs.linear, hooks=[hook])
    assert chief.get_variable_value('global_step') == 3


WORDS = ['apple', 'banana', 'cherry']
NEW_WORDS = ['cherry', 'date', 'apple', 'elderberry']


def _word_column(vocabulary_size):
  """A table of a vocabulary's rows (the input gives them as ids)."""
  return tpu_fc.embedding_column(
      tf.feature_column.categorical_column_with_identity('word',
                                                         vocabulary_size), 2,
      initializer=tf.compat.v1.truncated_normal_initializer(seed=1))


def _words_model_fn(features, labels, mode, params):
  del labels
  loss = tf.reduce_sum(tf.keras.layers.DenseFeatures(
      [_word_column(params['vocabulary_size'])])(features))
  return tpu_fc.TPUEstimatorSpec(mode, loss=loss, train_op=(
      tf.compat.v1.train.GradientDescentOptimizer(0.).minimize(
          loss, tf.compat.v1.train.get_global_step())))


@pytest.mark.parametrize('use_tpu', [False, True], ids=['cpu', 'tpu'])
def test_a_warm_start_remaps_a_vocabulary_with_vocab_info(tmp_path, use_tpu):
  """`WarmStartSettings(var_name_to_vocab_info={table: tf.estimator.
  VocabInfo(...)})`: each row of the new vocabulary gets its word's old row,
  a new word the backup initializer's zeros (tf.compat.v1.train.warm_start's),
  also into the emulated TPU's table (as on a TPU, not a trainable variable:
  warm_start finds it by a list of names, not a regex)."""
  table = 'dense_features/word_embedding/embedding_weights'
  files = {}
  for name, words in (('old', WORDS), ('new', NEW_WORDS)):
    files[name] = str(tmp_path / (name + '_words.txt'))
    with open(files[name], 'w') as f:
      f.write('\n'.join(words) + '\n')

  def input_fn(params):
    del params
    return tf.data.Dataset.from_tensors(
        ({'word': tf.sparse.from_dense(tf.constant([[1], [2]], tf.int64))},
         tf.zeros([2, 1]))).repeat()

  def estimator(name, words, warm_start_from=None):
    return tpu_fc.TPUEstimator(
        model_fn=_words_model_fn, use_tpu=use_tpu, train_batch_size=2,
        params={'vocabulary_size': len(words)},
        config=tpu_fc.RunConfig(model_dir=str(tmp_path / name)),
        warm_start_from=warm_start_from,
        embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
            feature_columns=[_word_column(len(words))],
            optimization_parameters=(
                tpu_fc.StochasticGradientDescentParameters(0.))))

  old = estimator('old', WORDS)
  old.train(input_fn, max_steps=1)
  with tpu_fc.legacy_names.installed():
    settings = tf.estimator.WarmStartSettings(
        old.model_dir, vars_to_warm_start=[table],  # (global variables too)
        var_name_to_vocab_info={table: tf.estimator.VocabInfo(
            new_vocab=files['new'], new_vocab_size=len(NEW_WORDS),
            num_oov_buckets=0, old_vocab=files['old'],
            backup_initializer=tf.compat.v1.zeros_initializer())})
  new = estimator('new', NEW_WORDS, settings)
  new.train(input_fn, max_steps=1)
  old_rows = old.get_variable_value(table)
  np.testing.assert_array_equal(new.get_variable_value(table), [
      old_rows[WORDS.index(word)] if word in WORDS else [0., 0.]
      for word in NEW_WORDS])


def _numpy_input_fns():
  """tpu_fc's numpy_input_fn, and on the legacy lane TF 2.15's."""
  return [estimator_inputs.numpy_input_fn] + (
      [tf.compat.v1.estimator.inputs.numpy_input_fn] if lanes.LEGACY else [])


def _batches_of(input_fn, most=12):
  """(static shapes, batches) of what `input_fn()` gives until its input ends
  (at most `most` batches); a MonitoredSession starts TF's queue runners."""
  with tf.Graph().as_default():
    result = input_fn()
    shapes = tf.nest.map_structure(lambda tensor: tensor.shape.as_list(),
                                   result)
    batches = []
    with tf.compat.v1.train.MonitoredSession() as session:  # (ends quietly
      while len(batches) < most:                            # at OutOfRange)
        batches.append(session.run(result))
  return shapes, batches


def _assert_read(input_fn_builders, kwargs, expected_shapes, expected, ends):
  """The input_fn each builder makes of `kwargs` (not shuffling) gives
  tensors of `expected_shapes`, the batches `expected`, then (`ends`) the
  end of its input."""
  for builder in input_fn_builders:
    shapes, batches = _batches_of(  # (one more: the end of input)
        builder(shuffle=False, **kwargs), most=len(expected) + ends)
    assert shapes == expected_shapes, builder
    assert len(batches) == len(expected), builder
    for batch, want in zip(batches, expected):
      tf.nest.map_structure(np.testing.assert_array_equal, batch, want)


ROWS = 5
A = np.arange(ROWS, dtype=np.float64)
B = np.arange(ROWS * 2, dtype=np.int64).reshape(ROWS, 2) * 10
TARGET = np.arange(ROWS, dtype=np.int32) * -1


def _rows(indices):
  return ({'a': A[indices], 'b': B[indices]}, TARGET[indices])


@pytest.mark.parametrize('case', ['epochs', 'forever', 'array_and_dict'])
def test_numpy_input_fn_reads_as_tf_2_15(case):
  """Rows in order, `batch_size` at a time across epochs (the last batch
  short), a static batch only when reading forever; x's keys sorted; an
  array x gives one tensor, a dict y a dict (TF 2.15's own agrees)."""
  kwargs, expected_shapes, expected = {
      'epochs': (dict(x={'b': B, 'a': A}, y=TARGET, batch_size=2,
                      num_epochs=2),
                 ({'a': [None], 'b': [None, 2]}, [None]),
                 [_rows([0, 1]), _rows([2, 3]), _rows([4, 0]), _rows([1, 2]),
                  _rows([3, 4])]),
      'forever': (dict(x={'a': A, 'b': B}, y=TARGET, batch_size=3,
                       num_epochs=None),
                  ({'a': [3], 'b': [3, 2]}, [3]),
                  [_rows([0, 1, 2]), _rows([3, 4, 0]), _rows([1, 2, 3]),
                   _rows([4, 0, 1])]),
      'array_and_dict': (dict(x=B, y={'t': TARGET}, batch_size=4),
                         ([None, 2], {'t': [None]}),
                         [(B[:4], {'t': TARGET[:4]}),
                          (B[4:], {'t': TARGET[4:]})]),
  }[case]
  _assert_read(_numpy_input_fns(), kwargs, expected_shapes, expected,
               ends=case != 'forever')


def test_numpy_input_fn_shuffles_and_reads_per_thread_as_tf_2_15():
  """Shuffled, or read by 2 threads (each reading every epoch): every row as
  often as TF 2.15's gives it; TF's errors for bad arguments."""
  for numpy_input_fn in _numpy_input_fns():
    for kwargs, times in ((dict(shuffle=True, num_epochs=3,
                                queue_capacity=4), 3),
                          (dict(shuffle=False, num_epochs=1,
                                num_threads=2), 2)):
      _, batches = _batches_of(numpy_input_fn(
          {'a': A}, TARGET, batch_size=2, **kwargs))
      rows = sorted(np.concatenate([batch['a'] for batch, _ in batches]))
      assert rows == sorted(list(A) * times), (numpy_input_fn, kwargs)
      for batch, target in batches:  # the rows stay whole
        np.testing.assert_array_equal(target, -batch['a'])
  calls = [
      lambda fn: fn({'a': A}, shuffle=None),
      lambda fn: fn({'a': A}, TARGET[:3], shuffle=False)(),
      lambda fn: fn({'a': A}, {'a': TARGET}, shuffle=False)(),
      lambda fn: fn([1, 2], shuffle=False)(),
      lambda fn: fn({}, shuffle=False)(),
  ]
  expected = [
      (ValueError, 'shuffle must be provided and explicitly set as boolean '
       '(it is recommended to set it as True for training); got None'),
      (ValueError, 'Length of tensors in x and y is mismatched. All elements '
       'in x and y must have the same length.\nShapes in x: {\'a\': (5,)}\n'
       'Shapes in y: (3,)\n'),
      (ValueError, "1 duplicate keys are found in both x and y: {'a'}"),
      (TypeError, 'x must be a dict or array; got list'),
      (ValueError, 'x cannot be an empty dict'),
  ]
  for numpy_input_fn in _numpy_input_fns():
    with tf.Graph().as_default():
      assert [oracle.outcome(call, numpy_input_fn) for call in calls] == (
          expected)


def test_pandas_input_fn_without_pandas_fails_as_tf_2_15s(monkeypatch):
  """pandas is no dependency of tpu_fc (only of its tests): without it, TF
  2.15's TypeError (its text, `inputs/pandas_io.py`)."""
  monkeypatch.setitem(sys.modules, 'pandas', None)  # (import pandas fails)
  assert oracle.outcome(estimator_inputs.pandas_input_fn, None,
                        shuffle=False) == (
                            TypeError, 'pandas_input_fn should not be called '
                            'without pandas installed')


def _pandas_input_fns():
  """tpu_fc's pandas_input_fn, and on the legacy lane TF 2.15's."""
  return [estimator_inputs.pandas_input_fn] + (
      [tf.compat.v1.estimator.inputs.pandas_input_fn] if lanes.LEGACY else [])


INDEX = np.arange(100, 100 + ROWS)


def _frame(**columns):
  return pd.DataFrame(columns, index=INDEX)


def _frame_rows(indices):
  """The rows of `_frame(b=B[:, 0], a=A)` and TARGET."""
  return {'a': A[indices], 'b': B[indices, 0]}, TARGET[indices]


@pytest.mark.parametrize('case', ['series', 'frame', 'forever', 'no_target'])
def test_pandas_input_fn_reads_as_tf_2_15(case):
  """A DataFrame's rows in order, `batch_size` at a time in TF1 graph mode,
  as `numpy_input_fn` reads arrays (the index is not a feature); a Series
  target is a tensor, a DataFrame's a dict by its columns, also one named as
  a feature; none: features only (TF 2.15's own agrees)."""
  x = _frame(b=B[:, 0], a=A)
  kwargs, expected_shapes, expected = {
      'series': (dict(x=x, y=pd.Series(TARGET, index=INDEX), batch_size=2),
                 ({'a': [None], 'b': [None]}, [None]),
                 [_frame_rows([0, 1]), _frame_rows([2, 3]), _frame_rows([4])]),
      'frame': (dict(x=x, y=_frame(t=TARGET, a=TARGET * 2), batch_size=3),
                ({'a': [None], 'b': [None]}, {'t': [None], 'a': [None]}),
                [({'a': A[:3], 'b': B[:3, 0]},
                  {'t': TARGET[:3], 'a': TARGET[:3] * 2}),
                 ({'a': A[3:], 'b': B[3:, 0]},
                  {'t': TARGET[3:], 'a': TARGET[3:] * 2})]),
      'forever': (dict(x=x, y=pd.Series(TARGET, index=INDEX), batch_size=3,
                       num_epochs=None),
                  ({'a': [3], 'b': [3]}, [3]),
                  [_frame_rows([0, 1, 2]), _frame_rows([3, 4, 0]),
                   _frame_rows([1, 2, 3])]),
      'no_target': (dict(x=x, batch_size=4),
                    {'a': [None], 'b': [None]},
                    [{'a': A[:4], 'b': B[:4, 0]}, {'a': A[4:], 'b': B[4:, 0]}]),
  }[case]
  _assert_read(_pandas_input_fns(), kwargs, expected_shapes, expected,
               ends=case != 'forever')


def test_pandas_input_fn_shuffles_and_refuses_as_tf_2_15():
  """Shuffled (a queue_capacity of None: 4 times the rows), every row once
  per epoch with its target; TF 2.15's errors for bad arguments."""
  x = _frame(a=A)
  y = pd.Series(-A, index=INDEX)
  for pandas_input_fn in _pandas_input_fns():
    _, batches = _batches_of(pandas_input_fn(
        x, y, batch_size=2, shuffle=True, num_epochs=2, queue_capacity=None))
    rows = sorted(np.concatenate([batch['a'] for batch, _ in batches]))
    assert rows == sorted(list(A) * 2), pandas_input_fn
    for batch, target in batches:
      np.testing.assert_array_equal(target, -batch['a'])
  with_target = _frame(a=A, target=A)
  calls = [
      lambda fn: fn(x, y, shuffle=None),
      lambda fn: fn(x, y, shuffle=False, target_column=3),
      lambda fn: fn(with_target, y, shuffle=False),
      lambda fn: fn(x, pd.Series(-A), shuffle=False),
  ]
  expected = [
      (ValueError, 'shuffle must be provided and explicitly set as boolean '
       '(it is recommended to set it as True for training); got None'),
      (TypeError, 'target_column must be a string type'),
      (ValueError, 'Cannot use name target for target column: DataFrame '
       'already has a column with that name: {}'.format(with_target.columns)),
      (ValueError, 'Index for x and y are mismatched.\nIndex for x: {}\n'
       'Index for y: {}\n'.format(x.index, pd.RangeIndex(ROWS))),
  ]
  for pandas_input_fn in _pandas_input_fns():
    assert [oracle.outcome(call, pandas_input_fn) for call in calls] == (
        expected), pandas_input_fn


@pytest.mark.parametrize('use_tpu', [False, True], ids=['cpu', 'tpu'])
def test_a_tutorial_input_fn_of_numpy_arrays_trains_a_tpu_estimator(
    tmp_path, use_tpu):
  """`numpy_input_fn(x, y, shuffle=False)` wrapped for TPUEstimator's params:
  one epoch ends training (use_tpu=False), or, read forever (the static
  batch a TPU needs), an in-graph loop takes a new batch each step; the
  model trains as on the same batches from a Dataset."""
  with tpu_fc.legacy_names.installed():
    numpy_input_fn = tf.compat.v1.estimator.inputs.numpy_input_fn
  estimator = estimators.linear_estimator(tmp_path / 'numpy', use_tpu)
  estimator.train(lambda params: numpy_input_fn(
      X, Y, batch_size=params['batch_size'], shuffle=False,
      num_epochs=None if use_tpu else 1)(), max_steps=2 * N // BATCH)
  assert estimator.get_variable_value('global_step') == (
      2 * N // BATCH if use_tpu else N // BATCH)
  dataset = estimators.linear_estimator(tmp_path / 'dataset', use_tpu)
  dataset.train(inputs.linear,
                max_steps=estimator.get_variable_value('global_step'))
  np.testing.assert_allclose(estimator.get_variable_value('dense/kernel'),
                             dataset.get_variable_value('dense/kernel'),
                             rtol=1e-6)
