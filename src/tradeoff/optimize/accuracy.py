"""How far an optimised version's outputs are from the original's, on the same inputs.

Each output is graded by what it holds, read from the original's values:

* **embedding** (rows of unit length): cosine similarity per sample, mean and worst;
  the drop is 1 - mean cosine.
* **classifier** (rows of probabilities summing to 1): top-1 agreement and the largest
  probability difference; the drop is 1 - agreement.
* **tensor** (anything else): largest absolute error, and that error relative to the
  largest original value, which is the drop.
"""

from __future__ import annotations

import numpy as np

from tradeoff.errors import InvalidValue
from tradeoff.results import OutputAccuracy

__all__ = ["compare_output", "cosine_rows", "output_kind", "top1_agreement"]

EMBEDDING, CLASSIFIER, TENSOR = "embedding", "classifier", "tensor"
_TOLERANCE = 1e-3


def output_kind(reference: np.ndarray) -> str:
    """What the original's output holds: embedding, classifier or tensor."""
    if reference.ndim != 2 or reference.shape[1] < 2 or reference.dtype.kind != "f":
        return TENSOR
    values = reference.astype(np.float64)
    if (values >= 0).all() and np.allclose(values.sum(axis=1), 1.0, atol=_TOLERANCE):
        return CLASSIFIER
    if np.allclose(np.linalg.norm(values, axis=1), 1.0, atol=_TOLERANCE):
        return EMBEDDING
    return TENSOR


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of each row of ``a`` with the same row of ``b``."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    norms = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    return np.einsum("ij,ij->i", a64, b64) / np.maximum(norms, 1e-30)


def top1_agreement(reference: np.ndarray, candidate: np.ndarray) -> float:
    """The share of rows whose largest entry is at the same place."""
    return float(np.mean(reference.argmax(axis=1) == candidate.argmax(axis=1)))


def compare_output(name: str, reference: np.ndarray, candidate: np.ndarray) -> OutputAccuracy:
    """Grade ``candidate`` against ``reference`` (same inputs, same shape)."""
    if reference.shape != candidate.shape:
        raise InvalidValue(f"output {name!r}: shape {list(candidate.shape)} differs from the "
                           f"original's {list(reference.shape)}")
    kind = output_kind(reference)
    samples = len(reference) if reference.ndim else 1
    ref, cand = reference.astype(np.float64), candidate.astype(np.float64)
    if kind == EMBEDDING:
        cosine = cosine_rows(ref, cand)
        metrics = {"cosine_mean": float(cosine.mean()), "cosine_min": float(cosine.min())}
        return OutputAccuracy(name, kind, samples, metrics, 1.0 - metrics["cosine_mean"])
    if kind == CLASSIFIER:
        agreement = top1_agreement(ref, cand)
        metrics = {"top1_agreement": agreement,
                   "max_probability_difference": float(np.abs(ref - cand).max())}
        return OutputAccuracy(name, kind, samples, metrics, 1.0 - agreement)
    error = float(np.abs(ref - cand).max()) if ref.size else 0.0
    scale = float(np.abs(ref).max()) if ref.size else 0.0
    relative = error / scale if scale > 0 else (0.0 if error == 0 else float("inf"))
    return OutputAccuracy(name, TENSOR, samples,
                          {"max_abs_error": error, "max_relative_error": relative}, relative)
