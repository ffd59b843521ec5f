"""Run ``tradeoff serve`` as a child process on free local ports (demo, tests, benchmarks).

    with ServerProcess(Path("models")) as server:
        print(server.url)            # http://127.0.0.1:<port>
    with started([ServerProcess(a), ServerProcess(b)]) as (first, second):
        ...                          # both up; both stopped at the end
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

from tradeoff.errors import ServerStartError

__all__ = [
    "PARENT_PID_ENV",
    "RAY_DEFAULT_PORTS",
    "LocalRayCluster",
    "ServerProcess",
    "free_port",
    "free_ports",
    "source_tree",
    "started",
]


# set for a server this module starts: it stops once that process is gone (server/runner.py)
PARENT_PID_ENV = "TRADEOFF_PARENT_PID"


@contextlib.contextmanager
def started(servers: list[ServerProcess]) -> Iterator[list[ServerProcess]]:
    """Start each server in turn; stop them all (and close their logs) at the end, also
    when one of them fails to start."""
    up: list[ServerProcess] = []
    try:
        for server in servers:
            up.append(server.start())
        yield up
    finally:
        for server in up:
            server.stop()
            server.close_log()


def free_port(host: str = "127.0.0.1") -> int:
    return free_ports(1, host)[0]


# ports a Ray node takes by default whatever else is asked: a free port picked for the GCS
# must not be one of them (the OS hands out 52365 as readily as any other)
RAY_DEFAULT_PORTS = frozenset({8265, 52365, 6379, 10001})


def _ray_free_port() -> int:
    """A free port on 127.0.0.2 that no Ray component claims by default."""
    while True:
        port = free_port("127.0.0.2")
        if port not in RAY_DEFAULT_PORTS and not 10002 <= port <= 19999:  # workers' range
            return port


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` different free ports (each socket stays bound until all are picked: a
    port just closed may be handed out again at once)."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket())
            sock.bind((host, 0))
            ports.append(sock.getsockname()[1])
        return ports


def source_tree(value: str) -> Path:
    """An argparse type: the ``src`` folder of another checkout, to serve from it with
    ``env={"PYTHONPATH": ...}`` (a benchmark's before and after)."""
    path = Path(value).resolve()
    if not (path / "tradeoff" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(
            f"{value}: no tradeoff package there; give the src folder of another checkout "
            "(git worktree add DIR COMMIT, then DIR/src)")
    return path


class ServerProcess:
    """A ``tradeoff serve`` child; ``cpus`` pins it with taskset when available."""

    def __init__(self, repository: Path, *, host: str = "127.0.0.1",
                 extra_args: tuple[str, ...] = (), cpus: str | None = None,
                 tls: bool = False, env: dict[str, str] | None = None) -> None:
        self.env = env or {}  # added to this process's environment for the child
        self.repository = Path(repository)
        self.scheme = "https" if tls else "http"
        self.host = host
        self.http_port, self.metrics_port, self.grpc_port = free_ports(3, host)
        self._picked = (self.http_port, self.metrics_port, self.grpc_port)
        self.extra_args = extra_args
        self.cpus = cpus
        self.process: subprocess.Popen[bytes] | None = None
        self.log = tempfile.NamedTemporaryFile(prefix="tradeoff-serve-", suffix=".log",
                                               delete=False)

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.metrics_port}/metrics"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "tradeoff", "serve", "--model-repository",
               str(self.repository), "--host", self.host, "--http-port", str(self.http_port),
               "--metrics-port", str(self.metrics_port), "--grpc-port", str(self.grpc_port),
               *self.extra_args]
        if self.cpus is not None and shutil.which("taskset"):
            cmd = ["taskset", "-c", self.cpus, *cmd]
        return cmd

    def start(self, timeout: float = 120.0) -> ServerProcess:
        """Start and wait until ready; on failure the child is stopped, its log closed,
        and RuntimeError carries the log's end. Ports this object picked that another
        process took between the pick and the child's bind (a free port is free only
        until someone uses it) are picked again, twice at most."""
        for _ in range(2):
            try:
                return self._start(timeout)
            except ServerStartError as exc:
                taken = "Address already in use" in str(exc)
                if not taken or self._ports() != self._picked:
                    raise
                self.log = tempfile.NamedTemporaryFile(prefix="tradeoff-serve-", suffix=".log",
                                                       delete=False)
                self.http_port, self.metrics_port, self.grpc_port = free_ports(3, self.host)
                self._picked = self._ports()
        return self._start(timeout)

    def _ports(self) -> tuple[int, int, int]:
        return self.http_port, self.metrics_port, self.grpc_port

    def _start(self, timeout: float) -> ServerProcess:
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        env[PARENT_PID_ENV] = str(os.getpid())
        self.process = subprocess.Popen(self.command(), stdout=self.log, stderr=subprocess.STDOUT,
                                        env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self._fail(f"tradeoff serve exited with {self.process.returncode}")
            try:
                # readiness only: the certificate is the test's to check, not this poll's
                context = ssl._create_unverified_context() if self.scheme == "https" else None
                with urllib.request.urlopen(f"{self.url}/v2/health/ready", timeout=1,
                                            context=context) as r:
                    if r.status == 200 and self._every_front_end_ready():
                        return self
            # not listening yet, or something else answers there (our child then exits)
            except (urllib.error.URLError, ConnectionError, TimeoutError,
                    http.client.HTTPException):
                pass
            time.sleep(0.1)
        self._fail(f"tradeoff serve was not ready within {timeout:.0f}s")

    def _every_front_end_ready(self) -> bool:
        """With ``--workers N``: whether all N front ends serve, not only the first."""
        if "--workers" not in self.extra_args:
            return True
        workers = self.extra_args[self.extra_args.index("--workers") + 1]
        return int(workers) < 2 or f"ready: {workers} front ends" in self.log_text()

    def _fail(self, why: str) -> NoReturn:
        self.stop()
        raise ServerStartError(f"{why}:\n{self.close_log()[-3000:]}")

    def log_text(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def close_log(self) -> str:
        """Close and remove the child's log; returns what it held."""
        text = self.log_text()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)
        return text

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM, wait, and return the exit code (SIGKILL after ``timeout``)."""
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return self.process.returncode

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.close_log()


class LocalRayCluster:
    """A Ray cluster of ``nodes`` nodes on this machine, each a ``ray start --block`` child
    on a loopback address of its own (127.0.0.2, 127.0.0.3, ...), so no traffic leaves
    loopback. It has a token of its own (Ray's token authentication stays on): ``env``
    holds what a driver needs to join it, and nothing in ``~/.ray`` is read or written.
    Stopping it ends its own processes only (not every Ray of the machine, as ``ray
    stop`` would).

        with LocalRayCluster(nodes=2) as cluster:
            cluster.address          # 127.0.0.2:<port>, for --ray
            cluster.env              # for the drivers: serve --ray, bench --ray
    """

    def __init__(self, nodes: int = 2, cpus_per_node: float = 1,
                 object_store_bytes: int = 200 << 20,
                 affinity: tuple[str, ...] | None = None) -> None:
        self.nodes = nodes
        self.affinity = affinity  # node k's processes run on these CPUs (taskset -c)
        self.cpus_per_node = cpus_per_node
        self.object_store_bytes = object_store_bytes
        self.port = _ray_free_port()
        self.address = f"127.0.0.2:{self.port}"
        self.temp_dir = tempfile.mkdtemp(prefix="tradeoff-ray-")
        self.log = tempfile.NamedTemporaryFile(prefix="tradeoff-ray-", suffix=".log",
                                               delete=False)
        self.env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32),
                    "RAY_USAGE_STATS_ENABLED": "0"}
        self.processes: list[subprocess.Popen[bytes]] = []

    def _node_env(self) -> dict[str, str]:
        # every process of the cluster carries TRADEOFF_RAY_CLUSTER, so stop finds them;
        # Ray's own metrics export (a Prometheus port on all interfaces) is not used here
        return dict(os.environ, **self.env, TRADEOFF_RAY_CLUSTER=self.temp_dir,
                    RAY_enable_metrics_collection="0")

    def _start_node(self, k: int, *args: str, timeout: float = 120.0) -> None:
        command = [str(Path(sys.executable).with_name("ray")), "start", "--block", *args]
        if self.affinity and shutil.which("taskset"):
            command = ["taskset", "-c", self.affinity[k % len(self.affinity)], *command]
        process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT,
                                   env=self._node_env(), start_new_session=True)
        self.processes.append(process)
        deadline = time.monotonic() + timeout
        while self._log_text().count("Ray runtime started.") <= k:
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ray start of node {k} failed:\n"
                                   f"{self._log_text()[-3000:]}")
            time.sleep(0.2)

    def _log_text(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

    def start(self) -> LocalRayCluster:
        common = ("--num-cpus", f"{self.cpus_per_node:g}", "--object-store-memory",
                  str(self.object_store_bytes), "--disable-usage-stats")
        try:
            self._start_node(0, "--head", "--node-ip-address", "127.0.0.2", "--port",
                             str(self.port), "--include-dashboard=false", "--no-monitor",
                             "--ray-client-server-port", str(_ray_free_port()),
                             "--temp-dir", self.temp_dir, *common)
            for k in range(1, self.nodes):
                self._start_node(k, "--address", self.address, "--node-ip-address",
                                 f"127.0.0.{2 + k}", *common)
        except Exception:
            self.stop()
            raise
        return self

    def pids(self) -> set[int]:
        """The processes of this cluster now (its nodes' and their workers')."""
        found = set()
        marker = f"TRADEOFF_RAY_CLUSTER={self.temp_dir}".encode()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    if marker in (entry / "environ").read_bytes().split(b"\0"):
                        found.add(int(entry.name))
                except OSError:  # gone, or not ours to read
                    continue
        return found | {p.pid for p in self.processes if p.poll() is None}

    def stop(self) -> None:
        """SIGTERM each node (the others first, then the head), which stops its
        processes; whatever of this cluster is left after that gets SIGKILL."""
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        shutil.rmtree(self.temp_dir, ignore_errors=True)

    def __enter__(self) -> LocalRayCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)
