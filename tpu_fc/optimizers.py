"""Legacy TPU embedding optimizer parameters (`tf.compat.v1.tpu.experimental.*Parameters`).

TF 2.16 removed these classes; scripts still construct them.  They are kept here with
TF 2.15's signatures, defaults, validation and error texts, frozen after construction,
and each converts to its `tf.tpu.experimental.embedding` twin with `to_mid_level()`.
All ten of TF 2.15's `tensorflow.python.tpu.tpu_embedding` are here: the seven its
`EmbeddingConfigSpec` takes with feature columns (`SUPPORTED_OPTIMIZERS`) and
AdagradMomentum, ProximalYogi and FrequencyEstimator, which its engine trains when a
dict-configured spec names them.

A class is all tpu_fc knows of its optimizer, as TF's mid-level `_Optimizer`
subclasses are (`_OptimizationParameters`' class attributes): its slots, their
legacy checkpoint names and initial values, its mid-level and keras-rs twins and
the TPU update the host engine applies (its `Rule`: a TF kernel or a row
function, defined before the class; `tpu_fc.lookup.sparse_update` runs it).
Every list of optimizers and every dispatch on one is derived from the classes,
so defining a subclass, here or in a user's code, adds an optimizer.
The update rules they stand for are defined, in numpy, in `tpu_fc.reference`, the
oracle, which imports nothing of tpu_fc (step order: duplicate ids summed,
gradient clipping, the rule, decoupled weight decay, weight clipping).

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

from typing import Any, Callable, ClassVar, Iterable, Mapping, NamedTuple

import numpy as np

from tpu_fc._tf import tf

_F32 = np.float32

_COMMON_FIELDS = ('learning_rate', 'use_gradient_accumulation', 'clip_weight_min',
                  'clip_weight_max', 'weight_decay_factor',
                  'multiply_weight_decay_factor_by_learning_rate',
                  'clip_gradient_min', 'clip_gradient_max')
# Every class defined, in order: tpu_fc's, then any subclass defined since.
_CLASSES: list[type[_OptimizationParameters]] = []


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


# The update rules: kernels `(parameters, table handle, {slot: handle}, ids, g,
# lr) -> op` updating the rows `ids` in place, and row functions (the
# reference's formulas on tensors of rows), each before its class.


def _hyper(parameters, *names):
  """Named hyperparameters as float32 constants: float32 arithmetic, as the reference."""
  return [tf.constant(_F32(getattr(parameters, name))) for name in names]


class Rule(NamedTuple):
  """How the host engine applies an optimizer's update (its class's `RULE`;
  `tpu_fc.lookup.sparse_update` runs it): on a TF kernel where that computes
  the reference's rule (fast, in place), else by the reference's formulas on
  the gathered rows.

  Attributes:
    kernel: `(parameters, table handle, {slot: handle}, ids, g, lr) -> op`,
      updating the rows `ids` in place; None: `rows` always.
    rows: `(parameters, w, {slot: rows}, g, lr) -> (new w, {slot: new rows})`
      on tensors of the rows; None: `kernel` always.
    kernel_is_exact: `parameters -> bool`, whether `kernel` may be used at
      all (default: always).
    kernel_needs_positive_lr: the kernel raises for `lr <= 0`: `rows` then.
  """
  kernel: Callable[..., Any] | None = None
  rows: Callable[..., Any] | None = None
  kernel_is_exact: Callable[[Any], bool] = lambda parameters: True
  kernel_needs_positive_lr: bool = False


class Twin:
  """The optimizer of another API that applies a class's rule: its class name
  there and the argument (and attribute) each of the class's own fields
  becomes; the common fields map by the API (`to_mid_level`, keras-rs).

  Args:
    name: the class in `tf.tpu.experimental.embedding` (`MID_LEVEL`) or in
      `keras.optimizers` (`KERAS_RS`).
    *same: the fields whose argument has their name.
    losses: (field, lost(value), why and what to do) of each value the twin
      cannot carry: refused, not dropped.
    **renamed: field=argument of the others.
  """

  def __init__(self, name: str, *same: str,
               losses: tuple[tuple[str, Callable[[Any], bool], str], ...] = (),
               **renamed: str):
    self.name = name
    self.fields: dict[str, str] = dict(zip(same, same), **renamed)
    self.losses = losses

  def arguments(self, parameters: _OptimizationParameters) -> dict[str, Any]:
    """The twin's arguments for the own fields of `parameters`."""
    return {argument: getattr(parameters, field)
            for field, argument in self.fields.items()}


class _OptimizationParameters:
  """What every `*Parameters` class has: its arguments as read-only
  attributes, the checks shared by all (module doc), equality by class and
  fields, `to_mid_level()` and `replace()`.

  The class attributes below are all tpu_fc knows of an optimizer: a new one
  is a subclass that sets them (defined outside tpu_fc too).

  Attributes:
    SLOTS: (legacy TPU checkpoint suffix, mid-level slot name) per slot
      variable, in the order the mid-level twin creates them (without one:
      the order of TF 2.15's `_*Handler`, tpu_fc's names).
    SLOT_INITIAL_FIELDS: the field each slot (by mid-level name) starts at;
      the others start at 0.
    TPU_ONLY_SLOTS: no model optimizer writes these suffixes, so a variable
      with them is an embedding table (`tpu-fc inspect`).
    FEATURE_COLUMNS: the spec takes it with feature columns (TF 2.15's
      seven, `SUPPORTED_OPTIMIZERS`); with dict configs it takes every class.
    MID_LEVEL: the `tf.tpu.experimental.embedding` optimizer of the same
      rule, both ways (`to_mid_level()`, `from_mid_level`); None: there is
      none, and `to_mid_level()` raises the class's `_NO_MID_LEVEL_TWIN`.
    KERAS_RS: the Keras 3 optimizer keras-rs converts to the `MID_LEVEL` twin
      (`EmbeddingConfigSpec.to_keras_rs`); None: keras-rs cannot train it.
    RULE: the TPU update the host engine applies, on a TF kernel or by the
      reference's formulas on rows (`Rule`).
  """
  SLOTS: ClassVar[tuple[tuple[str, str], ...]] = ()
  SLOT_INITIAL_FIELDS: ClassVar[Mapping[str, str]] = {}
  TPU_ONLY_SLOTS: ClassVar[bool] = False
  FEATURE_COLUMNS: ClassVar[bool] = False
  MID_LEVEL: ClassVar[Twin | None] = None
  _NO_MID_LEVEL_TWIN: ClassVar[str] = ''
  KERAS_RS: ClassVar[Twin | None] = None
  RULE: ClassVar[Rule | None] = None
  _DERIVED_FIELDS: ClassVar[tuple[str, ...]] = ()

  def __init_subclass__(cls, **kwargs: Any) -> None:
    super().__init_subclass__(**kwargs)
    _CLASSES.append(cls)

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

  def _keep(self, arguments: Mapping[str, Any], **derived: Any) -> None:
    """Stores a subclass constructor's own arguments (its `locals()` less the
    common ones) and `derived` fields, in that order, then freezes."""
    own = {name: value for name, value in arguments.items()
           if name not in _COMMON_FIELDS + ('self', '__class__')}
    for name, value in dict(own, **derived).items():
      object.__setattr__(self, name, value)
    object.__setattr__(self, '_frozen', True)

  def __setattr__(self, name: str, value: Any) -> None:
    if getattr(self, '_frozen', False):
      raise AttributeError(
          '{} is immutable; build a new one instead of setting {!r}.'.format(
              type(self).__name__, name))
    object.__setattr__(self, name, value)

  def __delattr__(self, name: str) -> None:
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

  def __eq__(self, other: Any) -> bool:
    return type(self) is type(other) and self.fields() == other.fields()

  def __hash__(self) -> int:
    return hash((type(self).__name__,) + tuple(
        (k, v if isinstance(v, (int, float, bool, str, type(None))) else id(v))
        for k, v in self.fields().items()))

  def __repr__(self) -> str:
    return '{}({})'.format(type(self).__name__, ', '.join(
        '{}={!r}'.format(k, v) for k, v in self.fields().items()))

  def slot_initial_values(self) -> dict[str, float]:
    """Initial value of each slot variable, keyed by mid-level slot name."""
    return {slot: getattr(self, self.SLOT_INITIAL_FIELDS[slot])
            if slot in self.SLOT_INITIAL_FIELDS else 0.0
            for _, slot in self.SLOTS}

  def updates_every_row(self) -> bool:
    """Whether a step updates every row of the table, not only those looked up."""
    return False

  def check_table(self, name: str, dimension: int) -> None:
    """Raises `ValueError` for a table (`name`, of `dimension`) this optimizer
    cannot train, as TF 2.15's engine does where it creates the table."""

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
      The class's `MID_LEVEL` twin: a `tf.tpu.experimental.embedding.SGD`,
      `Adagrad`, `AdagradMomentum`, `Adam` or `FTRL` for tpu_fc's.

    Raises:
      NotImplementedError: the class has no mid-level twin (ProximalAdagrad,
        Momentum, RMSProp, ProximalYogi, FrequencyEstimator); the message
        names the closest mid-level optimizer.
      ValueError: `FtrlParameters` with `initial_accumulator_value=0`, which
        the mid-level FTRL refuses.
    """
    if self.MID_LEVEL is None:
      raise NotImplementedError(self._NO_MID_LEVEL_TWIN)
    bounds = (self.clip_gradient_min, self.clip_gradient_max)
    return getattr(tf.tpu.experimental.embedding, self.MID_LEVEL.name)(
        learning_rate=(self.learning_rate if learning_rate is None
                       else learning_rate),
        clipvalue=None if bounds == (None, None) else bounds,
        # (the other common fields, as they are)
        **{name: getattr(self, name) for name in _COMMON_FIELDS[1:6]},
        **self.MID_LEVEL.arguments(self))


def _proximal_adagrad_kernel(parameters, table, slots, ids, g, lr):
  l1, l2 = _hyper(parameters, 'l1_regularization_strength',
                  'l2_regularization_strength')
  return tf.raw_ops.ResourceSparseApplyProximalAdagrad(
      var=table, accum=slots['accumulators'], lr=lr, l1=l1, l2=l2, grad=g,
      indices=ids)


def _proximal_adagrad_rows(parameters, w, slots, g, lr):
  """ProximalAdagrad for rates the kernel rejects (`lr <= 0`)."""
  l1, l2 = _hyper(parameters, 'l1_regularization_strength',
                  'l2_regularization_strength')
  one = tf.constant(_F32(1.0))
  a = slots['accumulators'] + g * g
  lr_t = lr / tf.sqrt(a)
  u = w - lr_t * g
  shrunk = tf.sign(u) * tf.maximum(tf.abs(u) - lr_t * l1,
                                   tf.constant(_F32(0.0)))
  return shrunk / (one + lr_t * l2), {'accumulators': a}


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
  initial_accumulator: float
  l1_regularization_strength: float
  l2_regularization_strength: float
  SLOTS = (('ProximalAdagrad', 'accumulators'),)
  SLOT_INITIAL_FIELDS = {'accumulators': 'initial_accumulator'}
  FEATURE_COLUMNS = True
  RULE = Rule(_proximal_adagrad_kernel, _proximal_adagrad_rows,
              kernel_needs_positive_lr=True)
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


def _adagrad_kernel(parameters, table, slots, ids, g, lr):
  """V2 with ε = 0 computes `η g / √a`, the reference's order (V1 uses rsqrt)."""
  del parameters
  return tf.raw_ops.ResourceSparseApplyAdagradV2(
      var=table, accum=slots['accumulators'], lr=lr, epsilon=_F32(0.0),
      grad=g, indices=ids)


def _adagrad_rows(parameters, w, slots, g, lr):
  """The kernel's arithmetic on the gathered rows (XLA has no sparse kernel)."""
  del parameters
  a = slots['accumulators'] + g * g
  return w - lr * g / tf.sqrt(a), {'accumulators': a}


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
  initial_accumulator: float
  SLOTS = (('Adagrad', 'accumulators'),)
  SLOT_INITIAL_FIELDS = {'accumulators': 'initial_accumulator'}
  FEATURE_COLUMNS = True
  MID_LEVEL = KERAS_RS = Twin('Adagrad',
                              initial_accumulator='initial_accumulator_value')
  RULE = Rule(_adagrad_kernel, _adagrad_rows)

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


def _adam_rows(parameters, w, slots, g, lr):
  """Adam without bias correction (no TF kernel has both denominators)."""
  b1, b2, eps = _hyper(parameters, 'beta1', 'beta2', 'epsilon')
  one = tf.constant(_F32(1.0))
  m = b1 * slots['momenta'] + (one - b1) * g
  v = b2 * slots['velocities'] + (one - b2) * g * g
  if parameters.sum_inside_sqrt:
    denominator = tf.sqrt(v + eps * eps)
  else:
    denominator = tf.sqrt(v) + eps
  return w - lr * m / denominator, {'momenta': m, 'velocities': v}


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
  beta1: float
  beta2: float
  epsilon: float
  lazy_adam: bool
  sum_inside_sqrt: bool
  SLOTS = (('Adam/m', 'momenta'), ('Adam/v', 'velocities'))
  TPU_ONLY_SLOTS = True
  FEATURE_COLUMNS = True
  MID_LEVEL = Twin('Adam', 'epsilon', 'lazy_adam', 'sum_inside_sqrt',
                   beta1='beta_1', beta2='beta_2')
  KERAS_RS = Twin('Adam', 'epsilon', beta1='beta_1', beta2='beta_2', losses=(
      ('lazy_adam', lambda value: not value,
       'keras-rs builds the TPU\'s lazy Adam (only looked-up rows move); set '
       'it True'),
      ('sum_inside_sqrt', lambda value: not value,
       'keras-rs builds the TPU\'s Adam with sum_inside_sqrt=True '
       '(sqrt(v + epsilon**2)); set it True')))
  RULE = Rule(rows=_adam_rows)

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

  def updates_every_row(self) -> bool:
    return not self.lazy_adam


def _ftrl_kernel(parameters, table, slots, ids, g, lr):
  """TPU `beta` is TF's `l2 + β/(2η)`, with and without multiply_linear_by_lr.

  The kernel's quadratic is `a'^p/η + 2 l2` (resp. `a'^p + 2 l2 η`), which is
  the reference's `(a'^p + β)/η + 2λ2` (resp. `a'^p + β + 2λ2η`) for that l2.
  """
  l1, l2, beta, power = _hyper(parameters, 'l1_regularization_strength',
                               'l2_regularization_strength', 'beta',
                               'learning_rate_power')
  if parameters.beta:
    l2 = l2 + beta / (tf.constant(_F32(2.0)) * lr)
  return tf.raw_ops.ResourceSparseApplyFtrlV2(
      var=table, accum=slots['accumulators'], linear=slots['linears'], grad=g,
      indices=ids, lr=lr, l1=l1, l2=l2, l2_shrinkage=_F32(0.0),
      lr_power=power,
      multiply_linear_by_lr=bool(parameters.multiply_linear_by_learning_rate))


def _ftrl_rows(parameters, w, slots, g, lr):
  """FTRL as the reference writes it, with the `|l| > λ1` guard before dividing."""
  power, l1, l2, beta = _hyper(parameters, 'learning_rate_power',
                               'l1_regularization_strength',
                               'l2_regularization_strength', 'beta')
  p, two = -power, tf.constant(_F32(2.0))
  a, a_new = slots['accumulators'], slots['accumulators'] + g * g
  power_delta = tf.pow(a_new, p) - tf.pow(a, p)
  if parameters.multiply_linear_by_learning_rate:
    linear = slots['linears'] + lr * g - power_delta * w
    q = tf.pow(a_new, p) + beta + two * l2 * lr
    threshold = l1 * lr
  else:
    linear = slots['linears'] + g - power_delta / lr * w
    q = (tf.pow(a_new, p) + beta) / lr + two * l2
    threshold = l1
  w_new = tf.where(tf.abs(linear) > threshold,
                   (tf.sign(linear) * threshold - linear) / q,
                   tf.zeros_like(w))
  return w_new, {'accumulators': a_new, 'linears': linear}


def _ftrl_kernel_is_exact(parameters):
  """False where the kernel's unguarded division can give NaN (or l2 < 0)."""
  zero_accumulator = (parameters.initial_accumulator_value == 0 and
                      parameters.l2_regularization_strength == 0 and
                      parameters.beta == 0 and
                      parameters.learning_rate_power != 0)
  return parameters.beta >= 0 and not zero_accumulator


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
  learning_rate_power: float
  initial_accumulator_value: float
  l1_regularization_strength: float
  l2_regularization_strength: float
  multiply_linear_by_learning_rate: bool
  beta: float
  allow_zero_accumulator: bool
  initial_linear_value: float
  SLOTS = (('Ftrl', 'accumulators'), ('Ftrl_1', 'linears'))
  SLOT_INITIAL_FIELDS = {'accumulators': 'initial_accumulator_value',
                         'linears': 'initial_linear_value'}
  FEATURE_COLUMNS = True
  MID_LEVEL = Twin('FTRL', 'learning_rate_power', 'initial_accumulator_value',
                   'l1_regularization_strength', 'l2_regularization_strength',
                   'multiply_linear_by_learning_rate', 'beta',
                   'allow_zero_accumulator')
  KERAS_RS = Twin(
      'Ftrl', 'learning_rate_power', 'initial_accumulator_value',
      'l1_regularization_strength', 'l2_regularization_strength', 'beta',
      losses=(('multiply_linear_by_learning_rate', bool,
               'keras-rs builds the TPU\'s FTRL without it; set it False'),
              ('allow_zero_accumulator', bool,
               'keras-rs builds the TPU\'s FTRL without it; set it False'),
              ('initial_accumulator_value', lambda value: value <= 0,
               'the TPU\'s FTRL needs accumulators > 0; start them at a small '
               'positive value, e.g. 1e-6')))
  RULE = Rule(_ftrl_kernel, _ftrl_rows, _ftrl_kernel_is_exact,
              kernel_needs_positive_lr=True)
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

  def to_mid_level(
      self, learning_rate: float | Callable[[], Any] | None = None) -> Any:
    if self.initial_accumulator_value <= 0:
      raise ValueError(
          'FtrlParameters(initial_accumulator_value={}) has no mid-level twin: '
          'tf.tpu.experimental.embedding.FTRL requires initial_accumulator_value '
          '> 0. Use a small positive value (e.g. 1e-6) to migrate.'.format(
              self.initial_accumulator_value))
    return super().to_mid_level(learning_rate)


def _sgd_kernel(parameters, table, slots, ids, g, lr):
  """`w -= η g`: a scatter-sub of `η g` is exactly that."""
  del parameters, slots
  return tf.raw_ops.ResourceScatterSub(resource=table, indices=ids,
                                       updates=lr * g)


def _sgd_rows(parameters, w, slots, g, lr):
  del parameters, slots
  return w - lr * g, {}


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
  FEATURE_COLUMNS = True
  MID_LEVEL = KERAS_RS = Twin('SGD')
  RULE = Rule(_sgd_kernel, _sgd_rows)

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


def _momentum_kernel(parameters, table, slots, ids, g, lr):
  (momentum,) = _hyper(parameters, 'momentum')
  return tf.raw_ops.ResourceSparseApplyMomentum(
      var=table, accum=slots['momenta'], lr=lr, grad=g, indices=ids,
      momentum=momentum, use_nesterov=bool(parameters.use_nesterov))


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
  momentum: float
  use_nesterov: bool
  SLOTS = (('Momentum', 'momenta'),)
  FEATURE_COLUMNS = True
  RULE = Rule(_momentum_kernel)
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


def _rms_prop_kernel(parameters, table, slots, ids, g, lr):
  rho, momentum, epsilon = _hyper(parameters, 'rho', 'momentum', 'epsilon')
  return tf.raw_ops.ResourceSparseApplyRMSProp(
      var=table, ms=slots['ms'], mom=slots['mom'], lr=lr, rho=rho,
      momentum=momentum, epsilon=epsilon, grad=g, indices=ids)


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
  rho: float
  momentum: float
  epsilon: float
  SLOTS = (('RMSProp/ms', 'ms'), ('RMSProp/mom', 'mom'))
  TPU_ONLY_SLOTS = True
  FEATURE_COLUMNS = True
  RULE = Rule(_rms_prop_kernel)
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


def _adagrad_momentum_rows(parameters, w, slots, g, lr):
  """AdagradMomentum as the reference writes it (no TF kernel has its rule)."""
  momentum, exponent, beta2, epsilon = _hyper(parameters, 'momentum',
                                              'exponent', 'beta2', 'epsilon')
  one = tf.constant(_F32(1.0))
  if parameters.beta2 == 1:
    a = slots['accumulators'] + g * g
  else:
    a = beta2 * slots['accumulators'] + (one - beta2) * g * g
  scaled = g * tf.pow(a + epsilon, -(one / exponent))
  m = momentum * slots['momenta'] + scaled
  step = momentum * m + scaled if parameters.use_nesterov else m
  return w - lr * step, {'accumulators': a, 'momenta': m}


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
  momentum: float
  use_nesterov: bool
  exponent: float
  beta2: float
  epsilon: float
  SLOTS = (('AdagradMomentum/Accumulator', 'accumulators'),
           ('AdagradMomentum/Momentum', 'momenta'))
  TPU_ONLY_SLOTS = True
  MID_LEVEL = Twin('AdagradMomentum', 'momentum', 'use_nesterov', 'exponent',
                   'beta2', 'epsilon')
  RULE = Rule(rows=_adagrad_momentum_rows)

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


def _proximal_yogi_rows(parameters, w, slots, g, lr):
  """ProximalYogi as the reference writes it (TF has no Yogi kernel)."""
  beta1, beta2, epsilon, l1, l2 = _hyper(
      parameters, 'beta1', 'beta2', 'epsilon', 'l1_regularization_strength',
      'l2_regularization_strength')
  one = tf.constant(_F32(1.0))
  m = beta1 * slots['momenta'] + (one - beta1) * g
  g2 = g * g
  v = slots['velocities'] + (one - beta2) * tf.sign(
      g2 - slots['velocities']) * g2
  lr_t = lr / (tf.sqrt(v) + epsilon)
  u = w - lr_t * m
  shrunk = tf.sign(u) * tf.maximum(tf.abs(u) - lr_t * l1,
                                   tf.constant(_F32(0.0)))
  return shrunk / (one + lr_t * l2), {'velocities': v, 'momenta': m}


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
  beta1: float
  beta2: float
  epsilon: float
  l1_regularization_strength: float
  l2_regularization_strength: float
  initial_accumulator_value: float
  SLOTS = (('ProximalYogi', 'velocities'), ('ProximalYogi_1', 'momenta'))
  SLOT_INITIAL_FIELDS = {'velocities': 'initial_accumulator_value'}
  TPU_ONLY_SLOTS = True
  RULE = Rule(rows=_proximal_yogi_rows)
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


def _frequency_estimator_rows(parameters, w, slots, g, lr):
  """FrequencyEstimator as the reference writes it; `lr` is the global step."""
  del g
  tau, max_delta, threshold = _hyper(parameters, 'tau', 'max_delta',
                                     'outlier_threshold')
  delta = lr - slots['last_hit_step']
  clipped = tf.minimum(delta, max_delta)
  estimate = tf.where(delta >= threshold * w, clipped,
                      w * (tf.constant(_F32(1.0)) - tau) + clipped * tau)
  return estimate, {'last_hit_step': tf.fill(tf.shape(w), lr)}


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
  tau: float
  max_delta: float
  outlier_threshold: float
  weight_exponent: float
  SLOTS = (('FrequencyEstimator', 'last_hit_step'),)
  TPU_ONLY_SLOTS = True
  RULE = Rule(rows=_frequency_estimator_rows)
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

  def check_table(self, name: str, dimension: int) -> None:
    if dimension != 1:
      raise ValueError(
          'FrequencyEstimator tables should only have a dimension of 1. '
          'Received dimension {} (table {!r}): its one number per id is the '
          'estimate; make the table dimension=1.'.format(dimension, name))


# Their order is TF 2.15's `_SUPPORTED_OPTIMIZERS` (its error text lists them), then
# the dict-only ones.
ALL_OPTIMIZERS = tuple(_CLASSES)
# What TF 2.15's EmbeddingConfigSpec takes with feature columns.
SUPPORTED_OPTIMIZERS = tuple(cls for cls in ALL_OPTIMIZERS if cls.FEATURE_COLUMNS)
_BY_NAME = {cls.__name__: cls for cls in ALL_OPTIMIZERS}


def optimizer_classes() -> tuple[type[_OptimizationParameters], ...]:
  """Every `*Parameters` class defined so far: `ALL_OPTIMIZERS`, then any
  subclass defined since (a user's own optimizer)."""
  return tuple(_CLASSES)


def twin_names(classes: Iterable[type[_OptimizationParameters]]) -> list[str]:
  """The names of the mid-level twins of `classes`, as messages list them:
  SGD (no slots) first, then by name."""
  return list(dict.fromkeys(name for _, name in sorted(
      (bool(cls.SLOTS), cls.MID_LEVEL.name) for cls in classes if cls.MID_LEVEL)))


def as_tpu_fc_parameters(parameters: Any) -> Any:
  """tpu_fc's parameters for TF 2.15's own `*Parameters` object (or `parameters`).

  Scripts on TF 2.15 may still build `tf.compat.v1.tpu.experimental.AdagradParameters`;
  they are converted field by field so one engine serves both.  Anything else is
  returned unchanged for the caller to reject.
  """
  if isinstance(parameters, _OptimizationParameters):
    return parameters
  cls = _BY_NAME.get(type(parameters).__name__)
  if cls is None or not type(parameters).__module__.startswith('tensorflow'):
    return parameters
  fields = {k: v for k, v in vars(parameters).items()
            if k not in cls._DERIVED_FIELDS}
  return cls(**fields)


def from_mid_level(optimizer: Any) -> _OptimizationParameters:
  """tpu_fc's legacy parameters for a `tf.tpu.experimental.embedding` optimizer.

  Lets the host engine run migrated tables (whose configs carry mid-level
  optimizers) with the same update rules: the first class whose `MID_LEVEL`
  twin is the optimizer's class (or its nearest base).
  """
  twins = {}
  for cls in _CLASSES:
    if cls.MID_LEVEL is not None:
      twins.setdefault(
          getattr(tf.tpu.experimental.embedding, cls.MID_LEVEL.name), cls)
  classes = [twins[base] for base in type(optimizer).__mro__ if base in twins]
  if not classes:
    raise NotImplementedError(
        'tpu_fc cannot train tables with the mid-level optimizer {}; supported: '
        '{}.'.format(type(optimizer).__name__,
                     ', '.join(twin_names(twins.values()))))
  cls = classes[0]
  return cls(**{name: getattr(optimizer, name) for name in _COMMON_FIELDS},
             **{field: getattr(optimizer, argument)
                for field, argument in cls.MID_LEVEL.fields.items()})
