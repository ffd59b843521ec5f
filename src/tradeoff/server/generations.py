"""The data plane's generations, from a request to a :class:`Generation`: the model
that answers (a router's choice, or the one named), the prompt checked against the
model's positions and tokenized (the chat template for messages) off the loop, then
queued on the model's engine or replayed from the response cache; a whole answer kept in
the cache and shadowed (its router's copy) when it ends.

    generations = Generations(manager, cache, in_background)  # the DataPlane owns one
    generation = await generations.start(name, prompt, params, priority)
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

from tradeoff.errors import InferenceFailed, InvalidInput, RequestError
from tradeoff.generate.engine_client import EngineClient, Handle
from tradeoff.generate.events import Done, Token
from tradeoff.generate.text_stream import full_text
from tradeoff.repository.router import Target
from tradeoff.scheduling.priority import DEFAULT_GENERATION_PRIORITY, GenerationPriority
from tradeoff.server.cache import ResponseCache
from tradeoff.server.gateway import GenerationCopy
from tradeoff.server.generation import Generation
from tradeoff.server.models import ModelManager
from tradeoff.server.openai_requests import Message
from tradeoff.server.router import RoutedModel, check_direct

__all__ = ["Generations", "Prompt"]

Prompt = str | list[Message]  # a prompt to continue, or a conversation to answer


class Generations:
    """Starts the generations of every generative model (and router of them) the
    ``manager`` serves; ``in_background`` holds a shadow copy's task until it ends."""

    def __init__(self, manager: ModelManager, cache: ResponseCache | None,
                 in_background: Callable[[asyncio.Task[None] | None], None]) -> None:
        self.manager = manager
        self.cache = cache  # None: no --cache
        self.in_background = in_background

    def models(self) -> list[EngineClient]:
        """The generative models that serve now and take calls by their own name (none
        a router hides)."""
        return [m for m in self.manager.generative_versions()
                if self.manager.models[m.name].latest is m and m.name not in
                self.manager.hidden]

    async def route(self, routed: RoutedModel, parameters: dict[str, Any]
                    ) -> tuple[str, GenerationPriority | None]:
        """The generative model a router sends this request to (RoutedModel.send: its
        rules' choice, or the first fallback that accepts requests now), and the priority
        its route sets (None: the request's own)."""
        if not routed.generative:
            raise InvalidInput(f"router {routed.name!r} sends to tensor models: POST "
                               f"/v2/models/{routed.name}/infer")

        async def attempt(target: Target) -> str:
            self.manager.generative(target.model).check_accepting()
            return target.model

        decision = routed.decide(parameters)
        name, _ = await routed.send(parameters, attempt, timed=False, decision=decision)
        priority = routed.config.routes[decision.route].priority  # router.yaml's, checked
        return name, None if priority is None else GenerationPriority(priority)

    async def start(self, name: str, prompt: Prompt, params: Any,
                    priority: GenerationPriority = DEFAULT_GENERATION_PRIORITY,
                    cache: bool = False, route_parameters: dict[str, Any] | None = None,
                    tenant: bytes = b"", *, via: RoutedModel | None = None,
                    copy: GenerationCopy | None = None) -> Generation:
        """Tokenize a prompt (or apply the chat template to messages), check it fits the
        model, and queue it; returns the :class:`Generation` whose outputs the transport
        formats. With ``cache`` (a whole, deterministic answer is wanted) and the
        model's ``response_cache``, a cached answer replays instead. A
        router of generative models sends it on by ``route_parameters`` (class, user).
        ``tenant`` is the API key that asked (its cache entries are its own). ``via``:
        the router that chose model ``name`` already (a router with pools: the OpenAI
        API routes), with ``copy``, the request as its pools would be sent it (a shadow
        copy to a pool)."""
        routed = via or self.manager.get(name)
        shadow = None
        route = ""
        if via is not None:
            route = name
        elif isinstance(routed, RoutedModel):  # an alias: the answer names its target
            name, route_priority = await self.route(routed, route_parameters or {})
            route = name
            if route_priority is not None:
                priority = route_priority
        else:
            check_direct(self.manager.hidden, name)
        model = self.manager.generative(name)
        for _ in range(3):  # a reload may replace the version while the prompt is tokenized
            tokens = await _prompt_tokens(model, prompt, params)
            current = self.manager.generative(name)
            if current is model:
                break
            model = current
        if isinstance(routed, RoutedModel) and routed.config.shadow is not None:
            shadow = _Shadowed(routed, model, copy)
        if not (cache and self.cache is not None and model.config.response_cache):
            handle = model.submit(tokens, params, priority)
            handle.shadow, handle.route = shadow, route
            return Generation(model, handle, len(tokens), self._ended)
        model.check_accepting()  # a stopping model answers 503, cached or not
        started = time.perf_counter_ns()
        key = self.cache.generation_key(tenant, model.name, model.version, tokens, params)
        found = await self.cache.lookup_generation(key, model.info.vocab, params.max_tokens)
        lookup_ns = time.perf_counter_ns() - started
        if found is not None:
            model.count_cache(True, lookup_ns)
            handle = Handle.replay(tokens, params, *found, model.tokenizer.decode)
        else:
            model.count_cache(False, lookup_ns)
            handle = model.submit(tokens, params, priority)
            handle.cache_key, handle.cache = key, "miss"
        handle.cache_ns = lookup_ns
        handle.shadow, handle.route = shadow, route
        return Generation(model, handle, len(tokens), self._ended)

    def _ended(self, handle: Handle, tokens: list[int], reason: str) -> None:
        """A whole answer ended: keep it when it was asked to be cached and ended
        normally (never an error or an abort), and send a shadow copy of a deterministic
        one if its router takes one."""
        if handle.cache_key is not None and self.cache is not None and \
                reason in ("stop", "length"):
            self.cache.keep_generation(handle.cache_key, tokens, reason)
        # a sampled answer differs from any other by design: only deterministic ones,
        # streamed or whole, are compared
        if handle.shadow is not None and reason in ("stop", "length") and \
                handle.params.deterministic:
            self._shadow(handle.shadow, handle, tokens)

    def _shadow(self, shadowed: _Shadowed, handle: Handle, tokens: list[int]) -> None:
        """A shadow copy of a whole generation, if the router takes one: the same prompt
        tokens on a shadow model here, and how many of the answer's tokens it chose
        alike; or the same request to a shadow pool, and how its text compares with the
        answer's."""
        routed = shadowed.router

        async def copy(shadow: Target) -> None:
            pool = routed.pools.get(shadow.model)
            if pool is not None:
                if shadowed.copy is None:
                    raise InferenceFailed("no request to send a pool")
                theirs = await shadowed.copy.text(pool, handle.params.max_tokens)
                ours, _ = await asyncio.to_thread(
                    full_text, shadowed.model.tokenizer.decode, tokens, handle.params.stop)
                routed.stats.shadow.compare_text(ours, theirs)
                return
            model = self.manager.generative(shadow.model)
            shadow_tokens = await _answer_tokens(model, handle.prompt, handle.params,
                                                 handle.priority)
            routed.stats.shadow.compare_tokens(tokens, shadow_tokens)

        self.in_background(routed.shadow(partial(self.shadow_busy, routed), copy))

    def shadow_busy(self, routed: RoutedModel, target: Target) -> bool:
        """Whether a shadow target of ``routed`` is too busy for a copy: a pool with no
        replica idle, a model here with requests waiting (a RequestError: it serves
        none)."""
        pool = routed.pools.get(target.model)
        if pool is not None:
            return not pool.has_idle_replica()
        model = self.manager.generative(target.model)
        model.check_accepting()
        return model.waiting > 0

    async def answer_text(self, routed: RoutedModel, target: Target, prompt: Prompt,
                          params: Any, priority: GenerationPriority,
                          copy: GenerationCopy | None) -> str:
        """The text a shadow target of ``routed`` answers this request with, whole: a
        pool's replica (``copy``, the request as pools are sent it), or a model here."""
        pool = routed.pools.get(target.model)
        if pool is not None:
            if copy is None:
                raise InferenceFailed("no request to send a pool")
            return await copy.text(pool)
        model = self.manager.generative(target.model)
        tokens = await _prompt_tokens(model, prompt, params)
        answer = await _answer_tokens(model, tokens, params, priority)
        text, _ = await asyncio.to_thread(full_text, model.tokenizer.decode, answer,
                                          params.stop)
        return text


@dataclass(frozen=True)
class _Shadowed:
    """What a routed generation's shadow copy needs: its router, the model that
    answered (its tokenizer gives the answer's text), and the request as a pool is sent
    it (None: not an OpenAI request)."""

    router: RoutedModel
    model: EngineClient
    copy: GenerationCopy | None


async def _prompt_tokens(model: EngineClient, prompt: Prompt, params: Any) -> list[int]:
    """The prompt's tokens for ``model``, checked to fit with ``params.max_tokens``: the
    cheap refusals first, then the tokenizer's work off the loop."""
    model.check_accepting()
    _check_prompt_size(model, prompt, params.max_tokens)
    tokens = await asyncio.to_thread(_tokenize, model.tokenizer, prompt)
    if not tokens:
        raise InvalidInput("the prompt is empty")
    limit = model.info.max_position
    if len(tokens) + params.max_tokens > limit:
        raise InvalidInput(f"prompt ({len(tokens)} tokens) + max_tokens "
                           f"({params.max_tokens}) is over the model's {limit} positions")
    return tokens


async def _answer_tokens(model: EngineClient, prompt: list[int], params: Any,
                         priority: GenerationPriority) -> list[int]:
    """A whole generation's tokens (a shadow copy's); InferenceFailed when it fails."""
    events = model.submit(prompt, params, priority).events
    tokens: list[int] = []
    while isinstance(event := await events.get(), Token):
        tokens.append(event.token)
    if not isinstance(event, Done):
        raise InferenceFailed(f"the shadow generation failed: {event}")
    return tokens


def _check_prompt_size(model: EngineClient, prompt: Prompt,
                       max_tokens: int) -> None:
    """Refuse, before any tokenizing, a prompt that cannot fit the model's positions: one
    with more characters than the free positions times the longest token of the
    vocabulary, or a chat with more messages than positions."""
    free = model.info.max_position - max_tokens
    if free < 1:
        raise InvalidInput(f"max_tokens ({max_tokens}) leaves no room for a prompt in the "
                           f"model's {model.info.max_position} positions")
    if isinstance(prompt, str):
        characters = len(prompt)
    else:
        if len(prompt) > free:
            raise InvalidInput(f"{len(prompt)} messages cannot fit the model's "
                               f"{free} free positions (max_tokens is {max_tokens})")
        characters = sum(len(m["content"]) + len(m["role"]) for m in prompt)
    most = free * model.tokenizer.longest_token_chars
    if characters > most:
        raise InvalidInput(f"the prompt ({characters} characters) cannot fit the model's "
                           f"{free} free positions (max_tokens is {max_tokens}; a token "
                           f"holds at most {model.tokenizer.longest_token_chars} characters)")


def _tokenize(tokenizer: Any, prompt: Prompt) -> list[int]:
    """Token ids of a prompt, or of messages through the chat template (CPU work: called
    in a worker thread)."""
    if isinstance(prompt, str):
        return list(tokenizer.encode(prompt))
    try:
        text = tokenizer.chat(prompt)
    except RequestError:
        raise
    except Exception as exc:  # the template's own checks (raise_exception, undefined)
        raise InvalidInput(f"the chat template refused these messages: {exc}") from None
    return list(tokenizer.encode(text))
