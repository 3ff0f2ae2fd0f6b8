"""Lucene ``EnglishAnalyzer``-compatible text analysis (pyserini's default).

Chain, as in Lucene: StandardTokenizer (UAX#29 word breaks, tokens longer than 255
chars split) -> EnglishPossessiveFilter -> LowerCaseFilter -> StopFilter (Lucene's
33 English stopwords) -> PorterStemFilter (original Porter algorithm).

The same ``Analyzer`` object is used at index and query time, and its ``config()``
is recorded in the index manifest so a searcher rebuilds exactly the same chain.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import regex
import Stemmer

# Lucene EnglishAnalyzer.ENGLISH_STOP_WORDS_SET.
LUCENE_ENGLISH_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then "
    "there these they this to was will with".split()
)

# The `regex` module implements UAX#29 word boundaries under the WORD flag: a token starts
# at a word character and runs until the next boundary. Han and Hiragana characters are
# single-character segments under UAX#29, exactly as Lucene emits them.
_TOKEN = regex.compile(r"\w(?:\B.)*", flags=regex.WORD | regex.V1)
_POSSESSIVE_SUFFIXES = ("'s", "\u2019s", "\uff07s")
MAX_TOKEN_LENGTH = 255


@dataclass(frozen=True)
class AnalyzerConfig:
    name: str = "lucene-english"
    stemmer: str = "porter"  # "porter" or "none"
    stopwords: str = "lucene-english"  # "lucene-english" or "none"
    lowercase: bool = True
    max_token_length: int = MAX_TOKEN_LENGTH


class Analyzer:
    """Turns text into index terms. Cheap to copy into worker processes."""

    def __init__(self, config: AnalyzerConfig | None = None) -> None:
        self.config = config or AnalyzerConfig()
        if self.config.stemmer not in ("porter", "none"):
            raise ValueError(f"unknown stemmer {self.config.stemmer!r} (expected 'porter' or 'none')")
        if self.config.stopwords not in ("lucene-english", "none"):
            raise ValueError(f"unknown stopword list {self.config.stopwords!r} (expected 'lucene-english' or 'none')")
        self._stop = LUCENE_ENGLISH_STOPWORDS if self.config.stopwords == "lucene-english" else frozenset()
        self._stemmer = Stemmer.Stemmer("porter") if self.config.stemmer == "porter" else None
        # Stems are cached per distinct surface form: Wikipedia-scale text repeats a small vocabulary.
        self._stem_cache: dict[str, str] = {}

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> "Analyzer":
        return cls(AnalyzerConfig(**cfg))

    def config_dict(self) -> dict[str, Any]:
        return asdict(self.config)

    def tokenize(self, text: str) -> list[str]:
        """StandardTokenizer: UAX#29 word segments, long ones split every 255 chars."""
        out = []
        limit = self.config.max_token_length
        for tok in _TOKEN.findall(text):
            if len(tok) <= limit:
                out.append(tok)
            else:
                out.extend(tok[i:i + limit] for i in range(0, len(tok), limit))
        return out

    def _stem(self, token: str) -> str:
        stem = self._stem_cache.get(token)
        if stem is None:
            # Lucene's PorterStemmer leaves words of one or two letters alone; Snowball's does not.
            stem = token if len(token) <= 2 or self._stemmer is None else self._stemmer.stemWord(token)
            if len(self._stem_cache) < 2_000_000:
                self._stem_cache[token] = stem
        return stem

    def analyze(self, text: str) -> list[str]:
        """Index terms of ``text`` in order (stopwords removed, so the length is Lucene's)."""
        terms = []
        stop = self._stop
        lower = self.config.lowercase
        for tok in self.tokenize(text):
            if tok.endswith(_POSSESSIVE_SUFFIXES):
                tok = tok[:-2]
            elif tok.endswith(("'S", "\u2019S", "\uff07S")):
                tok = tok[:-2]
            if lower:
                tok = tok.lower()
            if not tok or tok in stop:
                continue
            terms.append(self._stem(tok))
        return terms

    def term_counts(self, text: str) -> tuple[Counter, int]:
        """(term -> frequency, document length in tokens) for one document or query."""
        terms = self.analyze(text)
        return Counter(terms), len(terms)
