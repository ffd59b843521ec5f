"""ONNX Runtime backend: dtypes that need care (BF16, strings), options, describe()."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tradeoff.backends.onnxruntime import OnnxRuntimeBackend, describe, session_options
from tradeoff.backends.registry import InstanceSpec
from tradeoff.errors import ConfigError, ModelLoadError
from tradeoff.protocol.v2 import bf16_to_float32


def identity(path: Path, elem_type: int, shape: list) -> Path:
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "identity",
        [helper.make_tensor_value_info("x", elem_type, shape)],
        [helper.make_tensor_value_info("y", elem_type, shape)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_bf16_round_trips_as_bit_patterns(tmp_path: Path) -> None:
    path = identity(tmp_path / "bf16.onnx", TensorProto.BFLOAT16, [None, 3])
    backend = OnnxRuntimeBackend(InstanceSpec("bf16", path))
    bits = np.array([[0x3F80, 0x4000, 0xC040]], np.uint16)  # 1.0, 2.0, -3.0
    out = backend.run({"x": bits}, ["y"])["y"]
    np.testing.assert_array_equal(out, bits)
    np.testing.assert_array_equal(bf16_to_float32(out), [[1.0, 2.0, -3.0]])


def test_string_tensors_take_bytes_and_return_strings(tmp_path: Path) -> None:
    path = identity(tmp_path / "s.onnx", TensorProto.STRING, [None])
    backend = OnnxRuntimeBackend(InstanceSpec("s", path))
    out = backend.run({"x": np.array([b"ab", "c\u00e9".encode()], dtype=object)}, ["y"])["y"]
    assert [str(v) for v in out] == ["ab", "c\u00e9"]


def test_describe_reads_tensors_without_a_session(tmp_path: Path) -> None:
    path = identity(tmp_path / "f.onnx", TensorProto.FLOAT16, ["batch", 4])
    inputs, outputs = describe(path)
    assert [(t.name, t.datatype, t.shape) for t in inputs] == [("x", "FP16", (-1, 4))]
    assert [(t.name, t.datatype, t.shape) for t in outputs] == [("y", "FP16", (-1, 4))]


def test_unreadable_model_is_a_load_error(tmp_path: Path) -> None:
    path = tmp_path / "broken.onnx"
    path.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match=r"broken\.onnx"):
        OnnxRuntimeBackend(InstanceSpec("broken", path))
    with pytest.raises(ModelLoadError, match=r"broken\.onnx"):
        describe(path)


def test_session_options_from_parameters() -> None:
    spec = InstanceSpec("m", Path("m.onnx"), parameters={"intra_op_thread_count": "3",
                                                         "graph_optimization_level": "basic"})
    options = session_options(spec)
    assert options.intra_op_num_threads == 3
    assert str(options.graph_optimization_level).endswith("ORT_ENABLE_BASIC")
    with pytest.raises(ConfigError, match="graph_optimization_level"):
        session_options(InstanceSpec("m", Path("m.onnx"),
                                       parameters={"graph_optimization_level": "max"}))
    with pytest.raises(ConfigError, match="intra_op_thread_count"):
        session_options(InstanceSpec("m", Path("m.onnx"),
                                       parameters={"intra_op_thread_count": "x"}))


def test_gpu_groups_place_count_instances_on_each_listed_gpu() -> None:
    from tradeoff.backends.onnxruntime import execution_providers

    gpu = InstanceSpec("m", Path("m.onnx"), kind="KIND_GPU", device_id=1)
    providers = execution_providers(gpu)
    assert providers[-1] == "CPUExecutionProvider"
    import onnxruntime as ort
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert ("CUDAExecutionProvider", {"device_id": 1}) in providers
    else:
        assert providers == ["CPUExecutionProvider"]
    assert execution_providers(InstanceSpec("m", Path("m.onnx"))) == ["CPUExecutionProvider"]
