"""Synthetic passage corpora whose statistics follow real Wikipedia passages (for benchmarks at any scale).

Model (parameters in ``WIKI_PARAMS``, fitted offline by ``scripts/fit_synth_params.py``; see the comment there):
- Word ranks 1..H are the H most frequent real words of the sample (English function words, hence a realistic
  stopword share), with their measured probabilities.
- Ranks H+1..r_c follow a Zipf-Mandelbrot law, density ``(x + q)^-s``; beyond r_c the density continues with the
  steeper exponent ``tail_s``, which sets the vocabulary growth (Heaps' law ``V(n) ~ n^(1/tail_s)`` for large n).
  Rank r gets the density's mass on ``[r, r + 1)``. A token's rank is drawn in O(1): an alias table covers the
  first 2^14 - 1 ranks (93% of tokens), later ranks invert the closed-form CDF. The vocabulary is capped at
  ``vocab_size`` ranks.
- Other words are pseudo-words of consonant-vowel syllables, a pure function of the rank (shorter words for more
  frequent ranks, spelling scrambled within a length). Each ends in a consonant + a/o/u, which no Porter rule
  strips, so the analyzer keeps every one distinct; the alphabet makes none equal a head word or a stopword.
- Burstiness: each token after the first is, with probability ``burst``, a copy of an earlier token of the same
  passage (the marginal law is unchanged, but terms repeat within passages as they do in real text).
- Passage length ~ round(Normal(mean, std)) tokens; title length from the sample's histogram; titles use no
  head words.

Output is JSON lines ``{"id", "title", "text"}``, ids from 0. A numba kernel generates each chunk of
``CHUNK_DOCS`` documents from its own splitmix64 stream, so the bytes depend only on the seed and the parameters.
"""
from __future__ import annotations

import contextlib
import gzip
import math
import os
import re
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import numba
import numpy as np

from indexer.analyzer import LUCENE_ENGLISH_STOPWORDS

CHUNK_DOCS = 16384  # documents per kernel call; part of the output definition (each chunk has its own stream)

_CONSONANTS = b"bdfgklmprvz"  # without n and t, no pseudo-word can be "no" or "to"
_VOWELS = b"aeiou"
_FINAL_VOWELS = b"aou"  # no Porter-stemmer suffix ends in consonant + a/o/u
_NC, _NV, _NF = len(_CONSONANTS), len(_VOWELS), len(_FINAL_VOWELS)  # compile-time constants in the kernel
_CV = np.array([[c, v] for c in _CONSONANTS for v in _VOWELS], dtype=np.uint8)  # syllable j -> 2 bytes
_CF = np.array([[c, v] for c in _CONSONANTS for v in _FINAL_VOWELS], dtype=np.uint8)
TABLE_BITS = 14  # an alias table of 2^14 outcomes: the first 2^14 - 1 ranks (93% of tokens) and "a later rank"
TABLE_RANKS = (1 << TABLE_BITS) - 1  # ranks with a table entry; later ones come from the closed-form inverse CDF
_PSEUDO = re.compile(rf"^([{_CONSONANTS.decode()}][{_VOWELS.decode()}])*[{_CONSONANTS.decode()}][{_FINAL_VOWELS.decode()}]$")


def _antiderivative(x: np.ndarray | float, q: float, s: float) -> np.ndarray | float:
    """G with G' = (x + q)^-s."""
    if s == 1.0:
        return np.log(x + q)
    return (x + q) ** (1.0 - s) / (1.0 - s)


@dataclass(frozen=True)
class SynthParams:
    head_words: tuple[str, ...]
    head_probs: tuple[float, ...]
    zipf_s: float
    zipf_q: float
    tail_rank: int  # r_c: last rank of the Zipf-Mandelbrot regime
    tail_s: float
    vocab_size: int
    burst: float
    length_mean: float
    length_std: float
    title_len_probs: tuple[float, ...]  # P(title has i+1 tokens)
    query_len_probs: dict[int, float] = field(default_factory=dict)  # query tokens -> probability

    def __post_init__(self) -> None:
        h = len(self.head_words)
        if h != len(self.head_probs) or h == 0 or not 0 < sum(self.head_probs) < 1:
            raise ValueError("head_words and head_probs must pair up, with total probability in (0, 1)")
        if not h < self.tail_rank < self.vocab_size:
            raise ValueError("need len(head_words) < tail_rank < vocab_size")
        if self.zipf_q <= -(h + 1) or self.zipf_s <= 0 or self.tail_s <= 0:
            raise ValueError("zipf_q must exceed -(H+1) and both exponents must be positive")
        if not 0 <= self.burst < 1:
            raise ValueError("burst must be in [0, 1)")
        if self.length_mean < 1 or self.length_std < 0:
            raise ValueError("passage length mean must be >= 1 and its std >= 0")
        clash = [w for w in (*self.head_words, *LUCENE_ENGLISH_STOPWORDS) if _PSEUDO.match(w)]
        if clash:
            raise ValueError(f"real words {clash} have the pseudo-word shape; change the alphabet")

    def law(self) -> tuple[float, float, float, float]:
        """(head mass, mid-regime mass, tail-regime mass, tail factor K) of the unnormalised law."""
        h, q, rc = len(self.head_words), self.zipf_q, self.tail_rank
        k = (rc + 1 + q) ** (self.tail_s - self.zipf_s)  # continuity of the density at x = r_c + 1
        mid = _antiderivative(rc + 1.0, q, self.zipf_s) - _antiderivative(h + 1.0, q, self.zipf_s)
        tail = k * (_antiderivative(self.vocab_size + 1.0, q, self.tail_s) - _antiderivative(rc + 1.0, q, self.tail_s))
        return float(sum(self.head_probs)), float(mid), float(tail), float(k)

    def pmf(self, ranks: np.ndarray) -> np.ndarray:
        """Probability of each 1-based rank."""
        ranks = np.asarray(ranks, dtype=np.float64)
        h, q = len(self.head_words), self.zipf_q
        head, mid, tail, k = self.law()
        scale = (1.0 - head) / (mid + tail)
        out = np.empty_like(ranks)
        is_head = ranks <= h
        out[is_head] = np.asarray(self.head_probs)[ranks[is_head].astype(np.int64) - 1]
        is_mid = ~is_head & (ranks <= self.tail_rank)
        r = ranks[is_mid]
        out[is_mid] = scale * (_antiderivative(r + 1, q, self.zipf_s) - _antiderivative(r, q, self.zipf_s))
        is_tail = ranks > self.tail_rank
        r = ranks[is_tail]
        out[is_tail] = scale * k * (_antiderivative(r + 1, q, self.tail_s) - _antiderivative(r, q, self.tail_s))
        return out

    def rank_probabilities(self) -> np.ndarray:
        """p[r-1] for ranks 1..vocab_size (sums to 1)."""
        return self.pmf(np.arange(1, self.vocab_size + 1))


# Fitted offline by scripts/fit_synth_params.py (its JSON output copied here) on
# ../shared/data/wiki18-100w-passages-sample (1,000 DPR 100-word passages of the Dec. 2018 Wikipedia) together with
# ../shared/data/enwiki-xml-dump-sample (gensim's pages-articles sample, wikitext stripped, cut into 100-word
# passages): 564,352 tokens, 42,263 word types. Head = the 64 most frequent words plus the Lucene stopwords
# ranked below them; Zipf-Mandelbrot fitted on ranks 65-6137 (log-spaced least squares); (tail_rank, tail_s)
# fitted to the sample's vocabulary growth (Heaps K=19.117, beta=0.5842: 1/beta ~ tail_s); burst fitted so
# the mean tf of (passage, non-stopword) pairs is the sample's 1.2118; lengths from wiki18 passages and titles;
# query lengths (3-12 tokens) from MS MARCO dev-subset and NQ-open test questions. Lucene-stopword share of the
# sample's tokens: 0.3177.
WIKI_PARAMS = SynthParams(
    head_words=(
        "the", "of", "and", "in", "to", "a", "is", "as", "for", "was", "by", "that", "with", "on", "are",
        "from", "an", "it", "at", "or", "his", "he", "which", "be", "this", "were", "have", "has", "not",
        "also", "their", "one", "had", "its", "they", "but", "other", "first", "been", "more", "some",
        "all", "most", "after", "such", "who", "can", "two", "state", "there", "used", "when", "than",
        "new", "time", "may", "into", "many", "during", "these", "states", "only", "war", "between", "no",
        "then", "will", "if",
    ),
    head_probs=(
        0.0723662, 0.0385008, 0.0306564, 0.0270221, 0.0211783, 0.019036, 0.0107876, 0.00878, 0.0079507,
        0.0077771, 0.0072295, 0.0070842, 0.0067086, 0.0064215, 0.0053584, 0.00533, 0.0044192, 0.004196,
        0.0041446, 0.0041091, 0.0038522, 0.0036608, 0.0036272, 0.0034854, 0.0029751, 0.0028493, 0.0027979,
        0.0025959, 0.0024914, 0.0024471, 0.0023461, 0.0021635, 0.0021033, 0.0021015, 0.0020873, 0.002082,
        0.0020749, 0.0020094, 0.0017046, 0.0016958, 0.0016302, 0.0016018, 0.0015841, 0.0015753, 0.0015203,
        0.0014884, 0.0014672, 0.0014477, 0.001391, 0.0013857, 0.0013697, 0.001336, 0.001336, 0.001329,
        0.0012988, 0.0012864, 0.0012758, 0.0012545, 0.0012474, 0.0012474, 0.0012191, 0.0011978, 0.001189,
        0.0010951, 0.0009498, 0.0007141, 0.0007123, 0.000707,
    ),
    zipf_s=1.0189,
    zipf_q=85.5,
    tail_rank=6276,
    tail_s=1.8,
    # With 2^24 ranks the model expects 736,621 distinct words in 1M passages and 3,640,303 in DPR's 21M
    # (the sample's Heaps fit extrapolates to 900,876 and 5,333,920).
    vocab_size=1 << 24,
    burst=0.1631,
    length_mean=101.14,
    length_std=2.3,
    title_len_probs=(0.104, 0.375, 0.264, 0.118, 0.066, 0.044, 0.019, 0.006, 0.001, 0.0, 0.0, 0.003),
    query_len_probs={3: 0.0691, 4: 0.1161, 5: 0.1292, 6: 0.1164, 7: 0.0853, 8: 0.2247, 9: 0.129, 10: 0.0687,
                     11: 0.0392, 12: 0.0223},
)


# ---- kernel -------------------------------------------------------------------------------------------------

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@numba.njit(cache=True, inline="always")
def _next(state: np.ndarray) -> np.uint64:
    # splitmix64
    state[0] += _GOLDEN
    z = state[0]
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@numba.njit(cache=True, inline="always")
def _uniform(state: np.ndarray) -> float:
    return float(_next(state) >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@numba.njit(cache=True, inline="always")
def _inverse_antiderivative(y: float, q: float, s: float) -> float:
    if s == 1.0:
        return math.exp(y) - q
    return ((1.0 - s) * y) ** (1.0 / (1.0 - s)) - q


@numba.njit(cache=True, inline="always")
def _rank(state: np.ndarray, prob: np.ndarray, alias: np.ndarray, law: np.ndarray) -> int:
    """0-based rank index of one draw: Walker's alias method over the table (top TABLE_BITS bits pick the
    column, the next 32 bits decide between it and its alias); the last outcome stands for every later rank,
    drawn by the closed-form inverse CDF restricted to them."""
    x = _next(state)
    i = np.int64(x >> np.uint64(64 - TABLE_BITS))  # int() would keep uint64, and uint64 | int64 is float64
    r = i if ((x >> np.uint64(32 - TABLE_BITS)) & np.uint64(0xFFFFFFFF)) < prob[i] else alias[i]
    if r < TABLE_RANKS:
        return r
    return _law_rank(law[12] + _uniform(state) * (1.0 - law[12]), law, TABLE_RANKS + 1.0)


@numba.njit(cache=True)
def _law_rank(u: float, law: np.ndarray, min_rank: float) -> int:
    """0-based rank index (>= min_rank - 1) of a non-head draw u in [head mass, 1) by inverting the closed-form
    CDF. law = (head mass, mid mass, tail mass, K, q, s, tail_s, G(H+1), G_tail(r_c+1), H, r_c, V, mass of the
    table's ranks)."""
    w = (u - law[0]) / (1.0 - law[0]) * (law[1] + law[2])
    if w < law[1]:
        x = math.floor(_inverse_antiderivative(law[7] + w, law[4], law[5]))
        lo, hi = max(law[9] + 1.0, min_rank), law[10]
    else:
        x = math.floor(_inverse_antiderivative(law[8] + (w - law[1]) / law[3], law[4], law[6]))
        lo, hi = max(law[10] + 1.0, min_rank), law[11]
    return int(min(max(x, lo), hi)) - 1  # the clamp only absorbs rounding at the table and regime edges


@numba.njit(cache=True)
def _put_word(out, pos, k, cache_blob, cache_off, n_head, cls_size, cls_mult):
    """Write the word of 0-based rank index k at out[pos:], return the new position. The first words (head words,
    then the most frequent pseudo-words) are copied from a cache; the others are spelled from k."""
    if k < len(cache_off) - 1:
        for i in range(cache_off[k], cache_off[k + 1]):
            out[pos] = cache_blob[i]
            pos += 1
        return pos
    i = k - n_head
    c = 0
    while i >= cls_size[c]:
        i -= cls_size[c]
        c += 1
    j = (cls_mult[c] * i + 12345) % cls_size[c]  # a bijection of the class: spelling does not follow frequency
    end = pos + 2 * (c + 1)
    f = j % (_NC * _NF)
    out[end - 2] = _CF[f, 0]
    out[end - 1] = _CF[f, 1]
    j //= _NC * _NF
    for s in range(c - 1, -1, -1):
        f = j % (_NC * _NV)
        out[pos + 2 * s] = _CV[f, 0]
        out[pos + 2 * s + 1] = _CV[f, 1]
        j //= _NC * _NV
    return end


@numba.njit(cache=True)
def _word_cache(head_blob, head_off, cls_size, cls_mult, n_words):
    """(blob, offsets) of the words of rank indices 0..n_words-1, spelled by _put_word."""
    out = np.empty(n_words * 2 * (len(cls_size) + 8), dtype=np.uint8)
    off = np.zeros(n_words + 1, dtype=np.int64)
    pos = 0
    for k in range(n_words):
        pos = _put_word(out, pos, k, head_blob, head_off, len(head_off) - 1, cls_size, cls_mult)
        off[k + 1] = pos
    return out[:pos].copy(), off


@numba.njit(cache=True)
def _alias_table(p):
    """Walker/Vose alias table for the probabilities p (len a power of two): (prob as u32 thresholds, alias)."""
    n = len(p)
    scaled = p * (n / p.sum())
    prob = np.zeros(n, dtype=np.uint64)
    alias = np.arange(n).astype(np.int64)
    small = np.empty(n, dtype=np.int64)
    large = np.empty(n, dtype=np.int64)
    ns = nl = 0
    for i in range(n):
        if scaled[i] < 1.0:
            small[ns] = i
            ns += 1
        else:
            large[nl] = i
            nl += 1
    while ns and nl:
        ns -= 1
        nl -= 1
        s, g = small[ns], large[nl]
        prob[s] = np.uint64(scaled[s] * 4294967296.0)
        alias[s] = g
        scaled[g] = (scaled[g] + scaled[s]) - 1.0
        if scaled[g] < 1.0:
            small[ns] = g
            ns += 1
        else:
            large[nl] = g
            nl += 1
    for i in range(nl):
        prob[large[i]] = np.uint64(4294967296)  # always itself (rounding leftovers included)
    for i in range(ns):
        prob[small[i]] = np.uint64(4294967296)
    return prob, alias


@numba.njit(cache=True)
def _put(out: np.ndarray, pos: int, text: np.ndarray) -> int:
    out[pos:pos + len(text)] = text
    return pos + len(text)


@numba.njit(cache=True)
def _put_int(out: np.ndarray, pos: int, value: int) -> int:
    digits = 1
    v = value
    while v >= 10:
        v //= 10
        digits += 1
    for i in range(digits - 1, -1, -1):
        out[pos + i] = 48 + value % 10
        value //= 10
    return pos + digits


@numba.njit(cache=True, nogil=True)  # nogil: chunks are generated by several threads at once
def _chunk_kernel(seed, first_id, n_docs, prob, alias, law, words, burst, len_mean, len_std, max_len, title_cdf,
                  frame, out, tokens, tok_start):
    cache_blob, cache_off, n_head, cls_size, cls_mult = words
    pre_id, pre_title, pre_text, post = frame
    state = np.empty(1, dtype=np.uint64)
    state[0] = seed
    pos = 0
    t = 0
    for d in range(n_docs):
        pos = _put(out, pos, pre_id)
        pos = _put_int(out, pos, first_id + d)
        pos = _put(out, pos, pre_title)
        u = _uniform(state)
        n_title = 0
        while n_title < len(title_cdf) - 1 and u >= title_cdf[n_title]:
            n_title += 1
        for i in range(n_title + 1):
            u = law[0] + _uniform(state) * (1.0 - law[0])  # titles are names: no head (function) words
            if i:
                out[pos] = 32
                pos += 1
            pos = _put_word(out, pos, _law_rank(u, law, 0.0), cache_blob, cache_off, n_head, cls_size, cls_mult)
        pos = _put(out, pos, pre_text)
        u1 = 1.0 - _uniform(state)  # Box-Muller normal for the passage length
        u2 = _uniform(state)
        length = int(np.rint(len_mean + len_std * math.sqrt(-2.0 * math.log(u1)) * math.cos(2.0 * math.pi * u2)))
        length = min(max(length, 1), max_len)
        tok_start[d] = t
        for i in range(length):
            if i and _uniform(state) < burst:
                r = tokens[t - 1 - np.int64(_next(state) % np.uint64(i))]
            else:
                r = _rank(state, prob, alias, law)
            tokens[t] = r
            t += 1
            if i:
                out[pos] = 32
                pos += 1
            pos = _put_word(out, pos, r, cache_blob, cache_off, n_head, cls_size, cls_mult)
        pos = _put(out, pos, post)
    tok_start[n_docs] = t
    return pos


# ---- driver -------------------------------------------------------------------------------------------------


def _bytes(s: bytes | str) -> np.ndarray:
    return np.frombuffer(s.encode() if isinstance(s, str) else s, dtype=np.uint8).copy()


@dataclass
class SynthStats:
    docs: int = 0
    tokens: int = 0
    bytes: int = 0
    queries: int = 0


class Synthesizer:
    """Generates chunks of JSONL passages (and their token ranks) for one parameter set and seed."""

    def __init__(self, params: SynthParams = WIKI_PARAMS, seed: int = 0) -> None:
        self.params = p = params
        self.seed = seed
        head_mass, mid, tail, k = p.law()
        h = len(p.head_words)
        if p.vocab_size <= TABLE_RANKS:
            raise ValueError(f"vocab_size must exceed {TABLE_RANKS}")
        table = p.pmf(np.arange(1, TABLE_RANKS + 1))
        self.prob, self.alias = _alias_table(np.append(table, max(0.0, 1.0 - table.sum())))
        self.law = np.array([head_mass, mid, tail, k, p.zipf_q, p.zipf_s, p.tail_s,
                             _antiderivative(h + 1.0, p.zipf_q, p.zipf_s), _antiderivative(p.tail_rank + 1.0, p.zipf_q, p.tail_s),
                             h, p.tail_rank, p.vocab_size, table.sum()], dtype=np.float64)
        head = [w.encode() for w in p.head_words]
        classes = self._classes(p.vocab_size - h)
        cache = _word_cache(_bytes(b"".join(head)), np.cumsum([0] + [len(w) for w in head]).astype(np.int64),
                            *classes, TABLE_RANKS)
        self.words = (*cache, h, *classes)
        tl = np.cumsum(np.asarray(p.title_len_probs, dtype=np.float64))
        self.title_cdf = tl / tl[-1]
        self.max_len = int(math.ceil(p.length_mean + 8 * p.length_std)) + 1
        longest = max(max(len(w) for w in head), 2 * len(classes[0]))
        self._row_bytes = 64 + 20 + (len(self.title_cdf) + self.max_len) * (longest + 1)
        self._frame = tuple(_bytes(s) for s in ('{"id": "', '", "title": "', '", "text": "', '"}\n'))
        self._buf = np.empty(longest, dtype=np.uint8)

    @staticmethod
    def _classes(n: int) -> tuple[np.ndarray, np.ndarray]:
        """Sizes of the pseudo-word length classes (1, 2, ... syllables) covering n words, and each class's
        multiplier of the scrambling bijection j = (a * i + 12345) mod size."""
        nc, nv, nf = len(_CONSONANTS), len(_VOWELS), len(_FINAL_VOWELS)
        sizes, mults, syl = [], [], 0
        while n > 0:
            size = (nc * nv) ** syl * nc * nf
            if size >= 3_037_000_499:  # a * i must fit in int64
                raise ValueError("vocab_size too large for the pseudo-word classes")
            a = 2654435761 % size or 1
            while math.gcd(a, size) != 1:
                a += 1
            sizes.append(size)
            mults.append(a)
            n -= size
            syl += 1
        return np.array(sizes, dtype=np.int64), np.array(mults, dtype=np.int64)

    def word(self, rank_index: int) -> str:
        """The word of a 0-based rank index."""
        n = _put_word(self._buf, 0, rank_index, *self.words)
        return self._buf[:n].tobytes().decode()

    def chunk(self, index: int, n_docs: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Chunk ``index`` (documents from ``index * CHUNK_DOCS``): (JSONL as a uint8 array, token ranks, per-doc
        token starts)."""
        seed = np.random.SeedSequence([self.seed, index]).generate_state(1, dtype=np.uint64)[0]
        out = np.empty(n_docs * self._row_bytes, dtype=np.uint8)
        tokens = np.empty(n_docs * self.max_len, dtype=np.int32)
        tok_start = np.empty(n_docs + 1, dtype=np.int64)
        p = self.params
        n = _chunk_kernel(np.uint64(seed), index * CHUNK_DOCS, n_docs, self.prob, self.alias, self.law, self.words, p.burst,
                          p.length_mean, p.length_std, self.max_len, self.title_cdf, self._frame, out, tokens, tok_start)
        return out[:n], tokens[:tok_start[-1]], tok_start  # an array, not bytes: files write it without a copy

    def query(self, rng: np.random.Generator, tokens: np.ndarray) -> str:
        """3-12 words of one passage's tokens, in passage order, at least one of them not a stopword."""
        lens = self.params.query_len_probs
        sizes = np.array(sorted(lens), dtype=np.int64)
        probs = np.array([lens[k] for k in sorted(lens)], dtype=np.float64)
        words = [self.word(int(r)) for r in tokens]
        content = [i for i, w in enumerate(words) if w not in LUCENE_ENGLISH_STOPWORDS]
        n = int(min(rng.choice(sizes, p=probs / probs.sum()), len(words)))
        if not content:
            return " ".join(words[:n])
        while True:
            pick = np.sort(rng.choice(len(words), n, replace=False))
            if any(i in content for i in pick):
                return " ".join(words[i] for i in pick)


@contextlib.contextmanager
def _open_out(part: Path, compress: bool) -> Iterator[BinaryIO]:
    with open(part, "wb") as raw:
        if not compress:
            yield raw
            return
        # mtime=0 and no file name in the header: the same seed gives the same bytes
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=1) as gz:
            yield gz


def _chunks(synth: Synthesizer, n_docs: int, workers: int | None) -> Iterator[tuple[int, int, tuple]]:
    """(first doc, doc count, chunk) in order, generated ahead by a thread pool (at most workers + 1 in memory)."""
    n_chunks = (n_docs + CHUNK_DOCS - 1) // CHUNK_DOCS
    workers = max(1, min(workers or os.cpu_count() or 1, n_chunks))
    with ThreadPoolExecutor(workers) as pool:
        pending: deque = deque()
        for index in range(n_chunks):
            lo = index * CHUNK_DOCS
            count = min(CHUNK_DOCS, n_docs - lo)
            pending.append((lo, count, pool.submit(synth.chunk, index, count)))
            if len(pending) > workers:
                lo, count, fut = pending.popleft()
                yield lo, count, fut.result()
        while pending:
            lo, count, fut = pending.popleft()
            yield lo, count, fut.result()


def write_corpus(path: str | Path, n_docs: int, seed: int = 0, params: SynthParams = WIKI_PARAMS,
                 n_queries: int = 0, queries_path: str | Path | None = None,
                 progress: Callable[[int], None] | None = None, workers: int | None = None) -> SynthStats:
    """Write ``n_docs`` passages to ``path`` (gzip if it ends in ``.gz``) through ``path.part``, renamed when
    complete; with ``n_queries``, also ``qid<TAB>query`` lines to ``queries_path``, each drawn from one passage.
    ``workers`` threads generate chunks (default: one per CPU); the output does not depend on it."""
    if n_docs < 1:
        raise ValueError("the corpus needs at least one document")
    if not 0 <= n_queries <= n_docs:
        raise ValueError(f"the number of queries must be between 0 and the number of documents ({n_docs})")
    if n_queries and queries_path is None:
        raise ValueError("queries need an output path")
    if n_queries and not params.query_len_probs:
        raise ValueError("these parameters have no query length distribution")
    path = Path(path)
    synth = Synthesizer(params, seed)
    qdocs = np.sort(np.random.default_rng([seed, 1]).choice(n_docs, n_queries, replace=False))
    qrng = np.random.default_rng([seed, 2])
    qlines: list[str] = []
    stats = SynthStats()
    part = path.with_name(path.name + ".part")
    try:
        with _open_out(part, path.suffix == ".gz") as f:
            for lo, count, (data, tokens, starts) in _chunks(synth, n_docs, workers):
                f.write(data)
                for d in qdocs[(qdocs >= lo) & (qdocs < lo + count)] - lo:
                    qlines.append(f"{len(qlines) + 1}\t{synth.query(qrng, tokens[starts[d]:starts[d + 1]])}\n")
                stats.docs += count
                stats.tokens += len(tokens)
                stats.bytes += len(data)
                if progress:
                    progress(count)
        os.replace(part, path)
    finally:
        part.unlink(missing_ok=True)
    if n_queries:
        qpath = Path(queries_path)
        qpart = qpath.with_name(qpath.name + ".part")
        qpart.write_text("".join(qlines), encoding="utf-8")
        os.replace(qpart, qpath)
        stats.queries = len(qlines)
    return stats
