"""Fit the synthetic-corpus parameters of ``indexer/synth.py`` on the real samples in ../shared/data (run offline,
by a developer; ``ragserve corpus synth`` never reads ../shared). Prints the fitted values as JSON.

Samples: wiki18-100w-passages-sample (1,000 DPR 100-word passages) and enwiki-xml-dump-sample (the gensim
pages-articles dump, wikitext stripped here with a few regexes), plus MS MARCO dev and NQ-open test questions
for query lengths. Words are the analyzer's tokens, lowercased and not stemmed (surface forms are generated).
"""
from __future__ import annotations

import bz2
import html
import json
import re
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np

from indexer.analyzer import LUCENE_ENGLISH_STOPWORDS, Analyzer
from indexer.synth import WIKI_PARAMS, SynthParams, Synthesizer
from ragserve.topics import read_queries

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"
TOK = Analyzer().tokens  # lower-cased StandardTokenizer tokens
DPR_SCALE = (5.6e5, 2e6, 1e8, 2.1e9)  # tokens: this sample, the synth test, 1M passages, DPR's 21M passages


def wiki18() -> tuple[list[list[str]], list[list[str]]]:
    titles, passages = [], []
    with open(DATA / "wiki18-100w-passages-sample" / "sample_data.jsonl", encoding="utf-8") as f:
        for line in f:
            title, _, text = json.loads(line)["contents"].partition("\n")
            titles.append(TOK(title.strip('"')))
            passages.append(TOK(text))
    return titles, passages


_MARKUP = [
    (re.compile(r"<ref[^>/]*/>|<ref[^>]*>.*?</ref>", re.S), " "),
    (re.compile(r"<!--.*?-->", re.S), " "),
    (re.compile(r"\{\|.*?\|\}", re.S), " "),  # tables
    (re.compile(r"\[\[(?:File|Image|Category):[^\]]*\]\]"), " "),
    (re.compile(r"\[\[(?:[^\]|]*\|)?([^\]]*)\]\]"), r"\1"),  # [[target|label]] -> label
    (re.compile(r"\[https?://\S+ ?([^\]]*)\]"), r"\1"),
    (re.compile(r"<[^>]+>|&[a-z]+;"), " "),  # tags and entities (&nbsp; survives the XML unescaping)
    (re.compile(r"'{2,}|={2,}"), " "),
]
_TEMPLATE = re.compile(r"\{\{[^{}]*\}\}")


def strip_wikitext(text: str) -> str:
    prev = None
    while prev != text:  # nested templates: remove innermost first
        prev, text = text, _TEMPLATE.sub(" ", text)
    for pattern, repl in _MARKUP:
        text = pattern.sub(repl, text)
    return text


def xml_articles() -> list[list[str]]:
    path = DATA / "enwiki-xml-dump-sample" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
    docs = []
    with bz2.open(path) as f:
        for _, el in ET.iterparse(f):
            if el.tag.endswith("}text") and el.text and not el.text.lstrip().upper().startswith("#REDIRECT"):
                # cut into 100-word passages, as DPR does, so per-passage statistics are comparable
                words = TOK(html.unescape(strip_wikitext(el.text)))
                docs.extend(words[i:i + 100] for i in range(0, len(words), 100))
            el.clear()
    return docs


def fit_zipf_mandelbrot(freq: np.ndarray, first: int, last: int) -> tuple[float, float]:
    """Least squares of log f(r) = c - s log(r + q) on log-spaced ranks first..last (each decade weighs the same),
    grid over q."""
    r = np.unique(np.geomspace(first, last, 300).astype(np.int64))
    y = np.log(freq[r - 1])
    best = (np.inf, 0.0, 0.0)
    for q in np.arange(-first + 0.5, 200.0, 0.5):
        x = np.log(r + q)
        slope, c = np.polyfit(x, y, 1)
        err = float(np.sum((c + slope * x - y) ** 2))
        if err < best[0]:
            best = (err, -slope, q)
    return best[1], best[2]


def heaps_curve(docs: list[list[str]]) -> tuple[np.ndarray, np.ndarray]:
    """(tokens seen, distinct words seen) after each document."""
    seen: set[str] = set()
    ns, vs, n = [], [], 0
    for d in docs:
        n += len(d)
        seen.update(d)
        ns.append(n)
        vs.append(len(seen))
    return np.array(ns, dtype=np.float64), np.array(vs, dtype=np.float64)


def expected_types(params: SynthParams, n: np.ndarray) -> np.ndarray:
    """E[distinct ranks] after n i.i.d. draws, summing over log-spaced rank bins (midpoint rule)."""
    edges = np.unique(np.geomspace(1, params.vocab_size + 1, 4000).astype(np.int64))
    mids = params.pmf((edges[:-1] + edges[1:]) // 2)
    return np.sum((edges[1:] - edges[:-1])[:, None] * -np.expm1(n[None, :] * np.log1p(-mids)[:, None]), axis=0)


def mean_tf_nonstop(passages: list[list[str]]) -> float:
    pairs = [Counter(w for w in p if w not in LUCENE_ENGLISH_STOPWORDS) for p in passages]
    return sum(sum(c.values()) for c in pairs) / sum(len(c) for c in pairs)


def synth_passages(params: SynthParams, n_docs: int) -> list[list[str]]:
    s = Synthesizer(params, seed=123)
    _, tokens, starts = s.chunk(0, n_docs)
    return [[s.word(int(r)) for r in tokens[a:b]] for a, b in zip(starts[:-1], starts[1:])]


def main() -> int:
    titles, passages = wiki18()
    articles = xml_articles()
    docs = passages + articles
    counts = Counter(w for d in docs for w in d)
    freq = np.array(sorted(counts.values(), reverse=True), dtype=np.float64)
    total = float(freq.sum())
    ranked = [w for w, _ in counts.most_common()]
    # Head: the 64 most frequent words plus any Lucene stopword ranked below them, at their measured frequency.
    head = ranked[:64] + [w for w in ranked[64:] if w in LUCENE_ENGLISH_STOPWORDS]
    head_probs = [counts[w] / total for w in head]
    max_rank = int(np.searchsorted(-freq, -10, side="right"))  # ranks counted at least 10 times
    s, q = fit_zipf_mandelbrot(freq, 65, max_rank)

    lens = np.array([len(p) for p in passages])
    tlen = Counter(len(t) for t in titles if t)
    qlens = Counter()
    for name in (("msmarco-passage-queries", "topics.msmarco-passage.dev-subset.txt"), ("nq-open", "topics.dpr.nq.test.txt")):
        for qu in read_queries(DATA.joinpath(*name)):
            qlens[len(TOK(qu.text))] += 1
    params = replace(
        WIKI_PARAMS, head_words=tuple(head), head_probs=tuple(round(x, 7) for x in head_probs),
        zipf_s=round(s, 4), zipf_q=round(q, 2), length_mean=round(float(lens.mean()), 2),
        length_std=round(float(lens.std()), 2),
        title_len_probs=tuple(round(tlen.get(i, 0) / sum(tlen.values()), 4) for i in range(1, max(tlen) + 1)),
        query_len_probs={k: round(v / sum(qlens[i] for i in range(3, 13)), 4) for k, v in sorted(qlens.items()) if 3 <= k <= 12})

    # Heaps curve over the documents in a random order; the model's tail (tail_rank, tail_s) is fitted to it.
    order = np.random.default_rng(0).permutation(len(docs))
    ns, vs = heaps_curve([docs[i] for i in order])
    pick = np.unique(np.geomspace(len(ns) // 20, len(ns) - 1, 25).astype(np.int64))
    beta, logk = np.polyfit(np.log(ns[pick]), np.log(vs[pick]), 1)
    target_tf = mean_tf_nonstop(passages)
    for _ in range(3):  # burst and tail depend on each other weakly: alternate
        best = (np.inf, 0, 0.0)
        for rc in np.unique(np.geomspace(1000, 300000, 60).astype(np.int64)):
            for ts in np.arange(1.2, 3.01, 0.02):
                cand = replace(params, tail_rank=int(rc), tail_s=float(ts))
                err = float(np.sum((np.log(expected_types(cand, ns[pick] * (1 - params.burst))) - np.log(vs[pick])) ** 2))
                if err < best[0]:
                    best = (err, int(rc), round(float(ts), 2))
        params = replace(params, tail_rank=best[1], tail_s=best[2])
        lo, hi = 0.0, 0.6
        for _ in range(14):  # bisection: mean tf grows with burst
            mid = (lo + hi) / 2
            if mean_tf_nonstop(synth_passages(replace(params, burst=mid), 4000)) < target_tf:
                lo = mid
            else:
                hi = mid
        params = replace(params, burst=round((lo + hi) / 2, 4))

    out = {
        "sample": {"tokens": int(total), "types": len(counts), "wiki18_passages": len(passages),
                   "xml_passages": len(articles), "lucene_stopword_share": round(sum(counts[w] for w in LUCENE_ENGLISH_STOPWORDS) / total, 4),
                   "heaps_k": round(float(np.exp(logk)), 3), "heaps_beta": round(float(beta), 4),
                   "mean_tf_nonstop": round(target_tf, 4), "zipf_fit_ranks": [65, max_rank]},
        "model": {"expected_types": {f"{n:.3g}": int(v) for n, v in zip(
                      DPR_SCALE, expected_types(params, np.array(DPR_SCALE) * (1 - params.burst)))},
                  "heaps_extrapolated": {f"{n:.3g}": int(np.exp(logk) * n ** beta) for n in DPR_SCALE}},
        "params": asdict(params),
    }
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
