"""Building ONNX graphs by hand: the project's opset and IR version, and a node builder."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

__all__ = ["IR_VERSION", "OPSET", "GraphBuilder", "make_model"]

OPSET = 17
IR_VERSION = 8  # readable by every onnxruntime release tradeoff supports


def make_model(graph: onnx.GraphProto, producer: str = "tradeoff") -> onnx.ModelProto:
    """A checked ONNX model of ``graph`` at the project's opset and IR version."""
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name=producer)
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model)
    return model


class GraphBuilder:
    """Nodes and initializers of a graph under construction, with fresh value names.

        g = GraphBuilder()
        y = g.op("Add", g.op("MatMul", "x", g.const("w", weight)), g.const("b", bias))
    """

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self._count = 0

    def const(self, name: str, value: np.ndarray) -> str:
        self.initializers.append(numpy_helper.from_array(value, name))
        return name

    def op(self, op_type: str, *inputs: str, **attributes: Any) -> str:
        """Add one node; returns the name of its (single) output."""
        self._count += 1
        out = f"{op_type.lower()}_{self._count}"
        self.nodes.append(helper.make_node(op_type, list(inputs), [out], **attributes))
        return out
