"""The options of ``tradeoff serve``, in one module of plain dataclasses: the server reads
them, and the command's flags take their defaults from them (without importing the server,
so ``--help`` stays quick)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tradeoff.protocol.limits import DEFAULT_LIMITS, RequestLimits
from tradeoff.server.access import Access

if TYPE_CHECKING:
    from tradeoff.server.cache.spec import CacheSpec

__all__ = ["DEFAULT_MAX_REQUEST_BYTES", "RayOptions", "ServeOptions", "TransportLimits"]

DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class TransportLimits:
    """The per-connection and per-request-body limits of the HTTP port (all flags of
    ``tradeoff serve``; docs/reliability.md says which attack each one stops)."""

    max_header_bytes: int = 64 * 1024
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    max_connections: int = 8192
    max_connections_per_client: int = 2048
    max_body_memory: int = 1 << 30
    max_json_bytes: int = 16 << 20  # JSON text of one infer request (tensors as numbers)


@dataclass
class ServeOptions:
    """Everything ``tradeoff serve`` takes; ports of 0 pick free ones."""

    model_repository: Path
    host: str = "127.0.0.1"
    http_port: int = 8000
    metrics_port: int | None = 8002
    grpc_port: int | None = 8001
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    shutdown_timeout: float = 30.0
    default_max_batch_size: int = 4
    intra_op_threads: int = 1
    max_instances: int = 16
    warmup_timeout: float = 300.0
    inline_batch_us: int = 500  # batches measured shorter run on the event loop
    executors: str = "in-process"  # or "process": tensor models in one process per device
    executor_memory_mb: int = 64  # each shared arena of an executor process
    strict_readiness: bool = False
    max_inflight: int | None = 1024
    allow_fault_injection: bool = False
    access: Access = field(default_factory=Access)
    limits: RequestLimits = DEFAULT_LIMITS
    transport: TransportLimits = field(default_factory=TransportLimits)
    allowed_hosts: tuple[str, ...] = ()
    allowed_origins: tuple[str, ...] = ()
    tls_cert: Path | None = None
    tls_key: Path | None = None
    cache: CacheSpec | None = None


@dataclass(frozen=True)
class RayOptions:
    """Where and how many: ``address`` None starts Ray in this process."""

    address: str | None = None
    replicas: int = 1
    autoscale: tuple[int, int] | None = None  # (min, max) replicas
    target_ongoing_requests: float = 32.0
    upscale_delay_s: float = 30.0  # Ray Serve's defaults
    downscale_delay_s: float = 600.0
    max_ongoing_requests: int = 256
    replica_cpus: float = 1.0
    every_node: bool = False  # a proxy on every node, not only the head
    app_name: str = "tradeoff"

    @property
    def coordinator_name(self) -> str:
        return f"{self.app_name}-replicas"

    def deployment_options(self) -> dict[str, Any]:
        """Ray Serve's ``@serve.deployment`` arguments."""
        scale: dict[str, Any]
        if self.autoscale is not None:
            low, high = self.autoscale
            scale = {"autoscaling_config": {
                "min_replicas": low, "max_replicas": high, "initial_replicas": low,
                "target_ongoing_requests": self.target_ongoing_requests,
                "upscale_delay_s": self.upscale_delay_s,
                "downscale_delay_s": self.downscale_delay_s,
                # decide on the last few seconds, not Ray's default 30 s (Ray needs an
                # interval > 0, so an upscale delay of 0 still reports every 0.5 s)
                "metrics_interval_s": min(2.0, max(self.upscale_delay_s, 0.5)),
                "look_back_period_s": max(2.0, min(30.0, self.upscale_delay_s * 2))}}
        else:
            scale = {"num_replicas": self.replicas}
        return {**scale, "max_ongoing_requests": self.max_ongoing_requests,
                "ray_actor_options": {"num_cpus": self.replica_cpus},
                "health_check_period_s": 2.0, "health_check_timeout_s": 10.0}
