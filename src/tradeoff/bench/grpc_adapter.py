"""`tradeoff bench --protocol v2-grpc`: the Open Inference Protocol over gRPC.

Requests are serialized ModelInferRequest messages with ``raw_input_contents`` (as
tritonclient and perf_analyzer send them), prepared once; each connection is a gRPC
channel. The server's ``server-timing`` trailing metadata gives the same per-request
breakdown as the HTTP header.
"""

from __future__ import annotations

from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from grpc import aio

from tradeoff.bench.adapters import Connection, V2Adapter
from tradeoff.errors import BenchSetupError
from tradeoff.protocol import grpc_service_pb2 as pb
from tradeoff.protocol.grpc_parameters import set_parameter
from tradeoff.protocol.http_client import DEFAULT_MAX_RESPONSE_BYTES, Response, ResponseTooLarge
from tradeoff.protocol.v2 import encode_bytes_elements

__all__ = ["METHOD", "GrpcConnection", "GrpcV2Adapter"]

METHOD = "/inference.GRPCInferenceService/{}"
# gRPC status -> the HTTP status the result files it under
_HTTP_STATUS = {grpc.StatusCode.INVALID_ARGUMENT: 400, grpc.StatusCode.NOT_FOUND: 404,
                grpc.StatusCode.UNAVAILABLE: 503, grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
                grpc.StatusCode.UNIMPLEMENTED: 501, grpc.StatusCode.INTERNAL: 500}


class GrpcConnection:
    """One channel; ``request`` sends a serialized ModelInferRequest. Answers over
    ``max_bytes`` fail with ResponseTooLarge."""

    def __init__(self, target: str, timeout_s: float,
                 max_bytes: int = DEFAULT_MAX_RESPONSE_BYTES) -> None:
        self.timeout_s = timeout_s
        self.max_bytes = max_bytes
        self.channel = aio.insecure_channel(
            target, options=[("grpc.max_receive_message_length", min(max_bytes, 2**31 - 1))])
        self.infer = self.channel.unary_unary(METHOD.format("ModelInfer"))

    async def request(self, raw: bytes) -> Response:
        call = self.infer(raw, timeout=self.timeout_s)
        try:
            body = await call
        except aio.AioRpcError as exc:
            code = exc.code()
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError(exc.details()) from None
            if code == grpc.StatusCode.UNAVAILABLE and "connect" in (exc.details() or "").lower():
                raise ConnectionRefusedError(exc.details()) from None
            if code == grpc.StatusCode.RESOURCE_EXHAUSTED and \
                    "larger than max" in (exc.details() or ""):
                raise ResponseTooLarge.over(self.max_bytes) from None
            return Response(_HTTP_STATUS.get(code, 500), {}, (exc.details() or "").encode())
        headers = {key.encode(): value.encode() if isinstance(value, str) else value
                   for key, value in (await call.trailing_metadata() or ())}
        return Response(200, headers, body)

    def close(self) -> None:
        # aio channels close asynchronously; a closed channel needs no more work from us
        channel, self.channel = self.channel, None
        if channel is not None:
            import asyncio

            try:
                asyncio.get_running_loop().create_task(channel.close())
            except RuntimeError:
                pass


class GrpcV2Adapter(V2Adapter):
    """Open Inference Protocol v2 over gRPC (`tradeoff serve`, Triton)."""

    protocol = "v2-grpc"

    def __init__(self, url: str, model: str, **kwargs: Any) -> None:
        target = url.removeprefix("grpc://").removeprefix("http://").rstrip("/")
        super().__init__(f"http://{target}", model, **kwargs)
        self.url = target
        self.target = target

    def _call(self, method: str, request: Any, response_type: Any) -> Any:
        with grpc.insecure_channel(self.target) as channel:
            stub = channel.unary_unary(METHOD.format(method),
                                       request_serializer=type(request).SerializeToString,
                                       response_deserializer=response_type.FromString)
            try:
                return stub(request, timeout=self.timeout_s)
            except grpc.RpcError as exc:
                raise BenchSetupError(f"{self.target} {method}: {exc.code().name} "
                                      f"{exc.details()}") from None

    def _model_request(self) -> dict[str, str]:
        return {"name": self.model, "version": self.version}

    def _read_model(self) -> None:
        metadata = self._call("ModelMetadata", pb.ModelMetadataRequest(**self._model_request()),
                              pb.ModelMetadataResponse)
        self.metadata = json_format.MessageToDict(metadata, preserving_proto_field_name=True)
        for tensor in self.metadata.get("inputs", []):
            tensor["shape"] = [int(d) for d in tensor.get("shape", [])]
        config = self._call("ModelConfig", pb.ModelConfigRequest(**self._model_request()),
                            pb.ModelConfigResponse)
        self.config = json_format.MessageToDict(config.config, preserving_proto_field_name=True)
        self.config["max_batch_size"] = config.config.max_batch_size

    def server_metadata(self) -> dict[str, Any] | None:
        try:
            metadata = self._call("ServerMetadata", pb.ServerMetadataRequest(),
                                  pb.ServerMetadataResponse)
        except BenchSetupError:
            return None
        return json_format.MessageToDict(metadata, preserving_proto_field_name=True)

    def _request(self, inputs: dict[str, tuple[str, np.ndarray]],
                 parameters: dict[str, Any] | None = None) -> bytes:
        request = pb.ModelInferRequest(model_name=self.model, model_version=self.version)
        for key, value in (parameters or {}).items():
            set_parameter(request.parameters[key], value)
        for name, (datatype, array) in inputs.items():
            request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
            request.raw_input_contents.append(
                encode_bytes_elements(array) if datatype == "BYTES"
                else np.ascontiguousarray(array).tobytes())
        return request.SerializeToString()

    def connect(self, timeout_s: float) -> Connection:
        return GrpcConnection(self.target, timeout_s, self.max_response_bytes)

    def invalid(self, response: Response) -> str | None:
        try:
            pb.ModelInferResponse.FromString(response.body)
        except DecodeError as exc:
            return f"undecodable answer: {exc}"
        return None

    def server_stats(self) -> dict[str, Any] | None:
        try:
            stats = self._call("ModelStatistics",
                               pb.ModelStatisticsRequest(**self._model_request()),
                               pb.ModelStatisticsResponse)
        except BenchSetupError:
            return None
        entries = json_format.MessageToDict(stats, preserving_proto_field_name=True,
                                            always_print_fields_with_no_presence=True)
        models = entries.get("model_stats") or []
        return models[-1] if models else None

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "protocol": self.protocol, "url": self.target,
                "tensors": "raw"}
