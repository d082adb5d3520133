"""TF 2.15's heads (`tf.estimator.BinaryClassHead`, ...) for TF versions without them.

Modules named after tensorflow_estimator's `head/`: `base_head` (the `Head`
interface, the logic the heads share, the metric and prediction keys),
`binary_class_head`, `multi_class_head`, `multi_label_head`, `regression_head`
(with `PoissonRegressionHead`, `LogisticRegressionHead`) and `multi_head`.
`tpu_fc.install()` binds them into `tf.estimator` where TF has no heads of its
own (TF >= 2.16); imported only then.
"""
