"""The server's parts on their own: the generator queue, Prometheus rendering, auth helpers."""
from __future__ import annotations

import threading
import time

import pytest

from ragserve.server.auth import bearer_matches, is_loopback_host
from ragserve.server.errors import ApiError
from ragserve.server.generation_queue import GenerationQueue
from ragserve.server.metrics import Registry, ServerMetrics


def test_generation_jobs_never_overlap_and_keep_order():
    q = GenerationQueue(max_pending=64, metrics=ServerMetrics())
    running, overlaps, order = [0], [], []
    lock = threading.Lock()

    def job(i):
        def run():
            with lock:
                running[0] += 1
                overlaps.append(running[0])
            time.sleep(0.002)
            with lock:
                running[0] -= 1
            order.append(i)
            return i * i
        return run

    results = [None] * 40

    def client(i):
        results[i] = q.run(job(i), time.monotonic() + 30)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    q.shutdown()
    assert results == [i * i for i in range(40)]
    assert max(overlaps) == 1  # one job on the generator at a time
    assert sorted(order) == list(range(40))


def test_concurrent_jobs_run_up_to_the_concurrency_and_count_as_pending():
    q = GenerationQueue(max_pending=5, metrics=ServerMetrics(), concurrency=3)
    gate, lock = threading.Event(), threading.Lock()
    running, peak = [0], [0]

    def job():
        with lock:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
        gate.wait(10)
        with lock:
            running[0] -= 1

    futures = [q.submit(job) for _ in range(5)]  # three run, two wait
    time.sleep(0.2)
    assert running[0] == 3 and q.pending == 5
    with pytest.raises(ApiError) as e:
        q.submit(job)
    assert e.value.status == 503
    gate.set()
    for f in futures:
        f.result(5)
    assert peak[0] == 3 and q.pending == 0
    q.shutdown()


def test_full_queue_is_503_and_recovers():
    m = ServerMetrics()
    q = GenerationQueue(max_pending=2, metrics=m)
    gate = threading.Event()
    f1 = q.submit(gate.wait)
    f2 = q.submit(gate.wait)
    with pytest.raises(ApiError) as e:
        q.submit(lambda: 1)
    assert e.value.status == 503 and e.value.headers["Retry-After"]
    assert "ragserve_generation_queue_depth 2.0" in m.render()
    gate.set()
    f1.result(5), f2.result(5)
    assert q.run(lambda: 7, time.monotonic() + 5) == 7
    assert "ragserve_generation_queue_depth 0.0" in m.render()
    q.shutdown()


def test_timeout_drops_a_queued_job_and_abandons_a_running_one():
    q = GenerationQueue(max_pending=8, metrics=ServerMetrics())
    gate = threading.Event()
    ran = []
    blocker = q.submit(lambda: (gate.wait(10), ran.append("blocker")))
    with pytest.raises(ApiError) as e:  # queued behind the blocker: cancelled, never runs
        q.run(lambda: ran.append("queued"), time.monotonic() + 0.2)
    assert e.value.status == 504 and "queue" in e.value.message
    gate.set()
    blocker.result(5)
    with pytest.raises(ApiError) as e:  # already running when the deadline passes
        q.run(lambda: (time.sleep(0.5), ran.append("slow")), time.monotonic() + 0.1)
    assert e.value.status == 504 and "generating" in e.value.message
    q.shutdown()
    assert ran == ["blocker", "slow"]


def test_prometheus_text_format():
    r = Registry()
    c = r.counter("x_total", "Things.")
    h = r.histogram("lat_seconds", "Latency.", buckets=(0.1, 1.0))
    c.inc(path='a"b\\c\nd')
    c.inc(2, path='a"b\\c\nd')
    for v in (0.05, 0.1, 0.5, 3.0):
        h.observe(v, ep="/s")
    text = r.render()
    assert '# TYPE x_total counter\nx_total{path="a\\"b\\\\c\\nd"} 3.0\n' in text
    assert 'lat_seconds_bucket{ep="/s",le="0.1"} 2\n' in text  # le is inclusive
    assert 'lat_seconds_bucket{ep="/s",le="1.0"} 3\n' in text
    assert 'lat_seconds_bucket{ep="/s",le="+Inf"} 4\n' in text
    assert 'lat_seconds_sum{ep="/s"} 3.65\n' in text and 'lat_seconds_count{ep="/s"} 4\n' in text


def test_bearer_and_loopback():
    assert bearer_matches("Bearer s3cret", "s3cret") and bearer_matches("bearer  s3cret ", "s3cret")
    for bad in (None, "", "s3cret", "Basic s3cret", "Bearer s3cre", "Bearer s3cret2", "Bearer \udcff"):
        assert not bearer_matches(bad, "s3cret")
    for host in ("127.0.0.1", "127.8.9.10", "::1", "[::1]", "localhost"):
        assert is_loopback_host(host), host
    for host in ("0.0.0.0", "::", "10.1.2.3", "192.168.0.1", "8.8.8.8", "no-such-host.invalid"):
        assert not is_loopback_host(host), host
