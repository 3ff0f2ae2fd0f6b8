"""Topics, qrels and TREC run files: every supported format, the real shared files, and the error messages."""
from __future__ import annotations

import gzip
import io
import json

import numpy as np
import pytest

from ragserve.topics import Query, TopicsError, read_qrels, read_queries
from ragserve.trec import RunError, format_score, read_run, write_run
from tests.conftest import shared


def write(path, text: str, gz: bool = False):
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


# ---- topics -------------------------------------------------------------------------------------------------


def test_tsv_topics(tmp_path):
    p = write(tmp_path / "t.txt", "101\twhat is bm25\n\n7\t  lucene scoring  \n")
    assert read_queries(p) == [Query("101", "what is bm25"), Query("7", "lucene scoring")]


def test_beir_jsonl_gz(tmp_path):
    rows = [{"_id": "q1", "text": "first", "metadata": {}}, {"_id": "q2", "text": "second"}]
    p = write(tmp_path / "queries.jsonl.gz", "".join(json.dumps(r) + "\n" for r in rows), gz=True)
    assert [(q.id, q.text) for q in read_queries(p)] == [("q1", "first"), ("q2", "second")]


def test_generic_jsonl_keys_and_answers(tmp_path):
    rows = [{"qid": 5, "query": "a b"}, {"id": "x", "question": "c d", "golden_answers": ["yes"]}]
    p = write(tmp_path / "q.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    assert read_queries(p) == [Query("5", "a b"), Query("x", "c d", ("yes",))]


def test_plain_text_ids_are_line_numbers(tmp_path):
    p = write(tmp_path / "q.txt", "first query\n\nthird line query\n")
    assert read_queries(p) == [Query("1", "first query"), Query("3", "third line query")]


def test_dpr_qas_with_csv_quoted_answers(tmp_path):
    p = write(tmp_path / "nq.txt", "who wrote it\t['A B']\nwhen\t\"['x \"\"y\"\"']\"\n")
    assert read_queries(p) == [Query("1", "who wrote it", ("A B",)), Query("2", "when", ('x "y"',))]


def test_bom_is_ignored(tmp_path):
    p = tmp_path / "t.tsv"
    p.write_bytes("\ufeff1\thello\n".encode("utf-8"))
    assert read_queries(p) == [Query("1", "hello")]


@pytest.mark.parametrize(
    "name,text,message",
    [
        ("t.tsv", "1\ta\n2\tb\n1\tc\n", r"t.tsv:3: duplicate query id '1' \(first on line 1\)"),
        ("t.tsv", "1\ta\nno tab here\n", r"t.tsv:2: expected 'id<TAB>text'"),
        ("t.tsv", "1\ta\n2\t  \n", r"t.tsv:2: empty query text"),
        ("t.tsv", "\n\n", r"t.tsv: no queries"),
        ("q.jsonl", '{"_id": "a", "text": "x"}\n{"_id": "b", "text": \n', r"q.jsonl:2: invalid JSON"),
        ("q.jsonl", '{"_id": "a", "body": "x"}\n', r"q.jsonl:1: no query text"),
        ("q.jsonl", '{"text": "x"}\n', r"q.jsonl:1: no query id"),
        ("q.jsonl", "[1, 2]\n", r"q.jsonl:1: expected a JSON object"),
        ("nq.txt", "q one\t['a']\nq two\t[unclosed\n", r"nq.txt:2: answers field"),
    ],
)
def test_topics_errors_name_file_and_line(tmp_path, name, text, message):
    with pytest.raises(TopicsError, match=message):
        read_queries(write(tmp_path / name, text))


def test_topics_error_is_value_error_and_missing_file(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        read_queries(tmp_path / "absent.tsv")
    p = tmp_path / "bad.tsv"
    p.write_bytes(b"1\tok\n2\t\xff\xfe\n")
    with pytest.raises(TopicsError, match=r"bad.tsv:2: not UTF-8"):
        read_queries(p)


def test_real_topic_files():
    dev = read_queries(shared("msmarco-passage-queries", "topics.msmarco-passage.dev-subset.txt"))
    assert len(dev) == 6980 and dev[1] == Query("2", "Androgen receptor define")
    arguana = read_queries(shared("beir-arguana", "queries.jsonl.gz"))
    assert len(arguana) == 1406 and arguana[0].id == "test-environment-aeghhgwpe-pro02a"
    nq = read_queries(shared("nq-open", "topics.dpr.nq.test.txt"))
    assert len(nq) == 3610 and nq[0].text == "who got the first nobel prize in physics"
    assert nq[0].answers == ("Wilhelm Conrad Röntgen",)
    flash = read_queries(shared("nq-open", "flashrag_nq_test_sample.jsonl"))
    assert [q.text for q in flash] == [q.text for q in nq[:17]]


# ---- qrels --------------------------------------------------------------------------------------------------


def test_trec_and_beir_qrels(tmp_path):
    trec = write(tmp_path / "q.txt", "1 0 d1 2\n1 0 d2 0\n2 Q0 d3 1\n", gz=False)
    assert read_qrels(trec) == {"1": {"d1": 2, "d2": 0}, "2": {"d3": 1}}
    beir = write(tmp_path / "test.tsv.gz", "query-id\tcorpus-id\tscore\nq1\tc1\t1\nq1\tc2\t2.0\n", gz=True)
    assert read_qrels(beir) == {"q1": {"c1": 1, "c2": 2}}


@pytest.mark.parametrize(
    "text,message",
    [
        ("1 0 d1 1\n1 0 d1 2\n", r"q:2: \(1, d1\) judged 1 earlier and 2 here"),
        ("1 0 d1 1\n1 d2 1\n", r"q:2: 3 fields where the file has 4"),
        ("1 0 d1 high\n", r"q:1: relevance 'high' is not an integer"),
        ("1 0 d1 0.5\n", r"q:1: relevance '0.5'"),
        ("1 d1\n", r"q:1: expected 'qid 0 docid rel'"),
        ("query-id\tcorpus-id\tscore\n", r"q: no judgments"),
    ],
)
def test_qrels_errors(tmp_path, text, message):
    with pytest.raises(TopicsError, match=message):
        read_qrels(write(tmp_path / "q", text))


def test_real_qrels():
    dl19 = read_qrels(shared("msmarco-passage-queries", "qrels.dl19-passage.txt"))
    assert len(dl19) == 43 and sum(len(j) for j in dl19.values()) == 9260
    grades = [g for j in dl19.values() for g in j.values()]
    assert [grades.count(g) for g in range(4)] == [5158, 1601, 1804, 697]
    arguana = read_qrels(shared("beir-arguana", "qrels", "test.tsv"))
    assert len(arguana) == 1406 and all(list(j.values()) == [1] for j in arguana.values())


# ---- runs ---------------------------------------------------------------------------------------------------


def test_run_round_trip_keeps_f32_scores(tmp_path):
    rng = np.random.default_rng(0)
    scores = (rng.random(200) * 40).astype(np.float32)
    results = [("q1", [(f"d{i}", float(s)) for i, s in enumerate(scores[:150])]), ("q0", [("x", float(scores[150]))])]
    buf = io.StringIO()
    assert write_run(buf, results, "bm25") == 151
    first = buf.getvalue().splitlines()[0].split()
    assert first[:4] == ["q1", "Q0", "d0", "1"] and first[5] == "bm25"
    p = tmp_path / "run.txt"
    p.write_text(buf.getvalue())
    run = read_run(p)
    assert list(run) == ["q1", "q0"]
    back = np.array([s for _, s in run["q1"]], dtype=np.float32)
    assert np.array_equal(back, scores[:150])  # bit-exact through text
    assert [d for d, _ in run["q1"]] == [f"d{i}" for i in range(150)]


def test_format_score_is_short():
    assert format_score(np.float32(0.1)) == "0.1"
    assert float(np.float32(format_score(12.345678))) == float(np.float32(12.345678))


def test_read_run_sorts_by_rank(tmp_path):
    p = write(tmp_path / "r", "q 0 b 2 1.5 t\nq 0 a 1 2.5 t\nq 0 c 3 0.5 t\n")
    assert read_run(p) == {"q": [("a", 2.5), ("b", 1.5), ("c", 0.5)]}


@pytest.mark.parametrize(
    "text,message",
    [
        ("q Q0 a 1 2.0 t\nq Q0 a 2 1.0 t\n", r"r:2: query q retrieves 'a' twice \(first on line 1\)"),
        ("q Q0 a 1 2.0\n", r"r:1: expected 'qid Q0 docid rank score tag', got 5"),
        ("q Q0 a one 2.0 t\n", r"r:1: rank 'one'"),
        ("q Q0 a 1 nan t\n", r"r:1: score 'nan' is not finite"),
        ("\n", r"r: empty run"),
    ],
)
def test_read_run_errors(tmp_path, text, message):
    with pytest.raises(RunError, match=message):
        read_run(write(tmp_path / "r", text))


@pytest.mark.parametrize(
    "results,tag,message",
    [
        ([("q", [("a b", 1.0)])], "t", "document id 'a b'"),
        ([("q", [("a", 1.0), ("a", 0.5)])], "t", "retrieved twice"),
        ([("q", [("a", float("inf"))])], "t", "not finite"),
        ([("q", [])], "my tag", "run tag"),
    ],
)
def test_write_run_errors(results, tag, message):
    with pytest.raises(RunError, match=message):
        write_run(io.StringIO(), results, tag)
