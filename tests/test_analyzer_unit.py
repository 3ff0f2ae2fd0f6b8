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
    ("is as us os", ["us", "os"]),  # stopwords go; two-letter words are not stemmed (Lucene's Porter)
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
