"""Text <-> tokens for generative models: a Hugging Face ``tokenizer.json`` (through the
``tokenizers`` library) plus ``tokenizer_config.json`` (special tokens, chat template).

    tokenizer = Tokenizer.from_directory(Path("models/tinyllama/1"))
    ids = tokenizer.encode("Hello")
    prompt = tokenizer.chat([{"role": "user", "content": "Hi"}])
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tradeoff.errors import InvalidInput, ModelLoadError

__all__ = ["Tokenizer"]


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


class Tokenizer:
    """Encode, decode and apply the chat template of one model."""

    def __init__(self, backend: Any, config: dict[str, Any]) -> None:
        self.backend = backend
        self.config = config
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        self.add_bos = bool(config.get("add_bos_token", False))
        # a text of n characters takes at least n / longest_token_chars tokens
        self.longest_token_chars = max(
            map(len, backend.get_vocab(with_added_tokens=True)), default=1) or 1
        template = config.get("chat_template")
        self._template = None
        if isinstance(template, str):
            import jinja2.sandbox

            environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True)
            self._template = environment.from_string(template)

    def __reduce__(self) -> tuple[Any, tuple[Any, dict[str, Any]]]:
        """Pickled as what it is made from (the chat template is compiled again): an
        engine process hands its tokenizer to the front end this way."""
        return type(self), (self.backend, self.config)

    @classmethod
    def from_directory(cls, directory: Path) -> Tokenizer:
        from tokenizers import Tokenizer as HfTokenizer

        path = directory / "tokenizer.json"
        try:
            backend = HfTokenizer.from_file(str(path))
        except Exception as exc:  # the library raises its own exception type
            raise ModelLoadError(f"{path}: not a readable tokenizer: {exc}") from None
        config_path = directory / "tokenizer_config.json"
        try:
            config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        except (OSError, ValueError, RecursionError) as exc:  # RecursionError: deep nesting
            raise ModelLoadError(f"{config_path}: not a readable tokenizer config: "
                                 f"{type(exc).__name__}: {exc}") from None
        if not isinstance(config, dict):
            raise ModelLoadError(f"{config_path}: must be a JSON object")
        return cls(backend, config)

    def token_id(self, text: str | None) -> int | None:
        return None if text is None else self.backend.token_to_id(text)

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def encode(self, text: str) -> list[int]:
        ids: list[int] = self.backend.encode(text, add_special_tokens=False).ids
        bos = self.token_id(self.bos_token)
        if self.add_bos and bos is not None and (not ids or ids[0] != bos):
            ids = [bos, *ids]
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        text: str = self.backend.decode(list(ids), skip_special_tokens=True)
        return text

    def chat(self, messages: list[dict[str, Any]]) -> str:
        """The prompt text of a conversation, ready for the assistant's turn."""
        if self._template is None:
            raise InvalidInput("this model has no chat template; use /v1/completions")
        rendered: str = self._template.render(messages=messages, add_generation_prompt=True,
                                              bos_token=self.bos_token or "",
                                              eos_token=self.eos_token or "")
        return rendered
