"""Continuous batching of answers: every method's loop running in its own thread, their decode steps batched by
one batcher thread, gives the same answers and traces as the same requests run one at a time; the reference
engine's batched step equals each slot stepped alone; a request's session prefills only past the prefix its KV
cache already holds; prefill lanes prefill prompts at once, with the same answers; sampling options (temperature,
top_p, seed, stop strings).

The fast checks use the tiny random Llama of ``tests/rag_support.py``; one slow check runs the real generator
(google/gemma-3-270m) for two methods."""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from ragserve.rag.batcher import Batcher, BatchSettings, DecodeSession
from ragserve.rag.decoding import Sampling
from ragserve.rag.engines import ENGINES, engine_for
from ragserve.rag.engines.reference import ReferenceEngine
from ragserve.rag.generator import Generator, GeneratorError
from ragserve.rag.methods import METHOD_NAMES, build_method
from ragserve.rag.prompts import PromptBuilder, load_exemplars
from ragserve.retrieval.rerank import CrossEncoder, RerankingSearcher
from ragserve.retrieval.searcher import Searcher
from tests import rag_support as S

PROMPT = "Question: Who directed the film Titanic?\nAnswer:"
OPTIONS = {"k": 2, "max_new_tokens": 32, "answer_max_tokens": 8}
# thresholds at which the adaptive methods retrieve mid-answer on the tiny model's noise
METHOD_OPTIONS = {"flare": {"theta": 0.5}, "dragin": {"threshold": 0.5, "keep": 6}}


@pytest.fixture(scope="module", autouse=True)
def _threads():
    with S.one_torch_thread():
        yield


@pytest.fixture(scope="module")
def gen() -> Generator:
    return S.generator()


@pytest.fixture(scope="module")
def retrievers():
    searcher = Searcher(S.hotpot_index(), backend="cpu")
    reranking = RerankingSearcher(searcher, CrossEncoder(str(S.tiny_cross_encoder()), device="cpu"), depth=10)
    yield searcher, reranking
    searcher.close()


def record(answer, trace) -> tuple:
    """What an answer must reproduce exactly: the answer, and each step's kind, query, hits, text and stop."""
    return answer, [(s.kind, s.query, [h["id"] for h in s.hits], s.text, s.tokens, s.stop, s.prompt_tokens)
                    for s in trace.steps]


def run_all(generator, retrievers, jobs: list[tuple[str, str]], concurrent: bool, fewshot: int = 2,
            **options) -> list[tuple]:
    searcher, reranking = retrievers
    prompts = PromptBuilder(load_exemplars("multihop.txt"), fewshot=fewshot)

    def one(job):
        name, question = job
        method = build_method(name, generator, prompts, reranking if name == "two-stage" else searcher,
                              **{**OPTIONS, **METHOD_OPTIONS.get(name, {}), **options})
        if concurrent:
            start.wait(60)
        return record(*method.answer(question))

    start = threading.Barrier(len(jobs))
    if not concurrent:
        return [one(j) for j in jobs]
    with ThreadPoolExecutor(len(jobs)) as pool:
        return list(pool.map(one, jobs))


@pytest.mark.parametrize("lanes", [1, 2])
def test_interleaved_requests_of_every_method_equal_one_at_a_time(gen, retrievers, lanes):
    questions = [e.question for e in S.hotpot_examples()[:2]]
    jobs = [(m, q) for m in METHOD_NAMES for q in questions]
    if lanes > 1:  # the same model, prompts prefilled side by side
        gen = Generator.from_model(gen.model, gen.tokenizer, device="cpu", batch=BatchSettings(prefill_lanes=lanes))
    alone = run_all(gen, retrievers, jobs, concurrent=False)
    before = gen.batching
    together = run_all(gen, retrievers, jobs, concurrent=True)
    after = gen.batching
    for job, a, b in zip(jobs, alone, together):
        assert a == b, job
    kinds = {k for _, steps in alone for k, *_ in steps}
    assert {"retrieve", "generate", "answer"} <= kinds
    # the adaptive loops did retrieve mid-answer, so requests left and rejoined the batch between steps
    assert any(s[0] == "retrieve" for (m, _), (_, steps) in zip(jobs, alone) if m == "dragin" for s in steps)
    steps, advanced = after["steps"] - before["steps"], after["generation_steps"] - before["generation_steps"]
    assert advanced > 1.5 * steps, (steps, advanced)  # engine steps advanced several answers each


def test_engine_for_picks_the_registered_engine_of_the_model_type(gen, monkeypatch):
    assert isinstance(engine_for(gen.model, "cpu"), ReferenceEngine)  # no fast engine for Llama
    with pytest.raises(GeneratorError, match="no fast decode engine"):
        engine_for(gen.model, "cpu", kind="fast")
    with pytest.raises(GeneratorError, match="unknown engine"):
        engine_for(gen.model, "cpu", kind="turbo")
    monkeypatch.setitem(ENGINES, "llama", "ragserve.rag.engines.reference:ReferenceEngine")
    engine = engine_for(gen.model, "cpu", kind="fast", max_slots=3, max_length=100)
    assert isinstance(engine, ReferenceEngine) and (engine.max_slots, engine.max_length) == (3, 100)


def test_reference_step_is_batch_invariant(gen):
    prompts = [gen.tokenizer(p).input_ids for p in (PROMPT, "The Eiffel Tower is in", "Marie Curie was born")]
    together, alone = ReferenceEngine(gen.model, "cpu", max_slots=4), ReferenceEngine(gen.model, "cpu")
    slots = [together.open() for _ in prompts]
    firsts = [together.prefill(s, p) for s, p in zip(slots, prompts)]
    tokens = [int(r.argmax()) for r in firsts]
    rows = together.step(slots, tokens)
    assert rows.shape == (3, gen.model.config.vocab_size) and rows.dtype == torch.float32
    for i, (p, t) in enumerate(zip(prompts, tokens)):
        s = alone.open()
        assert torch.equal(alone.prefill(s, p), firsts[i])
        assert torch.equal(alone.step([s], [t])[0], rows[i])
        alone.close(s)
    # a truncated slot continues as if the dropped positions had never been fed
    together.truncate(slots[0], 3)
    assert together.length(slots[0]) == 3
    torch.testing.assert_close(together.prefill(slots[0], prompts[0][3:]), firsts[0], atol=1e-4, rtol=0)
    with pytest.raises(GeneratorError, match="slots"):
        together.open(), together.open()


def test_a_session_prefills_only_past_the_prefix_it_holds(gen):
    prefilled = []
    engine = gen.engine
    real = engine.prefill
    engine.prefill = lambda slot, ids: prefilled.append(len(ids)) or real(slot, ids)
    try:
        second = PROMPT + " It was directed by James Cameron.\nQuestion: When?\nAnswer:"
        with gen.session():
            a = gen.generate(PROMPT, 6)
            b = gen.generate(second, 6)
        fresh = gen.generate(second, 6)
    finally:
        del engine.prefill
    n1, n2 = (len(gen.tokenizer(p).input_ids) for p in (PROMPT, second))
    shared = len(gen.tokenizer(PROMPT).input_ids) - 1  # the prompt's last token may merge with what follows
    assert prefilled[0] == n1 and prefilled[1] <= n2 - shared + 1 and prefilled[2] == n2
    assert a.token_ids and b.token_ids == fresh.token_ids
    torch.testing.assert_close(torch.tensor(b.logprobs), torch.tensor(fresh.logprobs), atol=1e-4, rtol=0)


def test_more_sessions_than_slots_wait_for_one(gen):
    small = Generator.from_model(gen.model, gen.tokenizer, max_slots=1)
    expected = [gen.generate(p, 8).token_ids for p in (PROMPT, "The Eiffel Tower is in")]

    def one(p):
        with small.session():
            return small.generate(p, 8).token_ids

    with ThreadPoolExecutor(2) as pool:
        assert list(pool.map(one, (PROMPT, "The Eiffel Tower is in"))) == expected


def test_sampling_options(gen):
    greedy = gen.generate(PROMPT, 16, stop="none")
    # a nucleus of one token is the greedy choice
    assert gen.generate(PROMPT, 16, stop="none", sampling=Sampling(temperature=1.0, top_p=1e-6)).token_ids == \
        greedy.token_ids
    hot = Sampling(temperature=1.5, seed=7)
    a, b = (gen.generate(PROMPT, 16, stop="none", sampling=hot) for _ in range(2))
    assert a.token_ids == b.token_ids  # the same seed draws the same tokens
    assert a.token_ids != greedy.token_ids
    with gen.session(hot):  # one stream per request: its second generation goes on drawing
        c, d = gen.generate(PROMPT, 16, stop="none"), gen.generate(PROMPT, 16, stop="none")
    assert c.token_ids == a.token_ids and d.token_ids != c.token_ids
    word = greedy.text.strip().split()[2]
    cut = gen.generate(PROMPT, 16, stop="none", sampling=Sampling(stop=(word,)))
    assert cut.stop == "stop" and cut.text == greedy.text[:greedy.text.index(word)]
    for bad in ({"temperature": -1}, {"top_p": 0.0}, {"stop": ("",)}, {"stop": "x"}):
        with pytest.raises(GeneratorError):
            Sampling(**bad)


@pytest.mark.slow
def test_gemma_interleaved_answers_equal_one_at_a_time(gemma_dir, retrievers):
    """The real generator on its fast engine (prefix cache, kernels step): concurrent answers, and concurrent
    answers prefilled in two lanes (the engine's prefix cache shared by both), equal one at a time."""
    generator = Generator(str(gemma_dir), device="cpu")
    jobs = [(m, e.question) for m in ("fixed-sentence", "flare") for e in S.hotpot_examples()[:1]]
    small = {"fewshot": 1, "max_new_tokens": 16, "answer_max_tokens": 6, "theta": 0.9}
    alone = run_all(generator, retrievers, jobs, concurrent=False, **small)
    assert run_all(generator, retrievers, jobs, concurrent=True, **small) == alone
    assert all(answer for answer, _ in alone)
    generator._batcher.settings = BatchSettings(prefill_lanes=2)  # the same engine (a second one loads for 10 s)
    assert run_all(generator, retrievers, jobs, concurrent=True, **small) == alone
    assert generator._batcher._lanes is not None  # the lanes did prefill


class BarrierEngine:
    """A decode engine whose prefill waits for another prefill to arrive (``threading.Barrier`` of 2): prompts
    prefilled one after another never meet there."""

    max_slots, max_length, prefill_chunk = 4, 64, 0

    def __init__(self) -> None:
        self.barrier, self.threads, self.slots = threading.Barrier(2, timeout=1), set(), []

    def open(self) -> int:
        self.slots.append(len(self.slots))
        return self.slots[-1]

    def prefill(self, slot, ids, logits=True):
        self.threads.add(threading.current_thread().name)
        self.barrier.wait()
        return torch.zeros(8) if logits else None

    def reusable(self, slot, ids):
        return 0

    def step(self, slots, ids):
        return torch.zeros(len(slots), 8)

    def length(self, slot):
        return 0

    def truncate(self, slot, length):
        pass

    def close(self, slot):
        pass


class OneToken:
    """The smallest ``Decode``: the prompt's ids, one token, done."""

    def __init__(self, ids):
        self.ids = ids

    def feed(self, row):
        return None

    def result(self):
        return "done"


@pytest.mark.parametrize("lanes", [1, 2])
def test_prefill_lanes_prefill_prompts_at_once(lanes):
    """Two prompts admitted together: with two lanes both prefills run at the same time on the lanes' threads (they
    meet at the engine's barrier); with one, one after the other on the batcher thread (the barrier breaks and
    both generations fail)."""
    engine, batcher = BarrierEngine(), Batcher(settings=BatchSettings(prefill_lanes=lanes))
    holding, hold = threading.Event(), threading.Event()
    with ThreadPoolExecutor(3) as pool:
        pool.submit(batcher.call, lambda: (holding.set(), hold.wait(30)))  # the batcher thread waits in here
        assert holding.wait(30)
        futures = [pool.submit(batcher.generate, engine, OneToken(ids), DecodeSession()) for ids in ([1, 2], [4])]
        deadline = time.monotonic() + 30
        while len(batcher._new) < 2 and time.monotonic() < deadline:  # both queued: admitted in one round
            time.sleep(0.01)
        hold.set()
        results = [f.exception(timeout=30) or f.result() for f in futures]
    if lanes == 2:
        assert results == ["done", "done"]
        assert len(engine.threads) == 2 and all(t.startswith("ragserve-prefill") for t in engine.threads)
    else:
        assert all(isinstance(r, threading.BrokenBarrierError) for r in results)
        assert engine.threads == {"ragserve-batcher"}
    with pytest.raises(GeneratorError, match="prefill_lanes"):
        Batcher(settings=BatchSettings(prefill_lanes=0))
