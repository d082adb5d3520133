"""The contract every lookup path keeps, on this lane: lookup path x input kind x
optimizer (a pairwise covering of them, `CASES`), two training steps (one
in-graph loop on the emulated TPU) against the reference oracle
(`harness.oracle`).

cpu: `use_tpu=False`, the table a model variable trained by the model's
optimizer; embedding_core: the emulated TPU, the table the engine's, trained by
the spec's optimizer with the TPU's rule for several cores (one summed update,
or each core's in turn without gradient accumulation); tensor_core: the
emulated TPU, the table a model variable; mid_level: the model migrated to TF2,
`tpu_fc.mid_level.TPUEmbedding` driven by its training loop (enqueue, dequeue,
apply_gradients in a `tf.function`) on as many emulated cores, the table
trained by the mid-level twin of the spec's optimizer.  The model's optimizers
on the tables of cpu and tensor_core are those whose sparse update is a
reference rule (SGD, Adagrad), and which the emulated `CrossShardOptimizer` so
applies by rows.  On the legacy lane the cpu path must also equal TF 2.15's
own TPUEstimator(use_tpu=False), bit for bit.
"""
import numpy as np
import pytest

from harness import covering
from harness import estimators
from harness import inputs
from harness import lanes
from harness import mid_level
from harness import models
from harness import oracle
import tpu_fc
from tpu_fc._tf import tf
from tpu_fc.lookup import backends

# The optimizers of each path's table: the spec's (embedding_core: those it
# takes with columns; mid_level: those with a twin in
# tf.tpu.experimental.embedding, the only ones a migrated loop trains), or the
# model's.
OPTIMIZERS = {'embedding_core': sorted(estimators.COLUMN_OPTIMIZERS),
              'mid_level': sorted(mid_level.MID_LEVEL_OPTIMIZERS)}
# cpu takes no ragged input: TF's feature columns take no RaggedTensor
# (use_tpu=False is TF 2.15's graph); tests/test_bad_input.py has its error.
GRID = [(path, kind, name)
        for path in models.PATHS for kind in inputs.INPUT_KINDS
        for name in OPTIMIZERS.get(path, sorted(estimators.MODEL_OPTIMIZERS))
        if (path, kind) != ('cpu', 'ragged')]
# Adagrad on sparse input, on every path: what the bound's own test re-reads.
BOUND_CASES = [(path, 'sparse', 'adagrad') for path in models.PATHS]
# Pairwise: every optimizer on every path that runs it, and on every input
# kind; every path on every input kind.  A path reads the input kind into ids
# and weights, which the optimizer's rule sees only as each row's gradients,
# and the rule is the path's (the spec's, its mid-level twin's or the model's
# optimizer), so no bug needs all three levels together.
CASES = covering.pairwise(GRID, keep=BOUND_CASES)

pytestmark = pytest.mark.filterwarnings('ignore::UserWarning')


def _trained(model_dir, path, optimizer, kind, slots=()):
  """(table, {slot: value} of `slots`) of the contract model after two steps
  on `path` of `kind` input: the estimator's variables (`slots`: the
  optimizer's (suffix, slot) pairs), or the migrated TF2 loop's."""
  if path == 'mid_level':
    # Dense padded ids are combined per example against an output shape of
    # the examples (a SparseCore's reading; without one, one id a position).
    per_core = [len(inputs.IDS) // estimators.NUM_SHARDS]
    table, values = mid_level.train(
        mid_level.tpu_embedding(optimizer, estimators.NUM_SHARDS,
                                output_shape=per_core if kind == 'dense'
                                else None), kind, 2, estimators.NUM_SHARDS)
    return table, {slot: values[slot] for _, slot in slots}
  estimator = estimators.contract_estimator(model_dir, path, optimizer)
  estimator.train(inputs.contract_input_fn(kind), steps=2)
  return estimator.get_variable_value(models.TABLE), {
      slot: estimator.get_variable_value('{}/{}'.format(models.TABLE, suffix))
      for suffix, slot in slots}


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """(path, kind, optimizer) -> (model_dir, table, slots) of that training,
  run once for the tests reading it (the bound's test re-reads CASES')."""
  done = {}

  def train(path, kind, optimizer):
    case = (path, kind, optimizer)
    if case not in done:
      model_dir = tmp_path_factory.mktemp('-'.join(case))
      slots = oracle.expected_step(path, optimizer, steps=2).params.SLOTS
      done[case] = (model_dir,) + _trained(model_dir, path, optimizer, kind,
                                           slots)
    return done[case]
  return train


@pytest.mark.parametrize('path, kind, optimizer', CASES,
                         ids=['-'.join(case) for case in CASES])
def test_two_steps_match_the_reference(trained, tmp_path, path, kind,
                                       optimizer):
  want = oracle.expected_step(path, optimizer, steps=2)
  model_dir, table, slots = trained(path, kind, optimizer)
  want.assert_matches(table, slots, err_msg='-'.join((path, kind, optimizer)))
  if path in ('cpu', 'tensor_core'):  # a model variable: updated by rows, as
    # a TPU's dense sum of them would (tensor_core), never as a whole table
    ops = estimators.op_types(model_dir)
    assert ops & estimators.ROW_UPDATES and not ops & estimators.DENSE_UPDATES
  if path == 'cpu' and lanes.LEGACY:
    tf_estimator = estimators.tf_contract_estimator(tmp_path / 'tf', optimizer)
    tf_estimator.train(inputs.contract_input_fn(kind), steps=2)
    np.testing.assert_array_equal(
        table, tf_estimator.get_variable_value(models.TABLE))


# TF's class as named at import, before any build: while shards are built
# the name is the emulation's subclass, which keeps row gradients rows.
TF_CROSS_SHARD_OPTIMIZER = tf.compat.v1.tpu.CrossShardOptimizer


@pytest.mark.parametrize('optimizer', sorted(estimators.MODEL_OPTIMIZERS))
def test_tfs_own_cross_shard_optimizer_sums_a_tensor_core_table_densely(
    tmp_path, optimizer):
  """An optimizer made from TF's `CrossShardOptimizer` class itself sums a
  tensor-core table's row gradients densely, as a TPU does: the same table as
  the oracle's, by a whole-table update."""
  estimator = estimators.contract_estimator(
      tmp_path, 'tensor_core', optimizer,
      cross_shard_optimizer=TF_CROSS_SHARD_OPTIMIZER)
  estimator.train(inputs.contract_input_fn('sparse'), steps=2)
  want = oracle.expected_step('tensor_core', optimizer, steps=2)
  want.assert_matches(
      estimator.get_variable_value(models.TABLE),
      {slot: estimator.get_variable_value(
          '{}/{}'.format(models.TABLE, suffix))
       for suffix, slot in want.params.SLOTS}, err_msg=optimizer)
  ops = estimators.op_types(tmp_path)
  assert ops & estimators.DENSE_UPDATES and not ops & estimators.ROW_UPDATES


@pytest.mark.parametrize('path, kind, optimizer', BOUND_CASES,
                         ids=[path for path, _, _ in BOUND_CASES])
def test_the_bound_rejects_a_gradient_0_1_percent_off(trained, monkeypatch,
                                                      path, kind, optimizer):
  """The float32 bound of the comparison is tight enough to fail a rule that
  is 0.1% off (here: every gradient)."""
  _, table, _ = trained(path, kind, optimizer)
  monkeypatch.setattr(models, 'COEF', models.COEF * 1.001)
  with pytest.raises(AssertionError, match='beyond the float32 error bound'):
    oracle.expected_step(path, optimizer, steps=2).assert_matches(table)


@pytest.mark.parametrize('mode, on_tpu, want', [
    ('train', True, ['EmbeddingCoreBackend', 'TensorCoreBackend']),
    ('eval', True, ['EmbeddingCoreBackend', 'TensorCoreBackend']),
    ('infer', True, ['CpuLookupBackend']),
    ('train', False, []), ('eval', False, []), ('infer', False, []),
])
def test_one_dispatch_picks_the_backends_of_a_mode(mode, on_tpu, want):
  """The emulated TPU's TRAIN and EVAL graphs look up on the engine and the
  tensor core; its PREDICT graph and every use_tpu=False graph in the columns."""
  spec = tpu_fc.EmbeddingConfigSpec(
      feature_columns=[models.contract_column('embedding_core'),
                       models.contract_column('tensor_core')],
      optimization_parameters=estimators.EMBEDDING_OPTIMIZERS['sgd'])
  assert [type(backend).__name__ for backend in
          backends.backends_for(spec, mode, on_tpu)] == want
