"""The seam between the TPUEstimator driver and a lookup path.

One `EmbeddingConfigSpec` drives every path: `tpu_fc.lookup.backends.backends_for`
builds, once per graph, the backends a mode needs from it, each with its part of
the spec's layout (the features its path looks up, and their tables), and the
driver sequences them, the same calls for every backend:

1. `create_variables(training)`, before the model_fn;
2. `model_features(features, batch_size)`, each backend in turn: the features
   the model_fn sees in place of the ids the backend looks up itself;
3. `lookup(features, num_shards, batch_size)` on input_fn's features:
   `(step, per-shard activations)`, added to each shard's model features;
4. the model_fn once per shard (`shared_table_creators` name the shared
   columns whose tables the shards share), then `checkpoint_variables(graph)`;
5. in training `apply_gradients(step, aggregate_rows)` after the model's
   train_op, `training_hooks(step)`, and `before_save()` before each checkpoint.

Backends own their variables and know nothing of the driver: what the driver's
synchronous replicas need (`aggregate_rows`) is passed in.
"""
from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
  from tpu_fc._tf import tf
  from tpu_fc.spec import EmbeddingConfigSpec, EmbeddingLayout

# `(variable, row gradients, apply) -> op`: see `EmbeddingBackend.apply_gradients`.
AggregateRows = Callable[[Any, Any, Callable[[Any], Any]], Any]


class EmbeddingBackend(abc.ABC):
  """One lookup path of a spec's embedding features (see the module's order)."""

  def __init__(self, spec: EmbeddingConfigSpec, layout: EmbeddingLayout):
    """`layout`: the features of `spec` on this path, and their tables."""
    del spec
    self.layout = layout

  def create_variables(self, training: bool) -> None:
    """Creates the variables the backend owns; the default owns none (the
    model_fn's columns create theirs)."""
    del training

  @abc.abstractmethod
  def model_features(self, features: dict, batch_size: int | None) -> dict:
    """`features` (a dict) as the model_fn sees them over the whole batch."""

  def lookup(self, features: dict, num_shards: int,
             batch_size: int | None) -> tuple[Any, list[dict]]:
    """`(step, [per-shard {feature name: activation}])`; the default looks up
    nothing (the model_fn's columns look up in its graph)."""
    del features, batch_size
    return None, [{} for _ in range(num_shards)]

  def shared_table_creators(self) -> tuple[Any, ...]:
    """The shared columns' creators whose tables the model_fn looks up in its
    graph: every shard must get the same table."""
    return ()

  def checkpoint_variables(self, graph: tf.Graph) -> dict[str, tf.Variable]:
    """Legacy checkpoint name -> variable of what the backend owns, once the
    model_fn has built `graph`."""
    del graph
    return {}

  def apply_gradients(self, step: Any, aggregate_rows: AggregateRows | None
                      = None) -> tf.Operation | None:
    """The op updating the backend's variables after the model's train_op, or
    None when the model's optimizer trains them.

    `aggregate_rows(variable, rows, apply)`: the synchronous replicas' way to
    combine a variable's row gradients before applying them, or None.
    """
    del step, aggregate_rows
    return None

  def training_hooks(self, step: Any) -> tuple[Any, ...]:
    """Session hooks of a training graph."""
    del step
    return ()

  def before_save(self) -> Callable[[], tf.Operation] | None:
    """A function building the op every checkpoint save runs first (the
    driver builds it outside any in-graph loop), or None."""
