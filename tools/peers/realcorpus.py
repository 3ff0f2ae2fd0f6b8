"""A realistic benchmark corpus: synthetic passages spelled with real Wikipedia vocabulary, for held-out questions.

Generator (not resampled passages): ``indexer.synth``'s model fitted to real Wikipedia passages (the head words at
their measured frequencies, a Zipf-Mandelbrot body and a steeper tail fitted to the sample's vocabulary growth,
burstiness fitted to the mean within-passage tf, DPR passage lengths), with the rank -> word map changed:
- ranks after the head words are the real words of ../shared/data's Wikipedia text (the DPR 100-word passages,
  the MediaWiki dump sample with its markup stripped, the WikiExtractor articles and the HotpotQA paragraphs), in
  descending order of their count there, so a word's frequency follows its real rank;
- words of real questions that the sample lacks (NQ-open dev and test, MS MARCO dev-subset) are spread over the
  ranks just after the sample's vocabulary (a word unseen in ~3M tokens is rarer than the rarest seen ones), so
  question words exist in the corpus as they would in real Wikipedia, without their frequencies or any passage
  being drawn from a question;
- the rest of the (power-law) tail stays pseudo-words, as in ``indexer.synth``.
Tokens are drawn independently (no topical co-occurrence), so the documents that match several query words are
rarer than in real Wikipedia: the top-k threshold is lower, which makes dynamic pruning harder, not easier.
The queries are the real questions themselves (held out: never drawn from the passages).
"""
from __future__ import annotations

import bz2
import html
import json
import re
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from typing import Iterator

import numpy as np

from indexer.analyzer import LUCENE_ENGLISH_STOPWORDS, Analyzer
from indexer import synth as S
from ragserve.topics import read_queries

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
MAX_WORD_BYTES = 24  # longer sample tokens (URLs, long numbers) are left out of the vocabulary
QUESTION_SPREAD = 4  # question-only words take 1 rank in QUESTION_SPREAD after the sample's vocabulary

QUERY_SETS = {
    "nq": ("nq-open", "topics.dpr.nq.test.txt"),
    "msmarco": ("msmarco-passage-queries", "topics.msmarco-passage.dev-subset.txt"),
}
VOCAB_QUESTION_FILES = (("nq-open", "topics.dpr.nq.dev.txt"), ("nq-open", "topics.dpr.nq.test.txt"),
                        ("msmarco-passage-queries", "topics.msmarco-passage.dev-subset.txt"))

_MARKUP = [
    (re.compile(r"<ref[^>/]*/>|<ref[^>]*>.*?</ref>", re.S), " "),
    (re.compile(r"<!--.*?-->", re.S), " "),
    (re.compile(r"\{\|.*?\|\}", re.S), " "),
    (re.compile(r"\[\[(?:File|Image|Category):[^\]]*\]\]"), " "),
    (re.compile(r"\[\[(?:[^\]|]*\|)?([^\]]*)\]\]"), r"\1"),
    (re.compile(r"\[https?://\S+ ?([^\]]*)\]"), r"\1"),
    (re.compile(r"<[^>]+>|&[a-z]+;"), " "),
    (re.compile(r"'{2,}|={2,}"), " "),
]
_TEMPLATE = re.compile(r"\{\{[^{}]*\}\}")


def _strip_wikitext(text: str) -> str:
    prev = None
    while prev != text:
        prev, text = text, _TEMPLATE.sub(" ", text)
    for pattern, repl in _MARKUP:
        text = pattern.sub(repl, text)
    return html.unescape(text)


def wikipedia_texts(data: Path = DATA) -> Iterator[str]:
    """Every real Wikipedia text of the shared samples (each HotpotQA paragraph once)."""
    with open(data / "wiki18-100w-passages-sample" / "sample_data.jsonl", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["contents"]
    dump = data / "enwiki-xml-dump-sample" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
    with bz2.open(dump) as f:
        for _, el in ET.iterparse(f):
            if el.tag.endswith("}text") and el.text and not el.text.lstrip().upper().startswith("#REDIRECT"):
                yield _strip_wikitext(el.text)
            el.clear()
    with open(data / "enwiki-wikiextractor-json-sample" / "wiki_00", encoding="utf-8") as f:
        for line in f:
            yield json.loads(line)["text"]
    seen: set[str] = set()
    with open(data / "hotpotqa-dev500-ircot" / "dev_subsampled.jsonl", encoding="utf-8") as f:
        for line in f:
            for c in json.loads(line)["contexts"]:
                if c["paragraph_text"] not in seen:
                    seen.add(c["paragraph_text"])
                    yield c["title"] + " " + c["paragraph_text"]
    with open(data / "hotpotqa-train100-original" / "hotpotqa_train_corpus.json", encoding="utf-8") as f:
        for title, sentences in json.load(f).items():
            text = "".join(sentences)
            if text not in seen:
                seen.add(text)
                yield title + " " + text


def _usable(word: str) -> bool:
    # Inside a JSON string as raw bytes: no quote, backslash or control character; never a pseudo-word's shape.
    return (len(word.encode()) <= MAX_WORD_BYTES and word not in LUCENE_ENGLISH_STOPWORDS
            and not any(c in word for c in '"\\') and all(ord(c) >= 32 for c in word)
            and not S._PSEUDO.match(word))


def vocabulary(data: Path = DATA) -> tuple[list[str], list[str], dict]:
    """(sample words after the head, most frequent first; question words the sample lacks; facts)."""
    tok = Analyzer().tokens
    counts: Counter = Counter()
    for text in wikipedia_texts(data):
        counts.update(tok(text))
    head = set(S.WIKI_PARAMS.head_words)
    # Ties in count ordered by a hash of the word, not alphabetically (spelling must not follow frequency).
    ranked = sorted((w for w in counts if w not in head and _usable(w)),
                    key=lambda w: (-counts[w], hash_word(w)))
    known = set(counts)
    extra: set[str] = set()
    for parts in VOCAB_QUESTION_FILES:
        for q in read_queries(data.joinpath(*parts)):
            extra.update(w for w in tok(q.text) if w not in known and w not in head and _usable(w))
    extra_sorted = sorted(extra, key=hash_word)
    facts = {"sample_tokens": int(sum(counts.values())), "sample_types": len(counts),
             "sample_words_used": len(ranked), "question_only_words": len(extra_sorted)}
    return ranked, extra_sorted, facts


def hash_word(w: str) -> int:
    import zlib

    return zlib.crc32(w.encode())


class RealVocabSynthesizer(S.Synthesizer):
    """``indexer.synth.Synthesizer`` whose ranks after the head words are spelled as real words (module doc)."""

    def __init__(self, seed: int = 0, data: Path = DATA) -> None:
        super().__init__(S.WIKI_PARAMS, seed)
        ranked, extra, self.facts = vocabulary(data)
        h = len(S.WIKI_PARAMS.head_words)
        words = list(S.WIKI_PARAMS.head_words) + ranked
        # Question-only words: one rank in QUESTION_SPREAD after the sample's words, pseudo-words between them.
        n_real = len(words)
        total = n_real + QUESTION_SPREAD * len(extra)
        spelled = [None] * (total - n_real)
        for i, w in enumerate(extra):
            spelled[i * QUESTION_SPREAD] = w
        for i in range(len(spelled)):
            if spelled[i] is None:
                spelled[i] = self.word(n_real + i)  # the pseudo-word of that rank (the original cache and classes)
        words += spelled
        blob = b"".join(w.encode() for w in words)
        off = np.zeros(len(words) + 1, dtype=np.int64)
        off[1:] = np.cumsum([len(w.encode()) for w in words])
        _, _, n_head, cls_size, cls_mult = self.words
        assert n_head == h
        self.words = (np.frombuffer(blob, dtype=np.uint8).copy(), off, n_head, cls_size, cls_mult)
        longest = max(MAX_WORD_BYTES, max(len(w.encode()) for w in S.WIKI_PARAMS.head_words), 2 * len(cls_size))
        self._row_bytes = 64 + 20 + (len(self.title_cdf) + self.max_len) * (longest + 1)
        self._buf = np.empty(longest, dtype=np.uint8)
        law_p = S.WIKI_PARAMS.pmf(np.array([n_real + 1, total], dtype=np.float64))
        self.facts.update(real_ranks=n_real, question_ranks=[n_real + 1, total],
                          expected_count_per_1e8_tokens=[round(float(x) * 1e8, 1) for x in law_p])


def write_corpus(path: Path, n_docs: int, seed: int = 0, workers: int | None = None) -> dict:
    """Write ``n_docs`` passages (JSONL id/title/text) to ``path`` (through ``path.part``); returns the facts."""
    synth = RealVocabSynthesizer(seed)
    part = path.with_name(path.name + ".part")
    tokens = 0
    with open(part, "wb") as f:
        for _, _, (data, toks, _) in S._chunks(synth, n_docs, workers):
            f.write(data)
            tokens += len(toks)
    part.replace(path)
    return dict(synth.facts, docs=n_docs, tokens=tokens, seed=seed)


def questions(name: str, n: int, data: Path = DATA) -> list[str]:
    """The first ``n`` questions of a held-out query set (``QUERY_SETS``) with at least one word."""
    out = [q.text for q in read_queries(data.joinpath(*QUERY_SETS[name])) if q.text.strip()]
    return out[:n]

