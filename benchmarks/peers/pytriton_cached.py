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

import signal
import sys

from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig
from pytriton_server import TOKEN, bind  # this folder is on sys.path when run as a script


def main() -> None:
    # as in pytriton_server.py: SIGTERM stops Triton cleanly only as a SIGINT
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    path, name = sys.argv[1], sys.argv[2]
    http_port, grpc_port, cache_bytes = map(int, sys.argv[3:6])
    config = TritonConfig(http_address="127.0.0.1", http_port=http_port,
                          grpc_address="127.0.0.1", grpc_port=grpc_port, allow_metrics=False,
                          exit_on_error=True,
                          cache_config=[f"local,size={cache_bytes}"] if cache_bytes else None)
    with Triton(config=config, security_config=TritonSecurityConfig(access_token=TOKEN)) as triton:
        bind(triton, name, path, 64, response_cache=bool(cache_bytes))
        print("PYTRITON_READY", flush=True)
        triton.serve()


if __name__ == "__main__":
    main()
