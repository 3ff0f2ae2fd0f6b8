"""The shared-prefix KV cache and chunked prefill: ``PrefixCache`` keys chunks by their exact tokens and drops least
recently used leaves within its bytes; the Gemma 3 engine's prefill from a cached prefix, or in several calls ending
on chunk boundaries, writes the same KV bits and returns the same logits as one uncached prefill (an unaligned split
does not: that is why the chunks are aligned); the batcher interleaves a long prefill with running decode steps; and
every method's answers through the fast engine with the cache and interleaving equal the answers without them, one
at a time. One slow check does the same on the real gemma-3-270m."""
from __future__ import annotations

import threading
import time

import pytest
import torch

from ragserve.rag.batcher import Batcher, BatchSettings
from ragserve.rag.decoding import Decode, Sampling
from ragserve.rag.engine import PrefillSettings
from ragserve.rag.engines import engine_for
from ragserve.rag.engines.gemma3 import Gemma3Engine
from ragserve.rag.generator import Generator
from ragserve.rag.methods import METHOD_NAMES
from ragserve.rag.prefix_cache import PrefixCache
from tests import rag_support as S
from tests.test_rag_batching import run_all
from tools.tiny_models import tiny_gemma3

HEAD = [2, *range(10, 60)]  # 51 tokens every prompt starts with
PROMPTS = [HEAD + list(range(100 + 7 * i, 133 + 7 * i)) for i in range(3)]


@pytest.fixture(scope="module", autouse=True)
def _threads():
    with S.one_torch_thread():
        yield


@pytest.fixture(scope="module")
def tiny():
    return tiny_gemma3()


def test_cache_keys_chunks_by_their_exact_tokens_and_evicts_leaves_first():
    c = PrefixCache(chunk=4, max_bytes=300)
    a = list(range(12))
    for k in range(3):
        assert c.store(a, k, f"a{k}", 100)
    assert c.lookup(a, 0, 12) == ["a0", "a1", "a2"] and c.lookup(a, 4, 11) == ["a1"]  # chunks ending <= end
    assert c.lookup(a, 2, 12) == []  # not a chunk boundary
    assert c.covered(a + [99], 0, 12) == 12 and c.covered(a, 8, 12) == 4
    b = a[:5] + [77] + a[6:]  # differs inside chunk 1: only chunk 0 is shared
    assert c.lookup(b, 0, 12) == ["a0"]
    assert not c.store(b, 2, "b2", 100)  # its chunk 1 is not stored: chunk 2 would have no parent
    # full (300 bytes): storing b's chunk 1 drops the least recently used leaf (a2), never a chunk others extend
    c.lookup(a, 0, 8)
    assert c.store(b, 1, "b1", 100)
    assert c.nbytes == 300 and len(c) == 3 and c.lookup(a, 0, 12) == ["a0", "a1"]
    assert c.lookup(b, 0, 8) == ["a0", "b1"]
    assert not c.store(a, 0, "huge", 301) and c.stored == 4


def test_prefill_from_the_cache_is_the_same_bits_as_without(tiny):
    cold = Gemma3Engine(tiny, max_slots=2, max_length=160, prefill=PrefillSettings(chunk=16, prefix_cache_bytes=0))
    warm = Gemma3Engine(tiny, max_slots=2, max_length=160, prefill=PrefillSettings(chunk=16))
    for i, ids in enumerate(PROMPTS):
        a, b = cold.open(), warm.open()
        assert warm.reusable(b, ids) == (0 if i == 0 else 48)  # the head's three whole chunks, after the first
        la, lb = cold.prefill(a, ids), warm.prefill(b, ids)
        assert torch.equal(la, lb)
        for layer in range(len(cold.layers)):
            assert torch.equal(cold.k_cache[layer][a, :, :len(ids)], warm.k_cache[layer][b, :, :len(ids)])
            assert torch.equal(cold.v_cache[layer][a, :, :len(ids)], warm.v_cache[layer][b, :, :len(ids)])
        ta, tb = [int(la.argmax())], [int(lb.argmax())]
        for _ in range(20):
            ta.append(int(cold.step([a], [ta[-1]])[0].argmax()))
            tb.append(int(warm.step([b], [tb[-1]])[0].argmax()))
        assert ta == tb and len(set(ta)) > 3
        cold.close(a)
        warm.close(b)
    assert warm.describe()["prefix_cache"]["hits"] == 6


def test_prefill_split_on_chunk_boundaries_equals_one_call(tiny):
    engine = Gemma3Engine(tiny, max_slots=3, max_length=160, prefill=PrefillSettings(chunk=16, prefix_cache_bytes=0))
    ids = PROMPTS[0]
    whole = engine.prefill(engine.open(), ids)
    s = engine.open()
    assert engine.prefill(s, ids[:32], logits=False) is None
    assert torch.equal(engine.prefill(s, ids[32:]), whole)
    # split inside a chunk, that chunk is computed in two products of other shapes: not the same bits
    u = engine.open()
    engine.prefill(u, ids[:5], logits=False)
    split = engine.prefill(u, ids[5:])
    assert not torch.equal(split, whole)
    torch.testing.assert_close(split, whole, rtol=0, atol=1e-4)


def test_only_positions_a_prefill_computed_from_position_0_are_cached(tiny):
    """Decode steps compute their positions with other kernels: chunks holding them are never stored, and a
    slot whose prefill starts inside a chunk neither copies nor stores."""
    cold = Gemma3Engine(tiny, max_slots=1, max_length=160, prefill=PrefillSettings(chunk=16, prefix_cache_bytes=0))
    warm = Gemma3Engine(tiny, max_slots=1, max_length=160, prefill=PrefillSettings(chunk=16))
    s = warm.open()
    warm.prefill(s, PROMPTS[0][:40])  # chunks 0 and 1 stored; 32..39 computed as part of chunk 2
    for t in range(20, 30):
        warm.step([s], [t])
    warm.truncate(s, 45)
    assert warm.reusable(s, [5, 6]) == 0  # 45 is inside a chunk
    warm.prefill(s, list(range(200, 230)))
    assert warm.describe()["prefix_cache"]["stored"] == 2
    long = PROMPTS[0][:40] + list(range(20, 25)) + list(range(200, 230))
    warm.close(s)
    s = warm.open()
    assert warm.reusable(s, long) == 32
    a = cold.open()
    assert torch.equal(warm.prefill(s, long), cold.prefill(a, long))


class Recording(Gemma3Engine):
    """The engine, logging its calls: ("prefill", slot, positions) and ("step", slots)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple] = []

    def prefill(self, slot, ids, logits=True):
        self.calls.append(("prefill", slot, len(ids)))
        return super().prefill(slot, ids, logits)

    def step(self, slots, ids):
        self.calls.append(("step", tuple(slots)))
        return super().step(slots, ids)


def test_a_long_prefill_is_interleaved_with_running_decode_steps(tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(S.tiny_lm())
    engine = Recording(tiny, max_slots=2, max_length=400, prefill=PrefillSettings(chunk=16, prefix_cache_bytes=0))
    batcher = Batcher(settings=BatchSettings(prefill_tokens=32))

    def decode(ids, n):
        return Decode(list(ids), n, "none", Sampling(), None, tok, {1})

    long = [2, *range(3, 300)]
    alone = batcher.generate(engine, decode(long, 8)).token_ids
    engine.calls.clear()
    out = {}
    short = threading.Thread(target=lambda: out.update(a=batcher.generate(engine, decode(PROMPTS[0], 80))))
    short.start()
    while not any(c[0] == "step" for c in engine.calls):
        time.sleep(0.001)
    out["b"] = batcher.generate(engine, decode(long, 8))
    short.join()
    calls = engine.calls
    a_slot = calls[0][1]  # the short prompt's prefill came first
    b_slot = next(c[1] for c in calls if c[0] == "prefill" and c[1] != a_slot)
    pieces = [i for i, c in enumerate(calls) if c[0] == "prefill" and c[1] == b_slot]
    assert len(pieces) >= 9 and all(calls[i][2] <= 32 for i in pieces)  # 298 positions, 32 at a time
    between = [c for c in calls[pieces[0]:pieces[-1]] if c[0] == "step"]
    assert len(between) >= len(pieces) - 1  # a decode step after every piece but the last
    assert out["b"].token_ids == alone and len(out["a"].token_ids) == 80


def test_every_method_with_the_cache_and_interleaving_equals_without_one_at_a_time(tiny):
    from transformers import AutoTokenizer

    from ragserve.retrieval.searcher import Searcher

    tok = AutoTokenizer.from_pretrained(S.tiny_lm())
    model = tiny_gemma3(vocab_size=len(tok))
    plain = Generator.from_model(model, tok, engine="fast", batch=BatchSettings(prefill_tokens=0),
                                 engine_options={"prefill": PrefillSettings(chunk=16, prefix_cache_bytes=0)})
    cached = Generator.from_model(model, tok, engine="fast", batch=BatchSettings(prefill_tokens=32),
                                  engine_options={"prefill": PrefillSettings(chunk=16)})
    searcher = Searcher(S.hotpot_index(), backend="cpu")
    try:
        methods = [m for m in METHOD_NAMES if m != "two-stage"]  # two-stage needs a reranker; not a decode path
        jobs = [(m, e.question) for m in methods for e in S.hotpot_examples()[:2]]
        alone = run_all(plain, (searcher, None), jobs, concurrent=False)
        together = run_all(cached, (searcher, None), jobs, concurrent=True)
    finally:
        searcher.close()
    for job, a, b in zip(jobs, alone, together):
        assert a == b, job
    stats = cached.batching
    assert stats["prefill_reused"] > stats["prefill_tokens"] / 4  # the exemplars' chunks came from the cache
    assert plain.batching["prefill_reused"] == 0


@pytest.mark.slow
def test_real_gemma_prefill_from_the_cache_is_the_same_bits(gemma_dir):
    """gemma-3-270m on the served prompt layout (direct exemplars, passages, question): two prompts sharing the
    exemplars, with the cache and without, at the default chunk: the same logits bits and greedy tokens."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ragserve.rag.prompts import PromptBuilder, load_exemplars
    from ragserve.retrieval.contract import Hit

    tok = AutoTokenizer.from_pretrained(gemma_dir)
    model = AutoModelForCausalLM.from_pretrained(gemma_dir, dtype=torch.float32).eval()
    cold = engine_for(model, max_slots=1, max_length=1024, prefill=PrefillSettings(prefix_cache_bytes=0))
    warm = engine_for(model, max_slots=1, max_length=1024)
    builder = PromptBuilder(load_exemplars("multihop-direct.txt"))
    passages = [("Paris", "Paris is the capital and largest city of France."),
                ("Jane Austen", "Jane Austen was an English novelist known for Pride and Prejudice.")]
    reused = []
    for (title, text), q in zip(passages, ["What is the capital of France?", "Who wrote Emma?"]):
        ids = tok(builder.build(q, passages=[Hit(0, "1", 1.0, title, text)])).input_ids
        a, b = cold.open(), warm.open()
        reused.append(warm.reusable(b, ids))
        la, lb = cold.prefill(a, ids), warm.prefill(b, ids)
        assert torch.equal(la, lb)
        ta, tb = [int(la.argmax())], [int(lb.argmax())]
        for _ in range(6):
            ta.append(int(cold.step([a], [ta[-1]])[0].argmax()))
            tb.append(int(warm.step([b], [tb[-1]])[0].argmax()))
        assert ta == tb
        cold.close(a)
        warm.close(b)
    assert reused[0] == 0 and reused[1] >= 192  # the exemplars' whole chunks (241 tokens)
