"""Legacy TPU embedding optimizer parameters (`tf.compat.v1.tpu.experimental.*Parameters`).

TF 2.16 removed these classes; scripts still construct them.  They are kept here with
TF 2.15's signatures, defaults, validation and error texts, frozen after construction,
and each converts to its `tf.tpu.experimental.embedding` twin with `to_mid_level()`.
All ten of TF 2.15's `tensorflow.python.tpu.tpu_embedding` are here: the seven its
`EmbeddingConfigSpec` takes with feature columns (`SUPPORTED_OPTIMIZERS`) and
AdagradMomentum, ProximalYogi and FrequencyEstimator, which its engine trains when a
dict-configured spec names them.
The update rules they stand for are defined once, in numpy, in `tpu_fc.reference`.
"""
from tpu_fc._tf import tf

_COMMON_FIELDS = ('learning_rate', 'use_gradient_accumulation', 'clip_weight_min',
                  'clip_weight_max', 'weight_decay_factor',
                  'multiply_weight_decay_factor_by_learning_rate',
                  'clip_gradient_min', 'clip_gradient_max')


def _common(arguments):
  """The base-class arguments out of a subclass constructor's `locals()`."""
  return {name: arguments[name] for name in _COMMON_FIELDS}


def _check_non_negative(name, value):
  if value < 0.:
    raise ValueError('{} must be greater than or equal to 0. got {}.'.format(
        name, value))


def _check_beta(name, value):
  if value < 0. or value >= 1.:
    raise ValueError('{} must be between 0. and 1; got {}.'.format(name, value))


def _check_epsilon(value):
  if value <= 0.:
    raise ValueError('epsilon must be positive; got {}.'.format(value))


class _OptimizationParameters:
  """Fields and validation shared by every legacy optimizer.

  Class attributes of each subclass:
    SLOTS: (legacy TPU checkpoint suffix, mid-level slot name) per slot variable, in
      the order the mid-level optimizer creates them (without a mid-level twin: the
      order of TF 2.15's `_*Handler`, tpu_fc's names).
  """
  SLOTS = ()

  def __init__(self, learning_rate, use_gradient_accumulation, clip_weight_min,
               clip_weight_max, weight_decay_factor,
               multiply_weight_decay_factor_by_learning_rate,
               clip_gradient_min=None, clip_gradient_max=None):
    self.learning_rate = learning_rate
    self.use_gradient_accumulation = use_gradient_accumulation
    self.clip_weight_min = clip_weight_min
    self.clip_weight_max = clip_weight_max
    self.weight_decay_factor = weight_decay_factor
    self.multiply_weight_decay_factor_by_learning_rate = (
        multiply_weight_decay_factor_by_learning_rate)
    self.clip_gradient_min = clip_gradient_min
    self.clip_gradient_max = clip_gradient_max
    if not use_gradient_accumulation and (clip_gradient_min is not None or
                                          clip_gradient_max is not None):
      raise ValueError('When using gradient clipping limits, gradient  '
                       'accumulation must be enabled.')

  def _keep(self, arguments, **derived):
    """Stores a subclass constructor's own arguments (its `locals()` less the
    common ones) and `derived` fields, in that order, then freezes."""
    own = {name: value for name, value in arguments.items()
           if name not in _COMMON_FIELDS + ('self', '__class__')}
    for name, value in dict(own, **derived).items():
      object.__setattr__(self, name, value)
    object.__setattr__(self, '_frozen', True)

  def __setattr__(self, name, value):
    if getattr(self, '_frozen', False):
      raise AttributeError(
          '{} is immutable; build a new one instead of setting {!r}.'.format(
              type(self).__name__, name))
    object.__setattr__(self, name, value)

  def __delattr__(self, name):
    if getattr(self, '_frozen', False):
      raise AttributeError('{} is immutable; cannot delete {!r}.'.format(
          type(self).__name__, name))
    object.__delattr__(self, name)

  def fields(self):
    """The constructor-visible fields, in a stable order."""
    return {k: v for k, v in self.__dict__.items() if not k.startswith('_')}

  def replace(self, **changes):
    """A copy with some constructor arguments changed (e.g. the learning rate)."""
    arguments = {k: v for k, v in self.fields().items()
                 if k not in self._DERIVED_FIELDS}
    arguments.update(changes)
    return type(self)(**arguments)

  _DERIVED_FIELDS = ()

  def __eq__(self, other):
    return type(self) is type(other) and self.fields() == other.fields()

  def __hash__(self):
    return hash((type(self).__name__,) + tuple(
        (k, v if isinstance(v, (int, float, bool, str, type(None))) else id(v))
        for k, v in self.fields().items()))

  def __repr__(self):
    return '{}({})'.format(type(self).__name__, ', '.join(
        '{}={!r}'.format(k, v) for k, v in self.fields().items()))

  def slot_initial_values(self):
    """Initial value of each slot variable, keyed by mid-level slot name."""
    return {}

  def _mid_level_common(self, learning_rate):
    clipvalue = None
    if self.clip_gradient_min is not None or self.clip_gradient_max is not None:
      clipvalue = (self.clip_gradient_min, self.clip_gradient_max)
    return dict(
        learning_rate=self.learning_rate if learning_rate is None else learning_rate,
        use_gradient_accumulation=self.use_gradient_accumulation,
        clip_weight_min=self.clip_weight_min,
        clip_weight_max=self.clip_weight_max,
        weight_decay_factor=self.weight_decay_factor,
        multiply_weight_decay_factor_by_learning_rate=(
            self.multiply_weight_decay_factor_by_learning_rate),
        clipvalue=clipvalue)

  def to_mid_level(self, learning_rate=None):
    """The `tf.tpu.experimental.embedding` optimizer that applies the same rule.

    Args:
      learning_rate: optional override (a float or a zero-argument callable), used
        for tables that have their own `learning_rate_fn`.
    """
    raise NotImplementedError(self._NO_MID_LEVEL_TWIN)

  _NO_MID_LEVEL_TWIN = ''


class StochasticGradientDescentParameters(_OptimizationParameters):
  """Plain SGD: `w -= lr * g`."""

  def __init__(self, learning_rate, use_gradient_accumulation=True,
               clip_weight_min=None, clip_weight_max=None,
               weight_decay_factor=None,
               multiply_weight_decay_factor_by_learning_rate=None,
               clip_gradient_min=None, clip_gradient_max=None):
    super().__init__(**_common(locals()))
    self._keep(locals())

  def to_mid_level(self, learning_rate=None):
    return tf.tpu.experimental.embedding.SGD(
        **self._mid_level_common(learning_rate))


class AdagradParameters(_OptimizationParameters):
  """Adagrad without epsilon: `a += g*g; w -= lr * g / sqrt(a)`."""
  SLOTS = (('Adagrad', 'accumulators'),)

  def __init__(self, learning_rate, initial_accumulator=0.1,
               use_gradient_accumulation=True, clip_weight_min=None,
               clip_weight_max=None, weight_decay_factor=None,
               multiply_weight_decay_factor_by_learning_rate=None,
               clip_gradient_min=None, clip_gradient_max=None):
    super().__init__(**_common(locals()))
    if initial_accumulator <= 0:
      raise ValueError(f'Adagrad initial_accumulator must be greater than zero. '
                       f'Received: {initial_accumulator}.')
    self._keep(locals())

  def slot_initial_values(self):
    return {'accumulators': self.initial_accumulator}

  def to_mid_level(self, learning_rate=None):
    return tf.tpu.experimental.embedding.Adagrad(
        initial_accumulator_value=self.initial_accumulator,
        **self._mid_level_common(learning_rate))


class ProximalAdagradParameters(_OptimizationParameters):
  """Adagrad with an l1/l2 proximal step; the mid-level API has no twin."""
  SLOTS = (('ProximalAdagrad', 'accumulators'),)
  _NO_MID_LEVEL_TWIN = (
      'ProximalAdagradParameters has no twin in tf.tpu.experimental.embedding. '
      'The closest mid-level optimizer is tf.tpu.experimental.embedding.Adagrad '
      '(same accumulator, no l1/l2 proximal step); tf.tpu.experimental.embedding.'
      'FTRL offers l1/l2 regularization. tpu_fc.TPUEstimator still trains with '
      'ProximalAdagradParameters.')

  def __init__(self, learning_rate, initial_accumulator=0.1,
               l1_regularization_strength=0.0, l2_regularization_strength=0.0,
               use_gradient_accumulation=True, clip_weight_min=None,
               clip_weight_max=None, weight_decay_factor=None,
               multiply_weight_decay_factor_by_learning_rate=None,
               clip_gradient_min=None, clip_gradient_max=None):
    super().__init__(**_common(locals()))
    if initial_accumulator <= 0:
      raise ValueError(f'Adagrad initial_accumulator must be positive. '
                       f'Received: {initial_accumulator}.')
    _check_non_negative('l1_regularization_strength', l1_regularization_strength)
    _check_non_negative('l2_regularization_strength', l2_regularization_strength)
    self._keep(locals())

  def slot_initial_values(self):
    return {'accumulators': self.initial_accumulator}


class AdamParameters(_OptimizationParameters):
  """Adam as the TPU runs it: no bias correction, lazy by default."""
  SLOTS = (('Adam/m', 'momenta'), ('Adam/v', 'velocities'))

  def __init__(self, learning_rate, beta1=0.9, beta2=0.999, epsilon=1e-08,
               lazy_adam=True, sum_inside_sqrt=True,
               use_gradient_accumulation=True, clip_weight_min=None,
               clip_weight_max=None, weight_decay_factor=None,
               multiply_weight_decay_factor_by_learning_rate=None,
               clip_gradient_min=None, clip_gradient_max=None):
    super().__init__(**_common(locals()))
    _check_beta('beta1', beta1)
    _check_beta('beta2', beta2)
    _check_epsilon(epsilon)
    if not use_gradient_accumulation and not lazy_adam:
      raise ValueError(
          'When disabling Lazy Adam, gradient accumulation must be used.')
    self._keep(locals())

  def slot_initial_values(self):
    return {'momenta': 0.0, 'velocities': 0.0}

  def to_mid_level(self, learning_rate=None):
    # epsilon is always passed: the mid-level default is 1e-07, the legacy 1e-08.
    return tf.tpu.experimental.embedding.Adam(
        beta_1=self.beta1, beta_2=self.beta2, epsilon=self.epsilon,
        lazy_adam=self.lazy_adam, sum_inside_sqrt=self.sum_inside_sqrt,
        **self._mid_level_common(learning_rate))


class FtrlParameters(_OptimizationParameters):
  """FTRL-proximal with the TPU's `beta` and `multiply_linear_by_learning_rate`."""
  SLOTS = (('Ftrl', 'accumulators'), ('Ftrl_1', 'linears'))
  _DERIVED_FIELDS = ('initial_linear_value',)

  def __init__(self, learning_rate, learning_rate_power=-0.5,
               initial_accumulator_value=0.1, l1_regularization_strength=0.0,
               l2_regularization_strength=0.0, use_gradient_accumulation=True,
               clip_weight_min=None, clip_weight_max=None,
               weight_decay_factor=None,
               multiply_weight_decay_factor_by_learning_rate=None,
               multiply_linear_by_learning_rate=False, beta=0,
               allow_zero_accumulator=False, clip_gradient_min=None,
               clip_gradient_max=None):
    super().__init__(**_common(locals()))
    if learning_rate_power > 0.:
      raise ValueError('learning_rate_power must be less than or equal to 0. '
                       'got {}.'.format(learning_rate_power))
    if initial_accumulator_value < 0.:
      raise ValueError('initial_accumulator_value must be greater than or equal'
                       ' to 0. got {}.'.format(initial_accumulator_value))
    _check_non_negative('l1_regularization_strength', l1_regularization_strength)
    _check_non_negative('l2_regularization_strength', l2_regularization_strength)
    self._keep(locals(), initial_linear_value=0.0)

  def slot_initial_values(self):
    return {'accumulators': self.initial_accumulator_value,
            'linears': self.initial_linear_value}

  def to_mid_level(self, learning_rate=None):
    if self.initial_accumulator_value <= 0:
      raise ValueError(
          'FtrlParameters(initial_accumulator_value={}) has no mid-level twin: '
          'tf.tpu.experimental.embedding.FTRL requires initial_accumulator_value '
          '> 0. Use a small positive value (e.g. 1e-6) to migrate.'.format(
              self.initial_accumulator_value))
    return tf.tpu.experimental.embedding.FTRL(
        learning_rate_power=self.learning_rate_power,
        l1_regularization_strength=self.l1_regularization_strength,
        l2_regularization_strength=self.l2_regularization_strength,
        beta=self.beta,
        initial_accumulator_value=self.initial_accumulator_value,
        multiply_linear_by_learning_rate=self.multiply_linear_by_learning_rate,
        allow_zero_accumulator=self.allow_zero_accumulator,
        **self._mid_level_common(learning_rate))


class MomentumParameters(_OptimizationParameters):
  """Heavy-ball or Nesterov momentum; the mid-level API has no twin."""
  SLOTS = (('Momentum', 'momenta'),)
  _NO_MID_LEVEL_TWIN = (
      'MomentumParameters has no twin in tf.tpu.experimental.embedding. The '
      'closest mid-level optimizers are tf.tpu.experimental.embedding.SGD (no '
      'momentum) and tf.tpu.experimental.embedding.AdagradMomentum (momentum '
      'with an Adagrad preconditioner). tpu_fc.TPUEstimator still trains with '
      'MomentumParameters.')

  def __init__(self, learning_rate, momentum, use_nesterov=False,
               use_gradient_accumulation=True, clip_weight_min=None,
               clip_weight_max=None, weight_decay_factor=None,
               multiply_weight_decay_factor_by_learning_rate=None,
               clip_gradient_min=None, clip_gradient_max=None):
    super().__init__(**_common(locals()))
    self._keep(locals())

  def slot_initial_values(self):
    return {'momenta': 0.0}


class RMSPropParameters(_OptimizationParameters):
  """RMSProp with momentum; the mid-level API has no twin."""
  SLOTS = (('RMSProp/ms', 'ms'), ('RMSProp/mom', 'mom'))
  _NO_MID_LEVEL_TWIN = (
      'RMSPropParameters has no twin in tf.tpu.experimental.embedding. The '
      'closest mid-level optimizer is tf.tpu.experimental.embedding.Adam: with '
      'momentum=0, Adam(beta_1=0, beta_2=rho, epsilon=sqrt(epsilon), '
      'sum_inside_sqrt=True) applies the same update. tpu_fc.TPUEstimator '
      'still trains with RMSPropParameters.')

  def __init__(self, learning_rate, rho, momentum, epsilon,
               use_gradient_accumulation=True, clip_weight_min=None,
               clip_weight_max=None, weight_decay_factor=None,
               multiply_weight_decay_factor_by_learning_rate=None,
               clip_gradient_min=None, clip_gradient_max=None):
    super().__init__(**_common(locals()))
    self._keep(locals())

  def slot_initial_values(self):
    return {'ms': 0.0, 'mom': 0.0}


class AdagradMomentumParameters(_OptimizationParameters):
  """Momentum over the Adagrad-scaled gradient (`tpu_fc.reference`)."""
  SLOTS = (('AdagradMomentum/Accumulator', 'accumulators'),
           ('AdagradMomentum/Momentum', 'momenta'))

  def __init__(self, learning_rate, momentum, use_nesterov=False, exponent=2,
               beta2=1, epsilon=1e-10, use_gradient_accumulation=True,
               clip_weight_min=None, clip_weight_max=None,
               weight_decay_factor=None,
               multiply_weight_decay_factor_by_learning_rate=None,
               clip_gradient_min=None, clip_gradient_max=None):
    super().__init__(**_common(locals()))
    if epsilon <= 0:
      raise ValueError('Adagrad momentum: epsilon must be positive')
    if exponent <= 0:
      raise ValueError('Adagrad momentum: Precondition exponent must >0')
    self._keep(locals())

  def slot_initial_values(self):
    return {'accumulators': 0.0, 'momenta': 0.0}

  def to_mid_level(self, learning_rate=None):
    return tf.tpu.experimental.embedding.AdagradMomentum(
        momentum=self.momentum, use_nesterov=self.use_nesterov,
        exponent=self.exponent, beta2=self.beta2, epsilon=self.epsilon,
        **self._mid_level_common(learning_rate))


class ProximalYogiParameters(_OptimizationParameters):
  """Yogi with an l1/l2 proximal step; the mid-level API has no twin."""
  SLOTS = (('ProximalYogi', 'velocities'), ('ProximalYogi_1', 'momenta'))
  _NO_MID_LEVEL_TWIN = (
      'ProximalYogiParameters has no twin in tf.tpu.experimental.embedding. '
      'The closest mid-level optimizer is tf.tpu.experimental.embedding.Adam '
      '(the same first moment, an exponential second moment where Yogi\'s is '
      'additive, no l1/l2 proximal step); tf.tpu.experimental.embedding.FTRL '
      'offers l1/l2 regularization. tpu_fc.TPUEstimator still trains with '
      'ProximalYogiParameters.')

  def __init__(self, learning_rate=0.01, beta1=0.9, beta2=0.999, epsilon=1e-3,
               l1_regularization_strength=0.0, l2_regularization_strength=0.0,
               initial_accumulator_value=1e-6, use_gradient_accumulation=True,
               clip_weight_min=None, clip_weight_max=None,
               weight_decay_factor=None,
               multiply_weight_decay_factor_by_learning_rate=None,
               clip_gradient_min=None, clip_gradient_max=None):
    super().__init__(**_common(locals()))
    _check_beta('beta1', beta1)
    _check_beta('beta2', beta2)
    _check_epsilon(epsilon)
    _check_non_negative('l1_regularization_strength', l1_regularization_strength)
    _check_non_negative('l2_regularization_strength', l2_regularization_strength)
    self._keep(locals())

  def slot_initial_values(self):
    return {'velocities': self.initial_accumulator_value, 'momenta': 0.0}


class FrequencyEstimatorParameters(_OptimizationParameters):
  """Estimates how many global steps lie between two lookups of an id.

  Not an optimizer of the gradient (which should be zero): its table, of
  dimension 1, holds the estimate, and its learning rate must be the global
  step (a table `learning_rate_fn` casting it); the other common fields are
  fixed, as TF 2.15 fixes them.  No mid-level twin.
  """
  SLOTS = (('FrequencyEstimator', 'last_hit_step'),)
  _DERIVED_FIELDS = _COMMON_FIELDS
  _NO_MID_LEVEL_TWIN = (
      'FrequencyEstimatorParameters has no twin in tf.tpu.experimental.embedding: '
      'no mid-level optimizer estimates lookup frequencies. The closest choice '
      'is to keep the estimate out of the embedding: a [vocabulary_size, 1] '
      'non-trainable variable and a last-hit-step variable updated in the '
      'training step by the rule in tpu_fc.reference (tf.tensor_scatter_nd_'
      'update), with a tf.tpu.experimental.embedding.SGD table if it must stay '
      'a table. tpu_fc.TPUEstimator still trains with '
      'FrequencyEstimatorParameters.')

  def __init__(self, tau, max_delta, outlier_threshold, weight_exponent):
    super().__init__(
        learning_rate=1.0, use_gradient_accumulation=True, clip_weight_min=None,
        clip_weight_max=None, weight_decay_factor=None,
        multiply_weight_decay_factor_by_learning_rate=None)
    self._keep(locals())

  def slot_initial_values(self):
    return {'last_hit_step': 0.0}


# What TF 2.15's EmbeddingConfigSpec takes with feature columns (its
# `_SUPPORTED_OPTIMIZERS`, in its order: its error text lists them).
SUPPORTED_OPTIMIZERS = (
    ProximalAdagradParameters,
    AdagradParameters,
    AdamParameters,
    FtrlParameters,
    StochasticGradientDescentParameters,
    MomentumParameters,
    RMSPropParameters,
)
# Every legacy optimizer: with dict configs the spec takes these too.
ALL_OPTIMIZERS = SUPPORTED_OPTIMIZERS + (
    AdagradMomentumParameters, ProximalYogiParameters,
    FrequencyEstimatorParameters)
_BY_NAME = {cls.__name__: cls for cls in ALL_OPTIMIZERS}


def as_tpu_fc_parameters(parameters):
  """tpu_fc's parameters for TF 2.15's own `*Parameters` object (or `parameters`).

  Scripts on TF 2.15 may still build `tf.compat.v1.tpu.experimental.AdagradParameters`;
  they are converted field by field so one engine serves both.  Anything else is
  returned unchanged for the caller to reject.
  """
  if isinstance(parameters, ALL_OPTIMIZERS):
    return parameters
  cls = _BY_NAME.get(type(parameters).__name__)
  if cls is None or not type(parameters).__module__.startswith('tensorflow'):
    return parameters
  fields = {k: v for k, v in vars(parameters).items()
            if k not in cls._DERIVED_FIELDS}
  return cls(**fields)


def by_class(registry, parameters, what):
  """`registry[the class of parameters]` (tpu_fc's; convert TF 2.15's with
  `as_tpu_fc_parameters` first), a subclass finding its base's entry.

  The engine's update rules are such a registry; `tpu_fc.reference` keeps its
  own table by name, as an oracle that imports nothing of tpu_fc.
  """
  for cls in type(parameters).__mro__:
    if cls in registry:
      return registry[cls]
  raise NotImplementedError(
      'tpu_fc has no {} for optimizer parameters {}; supported: {}.'.format(
          what, type(parameters).__name__,
          ', '.join(sorted(cls.__name__ for cls in registry))))


def from_mid_level(optimizer):
  """tpu_fc's legacy parameters for a `tf.tpu.experimental.embedding` optimizer.

  Lets the host engine run migrated tables (whose configs carry mid-level
  optimizers) with the same update rules.
  """
  common = dict(
      learning_rate=optimizer.learning_rate,
      use_gradient_accumulation=optimizer.use_gradient_accumulation,
      clip_weight_min=optimizer.clip_weight_min,
      clip_weight_max=optimizer.clip_weight_max,
      weight_decay_factor=optimizer.weight_decay_factor,
      multiply_weight_decay_factor_by_learning_rate=(
          optimizer.multiply_weight_decay_factor_by_learning_rate),
      clip_gradient_min=optimizer.clip_gradient_min,
      clip_gradient_max=optimizer.clip_gradient_max)
  embedding = tf.tpu.experimental.embedding
  if isinstance(optimizer, embedding.Adagrad):
    return AdagradParameters(
        initial_accumulator=optimizer.initial_accumulator_value, **common)
  if isinstance(optimizer, embedding.AdagradMomentum):
    return AdagradMomentumParameters(
        momentum=optimizer.momentum, use_nesterov=optimizer.use_nesterov,
        exponent=optimizer.exponent, beta2=optimizer.beta2,
        epsilon=optimizer.epsilon, **common)
  if isinstance(optimizer, embedding.Adam):
    return AdamParameters(
        beta1=optimizer.beta_1, beta2=optimizer.beta_2,
        epsilon=optimizer.epsilon, lazy_adam=optimizer.lazy_adam,
        sum_inside_sqrt=optimizer.sum_inside_sqrt, **common)
  if isinstance(optimizer, embedding.FTRL):
    return FtrlParameters(
        learning_rate_power=optimizer.learning_rate_power,
        initial_accumulator_value=optimizer.initial_accumulator_value,
        l1_regularization_strength=optimizer.l1_regularization_strength,
        l2_regularization_strength=optimizer.l2_regularization_strength,
        multiply_linear_by_learning_rate=(
            optimizer.multiply_linear_by_learning_rate),
        beta=optimizer.beta,
        allow_zero_accumulator=optimizer.allow_zero_accumulator, **common)
  if isinstance(optimizer, embedding.SGD):
    return StochasticGradientDescentParameters(**common)
  raise NotImplementedError(
      'tpu_fc cannot train tables with the mid-level optimizer {}; supported: '
      'SGD, Adagrad, AdagradMomentum, Adam, FTRL.'.format(
          type(optimizer).__name__))
