"""The numba index-time tokenizer (indexer/fasttok.py) gives exactly the analyzer's token stream."""
from __future__ import annotations

import gzip
import json
from collections import Counter

import numpy as np
import pytest

from indexer import analysis, fasttok
from indexer.analysis import chunk_postings
from indexer.analyzer import NOT_LATIN1, Analyzer
from indexer.options import BuildOptions
from indexer.readers import iter_documents
from indexer.synth import write_corpus
from indexer.writer import build_index
from tests.conftest import shared

ANALYZER = Analyzer()

TRICKY = [
    "", " ", "a", "A", "The QUICK brown Fox's tail", "JOHN\u2019S car, the students' books", "x'", "'x", "x''y",
    "U.S.A. in 3.14 and 1,000,000 people; 1;2 a;b a:b a:1 1:2 1.a a.1 a1.b2 3.14.15 a.b.c. 1,a a,1",
    "foo_bar 123abc _a_ ___ a._b 1,_2 1_,2 a_:b a:_b __init__ x_1.5",
    "l\u2019homme d\u2019\u00e9tat 3\u20195 a\u2019 \u2019b x\u00b7y 1\u00b72 \u2018q\u2019 a\u2018b 1\u20182",
    "CAF\u00c9 caf\u00e9 NA\u00cfVE na\u00efve \u00c0\u00d6\u00d8\u00de \u00e0\u00f6\u00f8\u00fe \u00df \u00ff \u00b5m \u00aab \u00ba1",
    "2\u00d73 6\u00f72 \u00bd x\u00b2 \u00bf\u00a1 \u00a3100 \u00a7 \u00b6 \u00b0C \u00b1 \u00bb\u00ab \u00a0nbsp\u00a0",
    "em\u2014dash en\u2013dash \u2026 \u2020 \u2030 \u2039x\u203a a\u2010b \u201cquoted\u201d \u2022 bullet",
    "x" * 255, "x" * 256, "y" * 600, "\u00e9" * 300, "ab" + "\u00c9" * 254 + "cd", "1" * 510 + ".5",
    "tab\tnew\nline\r\nform\x0ffeed \x00nul\x1fus\x7fdel",
    "Kelvin \u212a and \u0130stanbul and \u03a3\u039f\u03a3",  # lower-cased to Latin-1 by Java: full path
    "\u00a9 2020 \u00ae brand",  # emoji: full path
    "soft\u00adhyphen 1\u20442 \x85nel \u0101bc \u4e2d\u6587 \U0001f600",  # outside the set: full path
    "lone \ud800 surrogate",
    "ends with mid.", "3.", ".5", "a.", "x'", "end 1,",
]


def _real_texts() -> list[str]:
    texts = [f"{d['title']} {d['text']}" for d in map(json.loads, gzip.open(shared("beir-arguana", "corpus.jsonl.gz"), "rt"))]
    texts += [json.loads(line)["contents"] for line in open(shared("wiki18-100w-passages-sample", "sample_data.jsonl"))]
    for path in (shared("enwiki-wikiextractor-json-sample", "wiki_00"),
                 shared("enwiki-xml-dump-sample", "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2")):
        texts += [f"{d.title} {d.text}" for d in iter_documents([path])]
    return texts


class _Tokens:
    """A token table whose term ids are just token numbers, so token streams can be read back."""

    def __init__(self, table: fasttok.TokenTable | None = None) -> None:
        self.table = table or fasttok.TokenTable(255)
        self.names: list[str] = []
        self.index: dict[str, int] = {}
        self.reported: list[str] = []  # tokens the table reported as new

    def _id(self, tok: str) -> int:
        if tok not in self.index:
            self.index[tok] = len(self.names)
            self.names.append(tok)
        return self.index[tok]

    def _new(self, tok: str) -> int:
        self.reported.append(tok)
        return self._id(tok)

    def streams(self, texts: list[str]) -> list[list[str] | None]:
        """Token stream of each text, None for a text left to the full path."""
        buf = "".join(texts).encode("utf-8", "surrogatepass")
        ids, ends, rejected = self.table.ids(buf, np.array([len(t) for t in texts], dtype=np.int64), self._new,
                                             self._id)
        out: list[list[str] | None] = []
        prev = 0
        for d in range(len(texts)):
            assert not rejected[d] or ends[d] == prev
            out.append(None if rejected[d] else [self.names[i] for i in ids[prev:ends[d]]])
            prev = ends[d]
        return out


def _check(texts: list[str], table: fasttok.TokenTable | None = None, chunk: int = 1000) -> int:
    """Assert the fast path's streams are the analyzer's; returns the number of texts it tokenized."""
    tokens = _Tokens(table)
    fast = 0
    for i in range(0, len(texts), chunk):
        part = texts[i:i + chunk]
        for text, toks in zip(part, tokens.streams(part)):
            # Rejected exactly when a character is outside the set; otherwise the analyzer's tokens.
            assert (toks is None) == bool(NOT_LATIN1.search(text)), text
            if toks is not None:
                assert toks == ANALYZER.tokens(text), text
                fast += 1
    assert len(tokens.reported) == len(set(tokens.reported))  # each distinct token analysed once
    return fast


def test_character_classes_cover_every_code_point_in_the_set():
    rest = "".join(map(chr, range(fasttok.CLASS_LIMIT, 0x110000)))
    assert len(NOT_LATIN1.findall(rest)) == len(rest)
    assert (fasttok.CLASSES == fasttok.REJECT).sum() == sum(
        1 for c in range(fasttok.CLASS_LIMIT) if NOT_LATIN1.match(chr(c)))


def test_tricky_strings():
    assert _check(TRICKY, chunk=7) == len(TRICKY) - 4
    for text in TRICKY:  # alone, so every document boundary case is also a chunk boundary
        _check([text])


def test_real_texts_give_the_analyzers_tokens():
    texts = _real_texts()
    assert _check(texts) > 0.9 * len(texts)


def test_synthetic_corpus_gives_the_analyzers_tokens(tmp_path):
    path = tmp_path / "synth.jsonl"
    write_corpus(path, 3000, seed=5)
    texts = [f"{d['title']} {d['text']}" for d in map(json.loads, path.open())]
    assert _check(texts) == len(texts)


def test_table_limits_leave_tokens_to_the_caller():
    texts = _real_texts()[:3000]
    for limits in ({"max_tokens": 50}, {"max_arena": 300}, {"max_tokens": 0}):
        _check(texts, fasttok.TokenTable(255, **limits), chunk=250)


def test_table_grows_with_tokens_pending():
    # One call inserting many new tokens: the table grows (and rehashes) while they await their ids.
    texts = [" ".join(f"w{i}x{j}" for j in range(50)) for i in range(4000)]
    table = fasttok.TokenTable(255)
    assert _check(texts, table, chunk=len(texts)) == len(texts)
    assert table.state[0] == 200_000 and table.slots.shape[0] >= 400_000


def test_other_token_length_limits():
    texts = ["abcdefghij" * 3, "\u00e9" * 25 + " ok", "x" * 7]
    analyzer = Analyzer.from_config({**ANALYZER.config_dict(), "max_token_length": 7})
    assert _Tokens(fasttok.TokenTable(7)).streams(texts) == [analyzer.tokens(t) for t in texts]


def test_chunk_postings_count_terms_per_document():
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 30, 200)
    ids = rng.integers(-1, 40, counts.sum()).astype(np.int32)
    slots = rng.integers(0, 1000, 40).astype(np.int32)  # stale content must not matter
    for _ in range(2):
        terms, tfs, uniq, lengths = chunk_postings(ids, counts, slots)
        pos = np.concatenate(([0], np.cumsum(counts)))
        posting = np.concatenate(([0], np.cumsum(uniq)))
        for d in range(counts.size):
            want = Counter(int(t) for t in ids[pos[d]:pos[d + 1]] if t >= 0)
            got = dict(zip(terms[posting[d]:posting[d + 1]].tolist(), tfs[posting[d]:posting[d + 1]].tolist()))
            assert got == want and lengths[d] == sum(want.values())


@pytest.mark.parametrize("workers", [1, 2])
def test_index_is_the_same_without_the_fast_path(tmp_path, monkeypatch, workers):
    corpus = shared("beir-arguana", "corpus.jsonl.gz")
    opts = BuildOptions(block_size=1 << 11, bank_bytes=3 << 20, progress=False, workers=workers)
    fast = build_index([corpus], tmp_path / "fast", opts)
    monkeypatch.setattr(analysis, "TokenTable", lambda max_len: None)  # every document takes the analyzer's path
    full = build_index([corpus], tmp_path / "full", opts)
    assert fast["files"] == full["files"]
