"""``ragserve serve --workers N``: N server processes on the same listening sockets, under one supervisor.

One Python process tops out at a few hundred requests a second (flask and waitress hold the GIL for most of a
request), far below what a device backend's batched launches can take. So the parent binds the sockets, then
forks N workers; each opens the index with its own backend, device queue and warm-up, and accepts from the
shared sockets (the kernel hands each new connection to one of them). Forking happens before anything starts
a thread or touches a device (the parent only parses flags and binds), so each worker initialises CUDA, numba's
thread pool and its model itself.

The parent supervises; it serves nothing:
- it prints the "listening on" line once every worker has opened its index (an error in a worker before that,
  such as a bad index, is printed as the one error line, exit 2);
- ``/readyz`` on any worker is 200 only once every worker has warmed up (the workers share one flag each), so a
  load balancer never reaches a cold worker after its check passed;
- SIGTERM or SIGINT to the parent is passed to every worker as one SIGTERM (a second one: stop without waiting),
  and each finishes its in-flight requests; the exit status is the worst of theirs (0 when all drained);
- a worker that dies (a crash, the OOM killer) is reported on one line, the others are stopped gracefully and
  the server exits 1: it does not restart workers, since the same index on the same device would likely fail
  the same way, and a process manager (systemd, Kubernetes) sees the failure and restarts the whole server;
- a worker whose parent has died stops by itself (its end of the control pipe reads EOF).
"""
from __future__ import annotations

import json
import logging
import mmap
import os
import select
import signal
import socket
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Callable

log = logging.getLogger("ragserve.server")
MAX_WORKERS = 64
POLL_S = 0.1
KILL_AFTER_S = 10.0  # after a worker's own grace period: the parent's last resort


@dataclass
class WorkerInfo:
    """Which worker this process is, and the warm-up flags all workers share (``/readyz``, ``/v1/info``)."""

    id: int = 1  # 1..count
    count: int = 1
    pid: int = field(default_factory=os.getpid)
    _flags: mmap.mmap | None = None  # one byte a worker: 1 once warmed up; None for a single process
    _channel: socket.socket | None = None  # to the parent: events as JSON lines

    def mark_warm(self) -> None:
        if self._flags is not None:
            self._flags[self.id - 1] = 1

    def warm_count(self, self_warm: bool) -> int:
        """Workers warmed up (a single process: whether it is)."""
        return sum(self._flags[:self.count]) if self._flags is not None else int(self_warm)

    def describe(self) -> dict:
        return {"workers": self.count, "worker": self.id, "pid": self.pid}

    def send(self, **event) -> None:
        if self._channel is not None:
            self._channel.sendall(json.dumps(event).encode() + b"\n")


class WorkerFailed(Exception):
    """The server could not start or keep its workers running; ``status`` is the exit status to use."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def _exit_text(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return f"killed by signal {sig} ({signal.Signals(sig).name})" if sig in signal.Signals._value2member_map_ \
            else f"killed by signal {sig}"
    return f"exited with status {os.waitstatus_to_exitcode(status)}"


class _Worker:
    def __init__(self, wid: int, pid: int, channel: socket.socket) -> None:
        self.id = wid
        self.pid = pid
        self.channel = channel
        self.buf = b""
        self.exit: int | None = None  # exit code, once reaped
        self.listening: dict | None = None
        self.error: str | None = None


def run_workers(count: int, sockets: list[socket.socket], worker_main: Callable[[WorkerInfo, threading.Event], int],
                on_listening: Callable[[dict], None], grace_s: float) -> int:
    """Fork ``count`` workers running ``worker_main(info, stop)`` (its return value is the worker's exit status;
    a ``WorkerFailed`` or any exception from it is reported to the parent), supervise them, return the exit
    status. ``on_listening(event)`` runs once every worker has sent its ``listening`` event. Raises
    ``WorkerFailed`` with the first worker's error (status 2) or a worker's death (status 1)."""
    # A forked child would inherit locks held by threads it does not have. The parent has imported numpy, whose
    # OpenBLAS pool stops itself around a fork (pthread_atfork); nothing here may start a Python thread.
    if threading.active_count() != 1:
        raise RuntimeError("run_workers must fork from a single-threaded process")
    flags = mmap.mmap(-1, count)  # shared with the children (MAP_SHARED)
    workers: list[_Worker] = []
    stop_requests = {"n": 0}

    def on_signal(_signum: int, _frame) -> None:
        stop_requests["n"] += 1

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        for wid in range(1, count + 1):
            mine, theirs = socket.socketpair()
            pid = os.fork()
            if pid == 0:  # the worker: never returns into the parent's stack
                mine.close()
                for w in workers:
                    w.channel.close()
                _worker_process(WorkerInfo(wid, count, os.getpid(), flags, theirs), worker_main)
            theirs.close()
            mine.setblocking(False)
            workers.append(_Worker(wid, pid, mine))
        for s in sockets:  # the workers hold them; once they all stop accepting, the port refuses connections
            s.close()
        return _supervise(workers, flags, stop_requests, on_listening, grace_s)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        for w in workers:
            w.channel.close()


def _worker_process(info: WorkerInfo, worker_main: Callable[[WorkerInfo, threading.Event], int]) -> None:
    stop = threading.Event()
    # The parent relays SIGINT (a terminal's Ctrl-C reaches the whole group) as one SIGTERM; until the server
    # loop installs its own handler, SIGTERM just asks it to stop as soon as it runs.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, lambda _s, _f: stop.set())
    status = 1
    try:
        threading.Thread(target=_watch_parent, args=(info._channel, stop), name="parent-watch", daemon=True).start()
        status = worker_main(info, stop)
    except WorkerFailed as e:
        info.send(event="error", message=str(e), status=e.status)
        status = e.status
    except BaseException:  # a bug: the traceback, then the parent reports the exit
        traceback.print_exc()
        status = 1
    finally:
        logging.shutdown()
        os._exit(status)


def _watch_parent(channel: socket.socket, stop: threading.Event) -> None:
    """EOF on the control pipe: the parent is gone, so stop (finishing what is in flight)."""
    try:
        while channel.recv(1):
            pass
    except OSError:
        pass
    stop.set()


def _supervise(workers: list[_Worker], flags: mmap.mmap, stop_requests: dict, on_listening: Callable[[dict], None],
               grace_s: float) -> int:
    relayed = 0  # SIGTERMs passed to the workers
    announced = warm_logged = False
    failure: WorkerFailed | None = None
    kill_at = None
    while any(w.exit is None for w in workers):
        if stop_requests["n"] > relayed or (failure is not None and relayed == 0):
            relayed += 1
            if relayed == 1:
                if failure is None:  # a failure is told on its own line
                    log.info("stopping %d worker(s)", sum(w.exit is None for w in workers))
                kill_at = time.monotonic() + grace_s + KILL_AFTER_S
            _signal_all(workers, signal.SIGTERM)
        if kill_at is not None and time.monotonic() > kill_at:
            log.warning("workers still running %.0f s after the grace period: killing them", KILL_AFTER_S)
            _signal_all(workers, signal.SIGKILL)
            kill_at = None
        live = [w.channel for w in workers if w.exit is None]
        readable, _, _ = select.select(live, [], [], POLL_S) if live else ([], [], [])
        for w in workers:
            if w.channel in readable:
                _read_events(w)
        for w in workers:
            if w.exit is None:
                pid, status = os.waitpid(w.pid, os.WNOHANG)
                if pid:
                    _read_events(w)  # what it said before it went
                    w.exit = os.waitstatus_to_exitcode(status)
                    if failure is None and relayed == 0:
                        failure = (WorkerFailed(w.error, 2) if w.error else
                                   WorkerFailed(f"worker {w.id} (pid {w.pid}) {_exit_text(status)}; stopping the "
                                                f"server", 1))
        if failure is None and any(w.error for w in workers):  # it will exit; stop the others meanwhile
            first = next(w for w in workers if w.error)
            failure = WorkerFailed(first.error, 2)
        if not announced and failure is None and all(w.listening for w in workers):
            announced = True
            on_listening(workers[0].listening)
        if announced and not warm_logged and sum(flags[:len(workers)]) == len(workers):
            warm_logged = True
            log.info("all %d workers warmed up: ready", len(workers))
    if failure is not None:
        raise failure
    return 0 if all(w.exit == 0 for w in workers) else 1


def _signal_all(workers: list[_Worker], sig: signal.Signals) -> None:
    for w in workers:
        if w.exit is None:
            try:
                os.kill(w.pid, sig)
            except ProcessLookupError:
                pass


def _read_events(w: _Worker) -> None:
    try:
        while chunk := w.channel.recv(65536):
            w.buf += chunk
    except (BlockingIOError, InterruptedError):
        pass
    except OSError:
        return
    *lines, w.buf = w.buf.split(b"\n")
    for line in lines:
        event = json.loads(line)
        if event["event"] == "listening":
            w.listening = event
        elif event["event"] == "error" and w.error is None:
            w.error = event["message"]
