"""Analyzer cases with known Lucene EnglishAnalyzer outputs."""
from __future__ import annotations

import pytest

from indexer.analyzer import Analyzer, AnalyzerConfig, LUCENE_ENGLISH_STOPWORDS


@pytest.mark.parametrize("text, expected", [
    ("The quick brown foxes jumped", ["quick", "brown", "fox", "jump"]),
    ("John's car and the students' books", ["john", "car", "student", "book"]),
    ("JOHN\u2019S Book", ["john", "book"]),
    ("U.S.A. in 3.14 and 1,000,000 people", ["u.s.a", "3.14", "1,000,000", "peopl"]),
    ("a9.com wi-fi e-mail", ["a9", "com", "wi", "fi", "e", "mail"]),
    ("don't rock'n'roll", ["don't", "rock'n'rol"]),
    ("foo_bar 123abc", ["foo_bar", "123abc"]),
    ("\u4e2d\u6587 caf\u00e9s", ["\u4e2d", "\u6587", "caf\u00e9"]),
    ("is as us os", ["us", "os"]),
    ("beer \u0e40\u0e1a\u0e35\u0e22\u0e23\u0e4c ok", ["beer", "\u0e40\u0e1a\u0e35\u0e22\u0e23\u0e4c", "ok"]),  # a Thai run is one token
    ("arrow \u2194 \u00a9 2020 \U0001f600 \U0001f44d\U0001f3fd end", ["arrow", "\u2194", "\u00a9", "2020", "\U0001f600",
                                                     "\U0001f44d\U0001f3fd", "end"]),  # emoji are tokens
    (" \u0301 lone mark", ["lone", "mark"]),  # a combining mark alone starts no token  # stopwords go; two-letter words are not stemmed (Lucene's Porter)
    ("generalizations connected relational", ["gener", "connect", "relat"]),
    ("", []),
    ("!!! ... ---", []),
])
def test_lucene_english_cases(text, expected):
    assert Analyzer().analyze(text) == expected


def test_stopword_list_is_lucenes_33():
    assert len(LUCENE_ENGLISH_STOPWORDS) == 33
    assert {"the", "a", "with", "will", "such"} <= LUCENE_ENGLISH_STOPWORDS
    assert "from" not in LUCENE_ENGLISH_STOPWORDS


def test_options_turn_off_stemming_and_stopwords():
    a = Analyzer(AnalyzerConfig(stemmer="none", stopwords="none"))
    assert a.analyze("The running dogs") == ["the", "running", "dogs"]
    assert Analyzer.from_config(a.config_dict()).config == a.config
    with pytest.raises(ValueError, match="stemmer"):
        Analyzer(AnalyzerConfig(stemmer="snowball-fr"))


def test_long_tokens_are_split_every_255_chars():
    toks = Analyzer(AnalyzerConfig(stemmer="none")).analyze("x" * 600)
    assert [len(t) for t in toks] == [255, 255, 90]


def test_term_counts_give_length_after_stopwords():
    counts, n = Analyzer().term_counts("the cat and the cats")
    assert counts == {"cat": 2} and n == 2


def test_latin1_fast_path_tokenizes_like_uax29_on_real_text():
    import json

    from indexer import analyzer as A
    from tests.conftest import shared

    texts = [json.loads(line)["contents"] for line in open(shared("wiki18-100w-passages-sample", "sample_data.jsonl"))]
    texts += [json.loads(line)["text"] for line in open(shared("enwiki-wikiextractor-json-sample", "wiki_00"))]
    texts += ["l\u2019homme d\u2019\u00e9tat 3\u20195 a\u2019 \u2019b x\u00b7y 1\u00b72 caf\u00e9\u2019s na\u00efve \u00bd x\u00b2 "
              "\u00b5m \u00aab \u00ba1 \u2018q\u2019 a_:b a:_b _a_ ___ a._b 1,_2 1_,2 3.14.15 a.b.c. 1;2 a;b"]
    checked = 0
    for t in texts:
        t = t.lower()
        if not A.NOT_LATIN1.search(t):
            assert A._TOKEN_LATIN1.findall(t) == A._TOKEN.findall(t)
            checked += 1
    assert checked > 900
