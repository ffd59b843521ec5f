"""Triton (through PyTriton) serving ONNX models with ONNX Runtime: the peer of
benchmarks/peers.py. Runs in PyTriton's own venv (peers.py makes it):

    taskset -c 0 VENV/bin/python benchmarks/peers/pytriton_server.py \\
        HTTP_PORT GRPC_PORT MAX_BATCH_SIZE NAME=MODEL.onnx [NAME=MODEL.onnx ...]

Each model is bound under NAME with its ONNX input and output names, the batch dimension
first, ``max_batch_size`` MAX_BATCH_SIZE and dynamic batching without delay (as
``dynamic_batching { }`` in tradeoff serve); one intra-op thread. Metrics are off. The
statistics extension needs the header ``triton-access-token: tradeoff-bench``. Prints
``PYTRITON_READY`` once every model is bound; stops cleanly on SIGTERM or SIGINT.
"""

import signal
import sys

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

TOKEN = "tradeoff-bench"


def bind(triton: Triton, name: str, path: str, max_batch_size: int,
         response_cache: bool = False) -> None:
    """Bind the ONNX model at ``path`` as ``name`` (also used by pytriton_cached.py)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    (source,), (sink,) = session.get_inputs(), session.get_outputs()

    @batch
    def infer(**inputs: np.ndarray) -> dict[str, np.ndarray]:
        return {sink.name: session.run([sink.name], {source.name: inputs[source.name]})[0]}

    triton.bind(model_name=name, infer_func=infer,
                inputs=[Tensor(name=source.name, dtype=np.float32, shape=tuple(source.shape[1:]))],
                outputs=[Tensor(name=sink.name, dtype=np.float32, shape=tuple(sink.shape[1:]))],
                config=ModelConfig(max_batch_size=max_batch_size,
                                   batcher=DynamicBatcher(max_queue_delay_microseconds=0),
                                   response_cache=response_cache),
                strict=True)


def main() -> None:
    # PyTriton stops Triton and removes its shared memory on SIGINT only; SIGTERM would
    # end this process at once and leave both behind
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    http_port, grpc_port, max_batch_size = map(int, sys.argv[1:4])
    models = dict(arg.split("=", 1) for arg in sys.argv[4:])
    config = TritonConfig(http_address="127.0.0.1", http_port=http_port,
                          grpc_address="127.0.0.1", grpc_port=grpc_port, allow_metrics=False,
                          exit_on_error=True)
    with Triton(config=config, security_config=TritonSecurityConfig(access_token=TOKEN)) as triton:
        for name, path in models.items():
            bind(triton, name, path, max_batch_size)
        print("PYTRITON_READY", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
