"""The gpu backend returns exactly the cpu backend's top-k (ids and score bits), on torch's CPU device here and on
CUDA when present (tests marked ``gpu``); memory planning, staging, bounds and errors."""
from __future__ import annotations

import ctypes
import json
import time
from dataclasses import dataclass, replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from indexer.reader import IndexReader
from indexer.options import BuildOptions
from indexer.writer import build_index_from_documents
from ragserve.kernels.cpu.backend import CpuBackend
from ragserve.kernels.gpu import pipeline, relevancy, selection
from ragserve.kernels.gpu.cuda import kernels as CK
from ragserve.kernels.gpu.backend import GpuBackend
from ragserve.kernels.gpu.cuda.kernels import TileKernels
from ragserve.kernels.gpu.memory import MemoryPlanError, plan_memory
from ragserve.kernels.gpu.settings import GpuSettings
from ragserve.kernels.gpu.triton import triton_available
from indexer import bm25
from ragserve.kernels.contract import SearchError
from ragserve.kernels.registry import resolve_backend_name
from ragserve.retrieval.searcher import Searcher
from tests.conftest import shared

KS = (1, 10, 100, 1000)
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA device")


def assert_parity(gpu: GpuBackend, cpu: CpuBackend, queries, k: int, k1: float = 0.9, b: float = 0.4) -> None:
    want = cpu.search_terms(queries, k, k1, b)
    got = gpu.search_terms(queries, k, k1, b)
    bad = [i for i, (x, y) in enumerate(zip(got, want)) if not x.same_as(y)]
    assert not bad, f"{len(bad)} of {len(queries)} queries differ at k={k}, first: query {bad[0]}"
    assert sum(len(r.docids) for r in got) > 0


def small_blocks(hotpot_paragraphs_jsonl, tmp_path) -> tuple[IndexReader, Searcher, list]:
    """HotpotQA paragraphs in 64-doc blocks (~80 tiles a query: room for a sample and thresholds), a cpu searcher and
    the dev questions analysed."""
    from indexer.writer import build_index

    build_index([hotpot_paragraphs_jsonl], tmp_path / "idx", BuildOptions(block_size=64, bank_bytes=1 << 20,
                                                                          progress=False))
    reader = IndexReader(tmp_path / "idx")
    s = Searcher(reader, backend="cpu", threads=1)
    with open(shared("hotpotqa-dev500-ircot", "dev_subsampled.jsonl")) as f:
        return reader, s, [s.analyze(json.loads(line)["question_text"]) for line in f]


@pytest.fixture(scope="module")
def arguana(arguana_index, arguana_queries):
    reader = IndexReader(arguana_index)
    s = Searcher(reader, backend="cpu", threads=1)
    analysed = [s.analyze(q.text) for q in arguana_queries]
    assert len(reader.shards) > 1  # the fixture's small banks make several shards and blocks
    return reader, s.backend, [a for a in analysed if len(a)]


@pytest.fixture(scope="module")
def hotpot(hotpot_index):
    reader = IndexReader(hotpot_index)
    s = Searcher(reader, backend="cpu", threads=1)
    with open(shared("hotpotqa-dev500-ircot", "dev_subsampled.jsonl")) as f:
        questions = [json.loads(line)["question_text"] for line in f]
    assert len(questions) == 500
    return reader, s.backend, [s.analyze(q) for q in questions]


@pytest.fixture(scope="module")
def arguana_gpu(arguana):
    return GpuBackend(arguana[0], device="cpu", max_batch=32)


@pytest.fixture(scope="module")
def hotpot_gpu(hotpot):
    return GpuBackend(hotpot[0], device="cpu", max_batch=128)


# ArguAna queries are whole arguments (~100 distinct terms, ~150k postings each): a sample keeps CI fast.
@pytest.mark.parametrize("k", KS)
def test_parity_arguana(arguana, arguana_gpu, k):
    _, cpu, queries = arguana
    assert_parity(arguana_gpu, cpu, queries[::25], k)


@pytest.mark.parametrize("k", KS)
def test_parity_hotpot(hotpot, hotpot_gpu, k):
    _, cpu, queries = hotpot
    assert_parity(hotpot_gpu, cpu, queries, k)


def test_parity_ascending_term_order(arguana, hotpot):
    """Per-term launches in ascending term id (the canonical order when f64 sums are not provably exact)."""
    for (reader, cpu, queries), step in ((arguana, 200), (hotpot, 5)):
        g = GpuBackend(reader, device="cpu", term_order="ascending")
        assert_parity(g, cpu, queries[::step], 100)


@pytest.mark.parametrize("k", (1, 100))
def test_parity_exact_kth_threshold(hotpot, k):
    """The other threshold method (torch.topk's k-th value) gives the same top-k."""
    reader, cpu, queries = hotpot
    assert_parity(GpuBackend(reader, device="cpu", topk="topk"), cpu, queries[::3], k)


def test_parity_other_bm25_parameters(hotpot, hotpot_gpu):
    _, cpu, queries = hotpot
    assert_parity(hotpot_gpu, cpu, queries[::4], 100, k1=1.2, b=0.75)


def test_streamed_shards_give_the_same_results(arguana, hotpot):
    """A budget too small for every shard: the rest are staged per batch, results unchanged."""
    for (reader, cpu, queries), step in ((arguana, 100), (hotpot, 10)):
        sizes = [(int(s.postings.size), int(s.blk_id.size)) for s in reader.shards]
        full = plan_memory(reader.num_docs, sizes, 1 << 40, 1)
        budget = full.total_bytes - 1  # one row short of holding every shard: the planner must stream
        g = GpuBackend(reader, device="cpu", memory_bytes=budget, max_batch=4)
        d = g.describe()
        assert d["streamed_shards"] >= 1 and d["total_bytes"] <= budget
        assert d["index_bytes_on_device"] == d["norms_bytes"] + d["resident_shard_bytes"] + d["staging_bytes"]
        assert_parity(g, cpu, queries[::step], 10)


def test_staging_a_batch_that_needs_every_term_of_a_shard(tmp_path):
    """Staged terms carry one end sentinel each: a query with all of a shard's terms must still fit."""
    docs = [_Doc(f"d{i}", "", ["apple banana", "cherry", "apple", "banana cherry apple"][i % 4]) for i in range(400)]
    build_index_from_documents(docs, tmp_path / "idx", BuildOptions(block_size=16, bank_bytes=2048, progress=False))
    reader = IndexReader(tmp_path / "idx")
    sizes = [(int(s.postings.size), int(s.blk_id.size)) for s in reader.shards]
    g = GpuBackend(reader, device="cpu", memory_bytes=plan_memory(reader.num_docs, sizes, 1 << 40, 1).total_bytes - 1)
    assert g.describe()["streamed_shards"] >= 1
    s = Searcher(reader, backend="cpu")
    q = [s.analyze("apple banana cherry"), s.analyze("cherry"), s.analyze("banana apple")]
    for k in (5, 400):
        for got, want in zip(g.search_terms(q, k, reader.k1, reader.b), s.backend.search_terms(q, k, reader.k1, reader.b)):
            assert got.same_as(want)


def test_memory_plan_error_is_clear(arguana):
    reader = arguana[0]
    with pytest.raises(MemoryPlanError, match="needs at least .* bytes of device memory"):
        GpuBackend(reader, device="cpu", memory_bytes=1000)
    assert issubclass(MemoryPlanError, SearchError)


def test_plan_memory_placement():
    # 1000 docs: a row is 19,000 bytes; three shards of 4,000 + 8 * 11 bytes each.
    shards = [(1000, 10), (1000, 10), (1000, 10)]
    p = plan_memory(1000, shards, 10**9, 8)
    assert p.resident == (0, 1, 2) and p.streamed == () and p.rows == 8 and p.staging_bytes == 0
    shard = 4 * 1000 + 8 * 11
    staging = 4 * 1000 + 8 * 20  # the largest shard's postings, and room for one end sentinel per entry
    budget = 1000 + 19_000 + staging + shard + 100  # norms, a row, staging, one resident shard
    p = plan_memory(1000, shards, budget, 8)
    assert p.resident == (0,) and p.streamed == (1, 2) and p.rows == 1
    assert p.total_bytes <= budget and p.index_bytes == 1000 + staging + shard
    with pytest.raises(MemoryPlanError):
        plan_memory(1000, shards, 1000 + 19_000 + staging - 1, 8)
    # tables beside the shards (single queries' device plan): counted in the index, taken before any row
    full = 1000 + 3 * shard + 19_000
    p = plan_memory(1000, shards, full + 500, 8, table_bytes=500)
    assert p.streamed == () and p.rows == 1 and p.index_bytes == 1000 + 3 * shard + 500 and p.total_bytes == full + 500
    assert plan_memory(1000, shards, full + 499, 8, table_bytes=500).streamed  # a byte short: shards stream
    with pytest.raises(MemoryPlanError, match="tables 50,000"):
        plan_memory(1000, shards, budget, 8, table_bytes=50_000)


def test_k_bounds_and_empty_results(hotpot):
    reader = hotpot[0]
    s = Searcher(reader, backend="gpu", device="cpu")
    for bad in (0, -1, 10_001):
        with pytest.raises(SearchError):
            s.search("paris", k=bad)
    assert s.search("the of and", k=10) == []  # stopwords only: no term
    assert s.search("qqqzzzxxyy", k=10) == []  # unknown term
    everything = s.search("the city of paris", k=10_000, with_text=False)
    assert 0 < len(everything) < 10_000  # fewer matches than k: all of them, nothing unmatched
    assert all(h.score > 0 for h in everything)
    cpu = Searcher(reader, backend="cpu").search("the city of paris", k=10_000, with_text=False)
    assert [(h.docid, h.score) for h in everything] == [(h.docid, h.score) for h in cpu]


@dataclass
class _Doc:
    id: str
    title: str
    text: str


def test_ties_break_by_docid_across_k(tmp_path):
    """Many equal scores around the k-th place: ties go to the lower docid, across blocks and shards."""
    docs = [_Doc(f"d{i}", "", ["apple banana", "cherry", "apple", "banana cherry apple"][i % 4]) for i in range(400)]
    build_index_from_documents(docs, tmp_path / "idx", BuildOptions(block_size=16, bank_bytes=2048, progress=False))
    reader = IndexReader(tmp_path / "idx")
    s = Searcher(reader, backend="cpu")
    q = s.analyze("apple banana")
    for method in ("blockmax", "topk"):
        g = GpuBackend(reader, device="cpu", topk=method)
        for k in (1, 7, 100, 150, 250, 400):
            got = g.search_terms([q], k, reader.k1, reader.b)[0]
            assert got.same_as(s.backend.search_terms([q], k, reader.k1, reader.b)[0])
            order = np.lexsort((got.docids, -got.scores.astype(np.float64)))
            assert np.array_equal(order, np.arange(got.docids.size))
        assert len(g.search_terms([q], 400, reader.k1, reader.b)[0].docids) == 300  # docs without either term: none


def test_options_and_devices(hotpot):
    reader = hotpot[0]
    with pytest.raises(SearchError, match="unknown option"):
        GpuBackend(reader, device="cpu", colour="blue")
    with pytest.raises(SearchError):
        GpuBackend(reader, device="tpu")
    with pytest.raises(SearchError):
        GpuBackend(reader, device="cpu", term_order="random")
    with pytest.raises(SearchError):
        GpuBackend(reader, device="cpu", kernel="triton")  # the option's old name: now an unknown option
    with pytest.raises(SearchError, match="scorer must be one of auto, cuda, triton, torch"):
        GpuBackend(reader, device="cpu", scorer="cuda-magic")
    with pytest.raises(SearchError, match="scorer='cuda' runs the CUDA C kernels, which needs a CUDA device"):
        GpuBackend(reader, device="cpu", scorer="cuda")
    with pytest.raises(SearchError):
        GpuBackend(reader, device="cpu", topk="sort")
    d = GpuBackend(reader, device="cpu").describe()
    assert d["device"] == "cpu" and d["scorer"] == "torch" and d["streamed_shards"] == 0


def test_settings_are_one_object_passed_in(hotpot):
    """Tuning reaches the backend as one frozen ``GpuSettings``: checked when made, varied by ``replace``, passed down
    to the scorer and the selection; anything else is refused."""
    reader = hotpot[0]
    base = GpuSettings()
    with pytest.raises(AttributeError):
        base.peek = 8  # frozen: no caller changes another's settings
    for bad in ({"tile_max": 1000}, {"peek": 0}, {"budget_fraction": 1.5},
                {"min_capacity": -1}):
        with pytest.raises(ValueError):
            GpuSettings(**bad)
    with pytest.raises(TypeError):
        GpuSettings(scorer="triton")  # which kernels run is the backend's ``scorer=``, not a tuning setting
    with pytest.raises(SearchError, match="GpuSettings"):
        GpuBackend(reader, device="cpu", settings={"peek": 8})
    small = replace(base, tile_max=256)
    g = GpuBackend(reader, device="cpu", settings=small)
    assert g.settings is small and base.tile_max == 2048 and g._tile == 256


class _RecordingDevice:
    """libcuda as the tiled path calls it, recorded: handles are small integers, kernels do not run. A launched graph
    does what its ``rank_candidates`` would: it writes one ranked hit (``HIT``) to the pinned head the host reads."""

    HIT = (5, 1.5)  # docid, score
    SCORED_MS = 0.125  # the device time between the graph's two timing events

    def __init__(self) -> None:
        self.log: list[tuple] = []  # what ran outside any capture
        self.graphs: dict[int, list[tuple]] = {}  # an instantiated graph's nodes, in capture order
        self._capture: tuple[int, list[tuple]] | None = None  # (stream, nodes) while capturing
        self._next = 100

    def _handle(self, ref) -> int:
        self._next += 1
        ref._obj.value = self._next
        return self._next

    def _queue(self, entry: tuple, stream: int) -> None:
        (self._capture[1] if self._capture and self._capture[0] == stream else self.log).append(entry)

    def cuLaunchKernel(self, func, gx, gy, gz, bx, by, bz, smem, stream, params, extra) -> int:
        ptrs = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))
        arg = {"ptr": ctypes.c_uint64, "i32": ctypes.c_int32}
        out = ()
        if func == "rank_candidates":  # (found, cap, out, k, out_cap): where the hit goes
            out = tuple(ctypes.cast(ptrs[i], ctypes.POINTER(arg[t])).contents.value
                        for i, t in ((2, "ptr"), (4, "i32")))
        self._queue(("launch", func) + out, stream)
        return 0

    def cuEventCreate(self, ev, flags) -> int:
        self._handle(ev)
        return 0

    def cuStreamCreate(self, st, flags) -> int:
        self._handle(st)
        return 0

    def cuMemHostGetDevicePointer_v2(self, dev, host, flags) -> int:
        dev._obj.value = host.value  # mapped pinned memory: the device writes the host's bytes
        return 0

    def cuEventRecord(self, ev, stream) -> int:
        self._queue(("record", ev.value), stream)
        return 0

    def cuEventRecordWithFlags(self, ev, stream, flags) -> int:
        assert self._capture and self._capture[0] == stream and flags == 1  # an event record node of the graph
        self._queue(("record", ev.value), stream)
        return 0

    def cuEventSynchronize(self, ev) -> int:
        self.log.append(("wait", ev.value))
        return 0

    def cuEventElapsedTime(self, ms, start, end) -> int:
        ms._obj.value = self.SCORED_MS
        self.log.append(("elapsed", start.value, end.value))
        return 0

    def cuStreamWaitEvent(self, stream, ev, flags) -> int:
        self.log.append(("after", stream, ev.value))
        return 0

    def cuMemcpyHtoDAsync_v2(self, dst, src, nbytes, stream) -> int:
        self._queue(("to device", nbytes), stream)
        return 0

    def cuMemcpyDtoHAsync_v2(self, dst, src, nbytes, stream) -> int:
        self._queue(("to host", nbytes), stream)
        return 0

    def cuStreamBeginCapture_v2(self, stream, mode) -> int:
        self._capture = (stream.value, [])
        return 0

    def cuStreamEndCapture(self, stream, graph) -> int:
        graph._obj.value = 1
        return 0

    def cuGraphInstantiateWithFlags(self, exe, graph, flags) -> int:
        self.graphs[self._handle(exe)] = self._capture[1]
        self.log.append(("capture", self._next))
        self._capture = None
        return 0

    def cuGraphDestroy(self, graph) -> int:
        return 0

    def cuGraphLaunch(self, graph, stream) -> int:
        self.log.append(("graph", graph, stream))
        _, _, out, room = next(n for n in self.graphs[graph] if n[:2] == ("launch", "rank_candidates"))
        head = (ctypes.c_int64 * (2 + 2 * room)).from_address(out)
        head[0], head[2] = 1, self.HIT[0]
        ctypes.c_float.from_address(out + 4 * 2 * (2 + room)).value = self.HIT[1]
        return 0

    def cuGraphExecDestroy(self, graph) -> int:
        return 0

    def cuEventDestroy_v2(self, ev) -> int:
        return 0

    def cuStreamDestroy_v2(self, stream) -> int:
        return 0


def test_searcher_single_query_takes_the_graph_path(hotpot, monkeypatch):
    """The production path is the fast path: ``Searcher.search`` (which always asks for stage times) sends one query
    the device plans through the single-query CUDA graph: captured once, then one graph launch a query and no kernel
    launched outside it, with the relevancy time read from the graph's own events (recorded between the scoring and
    the selection kernels) and the hit the graph's ranking wrote. A batch takes the batched path. CI has no GPU: the
    backend runs on torch's CPU device with its CUDA parts (``relevancy.cuda_parts``: kernels, copies, graphs) on a
    recording driver; the path decision and everything around it are the backend's own."""
    from ragserve.kernels.contract import StageTimes
    from ragserve.kernels.gpu.cuda.rtc import CudaKernel, StreamCopies

    device = _RecordingDevice()
    module = SimpleNamespace(device=torch.device("cpu"), _cuda=device,
                             kernel=lambda name, sig: CudaKernel(module, name, sig))
    made = []

    def parts(tile, tpb, dev, settings, scorer):
        made.append((tile, tpb, scorer))
        return TileKernels(module, 132), StreamCopies(device)

    monkeypatch.setattr(relevancy, "cuda_parts", parts)
    monkeypatch.setattr(relevancy, "current_stream", lambda dev: 7)  # the caller's stream
    reader = hotpot[0]
    s = Searcher(reader, backend="gpu", device="cpu", scorer="cuda")  # the CUDA C kernels, on the recording driver
    assert made and s.backend.describe()["single_query_graph"]
    device.log.clear()
    times = StageTimes()
    hits = s.search("which city is the capital of france", k=10, times=times)
    assert [(h.docid, h.score) for h in hits] == [device.HIT]
    assert hits[0].id == reader.external_id(device.HIT[0])
    (kind, graph), *rest = device.log
    assert kind == "capture" and rest[0] == ("graph", graph, 7)  # captured, then launched on the caller's stream
    nodes = device.graphs[graph]
    assert [n[1] for n in nodes if n[0] == "launch"] == ["query_in", "plan_single", "bm25_tiles", "kth_largest",
                                                         "collect", "rank_candidates"]
    records = [i for i, n in enumerate(nodes) if n[0] == "record"]
    start, scored, done = (nodes[i][1] for i in records)
    assert records == [0, 4, len(nodes) - 1]  # before the plan; between scoring and selection; at the end
    assert rest[1:] == [("wait", done), ("elapsed", start, scored)]  # no launch, copy or sync outside the graph
    assert times.relevancy == pytest.approx(device.SCORED_MS / 1e3) and times.retrieval > 0
    device.log.clear()
    again = s.search("paris", k=10, times=times)  # the same graph: no capture
    assert [(h.docid, h.score) for h in again] == [device.HIT]
    assert device.log == [("graph", graph, 7), ("wait", done), ("elapsed", start, scored)]
    assert times.relevancy == pytest.approx(2 * device.SCORED_MS / 1e3)
    device.log.clear()
    s.search_batch(["paris", "the capital of france"], k=10)  # a batch: plan, kernels, read-back; no graph
    assert not any(e[0] in ("graph", "capture") for e in device.log)
    assert [e[1] for e in device.log if e[0] == "launch"] == ["tile_bounds", "bm25_tiles", "kth_largest", "collect"]


@pytest.mark.skipif(CUDA, reason="checks the behaviour without CUDA")
def test_unavailable_without_cuda(hotpot):
    ok, why = GpuBackend.is_available()
    assert not ok and "CUDA" in why
    assert resolve_backend_name("auto") == "cpu"
    with pytest.raises(SearchError, match="no CUDA device"):
        GpuBackend(hotpot[0])  # the default device is CUDA


@pytest.mark.skipif(CUDA, reason="a CUDA device is present")
def test_auto_on_a_machine_without_gpu_nodes_imports_no_torch(monkeypatch):
    """Without a GPU's device nodes ``auto`` is the CPU backend, decided without importing torch (a CLI call's
    ~0.65 s); where nodes exist, the GPU backend itself decides (here: no usable CUDA, so cpu again)."""
    import subprocess
    import sys

    from ragserve.kernels import registry

    code = ("import sys; from ragserve.kernels import registry as r; n = r.resolve_backend_name('auto'); "
            "print(n, r.gpu_device_present(), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "cpu" and (out[2] == "False" or out[1] == "True")
    monkeypatch.setattr(registry, "_GPU_NODES", ("/",))  # a node present: the backend is asked, and refuses
    assert registry.gpu_device_present() and resolve_backend_name("auto") == "cpu"


# ---- CUDA ---------------------------------------------------------------------------------------------------
@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("term_order", ["auto", "ascending"])
@pytest.mark.parametrize("scorer", ["cuda", "torch"])
def test_cuda_parity(arguana, hotpot, scorer, term_order):
    before = torch.cuda.current_device()
    for reader, cpu, queries in (arguana, hotpot):
        g = GpuBackend(reader, device=f"cuda:{torch.cuda.device_count() - 1}", scorer=scorer, term_order=term_order)
        assert g.describe()["scorer"] == scorer
        for k in KS:
            assert_parity(g, cpu, queries if term_order == "auto" else queries[::10], k)
        g.close()
    assert torch.cuda.current_device() == before  # no global device switch


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("term_order", ["auto", "ascending"])
@pytest.mark.parametrize("scorer", ["cuda", "triton"])
def test_cuda_tile_scorers(hotpot, scorer, term_order):
    """Both tile scoring kernels (CUDA C through NVRTC, and Triton's) return the cpu backend's top-k; the CUDA one
    by both of its paths (terms at once where the sums are exact in any order, else one term after another)."""
    if scorer == "triton" and not triton_available():
        pytest.skip("triton is not installed")
    reader, cpu, queries = hotpot
    g = GpuBackend(reader, scorer=scorer, max_batch=16, term_order=term_order)
    assert g.describe()["scorer"] == scorer
    cache = bm25.norm_cache(0.9, 0.4, reader.avgdl)
    min_q = float(cache[int(np.asarray(reader.norms).max())]) / 4
    flat = [bm25.sum_is_exact(q.weights, min_q) for q in queries]
    assert np.mean(flat) > 0.9  # the flat path is what most of these queries take under "auto"
    for k in (1, 10, 1000):
        assert_parity(g, cpu, queries, k)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("scorer", ["cuda", "torch"])
def test_cuda_streaming_and_auto(arguana, scorer):
    reader, cpu, queries = arguana
    full = GpuBackend(reader, scorer=scorer, max_batch=1).plan
    budget = full.total_bytes - full.table_bytes - 1  # one byte short even without the device plan's tables
    g = GpuBackend(reader, scorer=scorer, memory_bytes=budget, max_batch=8)
    assert g.describe()["streamed_shards"] >= 1
    assert_parity(g, cpu, queries[::5], 100)
    assert resolve_backend_name("auto") == "gpu"


def test_tile_plan_orders_entries_canonically(hotpot):
    """The tiled kernel's host plan: every block entry of every (query, term), ordered by (query, block, term id)
    and grouped into (query, block) pairs, against a plain Python expansion (CPU only: no kernel involved)."""
    from ragserve.kernels.gpu.planning import plan_tiles

    reader, _, queries = hotpot
    planner = GpuBackend(reader, device="cpu").device_arrays()["planner"]
    items = planner.items(queries[:60])
    pbase = (np.arange(len(reader.shards)) * 1_000_003)[items.shard]
    want = []
    for i in range(len(items)):
        for e in range(int(items.e0[i]), int(items.e0[i] + items.ne[i])):
            g = planner.offsets[items.shard[i]] + e
            want.append((int(items.row[i]), int(planner.blk_id[g]), int(items.term[i]),
                         int(pbase[i] + planner.blk_start[g]), int(planner.blk_start[g + 1] - planner.blk_start[g]),
                         int(items.w[i:i + 1].view(np.int32)[0])))
    want.sort()
    shifts = np.where(np.arange(60) % 3 == 1, 40 + np.arange(60) % 5, 0)
    plan = plan_tiles(planner, items, pbase, -(-reader.num_docs // reader.block_size), shifts)
    t, n = plan.table, plan.n_ent
    assert n == len(want) > 0 and plan.pairs_at % 2 == 0
    assert t[:n].tolist() == [w[3] for w in want] and t[n:2 * n].tolist() == [w[4] for w in want]
    assert t[2 * n:3 * n].tolist() == [w[5] for w in want] and plan.max_count == max(w[4] for w in want)
    pairs = t[plan.pairs_at:].reshape(5, plan.n_pairs)
    starts = [j for j in range(n) if j == 0 or want[j][:2] != want[j - 1][:2]]
    assert pairs[2].tolist() == starts and pairs[3].tolist() == starts[1:] + [n]
    assert [tuple(x) for x in pairs[:2].T.tolist()] == [want[j][:2] for j in starts]
    assert pairs[4].tolist() == [int(shifts[want[j][0]]) for j in starts]


@pytest.mark.parametrize("auto", [True, False])
def test_plan_from_queries_equals_plan_from_items(hotpot, auto):
    """The one-call plan of resident shards (``plan_queries``) is ``plan_tiles`` of the batch's items, with the shifts
    of ``flat_shift`` (none under ``term_order='ascending'``)."""
    from ragserve.kernels.gpu.planning import flat_shift, plan_queries, plan_tiles

    reader, _, queries = hotpot
    g = GpuBackend(reader, device="cpu", term_order="auto" if auto else "ascending")
    planner, qs = g.device_arrays()["planner"], [q for q in queries[:70] if len(q)]
    pbase = np.arange(len(reader.shards)) * 1_000_003
    n_blocks = -(-reader.num_docs // reader.block_size)
    min_q = float(bm25.norm_cache(0.9, 0.4, reader.avgdl)[int(np.asarray(reader.norms).max())]) / 4
    items = planner.items(qs)
    shifts = np.array([flat_shift(q.weights, min_q) if auto else 0 for q in qs], dtype=np.int64)
    want = plan_tiles(planner, items, pbase[items.shard], n_blocks, shifts)
    got = plan_queries(planner, qs, pbase, n_blocks, auto, min_q)
    assert (got.n_ent, got.n_pairs, got.pairs_at, got.max_count) == (want.n_ent, want.n_pairs, want.pairs_at,
                                                                     want.max_count)
    assert np.array_equal(got.table, want.table)
    assert got.table[got.pairs_at + 4 * got.n_pairs:].any() == auto


def test_flat_shift_sums_are_exact(hotpot):
    """The CUDA flat path's 64-bit fixed point (``flat_shift``): every term score a query can give a doc (any tf, any
    norm the index holds), times 2^S, is an integer, n * max(w) * 2^S < 2^63, and the integer sums of random docs,
    rounded to f32 and scaled back, are the f32 of their f64 sums (the cpu backend's scores); queries whose f64 sums
    are not provably exact, and one-term queries, get 0."""
    from ragserve.kernels.gpu.planning import flat_shift

    reader, _, queries = hotpot
    norms = np.unique(np.asarray(reader.norms))
    cache = bm25.norm_cache(0.9, 0.4, reader.avgdl)
    min_q = float(cache[int(norms.max())]) / 4
    tf = np.arange(1, 1 << reader.tf_bits, dtype=np.float32)
    q = (tf[:, None] * cache[norms][None, :]).ravel()  # every tf * cache[norm]
    rng = np.random.default_rng(7)
    qs = [x.weights.astype(np.float32) for x in queries if len(x) > 1] + [np.float32([1e-3, 20.0])]
    shifts = [flat_shift(w, min_q) for w in qs]
    assert np.mean([sh > 0 for sh in shifts]) > 0.9
    assert flat_shift(np.float32([3.5]), min_q) == 0
    for w, sh in zip(qs, shifts):
        assert (sh > 0) == bm25.sum_is_exact(w, min_q), (w, sh)
        assert flat_shift(w, 0.0) == 0
        if sh == 0:
            continue
        assert len(w) * float(w.max()) * 2.0 ** sh < 2.0 ** 63
        s = w[:, None] - w[:, None] / (np.float32(1) + q[None, :])  # f32, each operation rounded: FORMAT.md's
        scaled = s.astype(np.float64) * 2.0 ** sh
        assert (scaled == np.floor(scaled)).all()
        pick = s[np.arange(len(w)), rng.integers(0, s.shape[1], (500, len(w)))]
        docs = np.where(rng.random((500, len(w))) < 0.6, pick, np.float32(0))
        ints = (docs.astype(np.float64) * 2.0 ** sh).astype(np.uint64).sum(axis=1)
        got = ints.astype(np.float32) * np.float32(2.0 ** -sh)
        want = docs.astype(np.float64).sum(axis=1).astype(np.float32)
        assert np.array_equal(got.view(np.uint32), want.view(np.uint32))
    assert flat_shift(np.float32([1e-30, 1e30]), min_q) == 0  # its f64 sums are not exact


@pytest.mark.gpu
@needs_cuda
def test_cuda_kth_largest_kernel():
    """The radix-select threshold kernel returns torch.topk's k-th largest value (ties, zeros, mostly zeros, one value
    throughout, k = n, k > n: 0), with a row in registers (n <= KTH_REG * KTH_THREADS) or partly read again each pass;
    it clears the 8-byte count it is given."""
    dev = torch.device("cuda")
    kn = TileKernels.build(2048, 128, dev, GpuSettings())
    gen = torch.Generator(device="cpu").manual_seed(3)
    for n in (49_153, 10_254):
        rows = torch.rand((8, n), generator=gen).to(dev)
        rows[1] = torch.round(rows[1] * 50) / 50  # heavy ties
        rows[2, ::3] = 0.0  # unmatched tiles
        rows[3] = 0.0
        rows[4, :100] = torch.tensor(np.float32(np.logspace(-40, 30, 100)), device=dev)  # subnormals to large
        rows[5, torch.rand(n, generator=gen).to(dev) > 0.02] = 0.0  # a sample's: ~2% of the tiles nonzero
        rows[6] = 7.25  # no bit differs: one pass counts them
        rows[7] = rows[7] * 0.01 + 12.0  # scores in [12, 12.01): the bits above the low mantissa bits alike
        thr = torch.empty(8, dtype=torch.float32, device=dev)
        count = torch.ones(4, dtype=torch.int32, device=dev)
        for k in (1, 2, 10, 150, 1000, 10_000, n, n + 1):
            kn.kth(8, CK.KTH_THREADS, rows, n, k, thr, count)
            want = (torch.topk(rows, k, dim=1).values.amin(dim=1) if k <= n else torch.zeros(8, device=dev))
            assert torch.equal(thr, want), (n, k)
            assert count.tolist() == [0, 0, 1, 1]
            count.fill_(1)


@pytest.mark.gpu
@needs_cuda
def test_cuda_tile_bounds_kernel():
    """``make_samples`` takes the tile of every SAMPLE-th posting, and ``tile_start`` (through ``tile_bounds``) finds
    where each tile's docs begin in an entry's postings as numpy's searchsorted does, for entries whose docs spread
    evenly, cluster in a few tiles, sit at one end or both, come in runs, or number 0, 1 or a few, at any offset from
    a sample."""
    dev = torch.device("cuda")
    tile, tpb, tf_bits = 2048, 128, 8
    block = tile * tpb
    kn = TileKernels.build(tile, tpb, dev, GpuSettings())
    rng = np.random.default_rng(5)
    entries = [np.zeros(0, np.int64), np.array([0]), np.array([block - 1]), np.arange(33) * 7919 % block]
    entries += [rng.choice(block, n, replace=False) for n in (40, 700, 5000, 60_000, 200_000)]
    entries += [np.arange(3000) + 5 * tile, np.arange(block - 70_000, block), np.arange(40_000),
                np.concatenate([np.arange(9000), np.arange(block - 9000, block)]),
                (np.arange(20_000) // 500 * 6000 + np.arange(20_000) % 500) % block,  # runs of 500 docs
                np.repeat(rng.choice(tpb, 6, replace=False) * tile, 1) + rng.integers(0, tile, 6)]
    entries = [np.unique(d).astype(np.int64) for d in entries]
    counts = np.array([d.size for d in entries], np.int64)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64) + 5  # not at the arena's start
    post = np.zeros(5 + counts.sum(), np.uint32)
    for a, d in zip(starts, entries):
        post[a:a + d.size] = (d.astype(np.uint32) << np.uint32(tf_bits)) | (1 + d.astype(np.uint32) % 200)
    n_ent = len(entries)
    ent = torch.from_numpy(np.concatenate([starts, counts])).to(dev)
    post_dev = torch.from_numpy(post.view(np.int32)).to(dev)
    n_samp = -(-post.size // CK.SAMPLE)
    samp = torch.full((n_samp,), 255, dtype=torch.uint8, device=dev)
    kn.samples(-(-n_samp // 256), 256, post_dev, samp, 0, n_samp, tf_bits)
    assert samp.cpu().numpy().tolist() == ((post[::CK.SAMPLE] >> tf_bits) // tile).tolist()
    bounds = torch.full((n_ent * tpb,), -1, dtype=torch.int32, device=dev)
    kn.bounds(-(-n_ent * tpb // CK.BOUNDS_THREADS), CK.BOUNDS_THREADS, ent, n_ent, post_dev, samp, bounds, tf_bits)
    got = bounds.cpu().numpy().reshape(n_ent, tpb)
    for e, d in enumerate(entries):
        assert got[e].tolist() == np.searchsorted(d, np.arange(tpb) * tile).tolist(), e


@pytest.mark.gpu
@needs_cuda
def test_cuda_rank_candidates_kernel():
    """The device ranking writes the count and the first min(n, k, room) docs and score bits in numpy's order (score
    descending, then doc ascending; heavy ties) to pinned host memory, the docs as int64 and the scores from word
    2 + room, and nothing else, for any count up to SORT_MAX; past SORT_MAX or past the candidates' room only the count.
    The candidates are left as they are."""
    from ragserve.kernels.gpu.cuda.rtc import StreamCopies

    dev = torch.device("cuda")
    kn = TileKernels.build(2048, 128, dev, GpuSettings())
    with torch.cuda.device(dev):
        copies = StreamCopies()
    out = torch.zeros(2 + 2 * CK.SORT_MAX + 2, dtype=torch.int64, pin_memory=True)
    out_dev = copies.device_address(out.data_ptr())
    rng = np.random.default_rng(5)
    for n in (0, 1, 2, 31, 63, 64, 65, 1000, 1050, CK.SORT_MAX - 1, CK.SORT_MAX, CK.SORT_MAX + 1):
        docs = rng.choice(1 << 31, n, replace=False).astype(np.int64)
        scores = np.float32(rng.integers(1, 40, n) / 8)  # ties
        pairs = np.zeros(2 + 2 * max(n, 1), np.int64)
        pairs[0], pairs[2:2 + 2 * n:2], pairs[3:3 + 2 * n:2] = n, docs, scores.view(np.int32)
        for cap in (n, n - 1):
            found = torch.from_numpy(pairs).to(dev)
            for k, room in ((n, 4 * CK.SORT_MAX // 3), (1 + n // 2, 600), (n, 7)):
                out.fill_(-1)
                kn.rank(CK.RANK_BLOCKS, CK.RANK_THREADS, found, cap, out_dev, k, room)
                assert np.array_equal(found.cpu().numpy(), pairs)  # synchronises
                want = np.full(out.numel(), -1, np.int64)
                want[0] = n
                if n <= min(cap, CK.SORT_MAX):
                    keys = np.sort(((0x7FFFFFFF - scores.view(np.int32).astype(np.int64)) << 32) | docs)
                    m = min(n, k, room)
                    want[2:2 + m] = keys[:m] & 0xFFFFFFFF
                    want.view(np.uint32)[2 * (2 + room):2 * (2 + room) + m] = 0x7FFFFFFF - (keys[:m] >> 32)
                assert np.array_equal(out.numpy(), want), (n, cap, k, room)


@pytest.mark.gpu
@needs_cuda
def test_cuda_current_stream_handle():
    """The raw accessor gives torch's current stream, also inside a ``torch.cuda.stream`` block."""
    from ragserve.kernels.gpu.cuda.rtc import current_stream

    dev = torch.device("cuda", torch.cuda.current_device())
    assert current_stream(dev) == torch.cuda.current_stream(dev).cuda_stream
    side = torch.cuda.Stream(dev)
    with torch.cuda.stream(side):
        assert current_stream(dev) == side.cuda_stream != torch.cuda.default_stream(dev).cuda_stream
    assert current_stream(torch.device("cuda")) == torch.cuda.current_stream().cuda_stream


@pytest.mark.gpu
@needs_cuda
def test_cuda_single_queries_ranked_on_the_device(hotpot, monkeypatch):
    """One query at a time, up to SORT_MAX candidates are ranked on the device (the host only reads the keys); past
    that the host ranks them. Both give the cpu backend's top-k."""
    reader, cpu, queries = hotpot
    g = GpuBackend(reader, scorer="cuda", max_batch=16)
    host = []
    rank_host = selection._rank_host
    monkeypatch.setattr(selection, "_rank_host", lambda *a: (host.append(a[4].size), rank_host(*a))[1])
    qs = [q for q in queries[:60] if len(q)]
    for k in (1, 10, 100, 1000, 4 * CK.SORT_MAX):
        host.clear()
        for q in qs:
            want, got = cpu.search_terms([q], k, 0.9, 0.4)[0], g.search_terms([q], k, 0.9, 0.4)[0]
            assert got.same_as(want), (k, q)
        assert all(n > CK.SORT_MAX for n in host)  # the host ranks only what the kernel could not
        assert len(host) < len(qs) // 2 if k < CK.SORT_MAX else host, k


@pytest.mark.gpu
@needs_cuda
def test_cuda_rescore_on_overflow_and_clean_buffers(hotpot, monkeypatch):
    """More candidates than room: the batch is scored again with more (the first collect cleared the maxima); after
    every search the maxima are zero again."""
    reader, cpu, queries = hotpot
    small = GpuSettings(min_capacity=16, candidates_per_hit=0, peek=8)
    g = GpuBackend(reader, scorer="cuda", max_batch=16, settings=small)
    launches = []
    launch = g._tiled.launch_chunk
    monkeypatch.setattr(g._tiled, "launch_chunk", lambda *a: (launches.append(1), launch(*a)))
    assert_parity(g, cpu, queries[:64], 100)
    assert len(launches) > 4
    launches.clear()
    for q in [q for q in queries[64:100] if len(q)][:16]:  # one at a time: a graph, then launches with more room
        assert_parity(g, cpu, [q], 100)
    assert len(launches) > 4
    tiles = g._tiled.tiles
    assert not tiles.maxima.any() and not tiles.tile_maxima.any() and not tiles.running.any()


@pytest.mark.gpu
@needs_cuda
def test_cuda_batches_ranked_by_torch_ops(hotpot):
    """Batches whose candidates the device ranks with torch ops (past ``host_rank_max``), several in the pipeline (each
    ranked while the next is queued): every batch gets the cpu backend's top-k."""
    reader, cpu, queries = hotpot
    g = GpuBackend(reader, scorer="cuda", max_batch=8, settings=GpuSettings(host_rank_max=0))
    for k in (10, 100):
        assert_parity(g, cpu, queries[:64], k)  # 8 batches
    assert not g._tiled.tiles.maxima.any() and not g._tiled.tiles.tile_maxima.any()


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("term_order", ["auto", "ascending"])
@pytest.mark.parametrize("ratio", [1, 1000])
def test_cuda_sample_threshold_skips_tiles_exactly(hotpot_paragraphs_jsonl, tmp_path, term_order, ratio,
                                                   monkeypatch):
    """The CUDA scorer's sample of units and the threshold it sets, then either the filter and the scoring of
    the units it lists (filter_ratio 1: wherever k <= the units sampled a row) or every unit scored with the tiles
    below it not read out (1000): small blocks make ~80 tiles, enough for a sample at k = 1 and 10; the top-k
    stays the cpu backend's."""
    reader, s, queries = small_blocks(hotpot_paragraphs_jsonl, tmp_path)
    settings = GpuSettings(sample_scale=2.0, min_sample_step=2, sample_min_units=0, filter_ratio=ratio)
    steps = []
    step = relevancy.sample_step
    monkeypatch.setattr(relevancy, "sample_step", lambda *a: (steps.append(step(*a)), steps[-1])[1])
    g = GpuBackend(reader, scorer="cuda", max_batch=32, term_order=term_order, settings=settings)
    assert g.describe()["scorer"] == "cuda" and g._tiled.tiles.n_tiles > 50
    filtered = []
    kn = g._tiled.tiles.kernels
    run_filter = kn.filter
    monkeypatch.setattr(kn, "filter", lambda *a, **kw: (filtered.append(a[0]), run_filter(*a, **kw)))
    for k in (1, 10, 100):
        steps.clear()
        assert_parity(g, s.backend, queries, k)
        if filtered:  # the sample's kth_largest cleared the list's count before the last batch's filter
            assert 0 < int(g._tiled.tiles.listed[0]) <= filtered[-1]
        assert steps and all(steps) if k < 100 else not any(steps)  # 100: too few units a row for a sample
        if k < 100:
            assert (g._tiled.tiles.theta > 0).any()  # some rows had a threshold to skip tiles by
    tiles = g._tiled.tiles
    assert not tiles.maxima.any() and not tiles.tile_maxima.any() and not tiles.running.any()
    assert bool(filtered) == (ratio == 1)


@pytest.mark.gpu
@needs_cuda
def test_cuda_running_threshold_is_a_lower_bound(hotpot_paragraphs_jsonl, tmp_path):
    """The scorer's running threshold, scanned every few tiles here: never above a row's k-th largest exact tile maximum
    (so no top-k doc is below it), raised, and every tile reaching it still writes its exact maximum; the top-k stays
    the cpu backend's, and the state is zero again after each search."""
    reader, s, queries = small_blocks(hotpot_paragraphs_jsonl, tmp_path)
    queries = [q for q in queries if len(q)][:32]
    # every unit scored in one launch; the scan compiled in every 4 tiles
    base = GpuSettings(sample_scale=0.0, run_scan=4)
    backends = {running: GpuBackend(reader, scorer="cuda", max_batch=32,
                                    settings=replace(base, running_threshold=running)) for running in (False, True)}
    g = backends[True]
    for k in (1, 10, 30):
        maxima = {}
        for running, b in backends.items():
            tiles, selector = b._tiled.tiles, b._tiled.selector
            _, cache, min_q = b._cache(0.9, 0.4)
            rows, plan, _, _ = b._tiled.plan_chunk(queries, min_q)
            tiles.begin(rows)
            tiles.score(plan, b._arena.post, b._arena.norms, cache, k)
            maxima[running] = tiles.tile_maxima[:rows].clone()
            run = tiles.running[:rows, CK.RUN_BINS + 1].clone().view(torch.float32)
            selector.start(rows, k)
            selector.finish(lambda: None)
            assert not tiles.running.any() and not tiles.tile_maxima.any()
        exact = maxima[False]
        kth = torch.topk(exact, k, dim=1).values[:, -1]
        assert (run <= kth).all(), k
        assert (run > 0).any(), k
        reach = exact >= run[:, None]
        assert torch.equal(maxima[True][reach], exact[reach])  # tiles reaching it were read out
        below = maxima[True][~reach]  # the others: read out before it rose past them, or skipped (timing decides)
        assert ((below == 0) | (below == exact[~reach])).all()
        assert_parity(g, s.backend, queries, k)
        assert not g._tiled.tiles.running.any()


@pytest.mark.gpu
@needs_cuda
def test_cuda_filter_lists_every_unit_that_can_reach_the_threshold(hotpot_paragraphs_jsonl, tmp_path):
    """The filter's bound (fast division, fixed-point sums) never falls under a tile's exact maximum: with the threshold
    set to exactly one of a row's exact tile maxima, every unit reaching it is listed, and few others are."""
    reader, s, queries = small_blocks(hotpot_paragraphs_jsonl, tmp_path)
    queries = [q for q in queries if len(q)][:32]
    # every unit scored exactly, no threshold, nor a running one: every tile's maximum written
    g = GpuBackend(reader, scorer="cuda", max_batch=32,
                   settings=GpuSettings(sample_scale=0.0, running_threshold=False))
    tiles, kn = g._tiled.tiles, g._tiled.tiles.kernels
    _, cache, min_q = g._cache(0.9, 0.4)
    rows, plan, _, _ = g._tiled.plan_chunk(queries, min_q)
    tiles.begin(rows)
    tiles.score(plan, g._arena.post, g._arena.norms, cache, 1)
    exact = tiles.tile_maxima[:rows].clone()  # row, global tile: the f32 of each tile's f64 maximum
    g._tiled.selector.start(rows, 1)
    g._tiled.selector.finish(lambda: None)
    n_units = plan.n_pairs * tiles.tpb
    pair_row = plan.table[plan.pairs_at:plan.pairs_at + plan.n_pairs]
    pair_blk = plan.table[plan.pairs_at + plan.n_pairs:plan.pairs_at + 2 * plan.n_pairs]
    unit_row = np.repeat(pair_row, tiles.tpb)
    unit_tile = (np.repeat(pair_blk, tiles.tpb) * tiles.tpb + np.tile(np.arange(tiles.tpb), plan.n_pairs))
    unit_max = exact.cpu().numpy()[unit_row, np.minimum(unit_tile, tiles.n_tiles - 1)]
    unit_max[unit_tile >= tiles.n_tiles] = 0.0
    w_sum = np.array([float(np.sum(q.weights)) for q in queries])
    listed = torch.empty(2 + n_units, dtype=torch.int32, device=g.device)
    table = tiles.table_dev.data_ptr()
    sorted_max = [np.unique(unit_max[unit_row == r]) for r in range(rows)]
    for frac in (1.0, 0.99, 0.9, 0.7, 0.5, 0.2):  # thresholds: a row's exact tile maxima near that quantile
        theta_np = np.array([m[min(len(m) - 1, int(frac * (len(m) - 1)))] for m in sorted_max], dtype=np.float32)
        theta = torch.from_numpy(theta_np).to(g.device)
        listed.zero_()
        kn.filter(n_units, CK.threads(tiles.tile), table, plan.n_ent, table + 8 * plan.pairs_at, plan.n_pairs,
                  g._arena.post, g._arena.norms, cache, tiles.bounds, g.num_docs, tiles.tf_bits, tiles.block_size,
                  theta, listed)
        out = listed.cpu().numpy()
        got = np.zeros(n_units, bool)
        got[out[1:1 + out[0]]] = True
        need = (unit_max >= theta_np[unit_row]) & (unit_max > 0)
        assert need.any() and not (need & ~got).any(), (frac, np.flatnonzero(need & ~got)[:5])
        # and only units within the bound's slack of the threshold besides
        slack = theta_np[unit_row] * (1 - 2.0 ** -10) - 2.0 ** -15 * w_sum[unit_row]
        assert not (got & (unit_max < slack)).any(), frac


@pytest.mark.gpu
@needs_cuda
def test_cuda_single_query_plan_on_the_device(arguana, hotpot):
    """``plan_single``'s dense plan of one query: for every (doc block, query term) the entry of the host's plan, or a
    count of 0 where the term has no posting in the block; pairs are the blocks in order; its tile ranges are where
    each tile's docs begin in the entry's postings (numpy's searchsorted). Several shards (ArguAna's small banks)."""
    from ragserve.kernels.gpu.planning import plan_queries

    for reader, _, queries in (arguana, hotpot):
        g = GpuBackend(reader, scorer="cuda", max_batch=8)
        tiles = g._tiled.tiles
        assert g.plan.table_bytes > 0 and g.describe()["query_tables_bytes"] == g.plan.table_bytes
        post = g._arena.post.cpu().numpy().view(np.uint32)
        n_blocks, planner = tiles.n_blocks, g.device_arrays()["planner"]
        for q in [q for q in queries if 0 < len(q) <= CK.QMAX][:12]:
            assert tiles.plans_on_device(q)
            want = plan_queries(planner, [q], g._arena.pbase, n_blocks, False, 0.0)
            tiles.begin(1)
            tiles.set_query(q, 37)
            tiles.queue_plan(g._arena.post.data_ptr())
            torch.cuda.synchronize()
            nt, stride = len(q), tiles.stride
            n_ent = n_blocks * nt
            got = tiles.qtable.cpu().numpy()
            bounds = tiles.qbounds[:n_ent * tiles.tpb].cpu().numpy().reshape(n_ent, tiles.tpb)
            assert stride == n_blocks * CK.QMAX
            pairs = got[3 * stride:].reshape(5, n_blocks)
            assert (pairs[0] == 0).all() and pairs[1].tolist() == list(range(n_blocks)) and (pairs[4] == 37).all()
            assert pairs[2].tolist() == [b * nt for b in range(n_blocks)] and (pairs[3] - pairs[2] == nt).all()
            ent = got[:3 * stride].reshape(3, stride)[:, :n_ent].reshape(3, n_blocks, nt)  # start, count, weight bits
            assert (ent[2] == q.weights.view(np.int32)[None, :]).all()
            expect = np.zeros((2, n_blocks, nt), np.int64)  # start, count: every shard's entries of each term
            for j, t in enumerate(q.term_ids.astype(np.int64)):
                for sh in range(len(reader.shards)):
                    o = planner.offsets[sh]
                    for e in range(o + planner.term_ptr[t, sh], o + planner.term_ptr[t + 1, sh]):
                        a0, a1 = int(planner.blk_start[e]), int(planner.blk_start[e + 1])
                        expect[:, planner.blk_id[e], j] = g._arena.pbase[sh] + a0, a1 - a0
            assert (ent[1] == expect[1]).all() and (ent[0][expect[1] > 0] == expect[0][expect[1] > 0]).all()
            assert ent[1].sum() == want.table[want.n_ent:2 * want.n_ent].sum() > 0  # every posting of the host plan
            for e in np.flatnonzero(ent[1].reshape(-1)):
                docs = post[ent[0].reshape(-1)[e]:][:ent[1].reshape(-1)[e]] >> reader.tf_bits
                assert bounds[e].tolist() == np.searchsorted(docs, np.arange(tiles.tpb) * tiles.tile).tolist()
        g.close()


@pytest.mark.gpu
@needs_cuda
def test_cuda_single_queries_planned_on_the_device_or_the_host(arguana, monkeypatch):
    """One query at a time: up to QMAX terms planned on the device and run as one graph launch (captured once for each k
    and BM25 parameters, and launched alike when stage times are asked for: the times come from the graph's events),
    more on the host; all give the cpu backend's top-k, with the sums in any order or term after term."""
    from ragserve.kernels.contract import StageTimes

    reader, cpu, queries = arguana
    qs = [q for q in queries if 0 < len(q) <= CK.QMAX][:20]
    terms = np.unique(np.concatenate([q.term_ids for q in qs]))[:CK.QMAX + 40]
    long_q = bm25.QueryTerms(terms, np.ones(terms.size, np.float32),
                             np.linspace(0.5, 3.0, terms.size).astype(np.float32))
    assert len(long_q) > CK.QMAX
    host = []
    plan = pipeline.plan_queries  # the host plan of the queries the device does not plan
    monkeypatch.setattr(pipeline, "plan_queries", lambda *a: (host.append(len(a[1])), plan(*a))[1])
    for term_order in ("auto", "ascending"):
        g = GpuBackend(reader, scorer="cuda", max_batch=8, term_order=term_order)
        assert g.describe()["single_query_graph"]
        captures, launches = [], []
        copies = g._tiled.tiles.copies
        capture, launch = copies.capture, copies.launch_graph
        monkeypatch.setattr(copies, "capture", lambda *a: (captures.append(1), capture(*a))[1])
        monkeypatch.setattr(copies, "launch_graph", lambda *a: (launches.append(1), launch(*a)))
        for k, k1, b in ((10, 0.9, 0.4), (1000, 0.9, 0.4), (10, 1.2, 0.75)):
            host.clear()
            launches.clear()
            for q in qs + [long_q]:
                assert cpu.search_terms([q], k, k1, b)[0].same_as(g.search_terms([q], k, k1, b)[0]), k
            for q in qs[:4]:
                times = StageTimes()
                t = time.perf_counter()
                assert cpu.search_terms([q], k, k1, b)[0].same_as(g.search_terms([q], k, k1, b, times)[0]), k
                wall = time.perf_counter() - t
                assert 0 < times.relevancy and 0 < times.retrieval and times.relevancy + times.retrieval <= wall
            assert host == [1]  # only the long query
            assert len(launches) == len(qs) + 4  # timed or not, one graph launch a query the device plans
        assert len(captures) == 3
        g.close()


def test_sample_step():
    """Every sqrt(units a row / k)-th unit, odd; none when that is under min_sample_step, for fewer units than
    sample_min_units unless the filter runs, or when there is nothing."""
    s = GpuSettings(sample_min_units=10_000, sample_scale=1.0)
    step, filters = relevancy.sample_step, relevancy.filters
    assert step(9_999, 1, 10, s) == 31 and filters(9_999, 1, 10, 31, s)
    assert step(10_000, 1, 10, s) == 31
    assert step(64 * 10_000, 64, 10, s) == 31
    assert step(10_000, 1, 1000, s) == 0  # sqrt(10) < 4
    assert step(48_000, 1, 1000, s) == 7  # 6, made odd
    assert step(0, 0, 10, s) == 0
    s = replace(s, sample_scale=2.0)
    assert step(10_000, 1, 1000, s) == 7 and not filters(10_000, 1, 1000, 7, s)
    assert step(9_999, 1, 1000, s) == 0  # too few units, and no filter (4,000 > 9,999 // 7)
    assert step(9_999, 1, 10, s) == 63
    assert step(64 * 10_000, 64, 10, replace(s, sample_scale=0.0)) == 0


def test_host_ranking_of_candidates():
    """The tiled path's host ranking: candidates (row * num_docs + doc, score bits) in any order, per row by score
    descending then doc ascending, cut at k (rows with fewer than k, or none, included)."""
    from ragserve.kernels.gpu.selection import _rank_host

    rng = np.random.default_rng(7)
    rows, num_docs, k = 5, 1000, 7
    row = np.repeat(np.arange(rows), [30, 3, 0, 7, 300])
    doc = np.concatenate([rng.choice(num_docs, n, replace=False) for n in (30, 3, 0, 7, 300)])
    score = rng.choice(np.float32([0.5, 1.25, 2.0, 3.5]), row.size)  # many ties
    perm = rng.permutation(row.size)
    got = _rank_host(rows, k, num_docs, (row * num_docs + doc)[perm], score[perm].view(np.int32).astype(np.int64))
    for r in range(rows):
        sel = row == r
        order = np.lexsort((doc[sel], -score[sel]))[:k]
        assert got[r].docids.tolist() == doc[sel][order].tolist()
        assert got[r].scores.tolist() == score[sel][order].tolist()
