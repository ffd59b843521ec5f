"""The response cache: answers of deterministic requests kept in memory or in Redis.

A model opts in with ``response_cache { enable: true }`` (``response_cache: true`` in a
generative model's ``generate.yaml``), the server with ``--cache``; a request opts out
with the parameter ``"cache": false``.

Keys are built so a wrong answer cannot be served: the model name and resolved version,
every input's name, datatype, shape and bytes, the outputs asked for (and whether each
is binary), every request parameter that may change the answer and, unless the operator
shares entries across tenants, the API key that asked. All of it is hashed with BLAKE2b
keyed by the server's secret, so nobody without the secret can compute where an answer
lives. A value in Redis carries a MAC (keyed BLAKE2b over a second digest of the key
material and the value): a value a foreign writer planted or moved fails it and is a
miss, never an answer. In the process's own LRU, which nothing else writes, the second
digest alone is stored and compared (a key collision is a miss). A decoded value is
checked against the model (token ids in the vocabulary, tensors as the config declares)
before it is used.

    cache = ResponseCache.from_spec(CacheSpec.parse("local,size=256MB"))
    key = cache.tensor_key(tenant, "mlp", 1, inputs, wanted, parameters)
    outputs = await cache.lookup(key, expected)     # None: a miss
    cache.keep(key, outputs)        # after a successful inference only (key.tenant pays)

One idea per module, each importing only those above it:

    spec.py     what --cache asks for (local or Redis, sizes, scope, secret), parsed
    keys.py     request keys and the MAC of stored values, under the server's secret
    values.py   the stored form of an answer, and the checks a decoded one must pass
    stores.py   the local LRU and Redis, each with per-tenant bounds
    front.py    ResponseCache: lookups, insertions, counts, single-flight of misses
"""

from __future__ import annotations

from tradeoff.server.cache.front import ResponseCache
from tradeoff.server.cache.spec import CacheSpec

__all__ = [
    "CacheSpec",
    "ResponseCache",
]
