"""The HTTP server: ASGI app, data plane, statistics and Prometheus metrics."""
