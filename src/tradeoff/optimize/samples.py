"""Inputs for validating and calibrating a model: from a file, or built in.

A sample file holds N samples of every input the model serves, each of the config's
``dims`` (a model that batches takes them in batches; one that does not, one at a time):

* ``.npz``: one array per input name, each ``[N, *dims]``;
* ``.npy``: one array ``[N, *dims]``, for a model with one input;
* ``.txt``: one text per line, for a model with one BYTES input (``minilm``'s ``text``).

Without a file, a model directory's own ``samples/validation.*`` or
``samples/calibration.*`` (``tradeoff models build`` writes them for the packaged models)
is used, else seeded random inputs shaped like the config's. Validation and calibration
draw different samples, so a static version is not graded on what it was fitted to.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from tradeoff import data, dtypes
from tradeoff.errors import OptimizeError
from tradeoff.repository.config import ModelConfig

__all__ = [
    "GENERATED_DIM",
    "SEEDS",
    "SUFFIXES",
    "Samples",
    "builtin_samples",
    "load_samples",
    "sample_count",
    "take",
]

SUFFIXES = (".npz", ".npy", ".txt")
VALIDATION, CALIBRATION = "validation", "calibration"
# variable dims of generated samples take this size
GENERATED_DIM = 8
SEEDS = {VALIDATION: 1, CALIBRATION: 2}

Samples = dict[str, np.ndarray]


def sample_count(samples: Samples) -> int:
    return len(next(iter(samples.values())))


def take(samples: Samples, start: int, stop: int) -> Samples:
    """Samples ``start:stop`` of every input."""
    return {name: array[start:stop] for name, array in samples.items()}


def load_samples(path: Path, config: ModelConfig, flag: str = "--validation") -> Samples:
    """The samples of ``path`` as arrays the model's inputs take; OptimizeError (one line
    naming ``flag`` and the file) when the file is missing or does not fit the model."""
    where = f"{flag} {path}"
    if not path.is_file():
        raise OptimizeError(f"{where}: no such file")
    if path.suffix not in SUFFIXES:
        raise OptimizeError(f"{where}: expected a {', '.join(SUFFIXES)} file")
    names = [t.name for t in config.inputs]
    try:
        if path.suffix == ".txt":
            byte_inputs = [t.name for t in config.inputs if t.datatype == "BYTES"]
            if len(config.inputs) != 1 or not byte_inputs:
                raise OptimizeError(f"{where}: a text file fits a model with one BYTES input; "
                                    f"this one takes {names}")
            lines = [line.encode() for line in path.read_text().splitlines() if line.strip()]
            raw = {names[0]: np.array(lines, dtype=object).reshape(-1, 1)}
        elif path.suffix == ".npy":
            if len(names) != 1:
                raise OptimizeError(f"{where}: an .npy file holds one input; this model "
                                    f"takes {names}: use an .npz with one array per input")
            raw = {names[0]: np.load(path, allow_pickle=False)}
        else:
            with np.load(path, allow_pickle=False) as archive:
                raw = {key: archive[key] for key in archive.files}
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise OptimizeError(f"{where}: not readable: {exc}") from None
    return _checked(raw, config, where)


def _checked(raw: Samples, config: ModelConfig, where: str) -> Samples:
    missing = [t.name for t in config.inputs if t.name not in raw]
    extra = sorted(set(raw) - {t.name for t in config.inputs})
    if missing or extra:
        raise OptimizeError(f"{where}: holds {sorted(raw)} but the model's inputs are "
                            f"{[t.name for t in config.inputs]}")
    out: Samples = {}
    for tensor in config.inputs:
        array = raw[tensor.name]
        dims = tuple(tensor.dims)
        if array.ndim != len(dims) + 1 or any(d not in (-1, a)
                                              for d, a in zip(dims, array.shape[1:],
                                                              strict=True)):
            raise OptimizeError(f"{where}: input {tensor.name!r} is {list(array.shape)}; "
                                f"expected [N, {', '.join(map(str, dims))}] (-1: any size)")
        if len(array) == 0:
            raise OptimizeError(f"{where}: input {tensor.name!r} holds no samples")
        out[tensor.name] = _as_datatype(array, tensor.datatype, tensor.name, where)
    counts = {name: len(a) for name, a in out.items()}
    if len(set(counts.values())) > 1:
        raise OptimizeError(f"{where}: inputs hold different numbers of samples {counts}")
    return out


def _as_datatype(array: np.ndarray, datatype: str, name: str, where: str) -> np.ndarray:
    if datatype == "BYTES":
        if array.dtype.kind not in "SUO":
            raise OptimizeError(f"{where}: input {name!r} is BYTES but the file holds "
                                f"{array.dtype}")
        return np.array([v if isinstance(v, bytes) else str(v).encode()
                         for v in array.reshape(-1)], dtype=object).reshape(array.shape)
    target = dtypes.numpy_dtype(datatype)
    if not np.can_cast(array.dtype, target, casting="same_kind"):
        raise OptimizeError(f"{where}: input {name!r} is {datatype} but the file holds "
                            f"{array.dtype}")
    return array.astype(target, copy=False)


def builtin_samples(model_dir: Path, config: ModelConfig, purpose: str,
                    count: int = 64) -> tuple[Samples, str]:
    """Samples for ``purpose`` (validation or calibration) when no file is given, and
    where they came from."""
    for suffix in SUFFIXES:
        path = model_dir / "samples" / f"{purpose}{suffix}"
        if path.is_file():
            return load_samples(path, config, flag=f"built-in {purpose} samples"), str(path)
    rng = np.random.default_rng(SEEDS[purpose])
    out: Samples = {}
    for tensor in config.inputs:
        shape = (count, *(GENERATED_DIM if d == -1 else d for d in tensor.dims))
        if tensor.datatype == "BYTES":
            sentences = data.sentences()
            picked = rng.choice(len(sentences), size=int(np.prod(shape)))
            values = [sentences[i].encode() for i in picked]
            out[tensor.name] = np.array(values, dtype=object).reshape(shape)
            continue
        dtype = dtypes.numpy_dtype(tensor.datatype)
        if dtype.kind == "f":
            out[tensor.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            out[tensor.name] = rng.integers(0, 2, size=shape).astype(dtype)
        else:
            out[tensor.name] = rng.integers(0, min(100, np.iinfo(dtype).max),
                                            size=shape).astype(dtype)
    return out, f"generated (seed {SEEDS[purpose]})"
