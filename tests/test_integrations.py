"""The LangChain and LlamaIndex retrievers, with the real packages, in-process on the ArguAna index and against a
real server: the same top-k (ids, scores) as ``ragserve search`` (its TREC run, scores exact to the f32), with
each hit's passage, title and internal id."""
from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest

from ragserve.trec import read_run
from tests.serverproc import ServerProcess, run_cli, wait_until

langchain_core = pytest.importorskip("langchain_core")
llama_index_core = pytest.importorskip("llama_index.core")
requests = pytest.importorskip("requests")

from ragserve.integrations import langchain as rs_langchain  # noqa: E402
from ragserve.integrations import llamaindex as rs_llamaindex  # noqa: E402
from ragserve.integrations.hits import RetrievalError  # noqa: E402

K = 10
N_QUERIES = 40
KEY = "integration-key"


@pytest.fixture(scope="module")
def queries(arguana_queries) -> list:
    return [q for q in arguana_queries if q.text.strip()][:N_QUERIES]


@pytest.fixture(scope="module")
def cli_run(arguana_index, queries, tmp_path_factory) -> dict[str, list[tuple[str, float]]]:
    """``ragserve search --queries`` over the queries: {qid: [(doc id, f32 score)]}."""
    d = tmp_path_factory.mktemp("run")
    (d / "q.tsv").write_text("".join(f"{q.id}\t{q.text}\n" for q in queries), encoding="utf-8")
    r = run_cli("search", "--index", str(arguana_index), "--queries", str(d / "q.tsv"), "-k", str(K),
                "--output", str(d / "run.trec"), timeout=300)
    assert r.returncode == 0, r.stderr
    return {qid: [(doc, np.float32(s)) for doc, s in hits] for qid, hits in read_run(d / "run.trec").items()}


def langchain_pairs(retriever, text: str) -> list[tuple[str, float]]:
    docs = retriever.invoke(text)
    assert [d.metadata["rank"] for d in docs] == list(range(1, len(docs) + 1))
    assert all(d.id == d.metadata["id"] and d.page_content for d in docs)
    return [(d.id, d.metadata["score"]) for d in docs]


def llama_pairs(retriever, text: str) -> list[tuple[str, float]]:
    nodes = retriever.retrieve(text)
    assert all(n.node.node_id == n.node.metadata["id"] and n.node.get_content() for n in nodes)
    return [(n.node.node_id, n.score) for n in nodes]


def same_as_cli(pairs: list[tuple[str, float]], expected: list[tuple[str, float]]) -> None:
    assert len(pairs) == K and [(d, np.float32(s)) for d, s in pairs] == expected  # in rank order, ties too


def test_retrievers_in_process_return_the_top_k_of_ragserve_search(arguana_index, queries, cli_run):
    lc = rs_langchain.RagserveRetriever(index=arguana_index, k=K)
    li = rs_llamaindex.RagserveRetriever(arguana_index, k=K)
    try:
        for q in queries:
            a, b = langchain_pairs(lc, q.text), llama_pairs(li, q.text)
            assert a == b
            same_as_cli(a, cli_run[q.id])
        # the one-query CLI's JSON: exactly the same doubles, the same passages
        r = run_cli("search", "--index", str(arguana_index), "-k", str(K), "--json", queries[0].text)
        cli = json.loads(r.stdout)
        docs = lc.invoke(queries[0].text)
        assert [(h["id"], h["score"], h["text"], h["docid"]) for h in cli] == \
            [(d.id, d.metadata["score"], d.page_content, d.metadata["docid"]) for d in docs]
        assert [d.id for d in lc.invoke(queries[1].text, k=3)] == [d for d, _ in cli_run[queries[1].id][:3]]
        # the frameworks' async entry points reach the same search
        q = queries[2]
        assert [(d.id, d.metadata["score"]) for d in asyncio.run(lc.ainvoke(q.text))] == langchain_pairs(lc, q.text)
        assert [(n.node.node_id, n.score) for n in asyncio.run(li.aretrieve(q.text))] == llama_pairs(li, q.text)
    finally:
        lc.close()
        li.close()
    with pytest.raises(RetrievalError, match="exactly one of index"):
        rs_langchain.RagserveRetriever()
    with pytest.raises(RetrievalError, match="no such index directory"):
        rs_llamaindex.RagserveRetriever("/nonexistent/index")


def test_retrievers_against_a_server_return_the_same(arguana_index, queries, cli_run):
    # ArguAna queries are whole arguments, some longer than the default --max-query-chars
    srv = ServerProcess("--index", str(arguana_index), "--backend", "cpu", "--api-key", KEY,
                        "--max-query-chars", "20000")
    try:
        assert wait_until(lambda: requests.get(srv.url + "/readyz", headers={"Authorization": f"Bearer {KEY}"},
                                               timeout=5).status_code == 200, 120, 0.2), srv.log()
        lc = rs_langchain.RagserveRetriever(url=srv.url, api_key=KEY, k=K)
        li = rs_llamaindex.RagserveRetriever(url=srv.url, api_key=KEY, k=K)
        local = rs_langchain.RagserveRetriever(index=str(arguana_index), k=K)
        for q in queries[:15]:
            a = langchain_pairs(lc, q.text)
            assert a == llama_pairs(li, q.text) == langchain_pairs(local, q.text)
            same_as_cli(a, cli_run[q.id])
        assert lc.invoke(queries[0].text)[0].page_content == local.invoke(queries[0].text)[0].page_content
        local.close()
        with pytest.raises(RetrievalError, match="401 missing or wrong API key"):
            rs_langchain.RagserveRetriever(url=srv.url, api_key="wrong").invoke("x")
        with pytest.raises(RetrievalError, match="400 k must be between 1 and 100"):
            rs_llamaindex.RagserveRetriever(url=srv.url, api_key=KEY, k=101).retrieve("x")
    finally:
        srv.terminate()
