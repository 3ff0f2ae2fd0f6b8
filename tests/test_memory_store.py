"""The persisted memory bank: the append-only log (torn tails cut, never half applied), ``MemoryBank.remove``,
``MemoryStore`` (add, search, list, delete, reopen: the same hits; eviction; compaction; the lock) and a writer
killed with SIGKILL mid-burst, several times, losing no acknowledged add and leaving no add half there."""
from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from indexer.wal import MAGIC, AppendLog, LogError
from ragserve.memory import store as store_mod
from ragserve.memory.bank import MemoryBank
from ragserve.memory.store import MemoryStore, MemoryStoreError
from tests.conftest import REPO
from tests.serverproc import ServerProcess, run_cli

TEXTS = ["The violet heron nests on the roof of the old mill.", "Tides are caused by the gravity of the moon.",
         "The mill was built in 1820 by the river.", "Copper conducts heat and electricity well.",
         "The orchestra tuned to the oboe before the concert.", "Glaciers carve U-shaped valleys over millennia.",
         "A heron stood in the shallow water, waiting for fish.", "The moon's pull raises the sea twice a day."]


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    """A random 32-dimensional sentence encoder: fast to load, and narrow enough for the fpga-sim kernel."""
    from tools.tiny_models import build_tiny_sentence_encoder

    return build_tiny_sentence_encoder(tmp_path_factory.mktemp("enc") / "tiny-encoder", TEXTS * 20)


@pytest.fixture(scope="module")
def tiny_embedder(tiny_encoder):
    from ragserve.retrieval.embedder import Embedder

    return Embedder(tiny_encoder, device="cpu")


def hits(store: MemoryStore, query: str, k: int = 5) -> list[tuple[int, float]]:
    return [(h.entry.id, h.score) for h in store.search(query, k)]


# -- the log ------------------------------------------------------------------------------------------------
def write_log(path, payloads) -> AppendLog:
    log = AppendLog(path)
    assert list(log.replay()) == []
    for p in payloads:
        log.append(p)
    log.close()
    return log


def test_log_torn_tail_is_cut_at_every_offset_and_never_half_applied(tmp_path):
    path = tmp_path / "x.log"
    payloads = [b"first", bytes(range(256)) * 3, b"", b"the last record, torn at each byte"]
    write_log(path, payloads)
    whole = path.read_bytes()
    last_start = len(whole) - (8 + len(payloads[-1]))
    for cut in range(last_start, len(whole)):  # a crash at every byte of the last record's write
        path.write_bytes(whole[:cut])
        log = AppendLog(path)
        assert list(log.replay()) == payloads[:-1]
        assert log.dropped_bytes == cut - last_start and path.stat().st_size == last_start
        log.append(b"after")  # the next record follows the last whole one
        log.close()
        log = AppendLog(path)
        assert list(log.replay()) == [*payloads[:-1], b"after"] and log.dropped_bytes == 0
        log.close()
    for pos in (last_start + 2, last_start + 5, len(whole) - 1):  # a bad length or checksum: torn, too
        bad = bytearray(whole)
        bad[pos] ^= 0x40
        path.write_bytes(bytes(bad))
        log = AppendLog(path)
        assert list(log.replay()) == payloads[:-1] and log.dropped_bytes == len(whole) - last_start
        log.close()


def test_log_rewrite_and_bad_files(tmp_path):
    path = tmp_path / "x.log"
    write_log(path, [b"a", b"b", b"c"])
    log = AppendLog(path)
    assert list(log.replay()) == [b"a", b"b", b"c"]
    log.rewrite([b"c2"])
    log.append(b"d")
    log.close()
    (tmp_path / "x.log.new").write_bytes(MAGIC + b"half a rewrite")  # a rewrite that crashed before its rename
    log = AppendLog(path)
    assert list(log.replay()) == [b"c2", b"d"] and not (tmp_path / "x.log.new").exists()
    log.close()
    (tmp_path / "other").write_bytes(b"not a log at all")
    with pytest.raises(LogError, match="is not a ragserve log"):
        list(AppendLog(tmp_path / "other").replay())
    with pytest.raises(LogError, match="read the log"):
        AppendLog(path).append(b"x")


# -- MemoryBank.remove --------------------------------------------------------------------------------------
@pytest.mark.parametrize("capacity", [6, 50])
def test_bank_remove_gives_the_bank_built_from_what_remains(capacity):
    rng = np.random.default_rng(capacity)
    vecs = rng.integers(-3, 4, size=(40, 16)).astype(np.float32)  # integer values: many exact ties
    backends = ["cpu", "gpu"] + (["fpga-sim"] if shutil.which(os.environ.get("CXX", "g++")) else [])
    for backend in backends:
        bank = MemoryBank(16, capacity, backend, device="cpu" if backend == "gpu" else None)
        bank.insert(vecs[:30], np.arange(30))  # wraps the ring when capacity is 6
        held = list(range(max(0, 30 - capacity), 30))
        drop = held[1::3] + [999]
        assert bank.remove(drop) == held[1::3]
        left = [i for i in held if i not in drop]
        bank.insert(vecs[30:], np.arange(30, 40))
        ref = MemoryBank(16, capacity, "cpu")
        ref.insert(vecs[left], left)
        ref.insert(vecs[30:], np.arange(30, 40))
        q = rng.integers(-3, 4, size=(4, 16)).astype(np.float32)
        assert len(bank) == len(ref)
        for a, b in zip(bank.recall(q, 8), ref.recall(q, 8)):
            assert a.ids.tolist() == b.ids.tolist() and np.allclose(a.scores, b.scores, atol=1e-6)


# -- MemoryStore --------------------------------------------------------------------------------------------
def test_store_add_search_delete_reopen_gives_the_same_hits(tmp_path, tiny_encoder, tiny_embedder):
    path = tmp_path / "mem"
    with MemoryStore(path, tiny_encoder) as s:
        assert s.add(TEXTS[:3], [{"topic": "birds"}, None, {"n": 3}]) == [0, 1, 2]
        assert s.add(TEXTS[3:]) == [3, 4, 5, 6, 7]
        assert s.delete([2, 42]) == [2]
        assert [e.id for e in s.list()] == [0, 1, 3, 4, 5, 6, 7] and [e.id for e in s.list(after=4, limit=2)] == [5, 6]
        assert s.get(0).metadata == {"topic": "birds"} and s.get(2) is None
        before = {q: hits(s, q, 6) for q in ("heron nest", "the moon and the sea", "concert")}
        assert all(len(h) == 6 and 2 not in dict(h) for h in before.values())
    # the recall is the bank's kernel over the stored embeddings: the same as a MemoryBank given them
    ref = MemoryBank(tiny_embedder.dim, store_mod.DEFAULT_CAPACITY)
    kept = [0, 1, 3, 4, 5, 6, 7]
    ref.insert(tiny_embedder.encode([TEXTS[i] for i in kept]), kept)
    for q, h in before.items():
        r = ref.recall(tiny_embedder.encode([q]), 6)[0]
        assert [i for i, _ in h] == r.ids.tolist() and np.allclose([s for _, s in h], r.scores, atol=1e-6)
    with MemoryStore(path) as s:  # the encoder it was made with, from its settings
        assert {q: hits(s, q, 6) for q in before} == before
        assert s.add(["one more"]) == [8]  # ids are never reused
        s.delete([8, 7])
    with MemoryStore(path, embedder=tiny_embedder) as s:
        assert s.next_id == 9 and len(s) == 6 and s.get(0).text == TEXTS[0]


def test_store_fpga_sim_recalls_what_cpu_does(tmp_path, tiny_encoder, hotpot_index):
    if not shutil.which(os.environ.get("CXX", "g++")):
        pytest.skip("the fpga-sim kernel's C simulation needs g++")
    with MemoryStore(tmp_path / "mem", tiny_encoder) as s:
        s.add(TEXTS * 3)
        cpu = {q: hits(s, q, 10) for q in ("heron", "glaciers and valleys", "copper")}
    with MemoryStore(tmp_path / "mem", backend="fpga-sim") as s:
        for q, h in cpu.items():
            f = hits(s, q, 10)
            assert [i for i, _ in f] == [i for i, _ in h] and np.allclose([x for _, x in f], [x for _, x in h],
                                                                          atol=1e-6)
    # the command line on the same kernel: the same hits
    r = run_cli("memory", "search", "--memory", str(tmp_path / "mem"), "--memory-backend", "fpga-sim", "-k", "10", "--json",
                "heron", timeout=300)
    assert r.returncode == 0, r.stderr
    f = [(h["id"], h["score"]) for h in json.loads(r.stdout)]
    assert [i for i, _ in f] == [i for i, _ in cpu["heron"]]
    assert np.allclose([x for _, x in f], [x for _, x in cpu["heron"]], atol=1e-6)
    # a server's /v1/memory on the same kernel: the same hits, and an add through it lands in the bank
    import requests

    srv = ServerProcess("--index", str(hotpot_index), "--backend", "cpu", "--memory", str(tmp_path / "mem"),
                        "--memory-backend", "fpga-sim", "--embed-device", "cpu", "--max-k", "30")
    try:
        srv.wait_ready()
        u = srv.url + "/v1/memory"
        for q, h in cpu.items():
            r = requests.get(u, params={"query": q, "k": 10}, timeout=120).json()
            assert r["backend"] == "fpga-sim" and [x["id"] for x in r["hits"]] == [i for i, _ in h]
            assert np.allclose([x["score"] for x in r["hits"]], [x for _, x in h], atol=1e-6)
        assert requests.post(u, json={"texts": TEXTS[:2]}, timeout=120).json()["ids"] == [24, 25]
        served = [(x["id"], x["score"]) for x in requests.get(u, params={"query": "heron", "k": 30},
                                                             timeout=120).json()["hits"]]
        assert srv.terminate() == 0
    finally:
        srv.terminate()
    with MemoryStore(tmp_path / "mem") as s:  # reopened on cpu: the server's adds, the same recall
        cpu_after = hits(s, "heron", 30)
    assert {24, 25} <= {i for i, _ in cpu_after} and [i for i, _ in served] == [i for i, _ in cpu_after]
    assert np.allclose([x for _, x in served], [x for _, x in cpu_after], atol=1e-6)


def test_store_eviction_and_compaction_survive_reopen(tmp_path, tiny_encoder, monkeypatch):
    monkeypatch.setattr(store_mod, "COMPACT_MIN_DEAD", 4)
    path = tmp_path / "mem"
    with MemoryStore(path, tiny_encoder, capacity=5) as s:
        ids, evicted = s.add_with_evictions(TEXTS[:4])
        assert ids == [0, 1, 2, 3] and evicted == []
        ids, evicted = s.add_with_evictions(TEXTS[4:])
        assert evicted == [0, 1, 2] and [e.id for e in s.list()] == [3, 4, 5, 6, 7]
        size_before = s.log.size
        s.delete([5])  # 4 dead of 4 live: the log is rewritten with the live entries
        assert s.log.size < size_before and s._dead == 0
        s.add(["a ninth entry about herons"])
        h = hits(s, "heron", 5)
    with MemoryStore(path) as s:
        assert [e.id for e in s.list()] == [3, 4, 6, 7, 8] and hits(s, "heron", 5) == h
    # the gpu backend's kernel (torch, here on the CPU device) on the replayed log, and its compaction, which
    # takes the f32 embeddings from the log rather than the bank's copies
    with MemoryStore(path, backend="gpu", device="cpu") as s:
        g = hits(s, "heron", 5)
        assert [i for i, _ in g] == [i for i, _ in h] and np.allclose([x for _, x in g], [x for _, x in h], atol=1e-6)
        s.delete([3, 4, 6, 7])
        assert s._dead == 0 and [e.id for e in s.list()] == [8]
    with MemoryStore(path) as s:
        assert hits(s, "heron", 5) == [(8, dict(h)[8])]
    with pytest.raises(MemoryStoreError, match="capacity is fixed when it is made"):
        MemoryStore(path, capacity=9)


def test_store_bad_input_and_one_process_at_a_time(tmp_path, tiny_encoder, minilm_dir):
    with pytest.raises(MemoryStoreError, match="is a new memory bank: give the sentence encoder"):
        MemoryStore(tmp_path / "new")
    with pytest.raises(MemoryStoreError, match="is not a memory bank"):
        MemoryStore(tmp_path / "absent", create=False)
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("x")
    with pytest.raises(MemoryStoreError, match="exists and is not a memory bank"):
        MemoryStore(tmp_path / "full", tiny_encoder)
    s = MemoryStore(tmp_path / "mem", tiny_encoder)
    with pytest.raises(MemoryStoreError, match=rf"in use by another process \(pid {os.getpid()}\)"):
        MemoryStore(tmp_path / "mem")
    for bad, msg in (([], "nothing to add"), ([" "], "non-empty strings"), ([1], "non-empty strings")):
        with pytest.raises(MemoryStoreError, match=msg):
            s.add(bad)
    with pytest.raises(MemoryStoreError, match="metadata must be a JSON object"):
        s.add(["x"], ["not an object"])
    with pytest.raises(MemoryStoreError, match="1 texts but 2 metadata"):
        s.add(["x"], [{}, {}])
    with pytest.raises(MemoryStoreError, match="k must be an integer >= 1"):
        s.search("x", 0)
    assert s.search("anything", 3) == [] and s.log.size == len(MAGIC)  # nothing was written for bad input
    with pytest.raises(MemoryStoreError, match="lone surrogate"):
        s.add(["lone \ud800 surrogate"])
    assert s.add(["a note"], [{"k": "\udfff"}]) == [0]  # metadata as JSON input may carry it
    s.close()
    from ragserve.retrieval.embedder import EmbedderError

    with pytest.raises(EmbedderError, match="was built with model 'tiny-encoder'"):
        MemoryStore(tmp_path / "mem", minilm_dir)
    with MemoryStore(tmp_path / "mem") as s:
        assert s.get(0).text == "a note" and s.get(0).metadata == {"k": "\udfff"}
    log = AppendLog(tmp_path / "mem" / "memory.log")  # a whole record that is not a memory record
    list(log.replay())
    log.append(b"\x05\x00\x00\x00{bad}")
    log.close()
    with pytest.raises(MemoryStoreError, match="record 1 is not a memory record"):
        MemoryStore(tmp_path / "mem")


# -- kill -9 mid-burst ----------------------------------------------------------------------------------------
# The writer's encoder: a text's hash as a unit vector. It makes the child start in a fraction of a second (no
# torch) and an add mostly writing and syncing, so kills land inside the log's writes too; what is under test
# is the store's log and replay, which see the same records as with a real encoder.
HASH_ENCODER = """
import hashlib
import numpy as np

class HashEncoder:
    dim = 16

    class info:
        def to_dict():
            return {"name": "hash", "path": "", "fingerprint": "hash-16", "dim": 16}

    def encode(self, texts):
        v = np.stack([np.random.default_rng(int.from_bytes(hashlib.sha256(t.encode()).digest()[:8], "little"))
                      .standard_normal(16) for t in texts]).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    def check_same_model(self, info, what):
        assert info["fingerprint"] == "hash-16", what
"""
WRITER = HASH_ENCODER + """
import sys
from ragserve.memory.store import MemoryStore
s = MemoryStore(sys.argv[1], embedder=HashEncoder())
r = sys.argv[2]
print("open", flush=True)
i = 0
while True:  # one add of two texts at a time: both there or neither
    # a large record (about 1 MB), so that a kill often lands while it is being written or synced
    ids = s.add([f"round {r} add {i} first", f"round {r} add {i} second"],
                [{"round": r, "add": i}, {"round": r, "add": i, "pad": "y" * (1 << 20)}])
    print(" ".join(map(str, ids)), flush=True)
    i += 1
"""


def test_kill_9_during_a_burst_of_adds_loses_no_acknowledged_write(tmp_path):
    ns: dict = {}
    exec(HASH_ENCODER, ns)
    encoder = ns["HashEncoder"]()
    path = tmp_path / "mem"
    rng = random.Random(32)
    acked: set[int] = set()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)}
    torn = rounds = 0
    while rounds < 8 or (torn == 0 and rounds < 30):  # until a kill has torn a record, too
        rounds += 1
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(rounds)],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        assert child.stdout.readline().strip() == "open", child.stderr.read()
        lines = [child.stdout.readline() for _ in range(rng.randrange(3, 25))]
        assert all(lines), child.stderr.read()
        time.sleep(rng.random() * 0.03)  # somewhere inside an add: embedding, writing or syncing
        child.send_signal(signal.SIGKILL)
        lines += child.stdout.read().splitlines()  # printed before the kill: acknowledged too
        assert child.wait(30) == -signal.SIGKILL
        round_acked = {int(i) for ln in lines if ln.strip() for i in ln.split()}
        acked |= round_acked
        with MemoryStore(path, embedder=encoder) as s:
            torn += s.log.dropped_bytes > 0
            entries = {e.id: e for e in s.list(limit=10**9)}
            assert acked <= set(entries)  # every acknowledged add of every round is there
            extra = {i for i, e in entries.items() if e.metadata["round"] == str(rounds)} - round_acked
            # at most the add in flight at the kill, and then both of its texts
            assert extra in (set(), {max(round_acked) + 1, max(round_acked) + 2}), extra
            for i in sorted(round_acked | extra)[::2]:
                a, b = entries[i], entries[i + 1]
                assert a.metadata["add"] == b.metadata["add"] and a.text.endswith("first")
                assert b.text.endswith("second") and len(b.metadata["pad"]) == 1 << 20
            acked |= extra
            assert len(s) == len(acked)
            assert [h.entry.id for h in s.search(entries[min(round_acked)].text, 1)] == [min(round_acked)]
    print(f"kill -9: {rounds} rounds, {len(acked) // 2} acknowledged adds all kept, {torn} torn tails cut")
    assert torn > 0


def test_cli_list_and_delete(tmp_path, tiny_embedder):
    with MemoryStore(tmp_path / "mem", embedder=tiny_embedder) as s:
        s.add(TEXTS[:3], [{"n": 0}, None, None])
    r = run_cli("memory", "delete", "--memory", str(tmp_path / "mem"), "1", "9")
    assert r.returncode == 2 and r.stdout == "deleted 1\n"
    assert r.stderr == f"ragserve memory: error: no entry with id 9 in {tmp_path / 'mem'} (the others were deleted)\n"
    r = run_cli("memory", "list", "--memory", str(tmp_path / "mem"), "--json")
    listed = json.loads(r.stdout)
    assert listed["total"] == 2 and [(e["id"], e["text"], e["metadata"]) for e in listed["entries"]] == \
        [(0, TEXTS[0], {"n": 0}), (2, TEXTS[2], {})]
    r = run_cli("memory", "list", "--memory", str(tmp_path / "nothing"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "is not a memory bank" in r.stderr
