"""Any OpenAI-compatible endpoint (ours, vLLM, a hosted provider): streamed completions or
chat completions, timed event by event (:mod:`tradeoff.bench.openai_stream`).

    adapter = OpenAIAdapter("http://127.0.0.1:8000/v1", "smollm2-135m",
                            synthetic_prompts(100, (128, 128), (64, 64)), ignore_eos=True)

The API key comes from an environment variable (``api_key_env``) and goes only into the
``Authorization`` header: never into the result, the records or the log.
"""

from __future__ import annotations

import os
from typing import Any

from tradeoff.bench.adapters import Adapter
from tradeoff.bench.openai_stream import generation_body, generation_request
from tradeoff.bench.prompts import PromptItem, fingerprint
from tradeoff.errors import BenchSetupError
from tradeoff.protocol.openai_answers import StreamReader

__all__ = ["OpenAIAdapter"]


class OpenAIAdapter(Adapter):
    """Streamed generations from ``{base_url}/completions`` or ``/chat/completions``."""

    protocol = "openai"
    streaming = True

    def __init__(self, url: str, model: str, items: list[PromptItem], *, chat: bool = False,
                 ignore_eos: bool = False, api_key_env: str = "OPENAI_API_KEY",
                 headers: dict[str, str] | None = None, temperature: float = 0.0,
                 dataset: str = "", slo: dict[str, float] | None = None,
                 timeout_s: float = 300.0) -> None:
        super().__init__(url, timeout_s)
        if not self.prefix:
            self.prefix = "/v1"  # a bare host: the usual base path
        if self.prefix.rstrip("/").endswith(("/completions", "/models")):
            raise BenchSetupError(f"{url}: give the API's base URL (e.g. http://HOST:8000/"
                                  "v1), not a route of it; --chat picks /chat/completions")
        if not items:
            raise BenchSetupError("no prompts to send")
        self.model = model
        self.items = items
        self.chat = chat
        self.ignore_eos = ignore_eos
        self.api_key_env = api_key_env
        self.temperature = temperature
        self.dataset = dataset
        self.slo = slo or {}
        key = os.environ.get(api_key_env, "")
        self.headers = {**(headers or {}), **({"Authorization": f"Bearer {key}"} if key else {})}
        self.asked_tokens = [item.max_tokens for item in items]
        self.model_entry: dict[str, Any] | None = None

    def reader(self) -> StreamReader:
        """A fresh reader for one answer (its timing; the text is not kept)."""
        return StreamReader(chat=self.chat, keep_text=False)

    def prepare(self) -> list[bytes]:
        """One request per prompt; with ``--mix`` classes, one copy of the prompts per
        class (mix.py lays them out class by class), each carrying its class's parameters
        in the body (``class``, which our router reads; ``priority``, which vLLM's
        scheduler does)."""
        self._check_model()
        self.input_fingerprint = fingerprint(self.items)
        classes: list[dict[str, Any] | None] = [c.parameters for c in self.mix.classes] \
            or [None]
        self.asked_tokens = [item.max_tokens for _ in classes for item in self.items]
        return [generation_request(
            self.host, self.prefix,
            generation_body(self.model, prompt=item.prompt,
                            messages=list(item.messages) if item.messages else None,
                            max_tokens=item.max_tokens, ignore_eos=self.ignore_eos,
                            temperature=self.temperature, extra=parameters),
            self.chat, self.headers) for parameters in classes for item in self.items]

    def _check_model(self) -> None:
        """``GET /models``: the model must be listed when the endpoint lists models."""
        try:
            listing = self._get_json("/models")
        except BenchSetupError as exc:
            if exc.status in (401, 403):
                where = f"${self.api_key_env}" if os.environ.get(self.api_key_env) else \
                    f"no key: ${self.api_key_env} is not set"
                raise BenchSetupError(f"{self.url}: the endpoint refused the API key "
                                      f"({where}); set it, or name another variable "
                                      "with --api-key-env") from None
            if exc.status in (404, 405):
                return  # no model listing here; the first request will tell
            raise
        models = listing.get("data") if isinstance(listing, dict) else None
        if not isinstance(models, list):
            return
        names = [m.get("id") for m in models if isinstance(m, dict)]
        if self.model not in names:
            raise BenchSetupError(f"{self.url}: no model {self.model!r}; the endpoint lists "
                                  f"{', '.join(map(str, names[:10])) or 'none'}")
        self.model_entry = next(m for m in models if m.get("id") == self.model)

    def server_metadata(self) -> dict[str, Any] | None:
        if self.model_entry is None:
            return None
        return {"name": self.model_entry.get("owned_by"), "model": self.model_entry}

    def describe(self) -> dict[str, Any]:
        inputs = [i.input_words for i in self.items if i.input_words is not None]
        return {"protocol": self.protocol, "url": self.url, "model": self.model,
                "api": "chat/completions" if self.chat else "completions",
                "ignore_eos": self.ignore_eos, "temperature": self.temperature,
                "api_key": f"${self.api_key_env}" if os.environ.get(self.api_key_env)
                else None,
                "headers": sorted(k for k in self.headers if k != "Authorization"),
                "slo": self.slo or None,
                "dataset": {"source": self.dataset, "prompts": len(self.items),
                            "asked_output_tokens": {"min": min(self.asked_tokens),
                                                    "max": max(self.asked_tokens)},
                            "asked_input_words": {"min": min(inputs), "max": max(inputs)}
                            if inputs else None},
                "server": self.server_metadata()}
