"""The bodies of ``POST /v1/completions`` and ``POST /v1/chat/completions`` as types: one
msgspec Struct per body checks a request, decoded straight from its bytes, and documents
it (``/openapi.json`` shows the schemas made from the same types).

    request = decode(CompletionRequest, body)  # InvalidInput: the field, and why
    params = request.sampling_params()

JSON ``null`` is the same as leaving a field out (``cache`` excepted: true or false);
fields the types do not name are ignored; the OpenAI options this server does not
implement are refused when set, not ignored.
"""

from __future__ import annotations

import functools
import re
from typing import Annotated, Any, Literal, TypedDict, TypeVar

import msgspec
from msgspec import Meta

from tradeoff.errors import InvalidInput
from tradeoff.generate.sampling_limits import (
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_TEMPERATURE,
    SEED_MAX,
    SEED_MIN,
)
from tradeoff.generate.sampling_params import SamplingParams
from tradeoff.scheduling.priority import (
    GENERATION_PRIORITY_MAX,
    GENERATION_PRIORITY_MIN,
    GenerationPriority,
)

__all__ = ["REFUSED_FIELDS", "Body", "ChatRequest", "CompletionRequest", "GenerationRequest",
           "Message", "StreamOptions", "decode", "schemas"]

# OpenAI's options this server does not implement: refused when set (a true value)
REFUSED_FIELDS = ("logprobs", "top_logprobs", "echo", "logit_bias", "suffix")

_REFUSED = Meta(description="not supported by this server: refused when set")
_ONLY_ONE = Meta(description="only 1 is supported")
_STOP_STRING = Annotated[str, Meta(min_length=1, max_length=MAX_STOP_CHARS)]


class StreamOptions(msgspec.Struct):
    """What a streamed answer carries besides its text."""

    include_usage: Annotated[bool | None, Meta(
        description="a last chunk carrying the usage, before [DONE]")] = None


class Message(TypedDict):
    """One turn of a conversation, put through the model's chat template."""

    role: str
    content: str


class GenerationRequest(msgspec.Struct, kw_only=True):
    """What both bodies share: the model, how to sample, how to answer."""

    model: Annotated[str, Meta(description="the model (GET /v1/models lists them)")]
    max_tokens: Annotated[Annotated[int, Meta(ge=1)] | None, Meta(
        description="the most tokens the answer may have")] = None
    max_completion_tokens: Annotated[Annotated[int, Meta(ge=1)] | None, Meta(
        description="OpenAI's newer name of max_tokens")] = None
    temperature: Annotated[Annotated[float, Meta(ge=0, le=MAX_TEMPERATURE)] | None, Meta(
        description=f"from 0 to {MAX_TEMPERATURE:g}; below 1e-5 the answer is greedy"
    )] = None
    top_p: Annotated[Annotated[float, Meta(gt=0, le=1)] | None, Meta(
        description="above 0 and at most 1: the share of the distribution kept")] = None
    top_k: Annotated[Annotated[int, Meta(ge=0)] | None, Meta(
        description="the most likely tokens kept; 0: all of them")] = None
    # msgspec bounds only 64-bit signed integers: SamplingParams checks this range
    seed: Annotated[Annotated[int, Meta(extra_json_schema={
        "minimum": SEED_MIN, "maximum": SEED_MAX})] | None, Meta(
        description="an integer from -2**63 to 2**64 - 1: the same seed, the same "
                    "answer")] = None
    stop: Annotated[
        Annotated[str, Meta(max_length=MAX_STOP_CHARS)]
        | Annotated[list[_STOP_STRING], Meta(max_length=MAX_STOP_STRINGS)] | None,
        Meta(description=f"a string, or a list of at most {MAX_STOP_STRINGS} strings, each "
                         f"of 1 to {MAX_STOP_CHARS} characters: the answer ends before "
                         "the first found")] = None
    stream: Annotated[bool | None, Meta(description="the answer as server-sent events")] \
        = None
    stream_options: StreamOptions | None = None
    ignore_eos: Annotated[bool | None, Meta(
        description="generate max_tokens tokens, past the end of sequence")] = None
    cache: Annotated[bool, Meta(description="false: skip the response cache")] = True
    user: Annotated[str | None, Meta(description="the end user (a router's sticky key)")] \
        = None
    request_class: Annotated[str | None, Meta(description="a router's request class")] = \
        msgspec.field(default=None, name="class")
    priority: Annotated[
        Annotated[GenerationPriority, Meta(ge=GENERATION_PRIORITY_MIN,
                                           le=GENERATION_PRIORITY_MAX)] | None,
        Meta(description="from -2**31 to 2**31 - 1, lower first (as vLLM's) under "
                         "scheduling: priority; held to the key's allowance (serve "
                         "--priority-floor, 0 by default); a router's route may set it")
    ] = None
    n: Annotated[Literal[1] | None, _ONLY_ONE] = None
    best_of: Annotated[Literal[1] | None, _ONLY_ONE] = None
    logprobs: Annotated[Any, _REFUSED] = None
    top_logprobs: Annotated[Any, _REFUSED] = None
    echo: Annotated[Any, _REFUSED] = None
    logit_bias: Annotated[Any, _REFUSED] = None
    suffix: Annotated[Any, _REFUSED] = None

    def __post_init__(self) -> None:
        for name in REFUSED_FIELDS:
            if getattr(self, name):
                raise ValueError(f"'{name}' is not supported by this server")

    @property
    def include_usage(self) -> bool:
        """Whether a streamed answer ends with a chunk carrying the usage."""
        return bool(self.stream_options and self.stream_options.include_usage)

    def sampling_params(self) -> SamplingParams:
        """The engine's sampling settings (a field left out: SamplingParams' default)."""
        stop = () if not self.stop else (self.stop,) if isinstance(self.stop, str) else \
            tuple(self.stop)
        max_tokens = self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens
        given: dict[str, Any] = {name: value for name, value in (
            ("max_tokens", max_tokens), ("temperature", self.temperature),
            ("top_p", self.top_p), ("top_k", self.top_k)) if value is not None}
        return SamplingParams(seed=self.seed, stop=stop, ignore_eos=bool(self.ignore_eos),
                              **given)


class CompletionRequest(GenerationRequest, kw_only=True):
    """POST /v1/completions: a prompt to continue."""

    prompt: Annotated[str | Annotated[list[str], Meta(min_length=1, max_length=1)], Meta(
        description="the prompt: a string, or a list holding one string")]

    @property
    def text(self) -> str:
        """The prompt as one string."""
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    @property
    def prompt_bytes(self) -> bytes:
        """What a gateway matches prefixes on: the prompt's UTF-8."""
        return self.text.encode()


class ChatRequest(GenerationRequest, kw_only=True):
    """POST /v1/chat/completions: a conversation for the assistant to answer."""

    messages: Annotated[list[Message], Meta(
        min_length=1, description="the conversation, oldest turn first")]

    @property
    def prompt_bytes(self) -> bytes:
        """What a gateway matches prefixes on: each turn's role and content, in order."""
        return b"\0".join(f"{m['role']}\0{m['content']}".encode() for m in self.messages)


Body = TypeVar("Body", CompletionRequest, ChatRequest)
_DECODERS: dict[type, msgspec.json.Decoder[Any]] = {
    body: msgspec.json.Decoder(body) for body in (CompletionRequest, ChatRequest)}
_FIELD = re.compile(r" - at `\$\.(\w+)")


def decode(body_type: type[Body], body: bytes) -> Body:
    """The request in a JSON ``body`` (``{}`` when blank), or InvalidInput saying which
    field is wrong and why (CPU work: a large body's is run off the loop)."""
    try:
        request: Body = _DECODERS[body_type].decode(body if body.strip() else b"{}")
    except msgspec.ValidationError as exc:
        raise InvalidInput(_explained(body_type, str(exc))) from None
    except (msgspec.DecodeError, RecursionError) as exc:
        raise InvalidInput(f"request body is not valid JSON: {exc}") from None
    return request


def _explained(body_type: type, message: str) -> str:
    """msgspec's message, with what the field it names takes."""
    found = _FIELD.search(message)
    description = found and _descriptions(body_type).get(found[1])
    return f"{message} ('{found[1]}': {description})" if found and description else message


@functools.cache
def _descriptions(body_type: type) -> dict[str, str]:
    properties = schemas()[body_type.__name__]["properties"]
    return {name: field["description"] for name, field in properties.items()
            if "description" in field}


def schemas() -> dict[str, Any]:
    """The bodies' JSON schemas by name (and those they refer to), as OpenAPI's
    ``components.schemas``; a fresh dict each call."""
    _, components = msgspec.json.schema_components(
        (CompletionRequest, ChatRequest), ref_template="#/components/schemas/{name}")
    return components
