"""tpu_fc's legacy `*Parameters` against TF 2.15's and the mid-level optimizers.

On the legacy lane the reference is TF 2.15's own classes in
`tensorflow.python.tpu.tpu_embedding`; on both lanes the expected error texts,
defaults and slot names are written out here from LEGACY_SEMANTICS §4 and §7, and
mid-level expectations are built with `tf.tpu.experimental.embedding` directly.
Nothing expected is computed with tpu_fc.
"""
import inspect
import pickle
import re

import pytest

from harness import lanes
from harness.oracle import outcome
import tpu_fc  # before tensorflow
from tpu_fc import optimizers
import tensorflow as tf  # pylint: disable=g-bad-import-order


E = tf.tpu.experimental.embedding

NAMES = ['StochasticGradientDescentParameters', 'AdagradParameters',
         'AdamParameters', 'FtrlParameters', 'ProximalAdagradParameters',
         'MomentumParameters', 'RMSPropParameters',
         'AdagradMomentumParameters', 'ProximalYogiParameters',
         'FrequencyEstimatorParameters']
EXPORTED = NAMES[:4]  # tf.compat.v1.tpu.experimental.* on TF 2.15
# Fields its constructor sets without an argument: TF 2.15's
# FrequencyEstimatorParameters takes none of the common arguments.
FIXED = {'FrequencyEstimatorParameters': dict(
    learning_rate=1.0, use_gradient_accumulation=True, clip_weight_min=None,
    clip_weight_max=None, weight_decay_factor=None,
    multiply_weight_decay_factor_by_learning_rate=None, clip_gradient_min=None,
    clip_gradient_max=None)}
WITH_COMMON_ARGUMENTS = [name for name in NAMES if name not in FIXED]

COMMON_DEFAULTS = dict(use_gradient_accumulation=True, clip_weight_min=None,
                       clip_weight_max=None, weight_decay_factor=None,
                       multiply_weight_decay_factor_by_learning_rate=None,
                       clip_gradient_min=None, clip_gradient_max=None)
# Arguments without a default (LEGACY_SEMANTICS §4.1).
REQUIRED = {
    'StochasticGradientDescentParameters': dict(learning_rate=0.1),
    'AdagradParameters': dict(learning_rate=0.1),
    'AdamParameters': dict(learning_rate=0.1),
    'FtrlParameters': dict(learning_rate=0.1),
    'ProximalAdagradParameters': dict(learning_rate=0.1),
    'MomentumParameters': dict(learning_rate=0.1, momentum=0.9),
    'RMSPropParameters': dict(learning_rate=0.1, rho=0.9, momentum=0.5,
                              epsilon=1e-3),
    'AdagradMomentumParameters': dict(learning_rate=0.1, momentum=0.9),
    'ProximalYogiParameters': {},
    'FrequencyEstimatorParameters': dict(tau=0.1, max_delta=100.0,
                                         outlier_threshold=2.0,
                                         weight_exponent=1.0),
}
# Own defaults (LEGACY_SEMANTICS §4.1); Ftrl also has attribute
# initial_linear_value=0.0.
OWN_DEFAULTS = {
    'StochasticGradientDescentParameters': {},
    'AdagradParameters': dict(initial_accumulator=0.1),
    'AdamParameters': dict(beta1=0.9, beta2=0.999, epsilon=1e-08,
                           lazy_adam=True, sum_inside_sqrt=True),
    'FtrlParameters': dict(learning_rate_power=-0.5, initial_accumulator_value=0.1,
                           initial_linear_value=0.0,
                           l1_regularization_strength=0.0,
                           l2_regularization_strength=0.0,
                           multiply_linear_by_learning_rate=False, beta=0,
                           allow_zero_accumulator=False),
    'ProximalAdagradParameters': dict(initial_accumulator=0.1,
                                      l1_regularization_strength=0.0,
                                      l2_regularization_strength=0.0),
    'MomentumParameters': dict(use_nesterov=False),
    'RMSPropParameters': {},
    'AdagradMomentumParameters': dict(use_nesterov=False, exponent=2, beta2=1,
                                      epsilon=1e-10),
    'ProximalYogiParameters': dict(learning_rate=0.01, beta1=0.9, beta2=0.999,
                                   epsilon=1e-3,
                                   l1_regularization_strength=0.0,
                                   l2_regularization_strength=0.0,
                                   initial_accumulator_value=1e-6),
    'FrequencyEstimatorParameters': {},
}
# Non-default arguments for every field a constructor takes.
NON_DEFAULT_COMMON = dict(use_gradient_accumulation=True, clip_weight_min=-2.0,
                          clip_weight_max=3.0, weight_decay_factor=0.01,
                          multiply_weight_decay_factor_by_learning_rate=True,
                          clip_gradient_min=-0.5, clip_gradient_max=0.25)
NON_DEFAULT_OWN = {
    'StochasticGradientDescentParameters': {},
    'AdagradParameters': dict(initial_accumulator=0.7),
    'AdamParameters': dict(beta1=0.8, beta2=0.95, epsilon=1e-3, lazy_adam=False,
                           sum_inside_sqrt=False),
    'FtrlParameters': dict(learning_rate_power=-0.25,
                           initial_accumulator_value=0.2,
                           l1_regularization_strength=0.01,
                           l2_regularization_strength=0.02,
                           multiply_linear_by_learning_rate=True, beta=0.5,
                           allow_zero_accumulator=True),
    'ProximalAdagradParameters': dict(initial_accumulator=0.3,
                                      l1_regularization_strength=0.04,
                                      l2_regularization_strength=0.05),
    'MomentumParameters': dict(momentum=0.6, use_nesterov=True),
    'RMSPropParameters': dict(rho=0.8, momentum=0.3, epsilon=1e-4),
    'AdagradMomentumParameters': dict(momentum=0.6, use_nesterov=True,
                                      exponent=3.0, beta2=0.9, epsilon=0.1),
    'ProximalYogiParameters': dict(beta1=0.8, beta2=0.95, epsilon=1e-2,
                                   l1_regularization_strength=0.01,
                                   l2_regularization_strength=0.02,
                                   initial_accumulator_value=0.5),
    'FrequencyEstimatorParameters': dict(tau=0.2, max_delta=50.0,
                                         outlier_threshold=3.0,
                                         weight_exponent=0.5),
}


def _non_default(name, learning_rate=0.25):
  if name in FIXED:
    return dict(NON_DEFAULT_OWN[name])
  return dict(NON_DEFAULT_COMMON, learning_rate=learning_rate,
              **NON_DEFAULT_OWN[name])


def _another(name):
  """`_non_default(name)` with one field changed."""
  if name in FIXED:
    return dict(_non_default(name), tau=0.3)
  return _non_default(name, learning_rate=0.5)


def _ours(name):
  return getattr(tpu_fc, name)


def _theirs(name):
  return getattr(lanes.tf_tpu_embedding, name)


def _public(obj):
  return {k: v for k, v in vars(obj).items() if not k.startswith('_')}




def test_exported_from_package_and_module():
  for name in NAMES:
    assert _ours(name) is getattr(optimizers, name)
    assert name in tpu_fc.__all__
  # TF 2.15's `_tpu_estimator_embedding._SUPPORTED_OPTIMIZERS`, in its order.
  assert optimizers.SUPPORTED_OPTIMIZERS == tuple(
      _ours(n) for n in ['ProximalAdagradParameters', 'AdagradParameters',
                         'AdamParameters', 'FtrlParameters',
                         'StochasticGradientDescentParameters',
                         'MomentumParameters', 'RMSPropParameters'])
  assert sorted(cls.__name__ for cls in optimizers.ALL_OPTIMIZERS) == sorted(
      NAMES)


# --------------------------------------------------------------------------------
# Signatures.
# --------------------------------------------------------------------------------

def _signature(cls):
  return [(p.name, p.kind, p.default)
          for p in inspect.signature(cls).parameters.values()]


@pytest.mark.legacy_only
@pytest.mark.parametrize('name', NAMES)
def test_signature_matches_tf_2_15(name):
  assert _signature(_ours(name)) == _signature(_theirs(name))


@pytest.mark.legacy_only
@pytest.mark.parametrize('name', EXPORTED)
def test_tf_2_15_exports_are_the_reference_classes(name):
  assert getattr(tf.compat.v1.tpu.experimental, name) is _theirs(name)


@pytest.mark.parametrize('name', NAMES)
def test_signature_defaults_match_legacy_semantics(name):
  params = inspect.signature(_ours(name)).parameters
  required = [n for n, p in params.items() if p.default is inspect.Parameter.empty]
  assert required == list(REQUIRED[name])
  defaults = {n: p.default for n, p in params.items()
              if p.default is not inspect.Parameter.empty}
  expected = dict({} if name in FIXED else COMMON_DEFAULTS,
                  **OWN_DEFAULTS[name])
  expected.pop('initial_linear_value', None)  # attribute, not an argument
  assert defaults == expected
  assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
             for p in params.values())


# --------------------------------------------------------------------------------
# Validation: same type and text as TF 2.15 and as LEGACY_SEMANTICS §4.1.
# --------------------------------------------------------------------------------

CLIP = ('When using gradient clipping limits, gradient  accumulation must be '
        'enabled.')
NO_ACCUMULATION = dict(use_gradient_accumulation=False)

VALIDATION = []
for _name in WITH_COMMON_ARGUMENTS:
  VALIDATION += [
      (_name, 'clip_min_without_accumulation',
       dict(clip_gradient_min=-1.0, **NO_ACCUMULATION), ValueError, CLIP),
      (_name, 'clip_max_without_accumulation',
       dict(clip_gradient_max=1.0, **NO_ACCUMULATION), ValueError, CLIP),
      (_name, 'clip_zero_without_accumulation',
       dict(clip_gradient_min=0.0, **NO_ACCUMULATION), ValueError, CLIP),
  ]
VALIDATION += [
    ('AdagradParameters', 'initial_accumulator_zero', dict(initial_accumulator=0),
     ValueError, 'Adagrad initial_accumulator must be greater than zero. '
     'Received: 0.'),
    ('AdagradParameters', 'initial_accumulator_negative',
     dict(initial_accumulator=-0.5), ValueError,
     'Adagrad initial_accumulator must be greater than zero. Received: -0.5.'),
    ('AdagradParameters', 'order_clip_before_accumulator',
     dict(initial_accumulator=0, clip_gradient_max=1.0, **NO_ACCUMULATION),
     ValueError, CLIP),
    ('AdamParameters', 'beta1_negative', dict(beta1=-0.1), ValueError,
     'beta1 must be between 0. and 1; got -0.1.'),
    ('AdamParameters', 'beta1_one', dict(beta1=1.0), ValueError,
     'beta1 must be between 0. and 1; got 1.0.'),
    ('AdamParameters', 'beta2_one', dict(beta2=1.0), ValueError,
     'beta2 must be between 0. and 1; got 1.0.'),
    ('AdamParameters', 'beta2_negative', dict(beta2=-2), ValueError,
     'beta2 must be between 0. and 1; got -2.'),
    ('AdamParameters', 'epsilon_zero', dict(epsilon=0.0), ValueError,
     'epsilon must be positive; got 0.0.'),
    ('AdamParameters', 'epsilon_negative', dict(epsilon=-1e-8), ValueError,
     'epsilon must be positive; got -1e-08.'),
    ('AdamParameters', 'non_lazy_without_accumulation',
     dict(lazy_adam=False, **NO_ACCUMULATION), ValueError,
     'When disabling Lazy Adam, gradient accumulation must be used.'),
    ('AdamParameters', 'order_beta1_before_beta2', dict(beta1=2.0, beta2=2.0),
     ValueError, 'beta1 must be between 0. and 1; got 2.0.'),
    ('AdamParameters', 'order_beta2_before_epsilon', dict(beta2=2.0, epsilon=0),
     ValueError, 'beta2 must be between 0. and 1; got 2.0.'),
    ('AdamParameters', 'order_epsilon_before_lazy',
     dict(epsilon=0, lazy_adam=False, **NO_ACCUMULATION), ValueError,
     'epsilon must be positive; got 0.'),
    ('AdamParameters', 'order_clip_before_beta1',
     dict(beta1=2.0, clip_gradient_min=-1.0, **NO_ACCUMULATION), ValueError,
     CLIP),
    ('FtrlParameters', 'learning_rate_power_positive',
     dict(learning_rate_power=0.5), ValueError,
     'learning_rate_power must be less than or equal to 0. got 0.5.'),
    ('FtrlParameters', 'initial_accumulator_negative',
     dict(initial_accumulator_value=-0.1), ValueError,
     'initial_accumulator_value must be greater than or equal to 0. got -0.1.'),
    ('FtrlParameters', 'l1_negative', dict(l1_regularization_strength=-1.0),
     ValueError,
     'l1_regularization_strength must be greater than or equal to 0. got -1.0.'),
    ('FtrlParameters', 'l2_negative', dict(l2_regularization_strength=-2.0),
     ValueError,
     'l2_regularization_strength must be greater than or equal to 0. got -2.0.'),
    ('FtrlParameters', 'order_power_before_accumulator',
     dict(learning_rate_power=1.0, initial_accumulator_value=-1.0), ValueError,
     'learning_rate_power must be less than or equal to 0. got 1.0.'),
    ('FtrlParameters', 'order_accumulator_before_l1',
     dict(initial_accumulator_value=-1.0, l1_regularization_strength=-1.0),
     ValueError,
     'initial_accumulator_value must be greater than or equal to 0. got -1.0.'),
    ('FtrlParameters', 'order_l1_before_l2',
     dict(l1_regularization_strength=-1.0, l2_regularization_strength=-1.0),
     ValueError,
     'l1_regularization_strength must be greater than or equal to 0. got -1.0.'),
    ('ProximalAdagradParameters', 'initial_accumulator_zero',
     dict(initial_accumulator=0), ValueError,
     'Adagrad initial_accumulator must be positive. Received: 0.'),
    ('ProximalAdagradParameters', 'initial_accumulator_negative',
     dict(initial_accumulator=-1.5), ValueError,
     'Adagrad initial_accumulator must be positive. Received: -1.5.'),
    ('ProximalAdagradParameters', 'l1_negative',
     dict(l1_regularization_strength=-0.1), ValueError,
     'l1_regularization_strength must be greater than or equal to 0. got -0.1.'),
    ('ProximalAdagradParameters', 'l2_negative',
     dict(l2_regularization_strength=-0.2), ValueError,
     'l2_regularization_strength must be greater than or equal to 0. got -0.2.'),
    ('ProximalAdagradParameters', 'order_accumulator_before_l1',
     dict(initial_accumulator=0, l1_regularization_strength=-0.1), ValueError,
     'Adagrad initial_accumulator must be positive. Received: 0.'),
    ('AdagradMomentumParameters', 'epsilon_zero', dict(epsilon=0), ValueError,
     'Adagrad momentum: epsilon must be positive'),
    ('AdagradMomentumParameters', 'epsilon_negative', dict(epsilon=-1e-10),
     ValueError, 'Adagrad momentum: epsilon must be positive'),
    ('AdagradMomentumParameters', 'exponent_zero', dict(exponent=0),
     ValueError, 'Adagrad momentum: Precondition exponent must >0'),
    ('AdagradMomentumParameters', 'exponent_negative', dict(exponent=-2.0),
     ValueError, 'Adagrad momentum: Precondition exponent must >0'),
    ('AdagradMomentumParameters', 'order_epsilon_before_exponent',
     dict(epsilon=0, exponent=0), ValueError,
     'Adagrad momentum: epsilon must be positive'),
    ('AdagradMomentumParameters', 'order_clip_before_epsilon',
     dict(epsilon=0, clip_gradient_max=1.0, **NO_ACCUMULATION), ValueError,
     CLIP),
    ('ProximalYogiParameters', 'beta1_one', dict(beta1=1.0), ValueError,
     'beta1 must be between 0. and 1; got 1.0.'),
    ('ProximalYogiParameters', 'beta1_negative', dict(beta1=-0.5), ValueError,
     'beta1 must be between 0. and 1; got -0.5.'),
    ('ProximalYogiParameters', 'beta2_one', dict(beta2=1), ValueError,
     'beta2 must be between 0. and 1; got 1.'),
    ('ProximalYogiParameters', 'epsilon_zero', dict(epsilon=0.0), ValueError,
     'epsilon must be positive; got 0.0.'),
    ('ProximalYogiParameters', 'l1_negative',
     dict(l1_regularization_strength=-0.1), ValueError,
     'l1_regularization_strength must be greater than or equal to 0. got -0.1.'),
    ('ProximalYogiParameters', 'l2_negative',
     dict(l2_regularization_strength=-0.2), ValueError,
     'l2_regularization_strength must be greater than or equal to 0. got -0.2.'),
    ('ProximalYogiParameters', 'order_beta1_before_beta2',
     dict(beta1=2.0, beta2=2.0), ValueError,
     'beta1 must be between 0. and 1; got 2.0.'),
    ('ProximalYogiParameters', 'order_beta2_before_epsilon',
     dict(beta2=2.0, epsilon=0), ValueError,
     'beta2 must be between 0. and 1; got 2.0.'),
    ('ProximalYogiParameters', 'order_epsilon_before_l1',
     dict(epsilon=0, l1_regularization_strength=-1.0), ValueError,
     'epsilon must be positive; got 0.'),
    ('ProximalYogiParameters', 'order_l1_before_l2',
     dict(l1_regularization_strength=-1.0, l2_regularization_strength=-1.0),
     ValueError,
     'l1_regularization_strength must be greater than or equal to 0. got -1.0.'),
]
MISSING = [
    ('StochasticGradientDescentParameters', {}, TypeError,
     "StochasticGradientDescentParameters.__init__() missing 1 required "
     "positional argument: 'learning_rate'"),
    ('MomentumParameters', dict(learning_rate=0.1), TypeError,
     "MomentumParameters.__init__() missing 1 required positional argument: "
     "'momentum'"),
    ('RMSPropParameters', dict(learning_rate=0.1), TypeError,
     "RMSPropParameters.__init__() missing 3 required positional arguments: "
     "'rho', 'momentum', and 'epsilon'"),
    ('AdagradMomentumParameters', dict(learning_rate=0.1), TypeError,
     "AdagradMomentumParameters.__init__() missing 1 required positional "
     "argument: 'momentum'"),
    ('FrequencyEstimatorParameters', dict(tau=0.1), TypeError,
     "FrequencyEstimatorParameters.__init__() missing 3 required positional "
     "arguments: 'max_delta', 'outlier_threshold', and 'weight_exponent'"),
    ('FrequencyEstimatorParameters', dict(REQUIRED[
        'FrequencyEstimatorParameters'], learning_rate=0.1), TypeError,
     "FrequencyEstimatorParameters.__init__() got an unexpected keyword "
     "argument 'learning_rate'"),
]


@pytest.mark.parametrize('name,kwargs,error,text', [
    pytest.param(n, dict(REQUIRED[n], **kw), e, t, id='{}-{}'.format(n, i))
    for n, i, kw, e, t in VALIDATION
] + [pytest.param(n, kw, e, t, id='{}-missing'.format(n))
     for n, kw, e, t in MISSING])
def test_validation(name, kwargs, error, text):
  assert outcome(_ours(name), **kwargs) == (error, text)
  if lanes.LEGACY:
    assert outcome(_theirs(name), **kwargs) == (error, text)


@pytest.mark.parametrize('name,kwargs', [
    ('FtrlParameters', dict(initial_accumulator_value=0)),  # legal in legacy
    ('FtrlParameters', dict(learning_rate_power=0.0)),
    ('AdamParameters', dict(beta1=0.0, beta2=0.0)),
    ('AdamParameters', dict(lazy_adam=False)),
    ('AdamParameters', dict(lazy_adam=True, **NO_ACCUMULATION)),
    ('AdagradParameters', dict(clip_gradient_min=-1.0)),
    ('MomentumParameters', dict(use_nesterov=True, **NO_ACCUMULATION)),
    ('AdagradMomentumParameters', dict(beta2=0.5, exponent=0.5, momentum=0.0)),
    ('AdagradMomentumParameters', dict(use_nesterov=True, **NO_ACCUMULATION)),
    ('ProximalYogiParameters', dict(beta1=0.0, beta2=0.0,
                                    initial_accumulator_value=0.0)),
    # TF 2.15 checks none of FrequencyEstimatorParameters' arguments.
    ('FrequencyEstimatorParameters', dict(tau=1.5, max_delta=-1.0,
                                          outlier_threshold=0.0,
                                          weight_exponent=-2.0)),
])
def test_valid_edge_cases_construct(name, kwargs):
  kwargs = dict(REQUIRED[name], **kwargs)
  obj = _ours(name)(**kwargs)
  for key, value in kwargs.items():
    assert getattr(obj, key) == value
  if lanes.LEGACY:
    assert _public(obj) == _public(_theirs(name)(**kwargs))


# --------------------------------------------------------------------------------
# Attribute values, immutability, replace().
# --------------------------------------------------------------------------------

@pytest.mark.parametrize('name', NAMES)
def test_default_attributes(name):
  obj = _ours(name)(**REQUIRED[name])
  expected = dict(FIXED.get(name, COMMON_DEFAULTS), **REQUIRED[name],
                  **OWN_DEFAULTS[name])
  assert _public(obj) == expected
  if lanes.LEGACY:
    assert _public(obj) == _public(_theirs(name)(**REQUIRED[name]))


@pytest.mark.parametrize('name', NAMES)
def test_non_default_attributes(name):
  kwargs = _non_default(name)
  obj = _ours(name)(**kwargs)
  expected = dict(FIXED.get(name, {}), **kwargs)
  if name == 'FtrlParameters':
    expected['initial_linear_value'] = 0.0
  assert _public(obj) == expected
  if lanes.LEGACY:
    assert _public(obj) == _public(_theirs(name)(**kwargs))
    # Positional arguments bind the same way.
    args = list(inspect.signature(_theirs(name)).parameters)
    positional = [kwargs[a] for a in args]
    assert _public(_ours(name)(*positional)) == _public(
        _theirs(name)(*positional))


@pytest.mark.parametrize('name', NAMES)
def test_immutable(name):
  obj = _ours(name)(**_non_default(name))
  before = _public(obj)
  with pytest.raises(AttributeError):
    obj.learning_rate = 1.0
  with pytest.raises(AttributeError):
    obj.use_gradient_accumulation = False
  with pytest.raises(AttributeError):
    obj.brand_new_attribute = 1
  for field in NON_DEFAULT_OWN[name]:
    with pytest.raises(AttributeError):
      setattr(obj, field, getattr(obj, field))
  assert _public(obj) == before


def test_immutable_against_delete():
  obj = tpu_fc.AdagradParameters(0.1)
  with pytest.raises(AttributeError):
    del obj.learning_rate
  assert obj.learning_rate == 0.1


@pytest.mark.parametrize('name', NAMES)
def test_equality_hash_and_pickle(name):
  a = _ours(name)(**_non_default(name))
  b = _ours(name)(**_non_default(name))
  assert a == b and hash(a) == hash(b)
  assert a != _ours(name)(**_another(name))
  clone = pickle.loads(pickle.dumps(a))
  assert type(clone) is type(a) and _public(clone) == _public(a)
  with pytest.raises(AttributeError):
    clone.learning_rate = 3.0


@pytest.mark.parametrize('name', WITH_COMMON_ARGUMENTS)
def test_replace(name):
  obj = _ours(name)(**_non_default(name))
  before = _public(obj)
  new = obj.replace(learning_rate=0.5)
  assert type(new) is type(obj) and new is not obj
  assert _public(new) == dict(before, learning_rate=0.5)
  assert _public(obj) == before  # original untouched
  with pytest.raises(AttributeError):
    new.learning_rate = 0.7
  # Changing an own field, and validation on the way.
  again = obj.replace(use_gradient_accumulation=True, clip_gradient_min=None)
  assert _public(again) == dict(before, clip_gradient_min=None)
  with pytest.raises(ValueError) as info:  # gradient clip set, accumulation off
    obj.replace(use_gradient_accumulation=False)
  assert str(info.value) == CLIP
  with pytest.raises(TypeError):
    obj.replace(no_such_argument=1)


def test_replace_frequency_estimator():
  obj = tpu_fc.FrequencyEstimatorParameters(**_non_default(
      'FrequencyEstimatorParameters'))
  new = obj.replace(tau=0.3)
  assert _public(new) == dict(_public(obj), tau=0.3)
  with pytest.raises(TypeError):  # the fixed fields are no arguments
    obj.replace(learning_rate=0.5)


def test_replace_validates_own_fields():
  with pytest.raises(ValueError) as info:
    tpu_fc.AdagradParameters(0.1).replace(initial_accumulator=0)
  assert str(info.value) == (
      'Adagrad initial_accumulator must be greater than zero. Received: 0.')
  ftrl = tpu_fc.FtrlParameters(0.1).replace(initial_accumulator_value=0.0,
                                             beta=1.0)
  assert (ftrl.initial_accumulator_value, ftrl.beta,
          ftrl.initial_linear_value) == (0.0, 1.0, 0.0)


# --------------------------------------------------------------------------------
# to_mid_level().
# --------------------------------------------------------------------------------

def _expected_mid_level(name, kwargs, learning_rate=None):
  """The mid-level optimizer built with TF directly from the legacy arguments."""
  common = dict(
      learning_rate=kwargs['learning_rate'] if learning_rate is None
      else learning_rate,
      use_gradient_accumulation=kwargs.get('use_gradient_accumulation', True),
      clip_weight_min=kwargs.get('clip_weight_min'),
      clip_weight_max=kwargs.get('clip_weight_max'),
      weight_decay_factor=kwargs.get('weight_decay_factor'),
      multiply_weight_decay_factor_by_learning_rate=kwargs.get(
          'multiply_weight_decay_factor_by_learning_rate'))
  if (kwargs.get('clip_gradient_min') is not None or
      kwargs.get('clip_gradient_max') is not None):
    common['clipvalue'] = (kwargs.get('clip_gradient_min'),
                           kwargs.get('clip_gradient_max'))
  if name == 'StochasticGradientDescentParameters':
    return E.SGD(**common)
  if name == 'AdagradParameters':
    return E.Adagrad(initial_accumulator_value=kwargs.get('initial_accumulator',
                                                          0.1), **common)
  if name == 'AdamParameters':
    return E.Adam(beta_1=kwargs.get('beta1', 0.9), beta_2=kwargs.get('beta2', 0.999),
                  epsilon=kwargs.get('epsilon', 1e-08),
                  lazy_adam=kwargs.get('lazy_adam', True),
                  sum_inside_sqrt=kwargs.get('sum_inside_sqrt', True), **common)
  if name == 'FtrlParameters':
    return E.FTRL(
        learning_rate_power=kwargs.get('learning_rate_power', -0.5),
        l1_regularization_strength=kwargs.get('l1_regularization_strength', 0.0),
        l2_regularization_strength=kwargs.get('l2_regularization_strength', 0.0),
        beta=kwargs.get('beta', 0),
        initial_accumulator_value=kwargs.get('initial_accumulator_value', 0.1),
        multiply_linear_by_learning_rate=kwargs.get(
            'multiply_linear_by_learning_rate', False),
        allow_zero_accumulator=kwargs.get('allow_zero_accumulator', False),
        **common)
  if name == 'AdagradMomentumParameters':
    return E.AdagradMomentum(
        momentum=kwargs['momentum'],
        use_nesterov=kwargs.get('use_nesterov', False),
        exponent=kwargs.get('exponent', 2), beta2=kwargs.get('beta2', 1),
        epsilon=kwargs.get('epsilon', 1e-10), **common)
  raise AssertionError(name)


TWINS = {'StochasticGradientDescentParameters': 'SGD', 'AdagradParameters': 'Adagrad',
         'AdamParameters': 'Adam', 'FtrlParameters': 'FTRL',
         'AdagradMomentumParameters': 'AdagradMomentum'}
NO_TWIN = ['ProximalAdagradParameters', 'MomentumParameters', 'RMSPropParameters',
           'ProximalYogiParameters', 'FrequencyEstimatorParameters']


def _twin_cases():
  cases = []
  for name in TWINS:
    cases.append(pytest.param(name, dict(REQUIRED[name]), id=name + '-defaults'))
    cases.append(pytest.param(name, _non_default(name), id=name + '-all'))
    cases.append(pytest.param(
        name, dict(REQUIRED[name], clip_gradient_min=-1.0), id=name + '-clip_min'))
    cases.append(pytest.param(
        name, dict(REQUIRED[name], clip_gradient_max=2.0, clip_weight_max=1.0),
        id=name + '-clip_max'))
    cases.append(pytest.param(
        name, dict(REQUIRED[name], **NO_ACCUMULATION), id=name + '-no_accum'))
  return cases


def _assert_same_mid_level(result, expected):
  assert type(result) is type(expected)
  assert vars(result) == vars(expected)


@pytest.mark.parametrize('name,kwargs', _twin_cases())
def test_to_mid_level(name, kwargs):
  result = _ours(name)(**kwargs).to_mid_level()
  expected = _expected_mid_level(name, kwargs)
  assert type(result) is getattr(E, TWINS[name])
  _assert_same_mid_level(result, expected)
  # Spelled out: renamed / carried fields.
  assert result.learning_rate == kwargs['learning_rate']
  assert result.clip_gradient_min == kwargs.get('clip_gradient_min')
  assert result.clip_gradient_max == kwargs.get('clip_gradient_max')
  assert result.clip_weight_min == kwargs.get('clip_weight_min')
  assert result.clip_weight_max == kwargs.get('clip_weight_max')
  assert result.weight_decay_factor == kwargs.get('weight_decay_factor')
  assert result.multiply_weight_decay_factor_by_learning_rate == kwargs.get(
      'multiply_weight_decay_factor_by_learning_rate')
  assert result.use_gradient_accumulation == kwargs.get(
      'use_gradient_accumulation', True)
  if name == 'AdagradParameters':
    assert result.initial_accumulator_value == kwargs.get('initial_accumulator', 0.1)
  if name == 'AdamParameters':
    assert (result.beta_1, result.beta_2) == (kwargs.get('beta1', 0.9),
                                              kwargs.get('beta2', 0.999))
  if name == 'AdagradMomentumParameters':
    assert (result.momentum, result.use_nesterov, result.exponent,
            result.beta2, result.epsilon) == (
                kwargs['momentum'], kwargs.get('use_nesterov', False),
                kwargs.get('exponent', 2), kwargs.get('beta2', 1),
                kwargs.get('epsilon', 1e-10))


def test_adam_epsilon_is_the_legacy_default():
  result = tpu_fc.AdamParameters(0.1).to_mid_level()
  assert result.epsilon == 1e-08
  assert E.Adam(0.1).epsilon == 1e-07  # the mid-level default it must not take


def _schedule():
  return 0.125


@pytest.mark.parametrize('name', list(TWINS))
@pytest.mark.parametrize('rate', [0.05, _schedule, lambda: 0.5],
                         ids=['float', 'function', 'lambda'])
def test_to_mid_level_learning_rate_override(name, rate):
  kwargs = _non_default(name)
  result = _ours(name)(**kwargs).to_mid_level(learning_rate=rate)
  _assert_same_mid_level(result, _expected_mid_level(name, kwargs, rate))
  if callable(rate):
    assert result.learning_rate is rate
  else:
    assert result.learning_rate == rate
  # A learning_rate override of None keeps the parameters' own rate.
  assert _ours(name)(**kwargs).to_mid_level(learning_rate=None).learning_rate == (
      kwargs['learning_rate'])


def test_ftrl_zero_accumulator_has_no_mid_level_twin():
  params = tpu_fc.FtrlParameters(0.1, initial_accumulator_value=0)  # legal here
  with pytest.raises(ValueError, match='initial_accumulator_value'):
    params.to_mid_level()
  # The mid-level FTRL itself refuses it (LEGACY_SEMANTICS §4.3).
  with pytest.raises(ValueError):
    E.FTRL(0.1, initial_accumulator_value=0)


@pytest.mark.parametrize('name', NO_TWIN)
def test_no_mid_level_twin(name):
  with pytest.raises(NotImplementedError) as info:
    _ours(name)(**_non_default(name)).to_mid_level()
  alternatives = re.findall(r'tf\.tpu\.experimental\.embedding\.(\w+)',
                            str(info.value))
  assert alternatives, str(info.value)
  for alternative in alternatives:
    assert isinstance(getattr(E, alternative), type), alternative
  assert name in str(info.value)


# --------------------------------------------------------------------------------
# from_mid_level, as_tpu_fc_parameters.
# --------------------------------------------------------------------------------

@pytest.mark.parametrize('name,kwargs', _twin_cases())
def test_from_mid_level_round_trip(name, kwargs):
  params = _ours(name)(**kwargs)
  back = optimizers.from_mid_level(params.to_mid_level())
  assert type(back) is type(params)
  assert back == params
  assert _public(back) == _public(params)


def test_from_mid_level_fields():
  # Expected values: the mid-level defaults of LEGACY_SEMANTICS §4.2.
  assert optimizers.from_mid_level(E.SGD()) == tpu_fc.StochasticGradientDescentParameters(
      0.01)
  assert optimizers.from_mid_level(
      E.Adagrad(learning_rate=0.2, initial_accumulator_value=0.3, clipvalue=1.5)
  ) == tpu_fc.AdagradParameters(0.2, initial_accumulator=0.3,
                                clip_gradient_min=-1.5, clip_gradient_max=1.5)
  assert optimizers.from_mid_level(E.Adam()) == tpu_fc.AdamParameters(
      0.001, beta1=0.9, beta2=0.999, epsilon=1e-07)
  assert optimizers.from_mid_level(
      E.FTRL(clipvalue=(None, 2.0), weight_decay_factor=0.1)) == (
          tpu_fc.FtrlParameters(0.001, learning_rate_power=-0.5,
                                initial_accumulator_value=0.1, beta=0.0,
                                weight_decay_factor=0.1, clip_gradient_max=2.0))
  assert optimizers.from_mid_level(E.AdagradMomentum()) == (
      tpu_fc.AdagradMomentumParameters(0.001, momentum=0.0,
                                       use_nesterov=False, exponent=2,
                                       beta2=1, epsilon=1e-10))
  rate = lambda: 0.3
  assert optimizers.from_mid_level(E.Adagrad(learning_rate=rate)).learning_rate is rate


@pytest.mark.skipif(lanes.LEGACY, reason="TF 2.15's mid-level optimizers all have "
                    'a legacy twin')
def test_from_mid_level_unsupported():
  custom = E.CustomOptimizer(tf.function(lambda *unused: None))
  with pytest.raises(NotImplementedError, match='CustomOptimizer'):
    optimizers.from_mid_level(custom)


@pytest.mark.legacy_only
@pytest.mark.parametrize('defaults', [True, False], ids=['defaults', 'all'])
@pytest.mark.parametrize('name', NAMES)
def test_as_tpu_fc_parameters_converts_tf_2_15_objects(name, defaults):
  kwargs = dict(REQUIRED[name]) if defaults else _non_default(name)
  theirs = _theirs(name)(**kwargs)
  converted = optimizers.as_tpu_fc_parameters(theirs)
  assert type(converted) is _ours(name)
  assert converted == _ours(name)(**kwargs)
  assert _public(converted) == _public(theirs)


def test_as_tpu_fc_parameters_passes_through():
  ours = tpu_fc.AdagradParameters(0.1)
  assert optimizers.as_tpu_fc_parameters(ours) is ours
  for other in (None, 'adagrad', 0.1, E.Adagrad()):
    assert optimizers.as_tpu_fc_parameters(other) is other


# --------------------------------------------------------------------------------
# Slots.
# --------------------------------------------------------------------------------

# (legacy TPU checkpoint suffix, mid-level slot name): suffixes from
# LEGACY_SEMANTICS §7 (`<var>/Adagrad`, `<var>/Adam/m`, ...) and, for the three
# the column spec refuses, TF 2.15's `_*Handler.get_default_slot_variable_names`
# (`<table>/AdagradMomentum/Accumulator`, ...); mid-level names from §4.2
# (AdagradMomentum: its `_slot_names()`); for the optimizers without a twin the
# names are those of TF 2.15's slot namedtuples (pluralised like the mid-level
# `accumulators`; Yogi's m and v named as the mid-level Adam names its m and v).
EXPECTED_SLOTS = {
    'StochasticGradientDescentParameters': (),
    'AdagradParameters': (('Adagrad', 'accumulators'),),
    'AdamParameters': (('Adam/m', 'momenta'), ('Adam/v', 'velocities')),
    'FtrlParameters': (('Ftrl', 'accumulators'), ('Ftrl_1', 'linears')),
    'ProximalAdagradParameters': (('ProximalAdagrad', 'accumulators'),),
    'MomentumParameters': (('Momentum', 'momenta'),),
    'RMSPropParameters': (('RMSProp/ms', 'ms'), ('RMSProp/mom', 'mom')),
    'AdagradMomentumParameters': (('AdagradMomentum/Accumulator',
                                   'accumulators'),
                                  ('AdagradMomentum/Momentum', 'momenta')),
    'ProximalYogiParameters': (('ProximalYogi', 'velocities'),
                               ('ProximalYogi_1', 'momenta')),
    'FrequencyEstimatorParameters': (('FrequencyEstimator', 'last_hit_step'),),
}
# Initial slot values of _non_default(name): TF 2.15's handlers use
# constant(initial_accumulator) / constant(initial_accumulator_value) (Ftrl's
# accumulator, ProximalYogi's v) / constant(initial_linear_value=0.0) and zeros
# for everything else.
EXPECTED_SLOT_VALUES = {
    'StochasticGradientDescentParameters': {},
    'AdagradParameters': {'accumulators': 0.7},
    'AdamParameters': {'momenta': 0.0, 'velocities': 0.0},
    'FtrlParameters': {'accumulators': 0.2, 'linears': 0.0},
    'ProximalAdagradParameters': {'accumulators': 0.3},
    'MomentumParameters': {'momenta': 0.0},
    'RMSPropParameters': {'ms': 0.0, 'mom': 0.0},
    'AdagradMomentumParameters': {'accumulators': 0.0, 'momenta': 0.0},
    'ProximalYogiParameters': {'velocities': 0.5, 'momenta': 0.0},
    'FrequencyEstimatorParameters': {'last_hit_step': 0.0},
}


@pytest.mark.parametrize('name', NAMES)
def test_slots(name):
  cls = _ours(name)
  assert cls.SLOTS == EXPECTED_SLOTS[name]
  params = cls(**_non_default(name))
  assert params.slot_initial_values() == EXPECTED_SLOT_VALUES[name]
  assert list(params.slot_initial_values()) == [m for _, m in cls.SLOTS]


@pytest.mark.parametrize('name', list(TWINS))
def test_slots_match_mid_level(name):
  params = _ours(name)(**_non_default(name))
  mid = _expected_mid_level(name, _non_default(name))
  assert [m for _, m in params.SLOTS] == list(mid._slot_names())  # pylint: disable=protected-access
  initial = [float(init(shape=(1,), dtype=tf.float32).numpy()[0])
             for init in mid._slot_initializers()]  # pylint: disable=protected-access
  assert list(params.slot_initial_values().values()) == pytest.approx(initial)


@pytest.mark.legacy_only
@pytest.mark.parametrize('name', NAMES)
def test_slot_suffixes_match_tf_2_15_engine(name):
  """The names TF 2.15's engine gives a dict-configured table's slots."""
  handler = lanes.tf_tpu_embedding._get_optimization_handler(  # pylint: disable=protected-access
      _theirs(name)(**REQUIRED[name]))
  names = handler.get_default_slot_variable_names('tbl')
  expected = tuple(names) if names is not None else ()
  assert tuple('tbl/' + s for s, _ in _ours(name).SLOTS) == expected


@pytest.mark.legacy_only
@pytest.mark.parametrize('name', NAMES[:7])  # the column spec refuses the rest
def test_slot_suffixes_match_tf_2_15_estimator(name):
  from tensorflow_estimator.python.estimator.tpu import _tpu_estimator_embedding  # pylint: disable=g-import-not-at-top
  names = _tpu_estimator_embedding._get_slot_variable_names(  # pylint: disable=protected-access
      'scope', 'var', _theirs(name)(**REQUIRED[name]))
  expected = tuple(names) if names is not None else ()
  assert tuple('scope/var/' + s for s, _ in _ours(name).SLOTS) == expected
