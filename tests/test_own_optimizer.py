"""An optimizer tpu_fc does not have, declared as one class here, with its oracle
rule: it trains through every lookup path and its checkpoints convert both ways
and inspect, with no library edit (issue 37: an optimizer lives in one place).

`DecayedAdagradParameters`: Adagrad whose accumulator decays,
`a = decay·a + g²;  w -= η g / √a`; no legacy class and no TF kernel has it.
Its rule on the host engine is a row function of TF ops (its `RULE`); its
oracle, the same rule in numpy, is registered with the harness for each test.
Its mid-level twin, for checkpoints, is TF's `Adagrad`, whose one slot is its
own (`accumulators`); the mid-level API cannot carry the decay, so a mid-level
`Adagrad` still converts to `AdagradParameters`.
"""
import numpy as np
import pytest

from harness import checkpoints
from harness import estimators
from harness import inputs
from harness import models
from harness import oracle
import tpu_fc
from tpu_fc import checkpoint_conversion as conversion
from tpu_fc import optimizers
from tpu_fc._tf import tf


def _decayed_adagrad_rows(parameters, w, slots, g, lr):
  """The engine's rule, on TF ops over the looked-up rows (float32)."""
  decay = tf.constant(np.float32(parameters.decay))
  a = decay * slots['accumulators'] + g * g
  return w - lr * g / tf.sqrt(a), {'accumulators': a}


class DecayedAdagradParameters(optimizers._OptimizationParameters):  # pylint: disable=protected-access
  """Adagrad with a decaying accumulator: `a = decay·a + g²; w -= lr·g/√a`."""
  SLOTS = (('DecayedAdagrad', 'accumulators'),)
  SLOT_INITIAL_FIELDS = {'accumulators': 'initial_accumulator'}
  TPU_ONLY_SLOTS = True
  FEATURE_COLUMNS = True
  MID_LEVEL = optimizers.Twin(
      'Adagrad', initial_accumulator='initial_accumulator_value')
  RULE = optimizers.Rule(rows=_decayed_adagrad_rows)

  def __init__(self, learning_rate, decay=0.5, initial_accumulator=0.1,
               use_gradient_accumulation=True, clip_weight_min=None,
               clip_weight_max=None, weight_decay_factor=None,
               multiply_weight_decay_factor_by_learning_rate=None,
               clip_gradient_min=None, clip_gradient_max=None):
    super().__init__(learning_rate, use_gradient_accumulation, clip_weight_min,
                     clip_weight_max, weight_decay_factor,
                     multiply_weight_decay_factor_by_learning_rate,
                     clip_gradient_min, clip_gradient_max)
    self._keep(locals())


# The oracle: the rule in numpy, as tpu_fc.reference writes its rules, and the
# magnitudes of its terms (harness.oracle's float32 bound).
def _decayed_adagrad(params, w, slots, g, lr):
  a = np.float32(params.decay) * slots['accumulators'] + g * g
  return w - lr * g / np.sqrt(a), {'accumulators': a}


def _decayed_adagrad_magnitudes(p, x, m, lr):
  a = p.decay * x['accumulators'] + x['g'] ** 2
  return {'accumulators': p.decay * m['accumulators'] + m['g'] ** 2,
          'table': m['table'] + lr * m['g'] / np.sqrt(a)}


OWN = 'decayed_adagrad'
# (the contract's Adagrad has this initial accumulator too: only the decay differs)
OWN_OPTIMIZERS = {
    OWN: DecayedAdagradParameters(models.LR, decay=0.5, initial_accumulator=0.1),
    # Without gradient accumulation: the cores' sums applied in turn.
    OWN + '_per_core': DecayedAdagradParameters(
        models.LR, decay=0.5, initial_accumulator=0.1,
        use_gradient_accumulation=False),
}


@pytest.fixture
def own(monkeypatch):
  """The harness knows the class for the test: its oracle rule, and its
  parameters among the contract's optimizers."""
  oracle.register_rule(
      monkeypatch, DecayedAdagradParameters.__name__,
      lambda params: {'accumulators': params.initial_accumulator},
      _decayed_adagrad, _decayed_adagrad_magnitudes)
  for name, params in OWN_OPTIMIZERS.items():
    monkeypatch.setitem(estimators.EMBEDDING_OPTIMIZERS, name, params)


def _slot_values(estimator, slots):
  return {slot: estimator.get_variable_value(
      '{}/{}'.format(models.TABLE, suffix)) for suffix, slot in slots}


@pytest.mark.usefixtures('own')
@pytest.mark.parametrize('optimizer', sorted(OWN_OPTIMIZERS))
def test_the_host_engine_applies_the_classs_rule(tmp_path, optimizer):
  """The emulated TPU's embedding core, on two cores, two steps: the table and
  accumulators are the oracle's, and not those of its twin's rule."""
  estimator = estimators.contract_estimator(tmp_path, 'embedding_core',
                                            optimizer)
  estimator.train(inputs.contract_input_fn('sparse'), steps=2)
  table = estimator.get_variable_value(models.TABLE)
  slots = _slot_values(estimator, DecayedAdagradParameters.SLOTS)
  oracle.expected_step('embedding_core', optimizer, steps=2).assert_matches(
      table, slots)
  with pytest.raises(AssertionError, match=oracle.BEYOND_BOUND):
    oracle.expected_step('embedding_core', 'adagrad', steps=2).assert_matches(
        table, slots)


@pytest.mark.usefixtures('own')
@pytest.mark.parametrize('path', ['cpu', 'tensor_core'])
def test_the_models_optimizer_trains_the_other_paths(tmp_path, path):
  """With the class as the spec's optimizer, the cpu and tensor-core tables
  are model variables that the model's SGD trains, and have no slot."""
  estimator = estimators.contract_estimator(tmp_path, path, 'sgd',
                                            spec_optimizer=OWN)
  estimator.train(inputs.contract_input_fn('sparse'), steps=2)
  oracle.expected_step(path, 'sgd', steps=2).assert_matches(
      estimator.get_variable_value(models.TABLE), {})
  assert not [name for name in estimator.get_variable_names()
              if name.startswith(models.TABLE + '/')]


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
  """A legacy checkpoint of `harness.checkpoints`' model trained with the
  class on the emulated TPU, and its conversion to a mid-level one."""
  spec = checkpoints.make_spec(OWN_OPTIMIZERS[OWN])
  model_dir = tmp_path_factory.mktemp('own')
  checkpoints.train(model_dir, spec)
  mid_level = conversion.to_mid_level_checkpoint(spec, str(model_dir),
                                                 str(model_dir / 'mid_level'))
  return spec, model_dir, mid_level


def test_inspect_names_the_class_and_finds_its_tables(trained):
  """Its slot suffix is TPU-only: without a spec its tables are found by it."""
  _, model_dir, mid_level = trained
  for spec in (None, trained[0]):
    report = conversion.inspect_checkpoint(str(model_dir), spec)
    tables = {t['name']: t for t in report['tables']}
    assert tables[checkpoints.A_TABLE] == {
        'name': checkpoints.A_TABLE, 'shape': [10, 4],
        'optimizer': 'DecayedAdagrad (TPU embedding)',
        'slots': {'DecayedAdagrad': [10, 4]}}
  # A mid-level checkpoint is its twin's: nothing tells the two apart.
  tables = {t['name']: t
            for t in conversion.inspect_checkpoint(mid_level)['tables']}
  assert tables['tbl_a']['optimizer'] == 'Adagrad'
  assert tables['tbl_a']['slots'] == {'accumulators': [10, 4]}


def test_converts_into_tfs_tpu_embedding_and_back_bit_for_bit(trained,
                                                              tmp_path):
  spec, model_dir, mid_level = trained
  legacy = checkpoints.checkpoint_values(model_dir)
  variables = checkpoints.tpu_embedding_variables(spec, mid_level)
  for table, legacy_name in (('tbl_a', checkpoints.A_TABLE),
                             ('tbl_b_c_shared_embedding',
                              checkpoints.SHARED_TABLE)):
    assert sorted(variables[table]) == ['accumulators', 'parameters']
    np.testing.assert_array_equal(variables[table]['parameters'].numpy(),
                                  legacy[legacy_name])
    accumulators = legacy[legacy_name + '/DecayedAdagrad']
    np.testing.assert_array_equal(variables[table]['accumulators'].numpy(),
                                  accumulators)
    assert np.any(accumulators != 0.1), table  # trained
  checkpoints.assert_converted_back(
      conversion.to_legacy_checkpoint(spec, mid_level, str(tmp_path)), legacy)


def test_the_library_lists_stay_tpu_fcs():
  """Defining the class adds no public name and leaves tpu_fc's lists (TF's
  seven of the spec's error text among them) as they are; a mid-level Adagrad
  still converts to tpu_fc's Adagrad."""
  assert DecayedAdagradParameters in optimizers.optimizer_classes()
  assert DecayedAdagradParameters not in optimizers.ALL_OPTIMIZERS
  assert len(optimizers.SUPPORTED_OPTIMIZERS) == 7
  assert 'DecayedAdagradParameters' not in tpu_fc.__all__
  assert type(optimizers.from_mid_level(
      OWN_OPTIMIZERS[OWN].to_mid_level())) is tpu_fc.AdagradParameters
