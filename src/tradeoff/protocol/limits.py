"""What one inference request may hold, whatever protocol carries it (a flag of
``tradeoff serve`` each)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_LIMITS", "RequestLimits"]


@dataclass(frozen=True)
class RequestLimits:
    """What one request may hold; past a limit it is refused with 400 before any large
    allocation. The body size limit is the transport's (``--max-request-bytes``)."""

    max_inputs: int = 64
    max_elements: int = 1 << 26          # per tensor (shape product)
    max_json_depth: int = 32             # nesting of a tensor's JSON 'data' lists
    max_bytes_element: int = 16 << 20    # one BYTES element

    def to_dict(self) -> dict[str, int]:
        return {"max_inputs": self.max_inputs, "max_elements": self.max_elements,
                "max_json_depth": self.max_json_depth,
                "max_bytes_element": self.max_bytes_element}


DEFAULT_LIMITS = RequestLimits()
