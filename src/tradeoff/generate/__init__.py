"""Generative models: generate.yaml, the iteration-level scheduler over a paged KV cache,
sampling, the engine, and the thread that bridges it to the event loop."""
