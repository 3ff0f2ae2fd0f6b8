"""Synthetic corpus: statistics of a 20k-passage output against the fitted parameters, determinism, queries."""
from __future__ import annotations

import gzip
import hashlib
import json
from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

from indexer.analyzer import LUCENE_ENGLISH_STOPWORDS, Analyzer
from indexer.synth import CHUNK_DOCS, TABLE_RANKS, WIKI_PARAMS, Synthesizer, write_corpus
from ragserve.cli import main
from ragserve.topics import read_queries

N_DOCS = 20_000


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    d = tmp_path_factory.mktemp("synth")
    path, qpath = d / "c.jsonl", d / "q.tsv"
    stats = write_corpus(path, N_DOCS, seed=7, n_queries=200, queries_path=qpath, workers=2)
    docs = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    return path, qpath, stats, docs


def slope(counts: np.ndarray, q: float, first: int, last: int) -> float:
    r = np.unique(np.geomspace(first, last, 200).astype(np.int64))
    s, _ = np.polyfit(np.log(r + q), np.log(counts[r - 1]), 1)
    return -s


def test_statistics_follow_the_fitted_parameters(corpus):
    _, _, stats, docs = corpus
    p = WIKI_PARAMS
    assert stats.docs == len(docs) == N_DOCS and [d["id"] for d in docs[:3]] == ["0", "1", "2"]
    lengths = np.array([len(d["text"].split()) for d in docs])
    assert stats.tokens == lengths.sum()
    assert abs(lengths.mean() - p.length_mean) < 0.1 and abs(lengths.std() - p.length_std) < 0.1
    counts = Counter(w for d in docs for w in d["text"].split())
    total = sum(counts.values())
    freq = np.array(sorted(counts.values(), reverse=True), dtype=np.float64)
    # The Zipf-Mandelbrot regime: ranks past the head whose expected count is large enough to rank reliably.
    last = int(np.searchsorted(-p.pmf(np.arange(1, p.tail_rank + 1)) * total, -100))
    assert last > 2000
    assert abs(slope(freq, p.zipf_q, len(p.head_words) + 1, last) - p.zipf_s) < 0.05
    # Head words at their measured shares; Lucene stopwords ~32% of tokens as in the real sample.
    assert abs(counts["the"] / total - p.head_probs[0]) < 0.002
    stop = sum(counts[w] for w in LUCENE_ENGLISH_STOPWORDS) / total
    assert abs(stop - sum(pr for w, pr in zip(p.head_words, p.head_probs) if w in LUCENE_ENGLISH_STOPWORDS)) < 0.005
    assert 0.30 < stop < 0.34
    # Vocabulary growth: the sample's Heaps fit (K=19.117, beta=0.5842) at this size, within 10%.
    assert abs(len(counts) / (19.117 * total ** 0.5842) - 1) < 0.10
    # Burstiness: mean tf of (passage, non-stopword) pairs, 1.2118 in the sample.
    pairs = [Counter(w for w in d["text"].split() if w not in LUCENE_ENGLISH_STOPWORDS) for d in docs[:5000]]
    assert abs(sum(sum(c.values()) for c in pairs) / sum(len(c) for c in pairs) - 1.2118) < 0.03
    titles = Counter(len(d["title"].split()) for d in docs)
    assert abs(titles[2] / N_DOCS - p.title_len_probs[1]) < 0.02
    assert not any(w in p.head_words for d in docs[:2000] for w in d["title"].split())


def test_sampler_matches_the_law():
    s = Synthesizer(WIKI_PARAMS, seed=3)
    _, tokens, _ = s.chunk(0, CHUNK_DOCS)
    p = WIKI_PARAMS
    n = len(tokens)
    ranks = tokens.astype(np.int64) + 1
    # Token shares of the head, of the table/closed-form boundary and of the tail regime, as the pmf says.
    for bound in (len(p.head_words), TABLE_RANKS, p.tail_rank):
        expect = p.pmf(np.arange(1, bound + 1)).sum()
        got = np.mean(ranks <= bound)
        assert abs(got - expect) < 4 * np.sqrt(expect * (1 - expect) / n) + 0.002, bound
    assert ranks.max() <= p.vocab_size and ranks.max() > 1_000_000  # the closed-form tail is reached
    assert np.isclose(replace(p, vocab_size=200_000).rank_probabilities().sum(), 1.0)


def test_same_seed_same_bytes_and_workers_do_not_matter(tmp_path, corpus):
    path, qpath, _, _ = corpus
    again, qagain = tmp_path / "c.jsonl", tmp_path / "q.tsv"
    write_corpus(again, N_DOCS, seed=7, n_queries=200, queries_path=qagain, workers=1)
    assert hashlib.sha256(again.read_bytes()).digest() == hashlib.sha256(path.read_bytes()).digest()
    assert qagain.read_bytes() == qpath.read_bytes()
    other = tmp_path / "o.jsonl"
    write_corpus(other, 100, seed=8)
    assert other.read_bytes() != path.read_bytes()[: len(other.read_bytes())]
    gz = tmp_path / "c.jsonl.gz"
    write_corpus(gz, 1000, seed=7)
    first = gz.read_bytes()
    write_corpus(gz, 1000, seed=7)
    assert gz.read_bytes() == first  # gzip header carries no time or name
    assert gzip.decompress(first) == b"".join(path.read_bytes().splitlines(keepends=True)[:1000])
    assert not list(tmp_path.glob("*.part"))


def test_analyzer_keeps_pseudo_words_distinct():
    s = Synthesizer(WIKI_PARAMS)
    h = len(WIKI_PARAMS.head_words)
    rng = np.random.default_rng(0)
    ranks = np.concatenate([np.arange(h, h + 5000), rng.integers(h, WIKI_PARAMS.vocab_size, 20000)])
    words = [s.word(int(r)) for r in np.unique(ranks)]
    assert len(set(words)) == len(words)
    analyzer = Analyzer()
    assert all(analyzer.analyze(w) == [w] for w in words)
    assert [s.word(i) for i in range(3)] == list(WIKI_PARAMS.head_words[:3])


def test_queries_come_from_passages(corpus):
    _, qpath, stats, docs = corpus
    queries = read_queries(qpath)
    assert stats.queries == len(queries) == 200 and [q.id for q in queries[:2]] == ["1", "2"]
    lens = Counter(len(q.text.split()) for q in queries)
    assert min(lens) >= 3 and max(lens) <= 12
    texts = [set(d["text"].split()) for d in docs]
    stop_share = np.mean([w in LUCENE_ENGLISH_STOPWORDS for q in queries for w in q.text.split()])
    assert 0.15 < stop_share < 0.5  # common words too, not only rare ones
    for q in queries[:40]:
        words = q.text.split()
        assert any(w not in LUCENE_ENGLISH_STOPWORDS for w in words)
        assert any(set(words) <= t for t in texts), q


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="at least one document"):
        write_corpus(tmp_path / "x.jsonl", 0)
    with pytest.raises(ValueError, match="number of queries"):
        write_corpus(tmp_path / "x.jsonl", 5, n_queries=6, queries_path=tmp_path / "q.tsv")
    with pytest.raises(ValueError, match="burst"):
        replace(WIKI_PARAMS, burst=1.0)
    with pytest.raises(ValueError, match="pseudo-word shape"):
        replace(WIKI_PARAMS, head_words=("the", "bada"), head_probs=(0.1, 0.1))


def test_corpus_synth_command(tmp_path, capsys):
    out, qout = tmp_path / "s.jsonl", tmp_path / "q.tsv"
    assert main(["corpus", "synth", "--docs", "300", "--out", str(out), "--seed", "3", "--queries", "5",
                 "--queries-out", str(qout)]) == 0
    assert len(out.read_text().splitlines()) == 300 and len(read_queries(qout)) == 5
    assert "300 passages" in capsys.readouterr().out
    assert main(["corpus", "synth", "--docs", "10", "--out", str(out), "--queries", "5"]) == 2
    assert "--queries-out" in capsys.readouterr().err
    # Every output path gets its parent folders (as `index --out` does); a folder as the output is one line, exit 2.
    assert main(["corpus", "synth", "--docs", "10", "--out", str(tmp_path / "no" / "dir.jsonl")]) == 0
    assert len((tmp_path / "no" / "dir.jsonl").read_text().splitlines()) == 10
    capsys.readouterr()
    assert main(["corpus", "synth", "--docs", "10", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
