"""Start the server: bind the ports, load the repository, serve until SIGTERM/SIGINT.

On SIGTERM or SIGINT the server stops accepting connections, answers every request it
has accepted (queued or running), unloads the models and exits 0, within
``shutdown_timeout`` seconds.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import ssl
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path

import uvicorn

from tradeoff.errors import InvalidValue, LocalResourceError, local_resource
from tradeoff.heap import settle_heap
from tradeoff.repository.repository import ModelRepository
from tradeoff.server.cache import ResponseCache
from tradeoff.server.dataplane import DataPlane
from tradeoff.server.executor_process import ExecutorProcesses, SharedExecutors
from tradeoff.server.front_end import FrontEnd, front_end_id
from tradeoff.server.http import HttpApp
from tradeoff.server.logs import install_rate_limit
from tradeoff.server.metrics import families, make_registry
from tradeoff.server.models import ModelManager
from tradeoff.server.options import ServeOptions, TransportLimits
from tradeoff.server.origins import OriginPolicy
from tradeoff.server.process import PARENT_PID_ENV
from tradeoff.server.replicas import ReplicaLink
from tradeoff.server.shared_arena import remove_stale_segments
from tradeoff.server.transport import guarded_protocol, raise_open_files_limit

__all__ = ["bind", "exit_with_parent", "make_app", "make_dataplane", "serve"]

log = logging.getLogger("tradeoff.server")


class _GracefulServer(uvicorn.Server):
    """Stops like Triton: on the first signal, refuse new work and flush the queues at
    once; exit 0 after a clean stop (uvicorn would re-raise the signal)."""

    on_signal: Callable[[], None] | None = None

    def handle_exit(self, sig: int, frame: object) -> None:
        if self.should_exit and sig == signal.SIGINT:
            self.force_exit = True  # a second Ctrl-C: stop waiting
            return
        log.info("signal %s: no new connections, finishing accepted requests",
                 signal.Signals(sig).name)
        self.should_exit = True
        if self.on_signal is not None:
            self.on_signal()


def exit_with_parent() -> None:
    """A server started by another tradeoff process (``ServerProcess``: a plan, a tuner, a
    benchmark) stops as on SIGTERM once that process is gone, even killed with SIGKILL:
    ``$TRADEOFF_PARENT_PID`` names it, and a thread looks for it every half second."""
    named = os.environ.pop(PARENT_PID_ENV, "")  # for this process, not its children
    if not named.isdigit():
        return
    parent = int(named)
    if os.getppid() != parent and _alive(parent):
        return  # an ancestor's, left in the environment: not this server's parent

    def watch() -> None:  # a parent gone before the server started: it stops at once
        while os.getppid() == parent:
            time.sleep(0.5)
        log.warning("the process that started this server (pid %s) is gone: stopping",
                    parent)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="tradeoff-parent-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        pass
    return True


def bind(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A socket bound to listen on ``host:port`` (LocalResourceError saying what to do
    when the port is taken); ``reuse_port``: other sockets of this user may bind it too
    (``serve --workers``' front ends, between which the kernel shares connections)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise LocalResourceError(f"cannot listen on {host}:{port}: {exc.strerror}; is "
                                 "another server running there? Pick another port."
                                 ) from exc
    sock.set_inheritable(True)
    return sock


def _read_tls(cert: Path, key: Path) -> tuple[bytes, bytes]:
    """The certificate chain and key, PEM, checked to load together (as uvicorn and gRPC
    will load them) before any port is bound."""
    with local_resource(f"--tls-cert {cert} / --tls-key {key}"):
        ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(cert, key)
        return cert.read_bytes(), key.read_bytes()


def _generation_drain_s(shutdown_timeout: float) -> float:
    """How long generations may run on after SIGTERM: ``shutdown_timeout`` less a margin
    (up to 2 s), so each one still running ends with an error event before the
    connections are cut."""
    return max(shutdown_timeout - min(2.0, shutdown_timeout / 2), 0.0)


# descriptors kept for everything but HTTP connections: model files, gRPC, logs
_RESERVED_FILES = 256


def _fit_open_files(limits: TransportLimits) -> TransportLimits:
    """Raise the open-files limit so ``max_connections`` fit; where the hard limit does
    not allow it, lower ``max_connections`` and say so (accepting past the limit would
    fail every new connection, not only the extra ones)."""
    soft = raise_open_files_limit(limits.max_connections + _RESERVED_FILES)
    if soft >= limits.max_connections + _RESERVED_FILES:
        return limits
    fitted = max(soft - _RESERVED_FILES, 1)
    # one client keeps its share of what is left (a quarter, as with the defaults)
    per_client = min(limits.max_connections_per_client, max(fitted // 4, 1))
    log.warning("the open-files limit is %d: serving at most %d HTTP connections (%d per "
                "client), not %d (--max-connections); raise it with ulimit -n", soft,
                fitted, per_client, limits.max_connections)
    return replace(limits, max_connections=fitted, max_connections_per_client=per_client)


def _executor_processes(options: ServeOptions, shared: SharedExecutors | None
                        ) -> ExecutorProcesses | None:
    """With ``--executors process``: the executor processes, none started yet (the
    shared memory that servers killed earlier left behind is removed first); a front
    end of ``serve --workers`` dials its supervisor's (``shared``)."""
    if options.executors != "process":
        return None
    if shared is None:
        for name in remove_stale_segments():
            log.info("removed shared memory %s of a server no longer running", name)
    return ExecutorProcesses(options.executor_memory_mb << 20, shared)


def make_dataplane(options: ServeOptions, shared: SharedExecutors | None = None
                   ) -> DataPlane:
    """The data plane over the repository's models (not loaded yet) and the cache; a
    front end of ``serve --workers`` shares its supervisor's executors (``shared``)."""
    repository = ModelRepository(options.model_repository, options.default_max_batch_size)
    manager = ModelManager(repository, default_intra_op_threads=options.intra_op_threads,
                           allow_fault_injection=options.allow_fault_injection,
                           drain_timeout_s=_generation_drain_s(options.shutdown_timeout),
                           max_instances=options.max_instances,
                           inline_batch_us=options.inline_batch_us,
                           warmup_timeout_s=options.warmup_timeout,
                           executor_processes=_executor_processes(options, shared))
    cache = ResponseCache.from_spec(options.cache) if options.cache is not None else None
    manager.cache_enabled = cache is not None
    dataplane = DataPlane(manager, options.max_inflight, options.limits, cache)
    dataplane.strict_readiness = options.strict_readiness
    return dataplane


def make_app(options: ServeOptions, dataplane: DataPlane, transport: TransportLimits,
             metrics_port: int | None, startup: Callable[[], Awaitable[None]],
             shutdown: Callable[[], Awaitable[None]]) -> HttpApp:
    """The ASGI application over ``dataplane``, with the options' keys and origins."""
    return HttpApp(dataplane, make_registry(dataplane.manager, dataplane),
                   metrics_port=metrics_port, max_request_bytes=options.max_request_bytes,
                   on_startup=startup, on_shutdown=shutdown, access=options.access,
                   limits=transport,
                   origins=OriginPolicy.for_bind(options.host, options.allowed_hosts,
                                                 options.allowed_origins))


def serve(options: ServeOptions, front_end: FrontEnd | None = None) -> None:
    """Run the server in this process until it is told to stop; with ``front_end``, as
    one of ``serve --workers``' front ends (``server/workers.py``)."""
    if front_end is None:
        exit_with_parent()  # a front end stops with its supervisor's link
    install_rate_limit()
    tls = None
    if options.tls_cert is not None or options.tls_key is not None:
        if options.tls_cert is None or options.tls_key is None:
            raise InvalidValue("TLS needs both --tls-cert and --tls-key")
        tls = _read_tls(options.tls_cert, options.tls_key)
    dataplane = make_dataplane(options, front_end.link if front_end else None)
    if front_end is not None:
        dataplane.shared_in_flight = front_end.inflight
    shared = front_end is not None  # the supervisor holds the ports for its front ends
    sockets = [bind(options.host, options.http_port, shared)]
    if options.metrics_port is not None:
        sockets.append(bind(options.host, options.metrics_port, shared))
    http_port = sockets[0].getsockname()[1]
    metrics_port = sockets[1].getsockname()[1] if options.metrics_port is not None else None

    loop_box: list[asyncio.AbstractEventLoop] = []

    grpc_box: list = []
    peers: list[ReplicaLink] = []

    async def startup() -> None:
        loop_box.append(asyncio.get_running_loop())
        if front_end is not None:
            await front_end.link.start()
        await dataplane.manager.load_all()
        settle_heap()
        if front_end is not None:  # the repository changes made since the start
            link = ReplicaLink(front_end.link.coordinator, dataplane,
                               front_end_id(front_end.index, os.getpid()), "local",
                               os.getpid(), None)
            link.metrics = lambda: families(app.registry)
            await link.join()
            app.others_metrics = link.metric_families
            peers.append(link)
        if options.grpc_port is not None:
            from tradeoff.server.grpc_server import start_grpc_server

            server, port = await start_grpc_server(dataplane, options.host, options.grpc_port,
                                                   options.max_request_bytes, options.access,
                                                   tls)
            grpc_box.append(server)
            log.info("gRPC (Open Inference Protocol v2) on %s:%d", options.host, port)
        dataplane.started = True
        scheme = "https" if tls else "http"
        log.info("HTTP (Open Inference Protocol v2) on %s://%s:%d", scheme, options.host,
                 http_port)
        log.info("access: %s", options.access.describe())
        if options.cache is not None and dataplane.cache is not None:
            log.info("response cache: %s", options.cache.describe())
            await dataplane.cache.check()  # warns now if Redis does not answer
        if metrics_port is not None:
            log.info("Prometheus metrics on %s://%s:%d/metrics", scheme, options.host,
                     metrics_port)
        if dataplane.ready():
            log.info("ready")
        else:
            log.warning("no model serves (see the errors above, or POST "
                        "/v2/repository/index): /v2/health/ready answers 503 until one "
                        "loads")

    async def shutdown() -> None:
        dataplane.begin_shutdown()  # once more if a signal started it: deadlines keep
        for link in peers:  # the other front ends stop asking this one
            await link.close()
        for server in grpc_box:
            await server.stop(options.shutdown_timeout)  # answers the calls in flight
        await dataplane.close()
        if front_end is not None:
            front_end.link.close()
        log.info("stopped")

    transport = _fit_open_files(options.transport)
    app = make_app(options, dataplane, transport, metrics_port, startup, shutdown)
    config = uvicorn.Config(
        app,
        loop="uvloop",
        http=guarded_protocol(transport, app),
        ws="none",  # no upgrades: every connection stays under the guarded protocol
        lifespan="on",
        log_config=None,
        access_log=False,
        proxy_headers=False,
        server_header=False,
        date_header=False,
        timeout_graceful_shutdown=max(int(options.shutdown_timeout), 1),
        # a request body larger than this is refused by our own check, not uvicorn's
        h11_max_incomplete_event_size=None,
        limit_concurrency=None,
        backlog=2048,
        ssl_certfile=str(options.tls_cert) if tls else None,
        ssl_keyfile=str(options.tls_key) if tls else None,
    )
    server = _GracefulServer(config)

    def on_signal() -> None:
        # runs inside a signal handler: hand the work to the event loop
        if loop_box:
            loop_box[0].call_soon_threadsafe(dataplane.begin_shutdown)

    server.on_signal = on_signal
    try:
        server.run(sockets=sockets)
    finally:
        for sock in sockets:
            sock.close()
    if server.started is False:
        raise SystemExit(1)
