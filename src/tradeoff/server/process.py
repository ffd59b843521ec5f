"""Run ``tradeoff serve`` as a child process on free local ports (demo, tests, benchmarks).

    with ServerProcess(Path("models")) as server:
        print(server.url)            # http://127.0.0.1:<port>
"""

from __future__ import annotations

import os
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
from pathlib import Path


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class ServerProcess:
    """A ``tradeoff serve`` child; ``cpus`` pins it with taskset when available."""

    def __init__(self, repository: Path, *, host: str = "127.0.0.1",
                 extra_args: tuple[str, ...] = (), cpus: str | None = None,
                 tls: bool = False, env: dict[str, str] | None = None) -> None:
        self.env = env or {}  # added to this process's environment for the child
        self.repository = Path(repository)
        self.scheme = "https" if tls else "http"
        self.host = host
        self.http_port = free_port(host)
        self.metrics_port = free_port(host)
        self.grpc_port = free_port(host)
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
        env = dict(os.environ, PYTHONUNBUFFERED="1", **self.env)
        self.process = subprocess.Popen(self.command(), stdout=self.log, stderr=subprocess.STDOUT,
                                        env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"tradeoff serve exited with {self.process.returncode}:\n"
                                   f"{self.log_text()[-3000:]}")
            try:
                # readiness only: the certificate is the test's to check, not this poll's
                context = ssl._create_unverified_context() if self.scheme == "https" else None
                with urllib.request.urlopen(f"{self.url}/v2/health/ready", timeout=1,
                                            context=context) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"tradeoff serve was not ready within {timeout:.0f}s:\n"
                           f"{self.log_text()[-3000:]}")

    def log_text(self) -> str:
        return Path(self.log.name).read_text(errors="replace")

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
        self.log.close()
        Path(self.log.name).unlink(missing_ok=True)
