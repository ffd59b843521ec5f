"""Configuration search: the batch size in process, the serving config on a live server."""
