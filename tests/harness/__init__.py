"""The test harness: the one place that builds models, specs, inputs and
estimators, with the reference oracle they are checked against.

* `inputs`: input_fns and the features of each input kind;
* `models`: model_fns and what they are built of (columns, losses, train ops),
  the contract model's lookup paths (`PATHS`);
* `mid_level`: the contract model migrated to `tpu_fc.mid_level` and its TF2
  training loop (the contract's mid_level path);
* `estimators`: estimators, specs and the optimizers they train with;
* `oracle`: `tpu_fc.reference` stepped with its float32 error bound
  (`ReferenceSteps`), the wrong rules that bound must reject, and the expected
  tables of the harness's models;
* `covering`: pairwise covering designs, the case lists of the matrices
  (every pair of any two factors' levels, not every combination);
* `checkpoints`: a legacy checkpoint's model (spec, model_fn, input_fn,
  training) and a checkpoint's values by name;
* `lanes`: which TensorFlow lane runs, and TF 2.15's own classes on the legacy
  lane (tests running them carry the `legacy_only` marker);
* `scripts`: running a Python process (tests doing so carry the `subprocess`
  marker).

Test modules import from here, never from each other (tests/test_layout.py).
"""
