"""A live `toolwire dev` for the tests: a binary built from this checkout (or
$TOOLWIRE_BIN), NATS and HTTP on free loopback ports, a temporary data folder
with the recorder on SQLite, authentication on, and an API token made with
`toolwire tokens create`. Used as a context manager; it stops the process."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import threading
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
READY_WITHIN_S = 90


class DevServer:
    def __init__(self, org: str = "acme", role: str = "approver"):
        self.org, self.role = org, role
        self.url = self.token = ""
        self._proc = None
        self._dir = ""
        self._stderr: list[str] = []

    def logs(self) -> str:
        return "".join(self._stderr)

    def __enter__(self) -> "DevServer":
        self._dir = tempfile.mkdtemp(prefix="toolwire-pyclient-test-")
        try:
            self._start()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _start(self) -> None:
        bin_ = os.environ.get("TOOLWIRE_BIN")
        if not bin_:
            bin_ = os.path.join(self._dir, "toolwire")
            env = dict(os.environ, GOFLAGS="-buildvcs=false")
            subprocess.run(["go", "build", "-o", bin_, "./cmd/toolwire"], cwd=REPO, env=env, check=True)
        data = os.path.join(self._dir, "data")
        db = "sqlite:" + os.path.join(data, "recorder.db")
        env = dict(os.environ, TOOLWIRE_AUTH="on")
        env.pop("DATABASE_URL", None)
        self._proc = subprocess.Popen(
            [bin_, "dev", "--data-dir", data, "--http", "127.0.0.1:0", "--nats-listen", "127.0.0.1:0", "--database-url", db],
            cwd=self._dir, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        )
        ready = threading.Event()

        def read() -> None:
            for line in self._proc.stderr:
                self._stderr.append(line)
                m = re.search(r"API at (http://\S+)/v1/runs", line)
                if m:
                    self.url = m.group(1)
                if self.url and "all services running" in line:
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        deadline = time.monotonic() + READY_WITHIN_S
        while not ready.wait(0.1):
            if self._proc.poll() is not None:
                raise RuntimeError(f"toolwire dev exited ({self._proc.returncode}) before it was ready:\n{self.logs()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"toolwire dev was not ready within {READY_WITHIN_S}s:\n{self.logs()}")
        out = subprocess.run(
            [bin_, "tokens", "create", "--database-url", db, "--name", "client-tests", "--org", self.org, "--role", self.role],
            cwd=self._dir, env=env, check=True, capture_output=True, text=True, timeout=60,
        )
        self.token = out.stdout.strip()

    def __exit__(self, *exc) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(20)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._dir:
            shutil.rmtree(self._dir, ignore_errors=True)
