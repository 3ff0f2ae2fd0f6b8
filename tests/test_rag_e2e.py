"""Every method end to end: the tiny random Llama over a real BM25 index of the HotpotQA dev paragraphs.
The model's text is noise, so these check the loops' mechanics: when they retrieve, with which query,
what reaches the trace, and the trigger decisions at thresholds where the outcome is certain."""
from __future__ import annotations

import time

import numpy as np
import pytest

from ragserve.rag.bridge import bridge_passages
from ragserve.rag.flare import masked_query
from ragserve.rag.methods import METHOD_NAMES, build_method
from ragserve.rag.prompts import PromptBuilder, load_exemplars
from ragserve.retrieval.rerank import CrossEncoder, RerankingSearcher
from ragserve.retrieval.searcher import Searcher
from tests import rag_support as S

QUESTIONS = 2
BUDGET = 40


@pytest.fixture(scope="module", autouse=True)
def _threads():
    with S.one_torch_thread():
        yield


@pytest.fixture(scope="module")
def searcher() -> Searcher:
    s = Searcher(S.hotpot_index(), backend="cpu")
    yield s
    s.close()


@pytest.fixture(scope="module")
def reranking(searcher) -> RerankingSearcher:
    return RerankingSearcher(searcher, CrossEncoder(str(S.tiny_cross_encoder()), device="cpu"), depth=20)


@pytest.fixture(scope="module")
def prompts() -> PromptBuilder:
    return PromptBuilder(load_exemplars("multihop.txt"), fewshot=4)


def make(name, prompts, searcher, reranking, **kw):
    retriever = reranking if name == "two-stage" else searcher
    opts = {"k": 3, "max_new_tokens": BUDGET, **kw}
    return build_method(name, S.generator(), prompts, retriever, **opts)


def kinds(trace) -> list[str]:
    return [s.kind for s in trace.steps]


def check_common(trace, searcher, wall: float, ranked: bool = True) -> None:
    for s in trace.steps:
        t = s.times.to_dict()
        assert all(v >= 0 for v in t.values())
        if s.kind == "retrieve":
            assert s.query and len(s.hits) <= 3
            assert t["relevancy"] > 0 and t["apply"] == 0
            scores = [h["score"] for h in s.hits]
            if ranked:  # bridge moves linked passages up
                assert scores == sorted(scores, reverse=True)
            for h in s.hits:
                assert h["title"] == searcher.index.document(int(h["id"][1:]))[0]
        else:
            assert t["apply"] > 0 and t["relevancy"] == 0 and s.tokens > 0
    total = trace.times
    assert total.prepare + total.relevancy + total.retrieval + total.apply <= wall
    assert trace.tokens == sum(s.tokens for s in trace.steps)
    assert trace.retrievals == kinds(trace).count("retrieve")
    # no answer marker in random text, so the model was asked for it
    assert kinds(trace)[-1] == "answer" or "the answer is" in trace.output.lower()


@pytest.mark.parametrize("name", METHOD_NAMES)
def test_every_method_runs_and_traces(name, prompts, searcher, reranking):
    method = make(name, prompts, searcher, reranking)
    for ex in S.hotpot_examples()[:QUESTIONS]:
        t0 = time.perf_counter()
        answer, trace = method.answer(ex.question)
        wall = time.perf_counter() - t0
        assert isinstance(answer, str) and trace.answer == answer
        check_common(trace, searcher, wall, ranked=not name.startswith("bridge"))
        gen_steps = [s for s in trace.steps if s.kind == "generate"]
        assert gen_steps and sum(s.tokens for s in gen_steps) <= 2 * BUDGET
        k = kinds(trace)
        if name == "none":
            assert trace.retrievals == 0
        elif name in ("single", "two-stage", "bridge"):
            assert k[:2] == ["retrieve", "generate"] and trace.retrievals == 1
            assert ex.question.startswith(trace.steps[0].query)
            if name == "bridge":  # the passages picked from the question's top 100
                picked = bridge_passages(ex.question, searcher.search(trace.steps[0].query, k=100), 3)
                assert [h["id"] for h in trace.steps[0].hits] == [h.id for h in picked]
        elif name in ("fixed-sentence", "fixed-length"):
            body = k[:-1] if k[-1] == "answer" else k
            assert body == ["retrieve", "generate"] * (len(body) // 2)  # a retrieval before every chunk
            assert ex.question.startswith(trace.steps[0].query)
            for i, s in enumerate(trace.steps[1:], 1):
                if s.kind == "retrieve":  # the previous chunk is the query
                    assert s.query == S.generator().truncate(trace.steps[i - 1].text, 64).strip()
            if name == "fixed-length":
                assert all(s.tokens <= 32 for s in gen_steps)
        elif name == "flare":
            assert k[0] == "retrieve" and ex.question.startswith(trace.steps[0].query)
            for i, s in enumerate(trace.steps):
                if s.kind == "generate" and s.trigger:
                    assert s.trigger["fired"] == (s.trigger["min_prob"] < 0.8)
                    if s.trigger["fired"]:  # retrieval, then the sentence regenerated
                        assert k[i + 1:i + 3] == ["retrieve", "generate"]
        elif name == "dragin":
            for i, s in enumerate(trace.steps):
                if s.kind == "generate" and s.trigger.get("fired"):
                    assert k[i + 1] == "retrieve" and s.trigger["words"]
                    assert all(v > s.trigger["threshold"] for v in s.trigger["scores"])


def test_flare_decisions_at_certain_thresholds(prompts, searcher, reranking):
    q = S.hotpot_examples()[2].question
    _, never = make("flare", prompts, searcher, reranking, theta=0.0).answer(q)
    assert never.retrievals == 1  # only the initial retrieval: no probability is below 0
    _, always = make("flare", prompts, searcher, reranking, theta=1.0, beta=0.0).answer(q)
    looks = [s for s in always.steps if s.kind == "generate" and s.trigger]
    assert looks and all(s.trigger["fired"] for s in looks)
    assert always.retrievals == 1 + len(looks)
    # beta = 0 masks nothing: the query is the look-ahead sentence itself
    i = always.steps.index(looks[0])
    assert always.steps[i + 1].query == S.generator().truncate(masked_query(looks[0].text, [], np.array([]), 0.0), 64)


def test_dragin_decisions_at_certain_thresholds(prompts, searcher, reranking):
    q = S.hotpot_examples()[3].question
    _, never = make("dragin", prompts, searcher, reranking, threshold=1e9).answer(q)
    assert never.retrievals == 0 and never.steps[0].trigger["fired"] is False
    _, fires = make("dragin", prompts, searcher, reranking, threshold=0.0, keep=5).answer(q)
    first = fires.steps[0]
    assert first.trigger["fired"] and first.trigger["sentence"] == 0
    query = fires.steps[1].query
    assert 0 < len(query.split()) <= 5
    # QFS keeps content words of the context (question and generated text), never the uncertain words
    context = q + " " + first.text
    assert all(w in context for w in query.split())
    assert not set(query.split()) & set(first.trigger["words"])


def test_queries_are_cut_to_the_token_budget(prompts, searcher, reranking):
    method = make("flare", prompts, searcher, reranking, query_max_tokens=4, theta=1.0, beta=0.0)
    _, trace = method.answer(S.hotpot_examples()[0].question)
    queries = [s.query for s in trace.steps if s.kind == "retrieve"]
    assert len(queries) >= 2 and all(S.generator().count_tokens(q) <= 4 for q in queries)


def test_two_stage_reranks_bm25_candidates(searcher, reranking):
    q = S.hotpot_examples()[0].question
    first = searcher.search(q, k=20)
    expected = reranking.reranker.score(q, [f"{h.title}: {h.text}" for h in first])
    hits = reranking.search(q, k=5)
    order = np.argsort(-expected, kind="stable")[:5]
    assert [h.id for h in hits] == [first[i].id for i in order]
    np.testing.assert_allclose([h.score for h in hits], expected[order], rtol=1e-5)
    assert {h.id for h in hits} <= {h.id for h in first}


def test_reranker_as_the_retriever_of_a_loop(prompts, searcher, reranking):
    method = build_method("fixed-length", S.generator(), prompts, reranking, k=2, max_new_tokens=BUDGET)
    _, trace = method.answer(S.hotpot_examples()[1].question)
    assert trace.retrievals >= 2 and all(len(s.hits) == 2 for s in trace.steps if s.kind == "retrieve")


def test_method_configuration_errors(prompts, searcher):
    from ragserve.rag.base import MethodError
    with pytest.raises(MethodError, match="reranker"):
        build_method("two-stage", S.generator(), prompts, searcher)
    with pytest.raises(MethodError, match="needs a retriever"):
        build_method("single", S.generator(), prompts, None)
    with pytest.raises(MethodError, match="unknown method"):
        build_method("ircot", S.generator(), prompts, searcher)
    with pytest.raises(MethodError, match="positive"):
        build_method("single", S.generator(), prompts, searcher, k=0)
    with pytest.raises(MethodError, match="non-empty"):
        build_method("none", S.generator(), prompts).answer("  ")
