"""Graceful shutdown of a real ``ragserve serve`` process: SIGTERM stops new connections, lets in-flight
requests finish (still being uploaded, or still being downloaded), then exits 0."""
from __future__ import annotations

import json
import signal
import socket
import time

import pytest

from tests.serverproc import ServerProcess, wait_until


def refuses_connections(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return False
    except OSError:
        return True


def read_response(sock: socket.socket) -> tuple[int, dict, bytes]:
    """A complete HTTP/1.1 response with Content-Length (what flask sends for JSON)."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed before the headers: {buf!r}"
        buf += chunk
    head, body = buf.split(b"\r\n\r\n", 1)
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
    length = int(headers["content-length"])
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed after {len(body)} of {length} body bytes"
        body += chunk
    return status, headers, body


@pytest.fixture
def server(arguana_index):
    srv = ServerProcess("--index", str(arguana_index), "--backend", "cpu", "--shutdown-grace", "20")
    yield srv
    if srv.proc.poll() is None:
        srv.proc.kill()
        srv.proc.wait()


def test_request_being_uploaded_completes_after_sigterm(server):
    body = json.dumps({"query": "nuclear power plants are safe", "k": 5}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as s:
        s.sendall(b"POST /v1/search HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body[:10])
        time.sleep(0.3)  # the server has the headers and part of the body
        server.proc.send_signal(signal.SIGTERM)
        assert wait_until(lambda: refuses_connections(server.port), 10), "still accepting after SIGTERM"
        assert server.proc.poll() is None, "exited with a request in flight"
        s.sendall(body[10:])
        status, _, payload = read_response(s)
    assert status == 200
    hits = json.loads(payload)["hits"]
    assert len(hits) == 5 and hits[0]["score"] >= hits[-1]["score"]
    assert server.wait_exit(20) == 0, server.log()
    assert "stopped cleanly" in server.log()


def test_large_response_being_read_completes_after_sigterm(server):
    # 64 queries x 100 hits with their text: several MB, far more than the socket buffers hold.
    req = json.dumps({"queries": [f"argument {i} about education and school" for i in range(64)], "k": 100}).encode()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16384)
        s.settimeout(20)
        s.connect(("127.0.0.1", server.port))
        s.sendall(b"POST /v1/search HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(req) + req)
        first = s.recv(4096)  # the response has started; most of it is still on the server
        assert first.startswith(b"HTTP/1.1 200")
        time.sleep(0.3)
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        assert server.proc.poll() is None, "exited while a response was still being sent"
        data = bytearray(first)
        while b"\r\n\r\n" not in data:
            data += s.recv(65536)
        head, _, body = bytes(data).partition(b"\r\n\r\n")
        length = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0].split(b":")[1])
        body = bytearray(body)
        while len(body) < length:
            chunk = s.recv(1 << 20)
            assert chunk, f"connection closed after {len(body)} of {length} body bytes"
            body += chunk
    assert length > 2_000_000
    results = json.loads(body)["results"]
    assert len(results) == 64 and all(len(r["hits"]) == 100 for r in results)
    assert server.wait_exit(20) == 0, server.log()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_idle_server_exits_promptly(server, sig):
    t0 = time.monotonic()
    server.proc.send_signal(sig)
    assert server.wait_exit(10) == 0, server.log()
    assert time.monotonic() - t0 < 5


def test_grace_period_bounds_the_wait(arguana_index):
    srv = ServerProcess("--index", str(arguana_index), "--backend", "cpu", "--shutdown-grace", "0.5")
    with socket.create_connection(("127.0.0.1", srv.port), timeout=20) as s:
        s.sendall(b"POST /v1/search HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 100\r\n\r\n{")  # a body that never finishes arriving
        time.sleep(0.3)
        t0 = time.monotonic()
        srv.proc.send_signal(signal.SIGTERM)
        assert srv.wait_exit(15) == 1
    assert time.monotonic() - t0 < 5
    assert "unfinished" in srv.log()
