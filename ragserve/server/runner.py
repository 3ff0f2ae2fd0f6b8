"""Serve a WSGI app with waitress, and on SIGTERM/SIGINT stop accepting, finish in-flight requests, exit.

waitress's own ``run()`` has no graceful stop (a signal just kills the loop), so this drives its event loop
itself: the loop polls a stop flag, then keeps running only until the in-flight requests have been answered
and their bytes written, bounded by a grace period.
"""
from __future__ import annotations

import logging
import signal
import socket
import threading
import time
from typing import Callable, Iterable

from waitress import wasyncore
from waitress.adjustments import Adjustments
from waitress.channel import HTTPChannel
from waitress.server import BaseWSGIServer, create_server

from ragserve.server.wsgi import ClosingIterable

log = logging.getLogger("ragserve.server")
POLL_S = 0.1  # how often the loop looks at the stop flag (signal handlers cannot safely wake it)


class InFlight:
    """WSGI middleware counting requests whose response iterable has not been closed yet."""

    def __init__(self, app: Callable) -> None:
        self.app = app
        self.count = 0
        self._lock = threading.Lock()

    def _add(self, n: int) -> None:
        with self._lock:
            self.count += n

    def __call__(self, environ: dict, start_response: Callable) -> Iterable[bytes]:
        self._add(1)
        try:
            body = self.app(environ, start_response)
        except BaseException:
            self._add(-1)
            raise
        return ClosingIterable(body, lambda: self._add(-1))


def _busy_channels(socket_map: dict) -> int:
    """Connections with a request being received, queued, run or written out."""
    return sum(1 for d in list(socket_map.values()) if isinstance(d, HTTPChannel)
               and d.connected and (d.requests or d.total_outbufs_len or d.request is not None))


def bind_sockets(host: str, port: int, backlog: int = 1024) -> list[socket.socket]:
    """Listening sockets for ``host:port`` as waitress itself would bind them (one per address the host resolves
    to), for worker processes to share. OSError when the port is taken."""
    socks = []
    try:
        for family, socktype, proto, sockaddr in Adjustments(host=host, port=port).listen:
            s = socket.socket(family, socktype, proto)
            socks.append(s)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            s.bind(sockaddr)
            s.listen(backlog)
    except OSError:
        for s in socks:
            s.close()
        raise
    return socks


def serve(app: Callable, host: str, port: int, threads: int, grace_s: float,
          on_listening: Callable[[list[tuple[str, int]]], None], stop: threading.Event | None = None,
          sockets: list[socket.socket] | None = None,
          stop_signals: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGINT), **waitress_options) -> int:
    """Run until one of ``stop_signals`` arrives (or ``stop`` is set, e.g. when the model fails to load), then drain.
    0 when every in-flight request finished within ``grace_s``. ``sockets``: listen on these already bound
    sockets (a worker process of ``--workers``) instead of binding ``host:port``."""
    counted = InFlight(app)
    where = {"sockets": sockets} if sockets else {"host": host, "port": port}
    server = create_server(counted, threads=threads, ident="ragserve", **where, **waitress_options)
    socket_map = server.map if hasattr(server, "map") else server._map
    listeners = [d for d in socket_map.values() if isinstance(d, BaseWSGIServer)]
    signals = {"count": 0}

    def on_signal(signum: int, _frame) -> None:
        signals["count"] += 1
        if signals["count"] > 1:
            log.warning("second signal: exiting without waiting for in-flight requests")

    previous = {s: signal.signal(s, on_signal) for s in stop_signals}
    try:
        on_listening([(d.effective_host, d.effective_port) for d in listeners])
        stop = stop or threading.Event()
        while not signals["count"] and not stop.is_set():
            wasyncore.loop(timeout=POLL_S, map=socket_map, use_poll=True, count=1)
        for d in listeners:  # stop accepting; the trigger stays so worker threads can still wake the loop
            wasyncore.dispatcher.close(d)
        log.info("shutting down: finishing %d in-flight request(s)", counted.count)
        deadline = time.monotonic() + grace_s
        while (counted.count or _busy_channels(socket_map)) and signals["count"] < 2:
            if time.monotonic() >= deadline:
                break
            wasyncore.loop(timeout=POLL_S / 4, map=socket_map, use_poll=True, count=1)
        unfinished = counted.count + _busy_channels(socket_map)
        listeners[0].task_dispatcher.shutdown(cancel_pending=True, timeout=1)
        wasyncore.close_all(socket_map)
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    if unfinished:
        log.warning("stopped with %d request(s) unfinished after the %.0f s grace period", unfinished, grace_s)
        return 1
    log.info("stopped cleanly")
    return 0
