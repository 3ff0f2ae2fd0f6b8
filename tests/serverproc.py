"""Run ``ragserve serve`` as a real process on a free loopback port, for the server tests."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

LISTEN_RE = re.compile(r"listening on (http://127\.0\.0\.1:(\d+))")
# The installed console script, as a user runs it (the venv's bin directory holds it next to python).
RAGSERVE = [str(Path(sys.executable).with_name("ragserve"))]


class ServerProcess:
    """``ragserve serve --port 0 ...``; the port is read from the server's own "listening on" line."""

    def __init__(self, *args: str, env: dict | None = None, startup_timeout: float = 60.0,
                 command: list[str] | None = None) -> None:
        """``command`` replaces ``ragserve serve ARGS`` (e.g. a script that ends by exec-ing the server)."""
        cmd = command or [sys.executable, "-m", "ragserve", "serve", "--host", "127.0.0.1", "--port", "0", *args]
        full_env = {**os.environ, **(env or {})}
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=full_env)
        self.lines: list[str] = []
        self._ready = threading.Event()
        self.url = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(startup_timeout) or not self.url:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError("server did not start:\n" + self.log())
        self.port = int(self.url.rsplit(":", 1)[1])

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append(line)
            m = LISTEN_RE.search(line)
            if m and not self.url:
                self.url = m.group(1)
                self._ready.set()
        self._ready.set()  # stderr closed: the process ended

    def wait_ready(self, timeout: float = 120.0) -> None:
        """Poll /readyz until the model has loaded (it loads in the background after the port opens)."""
        import requests

        def ready() -> bool:
            return requests.get(self.url + "/readyz", timeout=5).status_code == 200

        if not wait_until(ready, timeout, interval=0.2):
            raise RuntimeError("server never became ready:\n" + self.log())

    def log(self) -> str:
        return "".join(self.lines)

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM, then wait for the exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise

    def wait_exit(self, timeout: float) -> int:
        rc = self.proc.wait(timeout)
        self._reader.join(5)
        return rc


def run_cli(*args: str, env: dict | None = None, timeout: float = 60.0) -> subprocess.CompletedProcess:
    """``ragserve ARGS`` to completion (for commands expected to fail fast)."""
    return subprocess.run([sys.executable, "-m", "ragserve", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


def run_main(*args: str) -> subprocess.CompletedProcess:
    """``ragserve ARGS`` through the CLI's ``main`` in this process: the same parsing, output and exit status as
    ``run_cli`` without a fresh interpreter importing torch and transformers (seconds a call on two cores); for
    what needs no process of its own (a process holding a lock, a signal, a start-up: ``run_cli``)."""
    import contextlib
    import io

    from ragserve.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as e:  # argparse's errors, --help
            code = e.code if isinstance(e.code, int) else int(e.code is not None)
    return subprocess.CompletedProcess(["ragserve", *args], code, out.getvalue(), err.getvalue())


def wait_until(predicate, timeout: float, interval: float = 0.02) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def start_model_server(*extra: str) -> ServerProcess:
    """A server over the HotpotQA paragraphs index with the tiny random Llama and cross-encoder of
    ``tests/rag_support.py`` (answers are gibberish, but every method runs for real), once ready."""
    from tests import rag_support

    srv = ServerProcess("--index", str(rag_support.hotpot_index()), "--backend", "cpu",
                        "--model", str(rag_support.tiny_lm()), "--reranker", str(rag_support.tiny_cross_encoder()),
                        "--device", "cpu", *extra)
    srv.wait_ready()
    return srv


def run_load_test(*args: str, timeout: float = 120.0) -> dict:
    """``scripts/load_test.py ARGS --warmup 0 --json``: its report (the script exits 1 on any error)."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "load_test.py"
    r = subprocess.run([sys.executable, str(script), *args, "--warmup", "0", "--json"], capture_output=True, text=True,
                       timeout=timeout)
    assert r.stdout.strip(), r.stderr
    summary = json.loads(r.stdout.strip().splitlines()[-1])
    summary["exit"] = r.returncode
    return summary
