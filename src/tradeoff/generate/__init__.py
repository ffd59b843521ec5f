"""Generative models: generate.yaml, the iteration-level scheduler over a paged KV cache,
sampling, the engine, its core (the thread that steps it) and the client the event loop
talks to it through, by message."""
