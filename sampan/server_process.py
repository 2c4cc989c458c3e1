"""``ServerProcess``: run ``sampan serve`` as a child process on a free loopback port and wait until
it answers ``/healthz`` (used by the benchmark and the tests; handy for scripts too)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


class ServerProcess:
    """``with ServerProcess(["--task", "ner"]) as server: server.url`` - a running ``sampan serve``.

    Args:
        args: ``sampan serve`` arguments (not --host / --port, which this class sets).
        startup_timeout_s: how long loading the models may take before it gives up (the first start
            exports each Taskflow model once, which takes minutes on a small busy machine).
        env: extra environment variables for the child.
    """

    def __init__(self, args: Sequence[str], startup_timeout_s: float = 600.0, env: dict[str, str] | None = None,
                 host: str = "127.0.0.1"):
        self.args = list(args)
        self.startup_timeout_s = startup_timeout_s
        self.env = {**os.environ, **(env or {})}
        self.host = host
        self.port = 0
        self.proc: subprocess.Popen | None = None
        self._log = tempfile.NamedTemporaryFile(prefix="sampan-serve-", suffix=".log", delete=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def log_text(self) -> str:
        """What the server printed so far (stdout and stderr)."""
        with open(self._log.name, encoding="utf-8", errors="replace") as f:
            return f.read()

    def start(self) -> ServerProcess:
        self.port = free_port(self.host)
        cmd = [sys.executable, "-m", "sampan.cli", "serve", *self.args, "--host", self.host, "--port", str(self.port)]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sampan serve exited with {self.proc.returncode} before answering:\n"
                                   f"{self.log_text()[-4000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as response:
                    if response.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"sampan serve did not answer /healthz within {self.startup_timeout_s:g} s:\n"
                           f"{self.log_text()[-4000:]}")

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 15.0) -> int | None:
        """SIGTERM (uvicorn shuts down gracefully), then SIGKILL if it lingers; returns the exit code."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
        self._log.close()
        os.unlink(self._log.name)
