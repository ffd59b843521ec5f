"""The gRPC transport: the Open Inference Protocol's GRPCInferenceService on grpc.aio.

Like the HTTP app, it only translates: protobuf messages to and from the same
:class:`DataPlane` calls, so both transports share the scheduler and the statistics.
Tensors travel as ``raw_input_contents`` / ``raw_output_contents`` (what tritonclient and
perf_analyzer send) or as typed ``contents``; outputs are always raw, as Triton answers.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import numpy as np
from google.protobuf import json_format
from grpc import aio

from tradeoff import dtypes
from tradeoff.errors import InvalidInput, NotFound, RequestError
from tradeoff.protocol import grpc_service_pb2 as pb
from tradeoff.protocol import model_config_pb2
from tradeoff.protocol.grpc_parameters import parameter_value
from tradeoff.protocol.limits import DEFAULT_LIMITS, RequestLimits
from tradeoff.protocol.v2 import (
    RequestedOutput,
    TensorInput,
    V2Request,
    decode_binary_tensor,
    tensor_bytes,
)
from tradeoff.server.access import Access
from tradeoff.server.dataplane import DataPlane

__all__ = [
    "ADMIN_METHODS",
    "OPEN_METHODS",
    "SERVICE",
    "GrpcService",
    "decode_infer_request",
    "start_grpc_server",
]

log = logging.getLogger("tradeoff.server")
# lines a client's request causes: rate limited (server/logs.py)
request_log = logging.getLogger("tradeoff.server.requests")

SERVICE = "inference.GRPCInferenceService"

_STATUS = {400: grpc.StatusCode.INVALID_ARGUMENT, 404: grpc.StatusCode.NOT_FOUND,
           405: grpc.StatusCode.UNIMPLEMENTED, 413: grpc.StatusCode.RESOURCE_EXHAUSTED,
           503: grpc.StatusCode.UNAVAILABLE, 500: grpc.StatusCode.INTERNAL,
           401: grpc.StatusCode.UNAUTHENTICATED, 403: grpc.StatusCode.PERMISSION_DENIED}
OPEN_METHODS = frozenset({"ServerLive", "ServerReady", "ModelReady"})
ADMIN_METHODS = frozenset({"RepositoryModelLoad", "RepositoryModelUnload"})

# datatype -> the typed-contents field that carries it
_CONTENTS = {"BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
             "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
             "UINT16": "uint_contents", "UINT32": "uint_contents",
             "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents",
             "BYTES": "bytes_contents"}


def _typed_contents(tensor: Any, where: str) -> np.ndarray:
    datatype, shape = tensor.datatype, tuple(tensor.shape)
    field = _CONTENTS.get(datatype)
    if field is None:
        raise InvalidInput(f"{where}: {datatype} travels only in raw_input_contents")
    values = getattr(tensor.contents, field)
    count = math.prod(shape)
    if len(values) != count:
        raise InvalidInput(f"{where}: contents have {len(values)} elements but shape "
                           f"{list(shape)} needs {count}")
    if datatype == "BYTES":
        return np.array(list(values), dtype=object).reshape(shape)
    try:
        return np.asarray(values, dtype=dtypes.numpy_dtype(datatype)).reshape(shape)
    except (OverflowError, ValueError) as exc:  # e.g. 300 in INT8 contents
        raise InvalidInput(f"{where}: contents do not fit {datatype}: {exc}") from None


def decode_infer_request(request: pb.ModelInferRequest,
                         limits: RequestLimits = DEFAULT_LIMITS) -> V2Request:
    """A gRPC ModelInferRequest as the data plane's request."""
    if len(request.inputs) > limits.max_inputs:
        raise InvalidInput(f"{len(request.inputs)} inputs is over the limit of "
                           f"{limits.max_inputs} (--max-inputs)")
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidInput(f"raw_input_contents has {len(raw)} entries for "
                           f"{len(request.inputs)} inputs; give one per input")
    inputs = []
    for index, tensor in enumerate(request.inputs):
        where = f"input {tensor.name!r}"
        if tensor.datatype not in dtypes.DATATYPES:
            raise InvalidInput(f"{where}: unknown datatype {tensor.datatype!r}")
        if any(d < 0 for d in tensor.shape):
            raise InvalidInput(f"{where}: shape {list(tensor.shape)} has a negative size")
        shape = tuple(tensor.shape)
        if len(shape) > limits.max_json_depth or \
                math.prod(shape) > limits.max_elements:
            raise InvalidInput(f"{where}: shape {list(shape)} is over the limit of "
                               f"{limits.max_elements} elements and {limits.max_json_depth} "
                               "dimensions (--max-tensor-elements, --max-json-depth)")
        if raw:
            array = decode_binary_tensor(memoryview(raw[index]), tensor.datatype, shape, where,
                                         limits)
        else:
            array = _typed_contents(tensor, where)
        inputs.append(TensorInput(tensor.name, tensor.datatype, shape, array))
    if not inputs:
        raise InvalidInput("the request has no inputs")
    outputs = [RequestedOutput(o.name) for o in request.outputs] or None
    parameters = {k: parameter_value(v) for k, v in request.parameters.items()}
    return V2Request(request.id or None, inputs, outputs, parameters)


class GrpcService:
    """Handlers of GRPCInferenceService, registered under the protocol's service name."""

    def __init__(self, dataplane: DataPlane, access: Access | None = None) -> None:
        self.dataplane = dataplane
        self.access = access or Access()

    def _authorize(self, method: str, context: Any) -> bytes:
        """The same keys as over HTTP, from the ``authorization`` metadata; returns who
        made the call (:meth:`Access.check`)."""
        if not self.access.enabled or method in OPEN_METHODS:
            return b""
        authorization = next((v for k, v in context.invocation_metadata() or ()
                              if k == "authorization"), None)
        return self.access.check(authorization, admin=method in ADMIN_METHODS)

    async def server_live(self, request: pb.ServerLiveRequest, context: Any) -> Any:
        return pb.ServerLiveResponse(live=self.dataplane.live())

    async def server_ready(self, request: pb.ServerReadyRequest, context: Any) -> Any:
        return pb.ServerReadyResponse(ready=self.dataplane.ready())

    async def model_ready(self, request: pb.ModelReadyRequest, context: Any) -> Any:
        try:
            ready = self.dataplane.model_ready(request.name, request.version or None)
        except NotFound:
            ready = False  # an unknown model is not ready (gRPC answers no 404 here)
        return pb.ModelReadyResponse(ready=ready)

    async def server_metadata(self, request: pb.ServerMetadataRequest, context: Any) -> Any:
        return json_format.ParseDict(self.dataplane.server_metadata(),
                                     pb.ServerMetadataResponse())

    async def model_metadata(self, request: pb.ModelMetadataRequest, context: Any) -> Any:
        metadata = self.dataplane.model_metadata(request.name, request.version or None)
        return json_format.ParseDict(metadata, pb.ModelMetadataResponse())

    async def model_config(self, request: pb.ModelConfigRequest, context: Any) -> Any:
        config = self.dataplane.model_config(request.name, request.version or None)
        return pb.ModelConfigResponse(
            config=json_format.ParseDict(config, model_config_pb2.ModelConfig()))

    async def model_statistics(self, request: pb.ModelStatisticsRequest, context: Any) -> Any:
        stats = await self.dataplane.all_statistics(request.name or None,
                                                   request.version or None)
        return json_format.ParseDict(stats, pb.ModelStatisticsResponse(),
                                     ignore_unknown_fields=True)

    async def repository_index(self, request: pb.RepositoryIndexRequest, context: Any) -> Any:
        rows = self.dataplane.manager.index(request.ready)
        return pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(**row) for row in rows])

    async def repository_model_load(self, request: pb.RepositoryModelLoadRequest,
                                    context: Any) -> Any:
        parameters = {k: parameter_value(v) for k, v in request.parameters.items()}
        await self.dataplane.load_model(request.model_name, parameters)
        return pb.RepositoryModelLoadResponse()

    async def repository_model_unload(self, request: pb.RepositoryModelUnloadRequest,
                                      context: Any) -> Any:
        await self.dataplane.unload_model(request.model_name)
        return pb.RepositoryModelUnloadResponse()

    async def model_infer(self, request: pb.ModelInferRequest, context: Any) -> Any:
        response, server_timing = await self._infer(request,
                                                    self._authorize("ModelInfer", context))
        context.set_trailing_metadata((("server-timing", server_timing),))
        return response

    async def _infer(self, request: pb.ModelInferRequest, tenant: bytes) -> tuple[Any, str]:
        """The response to one request (``tenant``: who asked), and its Server-Timing
        value."""
        with self.dataplane.admitted():
            # the cheap checks before the tensors are decoded
            target = self.dataplane.tensor_target(request.model_name,
                                                  request.model_version or None)
            v2 = decode_infer_request(request, self.dataplane.limits)
            v2.tenant = tenant
            served, timings, outputs = await self.dataplane.infer_target(target, v2)
            assert isinstance(outputs, list)  # relayed only as it came: over HTTP
        response = pb.ModelInferResponse(model_name=request.model_name,
                                         model_version=str(served.version), id=request.id)
        if timings.route:
            response.parameters["routed_to"].string_param = timings.route
        for out in outputs:
            response.outputs.add(name=out.name, datatype=out.datatype,
                                 shape=list(out.array.shape))
            response.raw_output_contents.append(bytes(tensor_bytes(out.array, out.datatype)))
        return response, timings.server_timing()

    async def model_stream_infer(self, requests: Any, context: Any) -> Any:
        """Triton's streaming extension: requests in, responses out as each completes
        (not necessarily in order; each carries its request's id). An error answers its
        own request in ``error_message`` and the stream goes on."""
        try:
            tenant = self._authorize("ModelStreamInfer", context)
        except RequestError as exc:
            await context.abort(_STATUS.get(exc.status, grpc.StatusCode.INTERNAL), str(exc))
        answers: asyncio.Queue[Any] = asyncio.Queue()

        async def answer(request: pb.ModelInferRequest) -> None:
            try:
                response, _ = await self._infer(request, tenant)
                await answers.put(pb.ModelStreamInferResponse(infer_response=response))
            except Exception as exc:  # every request on the stream gets an answer
                if not isinstance(exc, RequestError):
                    request_log.exception("internal error in ModelStreamInfer")
                await answers.put(pb.ModelStreamInferResponse(
                    error_message=str(exc),
                    infer_response=pb.ModelInferResponse(model_name=request.model_name,
                                                         id=request.id)))

        tasks: set[asyncio.Task] = set()

        async def read() -> None:
            async for request in requests:
                task = asyncio.ensure_future(answer(request))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            if tasks:
                await asyncio.gather(*tasks)
            await answers.put(None)

        reader = asyncio.ensure_future(read())
        try:
            while (item := await answers.get()) is not None:
                yield item
        finally:
            reader.cancel()
            for task in list(tasks):  # the client left: its queued requests are dropped
                task.cancel()

    def handler(self) -> grpc.GenericRpcHandler:
        def unary(method: Callable[[Any, Any], Awaitable[Any]], request_type: Any,
                  response_type: Any, name: str) -> grpc.RpcMethodHandler:
            async def call(request: Any, context: Any) -> Any:
                try:
                    self._authorize(name, context)
                    return await method(request, context)
                except RequestError as exc:
                    await context.abort(_STATUS.get(exc.status, grpc.StatusCode.INTERNAL),
                                        str(exc))
                except aio.AbortError:
                    raise
                except Exception as exc:  # answer, and keep serving
                    request_log.exception("internal error in %s", method.__name__)
                    await context.abort(grpc.StatusCode.INTERNAL,
                                        f"internal error: {type(exc).__name__}: {exc}")
            return grpc.unary_unary_rpc_method_handler(
                call, request_deserializer=request_type.FromString,
                response_serializer=response_type.SerializeToString)

        table = {
            "ServerLive": (self.server_live, pb.ServerLiveRequest, pb.ServerLiveResponse),
            "ServerReady": (self.server_ready, pb.ServerReadyRequest, pb.ServerReadyResponse),
            "ModelReady": (self.model_ready, pb.ModelReadyRequest, pb.ModelReadyResponse),
            "ServerMetadata": (self.server_metadata, pb.ServerMetadataRequest,
                               pb.ServerMetadataResponse),
            "ModelMetadata": (self.model_metadata, pb.ModelMetadataRequest,
                              pb.ModelMetadataResponse),
            "ModelInfer": (self.model_infer, pb.ModelInferRequest, pb.ModelInferResponse),
            "ModelConfig": (self.model_config, pb.ModelConfigRequest, pb.ModelConfigResponse),
            "ModelStatistics": (self.model_statistics, pb.ModelStatisticsRequest,
                                pb.ModelStatisticsResponse),
            "RepositoryIndex": (self.repository_index, pb.RepositoryIndexRequest,
                                pb.RepositoryIndexResponse),
            "RepositoryModelLoad": (self.repository_model_load, pb.RepositoryModelLoadRequest,
                                    pb.RepositoryModelLoadResponse),
            "RepositoryModelUnload": (self.repository_model_unload,
                                      pb.RepositoryModelUnloadRequest,
                                      pb.RepositoryModelUnloadResponse),
        }
        methods = {name: unary(method, request_type, response_type, name)
                   for name, (method, request_type, response_type) in table.items()}
        methods["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
            self.model_stream_infer, request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=pb.ModelStreamInferResponse.SerializeToString)
        return grpc.method_handlers_generic_handler(SERVICE, methods)


async def start_grpc_server(dataplane: DataPlane, host: str, port: int,
                            max_message_bytes: int, access: Access | None = None,
                            tls: tuple[bytes, bytes] | None = None) -> tuple[aio.Server, int]:
    """Start serving on ``host:port`` (0: a free port); returns the server and its port.
    ``tls`` is (certificate chain, private key) in PEM."""
    options = [("grpc.max_receive_message_length", max_message_bytes),
               ("grpc.max_send_message_length", -1)]
    server = aio.server(options=options)
    server.add_generic_rpc_handlers((GrpcService(dataplane, access).handler(),))
    if tls is not None:
        credentials = grpc.ssl_server_credentials([(tls[1], tls[0])])
        bound = server.add_secure_port(f"{host}:{port}", credentials)
    else:
        bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot listen for gRPC on {host}:{port}; is another server "
                      "running there? Pick another port with --grpc-port.")
    await server.start()
    return server, bound
