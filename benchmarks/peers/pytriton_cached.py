"""Triton (through PyTriton) serving one ONNX model, with or without Triton's local
response cache: the peer of benchmarks/cache.py. Runs in PyTriton's own venv:

    python -m venv /tmp/pytriton-venv
    /tmp/pytriton-venv/bin/pip install nvidia-pytriton onnxruntime
    taskset -c 0 /tmp/pytriton-venv/bin/python benchmarks/peers/pytriton_cached.py \\
        MODEL.onnx NAME HTTP_PORT GRPC_PORT CACHE_BYTES(0: none)

The model is bound as NAME with its ONNX input and output names, max_batch_size 64 and
dynamic batching without delay (as `dynamic_batching { }` in tradeoff serve). The
statistics extension needs the header ``triton-access-token: tradeoff-bench``.
"""

import sys

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

path, name, http_port, grpc_port, cache_bytes = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])

options = ort.SessionOptions()
options.intra_op_num_threads = 1
options.inter_op_num_threads = 1
session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
(source,), (sink,) = session.get_inputs(), session.get_outputs()


@batch
def infer(**inputs):
    return {sink.name: session.run([sink.name], {source.name: inputs[source.name]})[0]}


config = TritonConfig(http_address="127.0.0.1", http_port=http_port, grpc_address="127.0.0.1",
                      grpc_port=grpc_port, allow_metrics=False, exit_on_error=True,
                      cache_config=[f"local,size={cache_bytes}"] if cache_bytes else None)
with Triton(config=config,
            security_config=TritonSecurityConfig(access_token="tradeoff-bench")) as triton:
    triton.bind(model_name=name, infer_func=infer,
                inputs=[Tensor(name=source.name, dtype=np.float32, shape=(source.shape[1],))],
                outputs=[Tensor(name=sink.name, dtype=np.float32, shape=(sink.shape[1],))],
                config=ModelConfig(max_batch_size=64, batcher=DynamicBatcher(),
                                   response_cache=bool(cache_bytes)),
                strict=True)
    print("PYTRITON_READY", flush=True)
    triton.serve()
