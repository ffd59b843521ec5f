"""Queues, the dynamic batcher and the instance pool that run requests on backends."""
