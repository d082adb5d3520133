"""Input pipelines on the emulated TPU (`TPUConfig.per_host_input_for_training`):
how input_fn feeds the cores and what each core's model_fn gets, per mode, as
TF 2.15 deploys input_fn on the hosts of a TPU."""
import re

import numpy as np
import pytest

import tpu_fc
from tpu_fc._tf import tf

from harness import models

# One host of 2 cores: a global batch of 4, per-core batches of 2.
# The input numbers each batch: `t` is its first `x` on every row, a per-batch
# step (as a normalization or in-batch negatives would be) that shows which
# batches the input_fn made.

PIPELINE_X = np.arange(16, dtype=np.float32).reshape(16, 1)
PIPELINES = tpu_fc.InputPipelineConfig


def _pipeline_input_fn(seen):
  def input_fn(params, mode):
    context = params.get('context')
    index, count = (context.current_input_fn_deployment()[1:3] if context
                    else (0, 1))
    seen.append(('input_fn', mode, params['batch_size'], context and (
        context.current_input_fn_deployment()[1:], context.num_hosts,
        context.current_host)))
    dataset = tf.data.Dataset.from_tensor_slices(PIPELINE_X).shard(
        count, index).batch(params['batch_size'], drop_remainder=True).map(
            lambda x: ({'x': x, 't': tf.ones_like(x) * x[0]}, x))
    if mode != tpu_fc.ModeKeys.TRAIN:
      return dataset
    dataset = dataset.repeat()
    if count > 1:  # PER_SHARD_V1: tensors of this core's own input, as TF wants
      return tf.compat.v1.data.make_one_shot_iterator(dataset).get_next()
    return dataset
  return input_fn


def _pipeline_model_fn(seen):
  """`w` trains to the step's mean `t` (SGD(0.5) on (w - t)²); `core0_x`
  sums the `x` of core 0 (only shard 0's train_op runs, and TPU core 0's
  variables are the checkpoint's)."""
  def model_fn(features, labels, mode, params):
    del labels
    context = params.get('context')
    seen.append(('model_fn', mode, params['batch_size'],
                 context and context.num_replicas))
    w = tf.compat.v1.get_variable('w', [], initializer=tf.zeros_initializer())
    core0_x = tf.compat.v1.get_variable(
        'core0_x', [], initializer=tf.zeros_initializer(), trainable=False)
    if mode == tpu_fc.ModeKeys.PREDICT:
      return tpu_fc.TPUEstimatorSpec(mode, predictions={'t': features['t'][:, 0]})
    loss = tf.reduce_mean(tf.square(w - features['t']))
    if mode == tpu_fc.ModeKeys.EVAL:
      return tpu_fc.TPUEstimatorSpec(mode, loss=loss, eval_metrics=(
          lambda t: {'mean_t': tf.compat.v1.metrics.mean(t),
                     'core0_t': tf.compat.v1.metrics.mean(t[0]),
                     'core1_t': tf.compat.v1.metrics.mean(t[-1])},
          [features['t']]))
    optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.5)
    if params['use_tpu']:
      optimizer = tf.compat.v1.tpu.CrossShardOptimizer(optimizer)
    return tpu_fc.TPUEstimatorSpec(mode, loss=loss, train_op=tf.group(
        optimizer.minimize(loss, tf.compat.v1.train.get_global_step()),
        core0_x.assign_add(tf.reduce_sum(features['x']))))
  return model_fn


# Per pipeline, derived by hand from TF 2.15's rule (see docs/emulation.md,
# "Input pipelines"): what input_fn and model_fn get (batch size, and the
# input_fn context's (invocation index, count, replicas fed)), and the
# results.  TRAIN, 2 steps in one loop: `w` ends at the 2nd step's mean t,
# `core0_x` sums core 0's x.  EVAL on the TPU, 2 steps: the metric tensors of
# the cores, concatenated in core order (t[0] is core 0's first row, t[-1]
# core 1's last).  PREDICT: t of each example.
#   PER_HOST_V1: one call, batches of 4 (t 0, 4, ...), core c takes slice c
#     (in every mode: the model_fn's batch is 2 in PREDICT too,
#     `batch_size_for_model_fn`, `tpu_context.py` 578-588).
#   PER_HOST_V2: one call, batches of 2 (t 0, 2, 4, ...); core c of step s
#     takes batch 2s + c: step 0 [0 1 | 2 3], step 1 [4 5 | 6 7].
#   PER_SHARD_V1: in training one call per core, each sharding the data by its
#     invocation index: core 0 [0 2], [4 6] (t 0, 4), core 1 [1 3], [5 7]
#     (t 1, 5); elsewhere PER_HOST_V1's.
#   BROADCAST: one call, batches of 4, every core takes the whole batch.
PIPELINE_CASES = {
    'per_host_v1': dict(
        pipeline=PIPELINES.PER_HOST_V1,
        input_fn={'train': [(4, (0, 1, 2))], 'eval': [(4, (0, 1, 2))],
                  'infer': [(4, (0, 1, 2))]},
        model_fn={'train': 2, 'eval': 2, 'infer': 2},
        w=4.0, core0_x=(0 + 1) + (4 + 5),
        metrics={'mean_t': 2.0, 'core0_t': 2.0, 'core1_t': 2.0},
        predicted=[0] * 4 + [4] * 4 + [8] * 4 + [12] * 4),
    'per_host_v2': dict(
        pipeline=PIPELINES.PER_HOST_V2,
        input_fn={'train': [(2, (0, 1, 2))], 'eval': [(2, (0, 1, 2))],
                  'infer': [(2, (0, 1, 2))]},
        model_fn={'train': 2, 'eval': 2, 'infer': 2},
        w=(4 + 4 + 6 + 6) / 4, core0_x=(0 + 1) + (4 + 5),
        metrics={'mean_t': (0 + 0 + 2 + 2 + 4 + 4 + 6 + 6) / 8,
                 'core0_t': (0 + 4) / 2, 'core1_t': (2 + 6) / 2},
        predicted=[t for t in range(0, 16, 2) for _ in range(2)]),
    'per_shard_v1': dict(
        pipeline=PIPELINES.PER_SHARD_V1,
        input_fn={'train': [(2, (0, 2, 1)), (2, (1, 2, 1))],
                  'eval': [(4, (0, 1, 2))], 'infer': [(4, (0, 1, 2))]},
        model_fn={'train': 2, 'eval': 2, 'infer': 2},
        w=(4 + 4 + 5 + 5) / 4, core0_x=(0 + 2) + (4 + 6),
        metrics={'mean_t': 2.0, 'core0_t': 2.0, 'core1_t': 2.0},
        predicted=[0] * 4 + [4] * 4 + [8] * 4 + [12] * 4),
    'broadcast': dict(
        pipeline=PIPELINES.BROADCAST,
        input_fn={'train': [(4, (0, 1, 2))], 'eval': [(4, (0, 1, 2))],
                  'infer': [(4, (0, 1, 2))]},
        model_fn={'train': 4, 'eval': 4, 'infer': 4},
        w=4.0, core0_x=(0 + 1 + 2 + 3) + (4 + 5 + 6 + 7),
        metrics={'mean_t': 2.0, 'core0_t': 2.0, 'core1_t': 2.0},
        predicted=[0] * 4 + [4] * 4 + [8] * 4 + [12] * 4),
}


def _pipeline_estimator(model_dir, pipeline, seen, eval_on_tpu=True):
  return tpu_fc.TPUEstimator(
      model_fn=_pipeline_model_fn(seen), use_tpu=True, eval_on_tpu=eval_on_tpu,
      train_batch_size=4, eval_batch_size=4, predict_batch_size=4,
      config=tpu_fc.RunConfig(model_dir=str(model_dir), tpu_config=tpu_fc.TPUConfig(
          iterations_per_loop=2, num_shards=2,
          per_host_input_for_training=pipeline)))


@pytest.mark.parametrize('case', sorted(PIPELINE_CASES))
def test_input_pipelines_feed_the_cores_as_tf_2_15s(tmp_path, case):
  want = PIPELINE_CASES[case]
  seen = []
  estimator = _pipeline_estimator(tmp_path, want['pipeline'], seen)
  estimator.train(_pipeline_input_fn(seen), max_steps=2)
  assert estimator.get_variable_value('w') == want['w']
  assert estimator.get_variable_value('core0_x') == want['core0_x']
  metrics = estimator.evaluate(_pipeline_input_fn(seen), steps=2)
  assert {name: metrics[name] for name in want['metrics']} == want['metrics']
  predicted = [p['t'] for p in estimator.predict(_pipeline_input_fn(seen))]
  assert predicted == want['predicted']
  for mode in ('train', 'eval', 'infer'):
    assert [(size, deployment) for kind, seen_mode, size, (deployment, _, _) in
            (entry for entry in seen if entry[0] == 'input_fn')
            if seen_mode == mode] == want['input_fn'][mode], mode
    assert {size for kind, seen_mode, size, _ in seen
            if kind == 'model_fn' and seen_mode == mode} == {
                want['model_fn'][mode]}, mode
  # Every context: one host, this one; the model_fn's: 2 replicas.
  assert {entry[3][1:] for entry in seen if entry[0] == 'input_fn'} == {(1, 0)}
  assert {entry[3] for entry in seen if entry[0] == 'model_fn'} == {2}
  # Evaluation on the CPU (eval_on_tpu=False): input_fn and model_fn once,
  # the global batch of 4 (t 0, then 4), no context.
  seen[:] = []
  on_cpu = _pipeline_estimator(tmp_path, want['pipeline'], seen,
                               eval_on_tpu=False)
  metrics = on_cpu.evaluate(_pipeline_input_fn(seen), steps=2)
  assert {name: metrics[name] for name in want['metrics']} == {
      'mean_t': 2.0, 'core0_t': 2.0, 'core1_t': 2.0}
  assert seen == [('input_fn', 'eval', 4, None), ('model_fn', 'eval', 4, None)]


@pytest.mark.parametrize('pipeline', [PIPELINES.PER_HOST_V1,
                                      PIPELINES.PER_HOST_V2])
def test_predicted_batches_are_a_tpu_steps(tmp_path, pipeline):
  """2 cores, predict_batch_size 4, 10 rows: a TPU step predicts its cores'
  batches joined, [4, 4, 2] rows, whether input_fn gives a step's batch of 4
  (PER_HOST_V1, the last one of 2) or a core's of 2 (PER_HOST_V2: step s
  takes batches 2s and 2s + 1; the third step core 0's last batch and
  padding, which TF drops: `tpu_estimator.py` 1016-1021, 2297-2301)."""
  rows = np.arange(10, dtype=np.float32)[:, None]

  def model_fn(features, labels, mode, params):
    del labels, params
    return tpu_fc.TPUEstimatorSpec(mode, predictions={'x': features['x'] * 2})

  def input_fn(params):
    return tf.data.Dataset.from_tensor_slices({'x': rows}).batch(
        params['batch_size'])

  estimator = tpu_fc.TPUEstimator(
      model_fn, use_tpu=True, train_batch_size=4, predict_batch_size=4,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path), tpu_config=(
          tpu_fc.TPUConfig(num_shards=2,
                           per_host_input_for_training=pipeline))))
  batches = [batch['x'] for batch in estimator.predict(
      input_fn, yield_single_examples=False)]
  assert [len(batch) for batch in batches] == [4, 4, 2]
  np.testing.assert_array_equal(np.concatenate(batches), rows * 2)
  np.testing.assert_array_equal(
      [example['x'] for example in estimator.predict(input_fn)], rows * 2)


def test_each_core_predicts_its_slice_of_the_padded_batch_with_its_labels(
    tmp_path):
  """PER_HOST_V1 prediction on 2 cores, predict_batch_size 4, 6 rows: as TF
  2.15's TPU predicts (`tpu_estimator.py`: each batch padded to 4, 918-928,
  split over the cores, 972; the model_fn of a core gets its 2 rows, features
  and labels, 1929-1936, and `params['batch_size']` 2, `tpu_context.py`
  578-588; the cores' predictions joined, 2297-2301, the padding's dropped)."""
  rows = np.arange(6, dtype=np.float32)[:, None]
  seen = []

  def model_fn(features, labels, mode, params):
    seen.append((params['batch_size'], features['x'].shape.as_list(),
                 labels.shape.as_list()))
    return tpu_fc.TPUEstimatorSpec(
        mode, predictions={'sum': features['x'] + labels})

  def input_fn(params):
    return tf.data.Dataset.from_tensor_slices(({'x': rows}, 10 * rows)).batch(
        params['batch_size'])

  estimator = tpu_fc.TPUEstimator(
      model_fn, use_tpu=True, train_batch_size=4, predict_batch_size=4,
      config=tpu_fc.RunConfig(model_dir=str(tmp_path), tpu_config=(
          tpu_fc.TPUConfig(num_shards=2))))
  predicted = [p['sum'] for p in estimator.predict(input_fn)]
  np.testing.assert_array_equal(predicted, 11 * rows)
  assert seen == [(2, [2, 1], [2, 1])] * 2


@pytest.mark.legacy_only
@pytest.mark.parametrize('pipeline', [
    PIPELINES.PER_SHARD_V1, PIPELINES.PER_HOST_V1, PIPELINES.PER_HOST_V2,
    PIPELINES.BROADCAST])
@pytest.mark.parametrize('eval_input', [PIPELINES.PER_HOST_V1, PIPELINES.SLICED])
@pytest.mark.parametrize('num_cores, num_hosts', [(2, 1), (16, 2)])
def test_input_deployment_is_tf_2_15s(tmp_path, pipeline, eval_input,
                                      num_cores, num_hosts):
  """tpu_fc's deployment of each mode against TF 2.15's own
  `_InternalTPUContext` on the system tpu_fc emulates for `num_cores` (given
  that system's metadata, as TF's `_OneCoreTPUContext` gives one core's):
  one host of 2 cores, or a pod slice's 2 hosts of 8.  Input_fn and model_fn
  batch sizes, the host and context of each input_fn call, how the cores
  take batches (TF's branches in
  `_InputPipeline._invoke_input_fn_and_record_structure`), and TF's checks
  of the configuration (`_validate_tpu_configuration`: on several hosts,
  evaluation and prediction need an input that feeds them all), which
  tpu_fc makes before it calls input_fn."""
  # pylint: disable=g-import-not-at-top,protected-access
  from tensorflow_estimator.python.estimator.tpu import tpu_context as tf_context
  from tpu_fc.estimator.tpu import input_pipeline

  class PodContext(tf_context._InternalTPUContext):

    def _get_tpu_system_metadata(self):
      return tf.tpu.experimental.TPUSystemMetadata(
          num_cores=num_cores, num_hosts=num_hosts,
          num_of_cores_per_host=num_cores // num_hosts, topology=None,
          devices=[])

  class InputFnCalled(Exception):
    pass

  def input_fn(params):
    raise InputFnCalled(params)

  tpu = tf.compat.v1.estimator.tpu
  tf_config = tpu.RunConfig(tpu_config=tpu.TPUConfig(
      num_shards=num_cores, per_host_input_for_training=pipeline,
      eval_training_input_configuration=eval_input))
  ours = tpu_fc.TPUConfig(num_shards=num_cores,
                          per_host_input_for_training=pipeline,
                          eval_training_input_configuration=eval_input)
  estimator = tpu_fc.TPUEstimator(
      model_fn=_pipeline_model_fn([]), use_tpu=True, train_batch_size=32,
      eval_batch_size=32, predict_batch_size=32, config=tpu_fc.RunConfig(
          model_dir=str(tmp_path), tpu_config=ours))
  assert (estimator._ctx.num_hosts, estimator._ctx.num_replicas) == (
      num_hosts, num_cores)
  for mode in (tpu_fc.ModeKeys.TRAIN, tpu_fc.ModeKeys.EVAL,
               tpu_fc.ModeKeys.PREDICT):
    deployment = input_pipeline.deployment(ours, mode, num_cores, num_hosts,
                                           32)
    with PodContext(tf_config, 32, 32, 32, use_tpu=True).with_mode(
        mode) as context:
      try:
        context.is_running_on_cpu()  # (TF's checks of the configuration)
        tf_refusal = None
      except ValueError as e:
        tf_refusal = str(e)
      try:
        if mode == tpu_fc.ModeKeys.EVAL:
          estimator.evaluate(input_fn, steps=1)
        elif mode == tpu_fc.ModeKeys.PREDICT:
          next(estimator.predict(input_fn))
        refusal = 'input_fn not called'
      except ValueError as e:
        refusal = str(e)
      except InputFnCalled:
        refusal = None
      if mode != tpu_fc.ModeKeys.TRAIN:
        assert refusal == tf_refusal, mode
      if tf_refusal:
        continue
      sharded = context.is_input_sharded_per_core()
      broadcast = context.is_input_broadcast_with_iterators()
      kind = (input_pipeline.PER_CORE_CALLS if sharded else
              input_pipeline.WHOLE if broadcast and eval_input != PIPELINES.SLICED
              else input_pipeline.SPLIT if broadcast else
              input_pipeline.PER_HOST_V2
              if context.is_input_per_host_with_iterators() else
              input_pipeline.SPLIT)
      assert (deployment.kind, deployment.broadcast) == (kind, broadcast), mode
      assert deployment.input_fn_batch_size == context.batch_size_for_input_fn
      assert deployment.model_fn_batch_size == context.batch_size_for_model_fn
      # The hosts and invocation indices of TF's calls (its enqueue
      # functions': per core, 'ordinal_<core>' of each host).
      cores_per_host = num_cores // num_hosts
      tf_calls = ([(host, host * cores_per_host + core)
                   for host in range(num_hosts)
                   for core in range(cores_per_host)] if sharded else
                  [(0, 0)] if broadcast else
                  [(host, host) for host in range(num_hosts)])
      assert [tuple(deployment.call(index))
              for index in range(deployment.input_fn_calls)] == [
                  (host,) + tf_context.TPUContext(
                      context, invocation_index=index, host_id=host
                  ).current_input_fn_deployment()[1:]
                  for host, index in tf_calls], mode


# PER_HOST_V2 with embedding features: the engine looks up the cores' batches
# joined in core order; each core gets the activations of its own batch.
EMBEDDED_IDS = np.array([[1, 2], [3, 3], [4, 6], [5, 7]] * 4, np.int64)
EMBEDDED_Y = np.arange(16, dtype=np.float32).reshape(16, 1)


def _embedded_estimator(model_dir, pipeline, num_shards):
  column = tpu_fc.embedding_column(
      tf.feature_column.categorical_column_with_identity('ids', 8), 1,
      initializer=tf.compat.v1.zeros_initializer())

  return tpu_fc.TPUEstimator(
      model_fn=models.embedding_model_fn(
          [column], lambda logits, features, labels: tf.reduce_mean(
              tf.square(logits - labels)), layer=tf.keras.layers.DenseFeatures),
      use_tpu=True, train_batch_size=4,
      config=tpu_fc.RunConfig(model_dir=str(model_dir), tpu_config=tpu_fc.TPUConfig(
          iterations_per_loop=2, num_shards=num_shards,
          per_host_input_for_training=pipeline)),
      embedding_config_spec=tpu_fc.EmbeddingConfigSpec(
          feature_columns=[column],
          optimization_parameters=tpu_fc.AdagradParameters(0.5)))


def _centered_input_fn(params):
  """Labels centered over each batch input_fn makes (a per-batch step)."""
  return tf.data.Dataset.from_tensor_slices((EMBEDDED_IDS, EMBEDDED_Y)).batch(
      params['batch_size'], drop_remainder=True).map(
          lambda ids, y: ({'ids': tf.sparse.from_dense(ids)},
                          y - tf.reduce_mean(y))).repeat()


def _reassembled_input_fn(params):
  """The global batches PER_HOST_V2 makes of `_centered_input_fn` on 2 cores,
  by hand: labels centered over each pair of rows, 4 rows a batch."""
  pairs = EMBEDDED_Y.reshape(-1, 2)
  centered = (pairs - pairs.mean(axis=1, keepdims=True)).reshape(-1, 1)
  return tf.data.Dataset.from_tensor_slices((EMBEDDED_IDS, centered)).batch(
      params['batch_size'], drop_remainder=True).map(
          lambda ids, y: ({'ids': tf.sparse.from_dense(ids)}, y)).repeat()


def test_per_host_v2_embeddings_train_as_one_core_on_the_joined_batches(
    tmp_path):
  """2 cores, PER_HOST_V2, 2 steps: the table is what one core training on
  the reassembled global batches makes (Adagrad with gradient accumulation:
  one update of the summed gradients, TPU's rule for several cores), and not
  what PER_HOST_V1 makes (labels centered over 4 rows)."""
  tables = {}
  for name, pipeline, shards, input_fn in (
      ('v2', PIPELINES.PER_HOST_V2, 2, _centered_input_fn),
      ('one_core', PIPELINES.PER_HOST_V1, None, _reassembled_input_fn),
      ('v1', PIPELINES.PER_HOST_V1, 2, _centered_input_fn)):
    estimator = _embedded_estimator(tmp_path / name, pipeline, shards)
    estimator.train(input_fn, max_steps=2)
    tables[name] = estimator.get_variable_value(
        'dense_features/ids_embedding/embedding_weights')
  # (float32 sums of an id's 2 to 4 gradients, maybe in another order: a few
  # roundings of values near 1, far below the 0.1 the pipelines differ by)
  np.testing.assert_allclose(tables['v2'], tables['one_core'], rtol=1e-6)
  assert np.abs(tables['v2'] - tables['v1']).max() > 0.1


# A pod slice of 16 cores: 2 hosts of 8 (`tpu_context.EmulatedSystem`), a
# global batch of 32.  Each host's input_fn reads its own shard of the rows
# (`current_host`): host 0 the even ones, host 1 the odd ones.
POD_X = np.arange(128, dtype=np.float32).reshape(128, 1)


def _host_sharded_input_fn(seen):
  def input_fn(params):
    context = params['context']
    seen.append((params['batch_size'], context.current_input_fn_deployment(),
                 context.current_host, context.num_hosts))
    return tf.data.Dataset.from_tensor_slices(POD_X).shard(
        context.num_hosts, context.current_host).batch(
            params['batch_size'], drop_remainder=True).map(
                lambda x: ({'x': x, 't': tf.ones_like(x) * x[0]}, x)).repeat()
  return input_fn


def _pipeline_ops_by_host(graph):
  """{host: the devices of the ops named `input_pipeline_task<host>/...`}."""
  hosts = {}
  for op in graph.get_operations():
    match = re.match(r'input_pipeline_task(\d+)/', op.name)
    if match:
      hosts.setdefault(int(match.group(1)), set()).add(op.device)
  return hosts


# Per pipeline, by hand (TF 2.15: `batch_size_for_input_fn`, `tpu_context.py`
# 563-576; `current_input_fn_deployment` 99-148; the per-host branch of
# `_invoke_input_fn_and_record_structure`, `tpu_estimator.py` 1540-1590):
# input_fn's batch size and (index, count, replicas fed) of its 2 calls; one
# step's mean t (which `w` trains to) and core 0's x.
#   PER_HOST_V1: each host a batch of 16 (t 0 on host 0, 1 on host 1), its
#     cores a slice of 2 each: mean t 0.5; core 0 has rows 0 and 2.
#   PER_HOST_V2: each host batches of 2; core k of host h takes its host's
#     batch k: t 4k on host 0, 4k + 1 on host 1, mean 14.5; core 0: 0 and 2.
# (One host of 16 cores would give PER_HOST_V1 one call of 32 rows, t 0.)
POD_CASES = {
    'per_host_v1': (PIPELINES.PER_HOST_V1, 16, 0.5, 0 + 2),
    'per_host_v2': (PIPELINES.PER_HOST_V2, 2, 14.5, 0 + 2),
}


@pytest.mark.parametrize('case', sorted(POD_CASES))
def test_a_pod_slice_calls_input_fn_on_each_host(tmp_path, case):
  pipeline, batch_size, mean_t, core0_x = POD_CASES[case]
  seen, graphs = [], []
  model_fn = _pipeline_model_fn([])

  def recording_model_fn(features, labels, mode, params):
    graphs.append(tf.compat.v1.get_default_graph())
    return model_fn(features, labels, mode, params)

  def estimator(master=''):
    return tpu_fc.TPUEstimator(
        model_fn=recording_model_fn, use_tpu=True, train_batch_size=32,
        eval_batch_size=32, predict_batch_size=32,
        config=tpu_fc.RunConfig(
            model_dir=str(tmp_path / master.replace(':', '')), master=master,
            tpu_config=tpu_fc.TPUConfig(iterations_per_loop=1, num_shards=16,
                                        per_host_input_for_training=pipeline)))

  trained = estimator()
  trained.train(_host_sharded_input_fn(seen), max_steps=1)
  assert seen == [(batch_size, ('/replica:0/task:0/device:CPU:0', host, 2, 8),
                   host, 2) for host in range(2)]
  assert trained.get_variable_value('w') == mean_t
  assert trained.get_variable_value('core0_x') == core0_x
  # A local master's hosts are this process: every pipeline on its CPU.
  assert _pipeline_ops_by_host(graphs[-1]) == {
      host: {'/replica:0/task:0/device:CPU:0'} for host in range(2)}
  # A remote master's (here one no session can reach, so only the graph is
  # built) are the TPU job's tasks: host h's pipeline on task h's CPU
  # (`tpu_host_placement_function`, `tpu_context.py` 630-652).
  with pytest.raises(tf.errors.NotFoundError):
    estimator('fake://tpu').train(_host_sharded_input_fn([]), max_steps=1)
  assert _pipeline_ops_by_host(graphs[-1]) == {
      host: {'/job:tpu_worker/task:{}/device:CPU:0'.format(host)}
      for host in range(2)}
  # On several hosts evaluation takes PER_HOST_V2 (or a broadcast input),
  # prediction a broadcast input (`_validate_tpu_configuration`, 745-788).
  if pipeline == PIPELINES.PER_HOST_V1:
    with pytest.raises(ValueError, match=re.escape(
        'TPUEstimator.evaluate is only supported under three conditions: 1. '
        'num_hosts=1; 2. BROADCAST mode; 3. PER_HOST_V2 mode. mode: 2; '
        'num_hosts: 2; num_replicas=1:16')):
      trained.evaluate(_host_sharded_input_fn([]), steps=1)
  with pytest.raises(ValueError, match=re.escape(
      'TPUEstimator.predict is only supported under three conditions: 1. '
      'num_hosts=1; 2. BROADCAST mode; 3. PER_HOST_V2 mode with '
      'num_replicas=1. mode: {}; num_hosts: 2; num_replicas=1:16'.format(
          pipeline))):
    next(trained.predict(_host_sharded_input_fn([])))
