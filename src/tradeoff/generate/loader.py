"""Load a generative model directory: its ``generate.yaml``, the decoder and tokenizer
from the backend registry, and an engine with the file's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tradeoff.backends.decoding import Decoder, Tokenizer
from tradeoff.backends.registry import BackendRegistry, default_registry
from tradeoff.generate.config import GenerativeConfig

__all__ = ["load_generative", "new_engine"]


def load_generative(directory: Path, backends: BackendRegistry | None = None
                    ) -> tuple[GenerativeConfig, Decoder, Tokenizer]:
    """Config, decoder and tokenizer of a generative model directory."""
    registry = backends or default_registry()
    config = GenerativeConfig.of_model(directory, registry.generative_formats())
    backend = registry.generative(config.format)
    path = Path(config.path) if Path(config.path).is_absolute() else directory / config.path
    decoder, tokenizer = backend.load(path, config.format, config.device, config.precision)
    return config, decoder, tokenizer


def new_engine(config: GenerativeConfig, decoder: Decoder) -> Any:
    """A :class:`GenerationEngine` with the settings of ``config``."""
    from tradeoff.generate.engine import GenerationEngine  # needs torch

    return GenerationEngine(
        decoder, num_blocks=config.num_blocks, block_size=config.block_size,
        max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
        max_num_queued=config.max_num_queued_requests, policy=config.scheduling,
        priority_aging_steps=config.priority_aging_steps, mode=config.batching,
        prefix_caching=config.prefix_caching,
        cuda_graphs=None if config.cuda_graphs else False,
        prefill_stretch=config.prefill_stretch, threads=config.threads)
