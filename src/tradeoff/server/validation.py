"""A decoded tensor request checked against the config of the model version that serves
it, and what its answer holds: the outputs the client asked for. Both transports' requests
go through :func:`validate`; a request header found valid is remembered per model version,
so a client that sends the same header again is checked once.

    internal = validate(served, request)     # the scheduler's request, or InvalidInput
    outputs = select_outputs(served.config, request, raw_outputs)
"""

from __future__ import annotations

from typing import Any

from tradeoff.errors import InvalidInput
from tradeoff.protocol.v2 import TensorOutput, V2Request, parse_json_object
from tradeoff.repository.config import ModelConfig
from tradeoff.scheduling.priority import tensor_priority
from tradeoff.scheduling.request import InferenceRequest
from tradeoff.server.cache.values import Expected
from tradeoff.server.catalog import ModelVersion

__all__ = ["KNOWN_HEADERS", "config_override", "expected_outputs", "select_outputs",
           "validate", "wanted_outputs"]

# request headers remembered as valid, per model version (see validate)
KNOWN_HEADERS = 256


def validate(served: ModelVersion, request: V2Request) -> InferenceRequest:
    """The scheduler's request for a decoded one, checked against ``served``'s config
    (InvalidInput saying what does not fit)."""
    name = served.name
    header = request.header
    if header is not None:
        known = served.checked.get(header)
        if known is not None:  # this header passed every check below already
            shape_key, rows, priority, timeout = known
            return InferenceRequest(
                inputs={t.name: t.array for t in request.inputs}, rows=rows,
                shape_key=shape_key, priority=priority, timeout_us=timeout)
    config = served.config
    expected_shapes = config.input_shapes
    batching = config.max_batch_size > 0
    inputs = {}
    rows = None
    for tensor in request.inputs:
        spec = config.input(tensor.name)
        if spec is None:
            raise InvalidInput(f"unexpected input {tensor.name!r} for model {name!r}; it "
                               f"takes {[t.name for t in config.inputs]}")
        if tensor.name in inputs:
            raise InvalidInput(f"input {tensor.name!r} is given twice")
        if tensor.datatype != spec.datatype:
            raise InvalidInput(f"input {tensor.name!r}: datatype {tensor.datatype} does not "
                               f"match the model's {spec.datatype}")
        if tensor.datatype == "BYTES" and served.check_bytes is not None:
            served.check_bytes(tensor.name, tensor.array)  # before it joins a batch
        shape = tensor.shape
        expected = expected_shapes[tensor.name]
        if len(shape) != len(expected) or any(
                want != -1 and got != want for got, want in zip(shape, expected, strict=True)):
            raise InvalidInput(f"input {tensor.name!r}: shape {list(shape)} does not match "
                               f"the model's {list(expected)}")
        tensor_rows = shape[0] if batching else 1
        if batching and not 1 <= tensor_rows <= config.max_batch_size:
            raise InvalidInput(f"input {tensor.name!r}: batch size {tensor_rows} is outside"
                               f" 1..{config.max_batch_size} (max_batch_size)")
        if rows is None:
            rows = tensor_rows
        elif tensor_rows != rows:
            raise InvalidInput(f"input {tensor.name!r} has batch size {tensor_rows} but "
                               f"other inputs have {rows}")
        inputs[tensor.name] = tensor.array
    if len(inputs) != len(expected_shapes):
        missing = [t.name for t in config.inputs if t.name not in inputs and not t.optional]
        if missing:
            raise InvalidInput(f"model {name!r} needs inputs {missing}")
    if request.outputs is not None:
        for out in request.outputs:
            if config.output(out.name) is None:
                raise InvalidInput(f"unknown output {out.name!r} for model {name!r}; it "
                                   f"has {[t.name for t in config.outputs]}")
    params = request.parameters
    priority = tensor_priority(params.get("priority", 0))
    if not isinstance(params.get("cache", True), bool):
        raise InvalidInput("parameter 'cache' must be true or false")
    timeout = params.get("timeout")
    if timeout is not None and (not isinstance(timeout, int) or isinstance(timeout, bool)
                                or timeout < 0):
        raise InvalidInput("parameter 'timeout' must be a non-negative integer "
                           "(microseconds)")
    # Which inputs, in config order, with their non-batch dims: only requests with
    # equal keys can be concatenated into one batch.
    shape_key = tuple((n, inputs[n].shape[1:] if batching else inputs[n].shape)
                      for n in expected_shapes if n in inputs)
    # BYTES elements are checked one by one (check_bytes): never taken as known
    if header is not None and len(served.checked) < KNOWN_HEADERS and \
            all(t.datatype != "BYTES" for t in request.inputs):
        served.checked[header] = (shape_key, rows or 1, priority, timeout or None)
    return InferenceRequest(inputs=inputs, rows=rows or 1, shape_key=shape_key,
                            priority=priority, timeout_us=timeout or None)


def config_override(parameters: dict[str, Any]) -> dict[str, Any] | None:
    """The ``config`` load parameter parsed, or None; model files in a request are refused."""
    unsupported = sorted(k for k in parameters if k.startswith("file:"))
    if unsupported:
        raise InvalidInput(f"load parameters {unsupported} (model files in the request) are "
                           "not supported; put the files in the model repository")
    config = parameters.get("config")
    if config is None:
        return None
    if not isinstance(config, str):
        raise InvalidInput("load parameter 'config' must be a string holding the model "
                           "config as JSON")
    return parse_json_object(config, "load parameter 'config'")


def wanted_outputs(config: ModelConfig, request: V2Request) -> list[tuple[str, bool]]:
    """The outputs the client asked for, in answer order, each with whether it is sent
    as binary data."""
    default_binary = request.binary_output
    if request.outputs is None:
        return [(t.name, default_binary) for t in config.outputs]
    return [(o.name, default_binary if o.binary is None else o.binary)
            for o in request.outputs]


def expected_outputs(config: ModelConfig, wanted: list[tuple[str, bool]],
                     rows: int) -> Expected:
    """What a stored answer to this request must hold: each output as the config declares
    it (the batch dimension is the request's rows)."""
    batch = [rows] if config.max_batch_size > 0 else []
    return [(name, tensor.datatype, binary, [*batch, *tensor.dims])
            for name, binary in wanted
            if (tensor := config.output(name)) is not None]


def select_outputs(config: ModelConfig, request: V2Request,
                   outputs: dict[str, Any]) -> list[TensorOutput]:
    """The outputs the client asked for, each marked binary or JSON."""
    result = []
    for name, binary in wanted_outputs(config, request):
        array = outputs[name]
        datatype = config.output(name).datatype  # type: ignore[union-attr]
        if datatype == "BYTES" and array.dtype.kind == "U":
            array = array.astype(object)
        result.append(TensorOutput(name, array, datatype, binary))
    return result
