"""A pool replica spoken to over KServe v2 gRPC (Triton's GRPCInferenceService): one kept
channel per replica, requests as ModelInferRequest with raw tensor contents, and the
replica's status codes read as the gateway's outcomes.

    link = GrpcLink(replica.config, api_key)            # the channel opens on first use
    response, server_timing = await link.infer(request, timeout_s, metadata)  # or raises
    ready = await link.ready(model, timeout_s)
    signature, max_batch_size = await link.signature(model, timeout_s)
    await link.close()
"""

from __future__ import annotations

from typing import Any

import grpc

from tradeoff.protocol import grpc_service_pb2 as pb
from tradeoff.protocol.grpc_parameters import set_parameter
from tradeoff.protocol.v2 import TensorOutput, V2Request, decode_binary_tensor, tensor_bytes
from tradeoff.repository.router import ReplicaConfig, Signature

__all__ = ["GrpcLink", "infer_request", "response_outputs"]

_SERVICE = "/inference.GRPCInferenceService/"


class GrpcLink:
    """A replica's gRPC channel and the calls the gateway makes on it."""

    def __init__(self, config: ReplicaConfig, api_key: str | None = None,
                 max_message_bytes: int = 64 << 20) -> None:
        self.config = config
        self.metadata = (("authorization", f"Bearer {api_key}"),) if api_key else ()
        self._max = max_message_bytes
        self._channel: grpc.aio.Channel | None = None
        self._calls: dict[str, Any] = {}

    def _call(self, method: str, reply: Any) -> Any:
        call = self._calls.get(method)
        if call is None:
            if self._channel is None:
                self._channel = grpc.aio.insecure_channel(
                    f"{self.config.host}:{self.config.port}",
                    options=[("grpc.max_receive_message_length", self._max),
                             ("grpc.max_send_message_length", self._max)])
            call = self._calls[method] = self._channel.unary_unary(
                _SERVICE + method, request_serializer=lambda m: m.SerializeToString(),
                response_deserializer=reply.FromString)
        return call

    def _metadata(self, extra: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
        """The pool's key unless the client's forwarded one replaces it."""
        if any(name == "authorization" for name, _ in extra):
            return extra
        return self.metadata + extra

    async def infer(self, request: pb.ModelInferRequest, timeout_s: float,
                    metadata: tuple[tuple[str, str], ...] = ()
                    ) -> tuple[pb.ModelInferResponse, str | None]:
        """ModelInfer: the answer, and the Server-Timing of its trailing metadata (None:
        none); raises grpc.aio.AioRpcError as the replica answered."""
        call = self._call("ModelInfer", pb.ModelInferResponse)(
            request, timeout=timeout_s, metadata=self._metadata(metadata))
        response: pb.ModelInferResponse = await call
        trailing = await call.trailing_metadata()
        timing = dict(trailing or ()).get("server-timing")
        return response, timing if isinstance(timing, str) else None

    async def ready(self, model: str, timeout_s: float) -> tuple[bool, str]:
        """Whether the replica serves ``model`` now, and if not, why."""
        try:
            answer = await self._call("ModelReady", pb.ModelReadyResponse)(
                pb.ModelReadyRequest(name=model), timeout=timeout_s, metadata=self.metadata)
        except grpc.aio.AioRpcError as exc:
            return False, f"ModelReady failed: {exc.code().name}: {exc.details()}"
        return bool(answer.ready), "" if answer.ready else "ModelReady answered not ready"

    async def signature(self, model: str, timeout_s: float) -> tuple[Signature, int]:
        """The model's inputs and outputs (ModelMetadata) and max_batch_size
        (ModelConfig; 0 where the replica has no config to give)."""
        metadata = await self._call("ModelMetadata", pb.ModelMetadataResponse)(
            pb.ModelMetadataRequest(name=model), timeout=timeout_s, metadata=self.metadata)
        signature = Signature(
            tuple((t.name, t.datatype, tuple(t.shape)) for t in metadata.inputs),
            tuple((t.name, t.datatype, tuple(t.shape)) for t in metadata.outputs))
        try:
            config = await self._call("ModelConfig", pb.ModelConfigResponse)(
                pb.ModelConfigRequest(name=model), timeout=timeout_s, metadata=self.metadata)
            batch = int(config.config.max_batch_size)
        except grpc.aio.AioRpcError:
            batch = 0
        return signature, batch

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None
            self._calls.clear()


def infer_request(request: V2Request, model: str) -> pb.ModelInferRequest:
    """A v2 request as a ModelInferRequest for ``model``: every input in raw contents."""
    message = pb.ModelInferRequest(model_name=model, id=request.id or "")
    for tensor in request.inputs:
        message.inputs.add(name=tensor.name, datatype=tensor.datatype,
                           shape=list(tensor.shape))
        message.raw_input_contents.append(bytes(tensor_bytes(tensor.array, tensor.datatype)))
    for output in request.outputs or ():
        message.outputs.add(name=output.name)
    for name, value in request.parameters.items():
        if name != "binary_data_output" and value is not None:
            set_parameter(message.parameters[name], value)
    return message


def response_outputs(response: pb.ModelInferResponse, request: V2Request) -> list[TensorOutput]:
    """A ModelInferResponse's outputs, each marked binary or JSON as the client asked."""
    raw = response.raw_output_contents
    if len(raw) != len(response.outputs):
        raise ValueError(f"{len(raw)} raw output contents for {len(response.outputs)} "
                         "outputs")
    return [TensorOutput(tensor.name, decode_binary_tensor(
                memoryview(contents), tensor.datatype, tuple(tensor.shape),
                f"output {tensor.name!r}"), tensor.datatype, request.binary_for(tensor.name))
            for tensor, contents in zip(response.outputs, raw, strict=True)]
