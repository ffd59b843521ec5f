"""``tradeoff serve --ray``: the data plane as a Ray Serve deployment.

Each replica is a whole ``tradeoff`` data plane (every model of the repository, with its
own batchers and instances) behind Ray Serve's HTTP proxy, which spreads requests over
the replicas. The repository path must be one every node sees. Replicas keep their
models in step through :mod:`tradeoff.server.replicas`; each serves its own Prometheus
``/metrics`` on ``--host`` (its node's address when that is every interface), behind
``--metrics-key``. Autoscaling is Ray Serve's: it holds the ongoing requests per replica
near ``target_ongoing_requests``. A local Ray (``--ray`` alone) gets a token of its own,
and binds to loopback when ``--host`` is a loopback address.

gRPC is not carried: Ray Serve's gRPC proxy routes only methods defined on the
deployment, and the KServe service is not one of them (docs/scale-out.md).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import secrets
import signal
import socket
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from tradeoff.errors import InvalidValue, MissingDependency, TradeoffError, Unauthorized
from tradeoff.heap import settle_heap
from tradeoff.server.access import Access
from tradeoff.server.metrics import render
from tradeoff.server.options import RayOptions, ServeOptions
from tradeoff.server.replicas import ReplicaCoordinator, ReplicaLink
from tradeoff.server.runner import make_app, make_dataplane

__all__ = [
    "NAMESPACE",
    "Replica",
    "connect",
    "deploy",
    "is_every_interface",
    "is_loopback",
    "local_ray_environment",
    "parse_autoscale",
    "serve_metrics",
    "serve_on_ray",
]

log = logging.getLogger("tradeoff.server")

NAMESPACE = "tradeoff"


def parse_autoscale(text: str) -> tuple[int, int]:
    """``MIN:MAX`` replicas, as ``--autoscale`` takes them."""
    low, sep, high = text.partition(":")
    try:
        bounds = int(low), int(high)
    except ValueError:
        bounds = (-1, -1)
    if not sep or bounds[0] < 0 or bounds[1] < max(bounds[0], 1):
        raise InvalidValue(f"--autoscale takes MIN:MAX replicas (0 <= MIN <= MAX, MAX >= 1), "
                           f"got {text!r}")
    return bounds


class Replica:
    """One replica: a data plane over the repository, its ASGI app and its peers."""

    def __init__(self, options: ServeOptions, coordinator_name: str) -> None:
        import ray
        from ray import serve

        self.options = options
        self.dataplane = make_dataplane(options)
        self.metrics_server: Any = None
        self.link: ReplicaLink | None = None
        self.coordinator = ray.get_actor(coordinator_name, namespace=NAMESPACE)
        self.replica_id = serve.get_replica_context().replica_id.unique_id
        self.node = ray.util.get_node_ip_address()
        self.asgi_app = make_app(options, self.dataplane, options.transport, None,
                                 self._startup, self._shutdown)

    def __serve_build_asgi_app__(self) -> Any:
        return self.asgi_app

    async def _startup(self) -> None:
        await self.dataplane.manager.load_all()
        settle_heap()
        metrics_url = None
        if self.options.metrics_port is not None:
            self.metrics_server = serve_metrics(self.options.host, self.asgi_app.registry,
                                                self.options.access)
            shown = self.node if is_every_interface(self.options.host) else \
                self.options.host
            host = f"[{shown}]" if ":" in shown else shown
            metrics_url = f"http://{host}:{self.metrics_server.server_port}/metrics"
        self.link = ReplicaLink(self.coordinator, self.dataplane, self.replica_id,
                                self.node, os.getpid(), metrics_url)
        await self.link.join()
        self.dataplane.started = True
        log.info("replica %s ready on %s (pid %d)", self.replica_id, self.node,
                 os.getpid())

    async def _shutdown(self) -> None:
        self.dataplane.begin_shutdown()
        if self.link is not None:
            await self.link.close()
        await self.dataplane.close()
        if self.metrics_server is not None:
            self.metrics_server.shutdown()


def is_every_interface(host: str) -> bool:
    return host in ("", "0.0.0.0", "::")


def is_loopback(host: str) -> bool:
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve_metrics(host: str, registry: Any, access: Access) -> ThreadingHTTPServer:
    """A replica's ``/metrics`` on ``host`` (a port of its own), behind the metrics keys
    as ``tradeoff serve``'s is; served from a daemon thread."""

    class Metrics(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self._answer(404, b"no route: the metrics port serves /metrics")
                return
            try:
                access.check_metrics((k.lower().encode("latin-1"), v.encode("latin-1"))
                                     for k, v in self.headers.items())
            except Unauthorized as exc:
                self._answer(401, str(exc).encode())
                return
            self._answer(200, render(registry), "text/plain; version=0.0.4; charset=utf-8")

        def _answer(self, status: int, body: bytes,
                    content_type: str = "text/plain; charset=utf-8") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            if status == 401:
                self.send_header("WWW-Authenticate", "Bearer")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:  # scrapes are not news
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True
        address_family = socket.AF_INET6 if ":" in host else socket.AF_INET

    server = Server((host, 0), Metrics)
    threading.Thread(target=server.serve_forever, name="replica-metrics",
                     daemon=True).start()
    return server


def _import_serve() -> Any:
    try:
        from ray import serve
    except ImportError:
        raise MissingDependency("serve --ray", "ray[serve]", "ray") from None
    return serve


def deploy(options: ServeOptions, ray_options: RayOptions) -> Any:
    """Start the coordinator, the proxy and the replicas on the connected Ray cluster;
    returns the coordinator's handle once every replica is up."""
    import ray

    serve = _import_serve()
    coordinator = ray.remote(num_cpus=0)(ReplicaCoordinator).options(
        name=ray_options.coordinator_name, namespace=NAMESPACE).remote()
    http: dict[str, Any] = {"host": options.host, "port": options.http_port}
    if options.tls_cert is not None and options.tls_key is not None:
        http.update(ssl_certfile=str(options.tls_cert), ssl_keyfile=str(options.tls_key))
    serve.start(proxy_location="EveryNode" if ray_options.every_node else "HeadOnly",
                http_options=http)
    deployment = serve.deployment(serve.ingress()(Replica), name="tradeoff",
                                  **ray_options.deployment_options())
    serve.run(deployment.bind(options, ray_options.coordinator_name),
              name=ray_options.app_name, route_prefix="/", blocking=False)
    return coordinator


def local_ray_environment(host: str) -> dict[str, str]:
    """The environment a local Ray (``--ray`` alone) starts with: token authentication
    on, with a token of its own (not ``~/.ray/auth_token``, which Ray would otherwise
    read, or write); with a loopback ``host``, every Ray process on 127.0.0.1 (Ray binds
    its servers to loopback only when the node's address is 127.0.0.1, which it allows
    only in its single-machine mode)."""
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    if is_loopback(host):
        env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    return env


def connect(address: str | None, every_node: bool = False, host: str = "127.0.0.1") -> None:
    """Join the Ray cluster at ``address`` (None: start a local one, see
    :func:`local_ray_environment`). With one proxy (on the head), Ray Serve's preference
    for replicas on the proxy's own node is turned off for the Serve actors this job
    starts: it would send every request to the head's replicas until they hold
    ``max_ongoing_requests`` each."""
    if address is None:
        # before Ray is imported: it reads its single-machine mode once, at import
        os.environ.update(local_ray_environment(host))
    _import_serve()
    import ray

    env = {} if every_node else {"RAY_SERVE_PROXY_PREFER_LOCAL_NODE_ROUTING": "0",
                                 "RAY_SERVE_PROXY_PREFER_LOCAL_AZ_ROUTING": "0"}
    try:
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False,
                 include_dashboard=False if address is None else None,
                 _node_ip_address="127.0.0.1" if address is None and is_loopback(host)
                 else None,
                 configure_logging=False, runtime_env={"env_vars": env} if env else None)
    except ray.exceptions.AuthenticationError:
        raise TradeoffError(f"the Ray cluster at {address} refused this process's token: "
                            "give the cluster's token as RAY_AUTH_TOKEN (or a file holding "
                            "it as RAY_AUTH_TOKEN_PATH)") from None
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise TradeoffError(f"cannot reach the Ray cluster at {address}: {exc}; start one "
                            "with `ray start --head`") from None


def serve_on_ray(options: ServeOptions, ray_options: RayOptions) -> None:
    """Run ``tradeoff serve --ray`` until SIGINT/SIGTERM, then take the deployment down."""
    options = replace(options, model_repository=options.model_repository.resolve())
    connect(ray_options.address, ray_options.every_node, options.host)
    serve = _import_serve()
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        coordinator = deploy(options, ray_options)
        import ray

        scheme = "https" if options.tls_cert else "http"
        log.info("Ray Serve proxy (Open Inference Protocol v2, /v1) on %s://%s:%d",
                 scheme, options.host, options.http_port)
        if options.grpc_port is not None:
            log.info("no gRPC under --ray: Ray Serve's proxy carries HTTP only here "
                     "(docs/scale-out.md)")
        if options.metrics_port is not None:
            log.info("/metrics: each replica serves its own on its node (listed below), "
                     "not --metrics-port")
        known: set[str] = set()
        while not stop.wait(1.0):
            members = ray.get(coordinator.replicas.remote())
            for member in members:
                if member["replica"] not in known:
                    known.add(member["replica"])
                    log.info("replica %s on %s, pid %d, metrics %s", member["replica"],
                             member["node"], member["pid"], member["metrics_url"] or "off")
            gone = known - {m["replica"] for m in members}
            for replica in sorted(gone):
                log.info("replica %s is gone", replica)
            known -= gone
    finally:
        log.info("taking the deployment down")
        try:
            serve.delete(ray_options.app_name)
            serve.shutdown()
        finally:
            import ray

            ray.shutdown()
        log.info("stopped")
