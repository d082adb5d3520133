"""The TPU layer of the Estimator: `TPUEstimator`, its config and spec, and the
emulation of a TPU without one (shard replication, in-graph loops)."""
