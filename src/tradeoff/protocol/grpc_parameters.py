"""The v2 gRPC protocol's parameters (``InferParameter``, ``ModelRepositoryParameter``):
one value of bool, int64, double or string each, to and from Python values.

    set_parameter(request.parameters["priority"], 1)
    parameter_value(request.parameters["priority"])     # 1
"""

from __future__ import annotations

from typing import Any

__all__ = ["parameter_value", "set_parameter"]


def set_parameter(slot: Any, value: Any) -> None:
    """Write ``value`` into a parameter message: bool, int64, double, else its string."""
    if isinstance(value, bool):
        slot.bool_param = value
    elif isinstance(value, int):
        slot.int64_param = value
    elif isinstance(value, float):
        slot.double_param = value
    else:
        slot.string_param = str(value)


def parameter_value(slot: Any) -> Any:
    """The value a parameter message holds (None when it holds none)."""
    kind = slot.WhichOneof("parameter_choice")
    return getattr(slot, kind) if kind else None
