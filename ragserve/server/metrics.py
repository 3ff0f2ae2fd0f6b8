"""Counters, gauges and histograms rendered in the Prometheus text exposition format (version 0.0.4).

Small and dependency-free: the server needs a handful of metric families, all updated under one lock.
"""
from __future__ import annotations

import math
import threading
from bisect import bisect_left

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
WAIT_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 1.0, 10.0)
SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)

LabelKey = tuple[tuple[str, str], ...]


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(key: LabelKey, extra: tuple[tuple[str, str], ...] = ()) -> str:
    items = key + extra
    if not items:
        return ""
    return "{" + ",".join(f'{k}="{_escape(v)}"' for k, v in items) + "}"


def _num(v: float) -> str:
    if math.isinf(v):
        return "+Inf" if v > 0 else "-Inf"
    return repr(float(v))


class _Family:
    kind = ""

    def __init__(self, name: str, help_text: str, lock: threading.Lock) -> None:
        self.name = name
        self.help = help_text
        self._lock = lock

    def header(self) -> list[str]:
        return [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} {self.kind}"]


class Counter(_Family):
    kind = "counter"

    def __init__(self, name: str, help_text: str, lock: threading.Lock) -> None:
        super().__init__(name, help_text, lock)
        self._values: dict[LabelKey, float] = {}

    def inc(self, amount: float = 1.0, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def render(self) -> list[str]:
        return self.header() + [f"{self.name}{_labels(k)} {_num(v)}" for k, v in sorted(self._values.items())]


class Gauge(_Family):
    kind = "gauge"

    def __init__(self, name: str, help_text: str, lock: threading.Lock) -> None:
        super().__init__(name, help_text, lock)
        self._values: dict[LabelKey, float] = {}

    def set(self, value: float, **labels: str) -> None:
        with self._lock:
            self._values[tuple(sorted(labels.items()))] = value

    def add(self, amount: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def render(self) -> list[str]:
        return self.header() + [f"{self.name}{_labels(k)} {_num(v)}" for k, v in sorted(self._values.items())]


class Histogram(_Family):
    kind = "histogram"

    def __init__(self, name: str, help_text: str, lock: threading.Lock,
                 buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        super().__init__(name, help_text, lock)
        self.buckets = tuple(sorted(buckets))
        self._series: dict[LabelKey, list] = {}  # key -> [bucket counts (non-cumulative) + overflow, sum, count]

    def observe(self, value: float, **labels: str) -> None:
        key = tuple(sorted(labels.items()))
        with self._lock:
            s = self._series.get(key)
            if s is None:
                s = self._series[key] = [[0] * (len(self.buckets) + 1), 0.0, 0]
            s[0][bisect_left(self.buckets, value)] += 1  # le is inclusive: value == bound goes in that bucket
            s[1] += value
            s[2] += 1

    def render(self) -> list[str]:
        out = self.header()
        for key, (counts, total, n) in sorted(self._series.items()):
            cum = 0
            for bound, c in zip(self.buckets + (math.inf,), counts):
                cum += c
                out.append(f"{self.name}_bucket{_labels(key, (('le', _num(bound)),))} {cum}")
            out.append(f"{self.name}_sum{_labels(key)} {_num(total)}")
            out.append(f"{self.name}_count{_labels(key)} {n}")
        return out


class Registry:
    """Metric families in registration order; ``render`` is the body of ``GET /metrics``."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: list[_Family] = []

    def counter(self, name: str, help_text: str) -> Counter:
        return self._add(Counter(name, help_text, self._lock))

    def gauge(self, name: str, help_text: str) -> Gauge:
        return self._add(Gauge(name, help_text, self._lock))

    def histogram(self, name: str, help_text: str, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> Histogram:
        return self._add(Histogram(name, help_text, self._lock, buckets))

    def _add(self, fam):
        self._families.append(fam)
        return fam

    def render(self) -> str:
        with self._lock:
            lines = [line for fam in self._families for line in fam.render()]
        return "\n".join(lines) + "\n"


class ServerMetrics:
    """The families the server exports."""

    def __init__(self) -> None:
        r = self.registry = Registry()
        self.requests = r.counter("ragserve_http_requests_total", "HTTP requests by endpoint, method and status.")
        self.latency = r.histogram("ragserve_http_request_duration_seconds",
                                   "Time to produce the response (for streams: until the last event), by endpoint.")
        self.in_flight = r.gauge("ragserve_http_requests_in_flight", "Requests being handled now.")
        self.queries = r.counter("ragserve_search_queries_total", "Queries searched (a batch counts each query).")
        self.search_stage = r.counter("ragserve_search_stage_seconds_total",
                                      "Seconds spent in each search stage (prepare, relevancy, retrieval).")
        self.retrieval = r.histogram("ragserve_retrieval_seconds",
                                     "Backend time (all stages) of one /v1/search request or one RAG retrieval step.")
        self.launch_queries = r.histogram("ragserve_search_launch_queries",
                                          "Queries in one backend launch (its _count is the number of launches).",
                                          SIZE_BUCKETS)
        self.launch_requests = r.histogram("ragserve_search_launch_requests",
                                           "Requests (searches and answer retrievals) batched into one backend launch.",
                                           SIZE_BUCKETS)
        self.queue_wait = r.histogram("ragserve_search_queue_wait_seconds",
                                      "Time a search waited in the backend's queue before its launch started.",
                                      WAIT_BUCKETS)
        self.generation = r.histogram("ragserve_generation_seconds",
                                      "Time one answer spent on the generator (model load excluded), by method.")
        self.answer_stage = r.counter("ragserve_answer_stage_seconds_total",
                                      "Seconds of answer traces by stage (retrieval, generation, ...) and method.")
        self.queue = r.gauge("ragserve_generation_queue_depth", "Answers queued or running on the generator.")
        self.decode_steps = r.gauge("ragserve_decode_engine_steps",
                                    "Decode engine steps run so far (each advances every answer decoding then).")
        self.decode_advanced = r.gauge("ragserve_decode_generation_steps",
                                       "Tokens those steps decoded, over all answers (divided by the steps: the mean "
                                       "batch).")
        self.info = r.gauge("ragserve_info", "Constant 1, labelled with the version, backend, model and worker.")
        self.docs = r.gauge("ragserve_index_documents", "Documents in the loaded index.")
        self.workers = r.gauge("ragserve_server_workers",
                               "Server processes (--workers); each keeps its own metrics, labelled by worker.")

    def render(self) -> str:
        return self.registry.render()
