"""The lookup paths behind one seam (`base`), picked in `backends`: `inputs` enqueues the features, `host_engine` emulates the TPU embedding core."""
