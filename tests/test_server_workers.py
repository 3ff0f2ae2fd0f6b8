"""``ragserve serve --workers 2``: real worker processes on one port, under a supervisor (cpu backend, ArguAna)."""
from __future__ import annotations

import json
import os
import signal
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from tests.serverproc import ServerProcess, run_cli, run_load_test, wait_until
from tests.test_server_shutdown import read_response, refuses_connections

QUERIES = ["nuclear power plants are safe", "animal testing for medicine", "school uniforms", "tax on sugar",
           "death penalty deters crime", "vegetarian diet is healthier", "ban on smoking in public places",
           "internet censorship", "space exploration is worth the cost", "gay marriage"]


def worker_pids(parent: int) -> list[int]:
    return [int(p) for p in Path(f"/proc/{parent}/task/{parent}/children").read_text().split()]


def alive(pid: int) -> bool:
    """Running (a zombie the test's own process has not reaped counts as gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def start(index: Path, *extra: str) -> ServerProcess:
    srv = ServerProcess("--index", str(index), "--backend", "cpu", "--workers", "2", "--search-slots", "1", *extra)
    srv.wait_ready()
    return srv


@pytest.fixture(scope="module")
def server(arguana_index):
    srv = start(arguana_index, "--shutdown-grace", "20")
    yield srv
    if srv.proc.poll() is None:
        srv.proc.kill()
        srv.proc.wait()


def search(url: str, query: str) -> tuple[list, str]:
    r = requests.post(url + "/v1/search", json={"query": query, "k": 10}, timeout=60)
    assert r.status_code == 200, r.text
    return [(h["docid"], h["score"]) for h in r.json()["hits"]], r.headers["X-Ragserve-Worker"]


def test_concurrent_searches_match_a_sequential_run_and_both_workers_serve(server):
    sequential = {q: search(server.url, q)[0] for q in QUERIES}
    jobs = [QUERIES[i % len(QUERIES)] for i in range(160)]
    with ThreadPoolExecutor(16) as pool:  # a new connection each: the kernel hands them to either worker
        got = list(pool.map(lambda q: (q, *search(server.url, q)), jobs))
    assert all(hits == sequential[q] for q, hits, _ in got)
    assert {w for _, _, w in got} == {"1", "2"}
    infos = {}
    for _ in range(100):  # /v1/info names the worker that answered
        info = requests.get(server.url + "/v1/info", timeout=10).json()["server"]
        infos[info["worker"]] = info
        if len(infos) == 2:
            break
    assert sorted(infos) == [1, 2] and {i["workers"] for i in infos.values()} == {2}
    assert sorted(i["pid"] for i in infos.values()) == sorted(worker_pids(server.proc.pid))
    ready = requests.get(server.url + "/readyz", timeout=10).json()
    assert ready["ready"] and ready["workers"]["warm"] == 2
    metrics = requests.get(server.url + "/metrics", timeout=10).text
    assert "ragserve_server_workers 2.0" in metrics


def test_load_test_sums_the_queue_metrics_of_every_worker(server):
    from tests.conftest import shared

    s = run_load_test("--url", server.url, "--queries", str(shared("beir-arguana", "queries.jsonl.gz")),
                      "--truncate", "2000", "--clients", "8", "--duration", "3", "--k", "10")
    assert s["exit"] == 0 and s["errors"] == 0 and s["meta"]["workers"] == 2, s
    level = s["levels"][0]
    # The cpu backend launches each request on its own: the launches of both workers add up to the requests.
    assert level["server_queue"]["queries_per_launch"] == 1.0
    assert 0.75 * level["requests"] <= level["server_queue"]["launches"] <= 1.25 * level["requests"], level


def test_sigterm_lets_in_flight_requests_finish_and_stops_every_worker(server):
    pids = worker_pids(server.proc.pid)
    body = json.dumps({"query": "nuclear power plants are safe", "k": 5}).encode()
    with socket.create_connection(("127.0.0.1", server.port), timeout=20) as s:
        s.sendall(b"POST /v1/search HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(body) + body[:10])
        time.sleep(0.3)  # one worker has the headers and part of the body
        t0 = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert wait_until(lambda: refuses_connections(server.port), 10), "still accepting after SIGTERM"
        s.sendall(body[10:])
        status, _, payload = read_response(s)
    assert status == 200 and len(json.loads(payload)["hits"]) == 5
    assert server.wait_exit(20) == 0, server.log()
    assert time.monotonic() - t0 < 10
    assert not [p for p in pids if alive(p)]
    log = server.log()
    assert all(f"worker {w} ragserve.server INFO stopped cleanly" in log for w in (1, 2))


def test_sigint_during_the_warm_up_exits_0(arguana_index):
    srv = ServerProcess("--index", str(arguana_index), "--backend", "cpu", "--workers", "2")
    pids = worker_pids(srv.proc.pid)
    # Right after the listening line, the workers still warming up; the workers see it as SIGTERM (a Ctrl-C
    # reaches the whole group, and they leave SIGINT to the supervisor).
    srv.proc.send_signal(signal.SIGINT)
    assert srv.wait_exit(30) == 0, srv.log()
    assert not [p for p in pids if alive(p)] and "Traceback" not in srv.log()


def test_a_killed_worker_is_reported_and_stops_the_server(arguana_index):
    srv = start(arguana_index)
    first, second = worker_pids(srv.proc.pid)
    os.kill(second, signal.SIGKILL)
    assert srv.wait_exit(30) == 1, srv.log()
    assert srv.log().strip().splitlines()[-1] == (f"ragserve serve: worker 2 (pid {second}) killed by signal 9 "
                                                  f"(SIGKILL); stopping the server")
    assert not alive(first)


def test_workers_stop_when_the_supervisor_is_killed(arguana_index):
    srv = start(arguana_index)
    pids = worker_pids(srv.proc.pid)
    srv.proc.kill()
    srv.proc.wait()
    assert wait_until(lambda: not any(alive(p) for p in pids), 15), "orphaned workers"


@pytest.mark.parametrize("value, message", [
    ("0", "--workers must be between 1 and 64, got 0"),
    ("65", "--workers must be between 1 and 64, got 65"),
    ("two", "argument --workers: invalid int value: 'two'; see 'ragserve serve --help'"),
])
def test_bad_workers_values(arguana_index, value, message):
    r = run_cli("serve", "--index", str(arguana_index), "--port", "0", "--workers", value, timeout=30)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [f"ragserve serve: error: {message}"]


def test_an_error_in_the_workers_is_one_line(tmp_path):
    r = run_cli("serve", "--index", str(tmp_path), "--port", "0", "--workers", "2", "--backend", "cpu", timeout=60)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("ragserve serve: error: ") and str(tmp_path) in lines[0], lines
