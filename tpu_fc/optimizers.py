"""Legacy TPU embedding optimizer parameters (`tf.compat.v1.tpu.experimental.*Parameters`).

TF 2.16 removed these classes; scripts still construct them.  They are kept here with
TF 2.15's signatures, defaults, validation and error texts, frozen after construction,
and each converts to its `tf.tpu.experimental.embedding` twin with `to_mid_level()`.
All ten of TF 2.15's `tensorflow.python.tpu.tpu_embedding` are here: the seven its
`EmbeddingConfigSpec` takes with feature columns (`SUPPORTED_OPTIMIZERS`) and
AdagradMomentum, ProximalYogi and FrequencyEstimator, which its engine trains when a
dict-configured spec names them.
The update rules they stand for are defined once, in numpy, in `tpu_fc.reference`
(step order: duplicate ids summed, gradient clipping, the rule, decoupled weight
decay, weight clipping).

A `*Parameters` object is immutable: setting or deleting an attribute raises
`AttributeError` (TF 2.15 allowed it; a spec shared by estimators must not change
under them); `replace(**changes)` builds a changed copy.  Objects of one class with
equal fields are equal.

Args (of every class but `FrequencyEstimatorParameters`, which fixes them):
  learning_rate: the tables' learning rate; a table's own `learning_rate`
    (dict configs) or its column's `learning_rate_fn` takes precedence.
  use_gradient_accumulation: True (default): a step's gradients of one id,
    from every example and core, are summed into one update.  False: a
    table's rows live on the cores modulo their count, and each core's sum is
    applied in turn, the core holding the id first (`docs/emulation.md`);
    with one core both are the same.
  clip_weight_min: the updated rows are clipped to at least this; None: no
    lower bound.
  clip_weight_max: the updated rows are clipped to at most this; None: no
    upper bound.
  weight_decay_factor: each update also subtracts this times the row's value
    before the update (decoupled weight decay); None: no decay.
  multiply_weight_decay_factor_by_learning_rate: True scales the decay by the
    learning rate; None or False does not.
  clip_gradient_min: each id's summed gradient is clipped to at least this
    before the update; None: no lower bound.  Needs
    `use_gradient_accumulation=True`.
  clip_gradient_max: each id's summed gradient is clipped to at most this
    before the update; None: no upper bound.  Needs
    `use_gradient_accumulation=True`.

Raises (every constructor, before its own checks):
  ValueError: a gradient clipping bound is given with
    `use_gradient_accumulation=False`.
"""
from __future__ import annotations

from typing import Any, Callable

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
  """What every `*Parameters` class has: its arguments as read-only
  attributes, the checks shared by all (module doc), equality by class and
  fields, `to_mid_level()` and `replace()`.

  Class attributes of each subclass:
    SLOTS: (legacy TPU checkpoint suffix, mid-level slot name) per slot variable, in
      the order the mid-level optimizer creates them (without a mid-level twin: the
      order of TF 2.15's `_*Handler`, tpu_fc's names).
  """
  SLOTS = ()

  def __init__(self, learning_rate: float | Callable[[], Any],
               use_gradient_accumulation: bool,
               clip_weight_min: float | None, clip_weight_max: float | None,
               weight_decay_factor: float | None,
               multiply_weight_decay_factor_by_learning_rate: bool | None,
               clip_gradient_min: float | None = None,
               clip_gradient_max: float | None = None):
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

  def fields(self) -> dict[str, Any]:
    """The constructor-visible fields, in a stable order."""
    return {k: v for k, v in self.__dict__.items() if not k.startswith('_')}

  def replace(self, **changes: Any) -> _OptimizationParameters:
    """A copy with some constructor arguments changed (e.g. the learning rate).

    Args:
      **changes: constructor arguments by name; the others keep this object's
        values.

    Returns:
      A new object of this class.

    Raises:
      TypeError: a name the constructor does not take.
      ValueError: the constructor's checks fail on the changed arguments.
    """
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

  def slot_initial_values(self) -> dict[str, float]:
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

  def to_mid_level(
      self, learning_rate: float | Callable[[], Any] | None = None) -> Any:
    """The `tf.tpu.experimental.embedding` optimizer that applies the same rule.

    Every field is passed on, the mid-level defaults are never relied on (the
    gradient clipping bounds become its `clipvalue`).

    Args:
      learning_rate: a learning rate in place of this object's (a float or a
        zero-argument callable), for tables that have their own
        `learning_rate_fn`; None: this object's.

    Returns:
      A `tf.tpu.experimental.embedding.SGD`, `Adagrad`, `AdagradMomentum`,
      `Adam` or `FTRL`.

    Raises:
      NotImplementedError: the class has no mid-level twin (ProximalAdagrad,
        Momentum, RMSProp, ProximalYogi, FrequencyEstimator); the message
        names the closest mid-level optimizer.
      ValueError: `FtrlParameters` with `initial_accumulator_value=0`, which
        the mid-level FTRL refuses.
    """
    raise NotImplementedError(self._NO_MID_LEVEL_TWIN)

  _NO_MID_LEVEL_TWIN = ''


class StochasticGradientDescentParameters(_OptimizationParameters):
  """Plain SGD: `w -= lr * g`.  No slots.

  Args:
    learning_rate: the tables' learning rate.
    use_gradient_accumulation, clip_weight_min, clip_weight_max,
      weight_decay_factor, multiply_weight_decay_factor_by_learning_rate,
      clip_gradient_min, clip_gradient_max: as for every optimizer
      (`tpu_fc.optimizers`).

  Raises:
    ValueError: see `tpu_fc.optimizers` (gradient clipping).
  """

  def __init__(self, learning_rate: float | Callable[[], Any],
               use_gradient_accumulation: bool = True,
               clip_weight_min: float | None = None,
               clip_weight_max: float | None = None,
               weight_decay_factor: float | None = None,
               multiply_weight_decay_factor_by_learning_rate: bool | None = None,
               clip_gradient_min: float | None = None,
               clip_gradient_max: float | None = None):
    super().__init__(**_common(locals()))
    self._keep(locals())

  def to_mid_level(
      self, learning_rate: float | Callable[[], Any] | None = None) -> Any:
    return tf.tpu.experimental.embedding.SGD(
        **self._mid_level_common(learning_rate))


class AdagradParameters(_OptimizationParameters):
  """Adagrad without epsilon: `a += g*g; w -= lr * g / sqrt(a)`.

  Slot: the accumulator `a` (checkpoint suffix `Adagrad`).

  Args:
    learning_rate: the tables' learning rate.
    initial_accumulator: the value every accumulator starts at; must be > 0.
    use_gradient_accumulation, clip_weight_min, clip_weight_max,
      weight_decay_factor, multiply_weight_decay_factor_by_learning_rate,
      clip_gradient_min, clip_gradient_max: as for every optimizer
      (`tpu_fc.optimizers`).

  Raises:
    ValueError: `initial_accumulator` <= 0; see also `tpu_fc.optimizers`.
  """
  SLOTS = (('Adagrad', 'accumulators'),)

  def __init__(self, learning_rate: float | Callable[[], Any],
               initial_accumulator: float = 0.1,
               use_gradient_accumulation: bool = True,
               clip_weight_min: float | None = None,
               clip_weight_max: float | None = None,
               weight_decay_factor: float | None = None,
               multiply_weight_decay_factor_by_learning_rate: bool | None = None,
               clip_gradient_min: float | None = None,
               clip_gradient_max: float | None = None):
    super().__init__(**_common(locals()))
    if initial_accumulator <= 0:
      raise ValueError(f'Adagrad initial_accumulator must be greater than zero. '
                       f'Received: {initial_accumulator}.')
    self._keep(locals())

  def slot_initial_values(self) -> dict[str, float]:
    return {'accumulators': self.initial_accumulator}

  def to_mid_level(
      self, learning_rate: float | Callable[[], Any] | None = None) -> Any:
    return tf.tpu.experimental.embedding.Adagrad(
        initial_accumulator_value=self.initial_accumulator,
        **self._mid_level_common(learning_rate))


class ProximalAdagradParameters(_OptimizationParameters):
  """Adagrad with an l1/l2 proximal step; the mid-level API has no twin.

  Slot: the accumulator (checkpoint suffix `ProximalAdagrad`).
  `to_mid_level()` raises `NotImplementedError`.

  Args:
    learning_rate: the tables' learning rate.
    initial_accumulator: the value every accumulator starts at; must be > 0.
    l1_regularization_strength: the l1 term of the proximal step; >= 0.
    l2_regularization_strength: the l2 term of the proximal step; >= 0.
    use_gradient_accumulation, clip_weight_min, clip_weight_max,
      weight_decay_factor, multiply_weight_decay_factor_by_learning_rate,
      clip_gradient_min, clip_gradient_max: as for every optimizer
      (`tpu_fc.optimizers`).

  Raises:
    ValueError: `initial_accumulator` <= 0, or a regularization strength < 0;
      see also `tpu_fc.optimizers`.
  """
  SLOTS = (('ProximalAdagrad', 'accumulators'),)
  _NO_MID_LEVEL_TWIN = (
      'ProximalAdagradParameters has no twin in tf.tpu.experimental.embedding. '
      'The closest mid-level optimizer is tf.tpu.experimental.embedding.Adagrad '
      '(same accumulator, no l1/l2 proximal step); tf.tpu.experimental.embedding.'
      'FTRL offers l1/l2 regularization. tpu_fc.TPUEstimator still trains with '
      'ProximalAdagradParameters.')

  def __init__(self, learning_rate: float | Callable[[], Any],
               initial_accumulator: float = 0.1,
               l1_regularization_strength: float = 0.0,
               l2_regularization_strength: float = 0.0,
               use_gradient_accumulation: bool = True,
               clip_weight_min: float | None = None,
               clip_weight_max: float | None = None,
               weight_decay_factor: float | None = None,
               multiply_weight_decay_factor_by_learning_rate: bool | None = None,
               clip_gradient_min: float | None = None,
               clip_gradient_max: float | None = None):
    super().__init__(**_common(locals()))
    if initial_accumulator <= 0:
      raise ValueError(f'Adagrad initial_accumulator must be positive. '
                       f'Received: {initial_accumulator}.')
    _check_non_negative('l1_regularization_strength', l1_regularization_strength)
    _check_non_negative('l2_regularization_strength', l2_regularization_strength)
    self._keep(locals())

  def slot_initial_values(self) -> dict[str, float]:
    return {'accumulators': self.initial_accumulator}


class AdamParameters(_OptimizationParameters):
  """Adam as the TPU runs it: no bias correction, lazy by default.

  Slots: the first and second moments (checkpoint suffixes `Adam/m`,
  `Adam/v`).  For bias correction, give the tables a `learning_rate_fn`
  computing `lr * sqrt(1 - beta2**t) / (1 - beta1**t)`.

  Args:
    learning_rate: the tables' learning rate.
    beta1: decay rate of the first moment; in [0, 1).
    beta2: decay rate of the second moment; in [0, 1).
    epsilon: keeps the denominator from 0 (see `sum_inside_sqrt`); must be
      > 0.  `to_mid_level()` passes it on (the
      mid-level default is 1e-07).
    lazy_adam: True: only the rows looked up in a step are updated.  False:
      every row is, the others with a zero gradient (their moments decay and
      their weights still move); needs `use_gradient_accumulation=True`.
    sum_inside_sqrt: the denominator: True `sqrt(v + epsilon**2)`, False
      `sqrt(v) + epsilon`.
    use_gradient_accumulation, clip_weight_min, clip_weight_max,
      weight_decay_factor, multiply_weight_decay_factor_by_learning_rate,
      clip_gradient_min, clip_gradient_max: as for every optimizer
      (`tpu_fc.optimizers`).

  Raises:
    ValueError: `beta1` or `beta2` outside [0, 1), `epsilon` <= 0, or
      `lazy_adam=False` without gradient accumulation; see also
      `tpu_fc.optimizers`.
  """
  SLOTS = (('Adam/m', 'momenta'), ('Adam/v', 'velocities'))

  def __init__(self, learning_rate: float | Callable[[], Any],
               beta1: float = 0.9, beta2: float = 0.999,
               epsilon: float = 1e-08, lazy_adam: bool = True,
               sum_inside_sqrt: bool = True,
               use_gradient_accumulation: bool = True,
               clip_weight_min: float | None = None,
               clip_weight_max: float | None = None,
               weight_decay_factor: float | None = None,
               multiply_weight_decay_factor_by_learning_rate: bool | None = None,
               clip_gradient_min: float | None = None,
               clip_gradient_max: float | None = None):
    super().__init__(**_common(locals()))
    _check_beta('beta1', beta1)
    _check_beta('beta2', beta2)
    _check_epsilon(epsilon)
    if not use_gradient_accumulation and not lazy_adam:
      raise ValueError(
          'When disabling Lazy Adam, gradient accumulation must be used.')
    self._keep(locals())

  def slot_initial_values(self) -> dict[str, float]:
    return {'momenta': 0.0, 'velocities': 0.0}

  def to_mid_level(
      self, learning_rate: float | Callable[[], Any] | None = None) -> Any:
    # epsilon is always passed: the mid-level default is 1e-07, the legacy 1e-08.
    return tf.tpu.experimental.embedding.Adam(
        beta_1=self.beta1, beta_2=self.beta2, epsilon=self.epsilon,
        lazy_adam=self.lazy_adam, sum_inside_sqrt=self.sum_inside_sqrt,
        **self._mid_level_common(learning_rate))


class FtrlParameters(_OptimizationParameters):
  """FTRL-proximal with the TPU's `beta` and `multiply_linear_by_learning_rate`.

  Slots: the accumulator and the linear term (checkpoint suffixes `Ftrl`,
  `Ftrl_1`; the linear term starts at 0, kept as `initial_linear_value`).

  Args:
    learning_rate: the tables' learning rate.
    learning_rate_power: how the per-coordinate rate falls with the
      accumulator (-0.5: as 1/sqrt); <= 0, 0 for a fixed rate.
    initial_accumulator_value: the value every accumulator starts at; >= 0.
      `to_mid_level()` needs > 0 (the mid-level FTRL refuses 0).
    l1_regularization_strength: the l1 term; >= 0.
    l2_regularization_strength: the l2 term; >= 0.
    multiply_linear_by_learning_rate: True keeps the linear term multiplied by
      the learning rate, so a rate ramped up from 0 gives no NaN.
    beta: FTRL's beta, added to the denominator of the per-coordinate rate.
    allow_zero_accumulator: passed to the mid-level FTRL by `to_mid_level()`,
      where it admits accumulators of 0 (TF: at some cost in speed); the
      emulated update does not read it.
    use_gradient_accumulation, clip_weight_min, clip_weight_max,
      weight_decay_factor, multiply_weight_decay_factor_by_learning_rate,
      clip_gradient_min, clip_gradient_max: as for every optimizer
      (`tpu_fc.optimizers`).

  Raises:
    ValueError: `learning_rate_power` > 0, `initial_accumulator_value` < 0, or
      a regularization strength < 0; see also `tpu_fc.optimizers`.
  """
  SLOTS = (('Ftrl', 'accumulators'), ('Ftrl_1', 'linears'))
  _DERIVED_FIELDS = ('initial_linear_value',)

  def __init__(self, learning_rate: float | Callable[[], Any],
               learning_rate_power: float = -0.5,
               initial_accumulator_value: float = 0.1,
               l1_regularization_strength: float = 0.0,
               l2_regularization_strength: float = 0.0,
               use_gradient_accumulation: bool = True,
               clip_weight_min: float | None = None,
               clip_weight_max: float | None = None,
               weight_decay_factor: float | None = None,
               multiply_weight_decay_factor_by_learning_rate: bool | None = None,
               multiply_linear_by_learning_rate: bool = False,
               beta: float = 0, allow_zero_accumulator: bool = False,
               clip_gradient_min: float | None = None,
               clip_gradient_max: float | None = None):
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

  def slot_initial_values(self) -> dict[str, float]:
    return {'accumulators': self.initial_accumulator_value,
            'linears': self.initial_linear_value}

  def to_mid_level(
      self, learning_rate: float | Callable[[], Any] | None = None) -> Any:
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
  """Heavy-ball or Nesterov momentum; the mid-level API has no twin.

  Slot: the momentum (checkpoint suffix `Momentum`).  `to_mid_level()` raises
  `NotImplementedError`.

  Args:
    learning_rate: the tables' learning rate.
    momentum: the momentum's decay: `m = momentum * m + g`.
    use_nesterov: True: Nesterov momentum (`w -= lr * (g + momentum * m)`);
      False: `w -= lr * m`.
    use_gradient_accumulation, clip_weight_min, clip_weight_max,
      weight_decay_factor, multiply_weight_decay_factor_by_learning_rate,
      clip_gradient_min, clip_gradient_max: as for every optimizer
      (`tpu_fc.optimizers`).

  Raises:
    ValueError: see `tpu_fc.optimizers` (gradient clipping).
  """
  SLOTS = (('Momentum', 'momenta'),)
  _NO_MID_LEVEL_TWIN = (
      'MomentumParameters has no twin in tf.tpu.experimental.embedding. The '
      'closest mid-level optimizers are tf.tpu.experimental.embedding.SGD (no '
      'momentum) and tf.tpu.experimental.embedding.AdagradMomentum (momentum '
      'with an Adagrad preconditioner). tpu_fc.TPUEstimator still trains with '
      'MomentumParameters.')

  def __init__(self, learning_rate: float | Callable[[], Any], momentum: float,
               use_nesterov: bool = False,
               use_gradient_accumulation: bool = True,
               clip_weight_min: float | None = None,
               clip_weight_max: float | None = None,
               weight_decay_factor: float | None = None,
               multiply_weight_decay_factor_by_learning_rate: bool | None = None,
               clip_gradient_min: float | None = None,
               clip_gradient_max: float | None = None):
    super().__init__(**_common(locals()))
    self._keep(locals())

  def slot_initial_values(self) -> dict[str, float]:
    return {'momenta': 0.0}


class RMSPropParameters(_OptimizationParameters):
  """RMSProp with momentum; the mid-level API has no twin.

  Slots: the mean square and the momentum (checkpoint suffixes
  `RMSProp/ms`, `RMSProp/mom`).  `to_mid_level()` raises
  `NotImplementedError`, naming the `Adam` settings that apply the same
  update when `momentum` is 0.

  Args:
    learning_rate: the tables' learning rate.
    rho: decay of the mean square: `ms = rho * ms + (1 - rho) * g*g`.
    momentum: decay of the momentum:
      `mom = momentum * mom + lr * g / sqrt(ms + epsilon)`.
    epsilon: added to the mean square under the square root.
    use_gradient_accumulation, clip_weight_min, clip_weight_max,
      weight_decay_factor, multiply_weight_decay_factor_by_learning_rate,
      clip_gradient_min, clip_gradient_max: as for every optimizer
      (`tpu_fc.optimizers`).

  Raises:
    ValueError: see `tpu_fc.optimizers` (gradient clipping).
  """
  SLOTS = (('RMSProp/ms', 'ms'), ('RMSProp/mom', 'mom'))
  _NO_MID_LEVEL_TWIN = (
      'RMSPropParameters has no twin in tf.tpu.experimental.embedding. The '
      'closest mid-level optimizer is tf.tpu.experimental.embedding.Adam: with '
      'momentum=0, Adam(beta_1=0, beta_2=rho, epsilon=sqrt(epsilon), '
      'sum_inside_sqrt=True) applies the same update. tpu_fc.TPUEstimator '
      'still trains with RMSPropParameters.')

  def __init__(self, learning_rate: float | Callable[[], Any], rho: float, momentum: float,
               epsilon: float,
               use_gradient_accumulation: bool = True,
               clip_weight_min: float | None = None,
               clip_weight_max: float | None = None,
               weight_decay_factor: float | None = None,
               multiply_weight_decay_factor_by_learning_rate: bool | None = None,
               clip_gradient_min: float | None = None,
               clip_gradient_max: float | None = None):
    super().__init__(**_common(locals()))
    self._keep(locals())

  def slot_initial_values(self) -> dict[str, float]:
    return {'ms': 0.0, 'mom': 0.0}


class AdagradMomentumParameters(_OptimizationParameters):
  """Momentum over the Adagrad-scaled gradient (`tpu_fc.reference`).

  Taken by the spec with dict configs only, as in TF 2.15.  Slots: the
  accumulator and the momentum (checkpoint suffixes
  `AdagradMomentum/Accumulator`, `AdagradMomentum/Momentum`, both starting
  at 0).

  Args:
    learning_rate: the tables' learning rate.
    momentum: the momentum's decay.
    use_nesterov: True: Nesterov momentum; False: heavy-ball.
    exponent: `k` of the scaled gradient `g * (a + epsilon)**(-1/k)` (2:
      divided by the square root); must be > 0.
    beta2: decay of the accumulator: `a = beta2 * a + (1 - beta2) * g*g`;
      1 (default) sums, `a += g*g`, as Adagrad does.
    epsilon: added to the accumulator in the scaled gradient; must be > 0.
    use_gradient_accumulation, clip_weight_min, clip_weight_max,
      weight_decay_factor, multiply_weight_decay_factor_by_learning_rate,
      clip_gradient_min, clip_gradient_max: as for every optimizer
      (`tpu_fc.optimizers`).

  Raises:
    ValueError: `epsilon` <= 0 or `exponent` <= 0; see also
      `tpu_fc.optimizers`.
  """
  SLOTS = (('AdagradMomentum/Accumulator', 'accumulators'),
           ('AdagradMomentum/Momentum', 'momenta'))

  def __init__(self, learning_rate: float | Callable[[], Any], momentum: float,
               use_nesterov: bool = False, exponent: float = 2,
               beta2: float = 1, epsilon: float = 1e-10,
               use_gradient_accumulation: bool = True,
               clip_weight_min: float | None = None,
               clip_weight_max: float | None = None,
               weight_decay_factor: float | None = None,
               multiply_weight_decay_factor_by_learning_rate: bool | None = None,
               clip_gradient_min: float | None = None,
               clip_gradient_max: float | None = None):
    super().__init__(**_common(locals()))
    if epsilon <= 0:
      raise ValueError('Adagrad momentum: epsilon must be positive')
    if exponent <= 0:
      raise ValueError('Adagrad momentum: Precondition exponent must >0')
    self._keep(locals())

  def slot_initial_values(self) -> dict[str, float]:
    return {'accumulators': 0.0, 'momenta': 0.0}

  def to_mid_level(
      self, learning_rate: float | Callable[[], Any] | None = None) -> Any:
    return tf.tpu.experimental.embedding.AdagradMomentum(
        momentum=self.momentum, use_nesterov=self.use_nesterov,
        exponent=self.exponent, beta2=self.beta2, epsilon=self.epsilon,
        **self._mid_level_common(learning_rate))


class ProximalYogiParameters(_OptimizationParameters):
  """Yogi with an l1/l2 proximal step; the mid-level API has no twin.

  Taken by the spec with dict configs only, as in TF 2.15.  Slots: the second
  and first moments (checkpoint suffixes `ProximalYogi`, `ProximalYogi_1`).
  Lazy, without bias correction.  `to_mid_level()` raises
  `NotImplementedError`.

  Args:
    learning_rate: the tables' learning rate.
    beta1: decay of the first moment; in [0, 1).
    beta2: decay of the second moment (Yogi's additive rule); in [0, 1).
    epsilon: added to the second moment's square root; must be > 0.
    l1_regularization_strength: the l1 term of the proximal step; >= 0.
    l2_regularization_strength: the l2 term of the proximal step; >= 0.
    initial_accumulator_value: the value the second moment starts at.
    use_gradient_accumulation, clip_weight_min, clip_weight_max,
      weight_decay_factor, multiply_weight_decay_factor_by_learning_rate,
      clip_gradient_min, clip_gradient_max: as for every optimizer
      (`tpu_fc.optimizers`).

  Raises:
    ValueError: `beta1` or `beta2` outside [0, 1), `epsilon` <= 0, or a
      regularization strength < 0; see also `tpu_fc.optimizers`.
  """
  SLOTS = (('ProximalYogi', 'velocities'), ('ProximalYogi_1', 'momenta'))
  _NO_MID_LEVEL_TWIN = (
      'ProximalYogiParameters has no twin in tf.tpu.experimental.embedding. '
      'The closest mid-level optimizer is tf.tpu.experimental.embedding.Adam '
      '(the same first moment, an exponential second moment where Yogi\'s is '
      'additive, no l1/l2 proximal step); tf.tpu.experimental.embedding.FTRL '
      'offers l1/l2 regularization. tpu_fc.TPUEstimator still trains with '
      'ProximalYogiParameters.')

  def __init__(self, learning_rate: float | Callable[[], Any] = 0.01,
               beta1: float = 0.9, beta2: float = 0.999,
               epsilon: float = 1e-3,
               l1_regularization_strength: float = 0.0,
               l2_regularization_strength: float = 0.0,
               initial_accumulator_value: float = 1e-6,
               use_gradient_accumulation: bool = True,
               clip_weight_min: float | None = None,
               clip_weight_max: float | None = None,
               weight_decay_factor: float | None = None,
               multiply_weight_decay_factor_by_learning_rate: bool | None = None,
               clip_gradient_min: float | None = None,
               clip_gradient_max: float | None = None):
    super().__init__(**_common(locals()))
    _check_beta('beta1', beta1)
    _check_beta('beta2', beta2)
    _check_epsilon(epsilon)
    _check_non_negative('l1_regularization_strength', l1_regularization_strength)
    _check_non_negative('l2_regularization_strength', l2_regularization_strength)
    self._keep(locals())

  def slot_initial_values(self) -> dict[str, float]:
    return {'velocities': self.initial_accumulator_value, 'momenta': 0.0}


class FrequencyEstimatorParameters(_OptimizationParameters):
  """Estimates how many global steps lie between two lookups of an id.

  Not an optimizer of the gradient (which should be zero): its table, of
  dimension 1, holds the estimate, and its learning rate must be the global
  step (a table `learning_rate_fn` casting it); the other common fields are
  fixed, as TF 2.15 fixes them.  No mid-level twin: `to_mid_level()` raises
  `NotImplementedError`.  Taken by the spec with dict configs only, as in TF
  2.15; its tables must have dimension 1 (the spec's layout raises
  `ValueError` otherwise).  Slot: the step of each id's last lookup
  (checkpoint suffix `FrequencyEstimator`).

  Args:
    tau: the rate, in (0, 1), at which the estimate moves toward the gap
      (global steps) between an id's last two lookups.
    max_delta: gaps are capped at this (TF's proto starts the estimates at
      it: give the table that initializer).
    outlier_threshold: a gap of at least this times the estimate is an
      outlier: the estimate becomes the (capped) gap.
    weight_exponent: kept for TF's signature; the emulated update does not
      read it (what the device does with it is not pinned by a source).
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

  def __init__(self, tau: float, max_delta: float, outlier_threshold: float,
               weight_exponent: float):
    super().__init__(
        learning_rate=1.0, use_gradient_accumulation=True, clip_weight_min=None,
        clip_weight_max=None, weight_decay_factor=None,
        multiply_weight_decay_factor_by_learning_rate=None)
    self._keep(locals())

  def slot_initial_values(self) -> dict[str, float]:
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
