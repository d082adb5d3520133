"""Lookup backends, one module per `embedding_lookup_device`."""
