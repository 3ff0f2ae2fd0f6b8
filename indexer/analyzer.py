"""Lucene ``EnglishAnalyzer``-compatible text analysis (pyserini's default).

Chain, as in Lucene: StandardTokenizer (UAX#29 word breaks, tokens longer than 255
chars split) -> EnglishPossessiveFilter -> LowerCaseFilter -> StopFilter (Lucene's
33 English stopwords) -> PorterStemFilter (Porter's reference release 3, as Lucene has it: ``indexer/porter.py``).

The same ``Analyzer`` object is used at index and query time, and its ``config()``
is recorded in the index manifest so a searcher rebuilds exactly the same chain.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

import re

import regex

from indexer.porter import PorterStemmer

# Lucene EnglishAnalyzer.ENGLISH_STOP_WORDS_SET.
LUCENE_ENGLISH_STOPWORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then "
    "there these they this to was will with".split()
)

# The `regex` module implements UAX#29 word boundaries under the WORD flag: a token is a segment that
# starts as Lucene's StandardTokenizer requires and runs until the next boundary. Han and Hiragana
# characters are single-character segments under UAX#29, exactly as Lucene emits them.
_TOKEN = regex.compile(
    r"[\p{Thai}\p{Lao}\p{Khmer}\p{Myanmar}]+"  # Lucene keeps a run of South-East Asian script whole
    r"|\p{Regional_Indicator}{2}"  # a flag
    r"|\p{Extended_Pictographic}(?:[\ufe0f\p{Emoji_Modifier}]|\u200d\p{Extended_Pictographic})*"  # emoji, as Lucene
    # A word segment starts with a letter, digit, '_' or an ideograph; never with a lone combining mark or joiner.
    r"|[\p{WB=ALetter}\p{WB=Hebrew_Letter}\p{WB=Numeric}\p{WB=Katakana}\p{WB=ExtendNumLet}\p{Ideographic}"
    r"\p{Hiragana}](?:\B.)*",
    flags=regex.WORD | regex.V1)
# Fast path, 2x quicker: for lower-cased text made only of Latin-1 and common punctuation, UAX#29 reduces
# to this pattern (letters, digits and '_' joined; MidLetter/MidNumLet between letters; MidNum/MidNumLet
# between digits). It gives the same tokens as _TOKEN on such text (tests/test_analyzer_unit.py). Index builds run
# the same pattern in numba (indexer/fasttok.py, character classes derived from the definitions below).
LATIN1_LETTERS = "a-z\u00aa\u00b5\u00ba\u00df-\u00f6\u00f8-\u00ff"  # as a character class
MID_LETTER = ":.'\u00b7\u2018\u2019"  # joins two letters (MidLetter, MidNumLet)
MID_NUM = ",;.'\u2018\u2019"  # joins two digits (MidNum, MidNumLet)
_L1 = LATIN1_LETTERS
_TOKEN_LATIN1 = re.compile(rf"[{_L1}0-9_]+(?:(?:(?<=[{_L1}])[{MID_LETTER}](?=[{_L1}])"
                           rf"|(?<=[0-9])[{MID_NUM}](?=[0-9]))[{_L1}0-9_]+)*")
# (c), (R), !! and ?! are emoji, which Lucene emits as tokens: text holding them takes the full path.
NOT_LATIN1 = re.compile("[^\x00-\x7f\u00a0-\u00a8\u00aa-\u00ac\u00af-\u00ff\u2010-\u2023\u2025\u2026"
                        "\u2030-\u203b\u203d\u203e\u2041-\u2043\u2045-\u2048\u204a-\u2053\u2055-\u205e]")
_POSSESSIVE_SUFFIXES = ("'s", "\u2019s", "\uff07s")
MAX_TOKEN_LENGTH = 255


def java_lower(s: str) -> str:
    """Lower case as Lucene's LowerCaseFilter does it: code point by code point (Java Character.toLowerCase).

    str.lower() applies the full Unicode mapping, which differs in two places: capital I with dot becomes
    "i" + combining dot (Java: "i"), and a word-final capital sigma becomes the final form (Java: always "σ").
    """
    if "\u0130" in s or "\u03a3" in s:
        s = s.replace("\u0130", "i").replace("\u03a3", "\u03c3")
    return s.lower()


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
        self._stemmer = PorterStemmer() if self.config.stemmer == "porter" else None
        # Every step after tokenization depends on the token alone, so the whole chain is cached per
        # distinct token: token -> term, or "" for a stopword. Real text repeats a small vocabulary.
        self._cache: dict[str, str] = {}

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> "Analyzer":
        return cls(AnalyzerConfig(**cfg))

    def config_dict(self) -> dict[str, Any]:
        return asdict(self.config)

    def _term(self, token: str) -> str:
        """Possessive filter, lower case, stop filter, Porter stemmer for one token ("" if dropped)."""
        if token.endswith(_POSSESSIVE_SUFFIXES) or token.endswith(("'S", "\u2019S", "\uff07S")):
            token = token[:-2]
        if self.config.lowercase:
            token = java_lower(token)
        if not token.strip("_") or token in self._stop:
            return ""  # a stopword, or an all-underscore segment (Lucene emits no token for those)
        # Lucene's PorterStemmer leaves words of one or two letters alone; Snowball's does not.
        if self._stemmer is None or len(token) <= 2:
            return token
        return self._stemmer.stem(token)

    def tokens(self, text: str) -> list[str]:
        """The token stream whose terms ``term`` gives: lower-cased first when the chain lower-cases, which is
        equivalent (segmentation ignores case, the possessive filter takes 's and 'S) and lets case variants
        share cache entries."""
        if self.config.lowercase:
            text = java_lower(text)
            pattern = _TOKEN if NOT_LATIN1.search(text) else _TOKEN_LATIN1
        else:
            pattern = _TOKEN
        toks = pattern.findall(text)
        limit = self.config.max_token_length
        if len(text) > limit and toks and max(map(len, toks)) > limit:
            toks = [tok[i:i + limit] for tok in toks for i in range(0, len(tok), limit)]
        return toks

    def term(self, token: str, cache: bool = True) -> str:
        """The index term of one token ("" if the chain drops it), cached unless the caller keeps its own cache."""
        term = self._cache.get(token)
        if term is None:
            term = self._term(token)
            if cache and len(self._cache) < 4_000_000:  # bounded: junk tokens must not grow it forever
                self._cache[token] = term
        return term

    def analyze(self, text: str) -> list[str]:
        """Index terms of ``text`` in order (stopwords removed, so the length is Lucene's)."""
        toks = self.tokens(text)
        get = self._cache.get
        terms = [get(t) for t in toks]
        if None in terms:
            terms = [self.term(t) for t in toks]
        return [t for t in terms if t]

    def term_counts(self, text: str) -> tuple[Counter, int]:
        """(term -> frequency, document length in tokens) for one document or query."""
        terms = self.analyze(text)
        return Counter(terms), len(terms)
