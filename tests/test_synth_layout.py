"""``scripts/synth_layout.py``'s query mapping: real query text onto a synthetic vocabulary by df rank, one
query string at a time (``QueryMapper``) and over a topics file (``map_queries``)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from indexer.reader import IndexReader
from ragserve.retrieval.searcher import Searcher
from scripts.synth_layout import QueryMapper, map_queries, write_layout

QUESTIONS = ["Which magazine was started first, Arthur's Magazine or First for Women?",
             "The Oberoi family is part of a hotel company that has a head office in what city?",
             "Were Scott Derrickson and Ed Wood of the same nationality?"]


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "layout"
    write_layout(out, 20_000, workers=1, log=lambda *_: None)
    return out


@pytest.fixture(scope="module")
def mapper(synth, hotpot_index) -> QueryMapper:
    return QueryMapper(synth, hotpot_index)


def test_each_term_gets_a_synthetic_term_of_the_same_df_rank(mapper):
    ref, syn = mapper.reference, mapper.synth
    sorted_df = np.sort(np.asarray(syn.df))
    checked = 0
    for q in QUESTIONS:
        counts, _ = ref.analyzer.term_counts(q)
        for term in counts:
            if term not in ref.term_ids:
                continue  # the next test's case
            d = int(ref.df[ref.term_ids[term]])
            got = int(syn.df[mapper.term(term)])
            lo, hi = (d - 0.5) * mapper.scale, (d + 0.5) * mapper.scale
            if ((sorted_df >= lo) & (sorted_df <= hi)).any():
                assert lo <= got <= hi, (term, d, got)
            else:  # no synthetic term in the bin: the nearest df above it (or the largest)
                assert got == sorted_df[min(np.searchsorted(sorted_df, d * mapper.scale), sorted_df.size - 1)]
            checked += 1
    assert checked > 15


def test_a_term_always_maps_the_same_way_and_repeats_stay(mapper):
    a = mapper("Scott Derrickson directed films")
    b = mapper("films that Scott Derrickson directed, Derrickson")
    wa, wb = a.split(), b.split()
    assert len(wa) == 4 and len(wb) == 5 and len(set(wb)) == 4
    assert set(wa) == set(wb) and wb.count(wa[1]) == 2  # "derrickson" twice
    assert all(len(w) == len(str(mapper.synth.vocab_size - 1)) and w.isdigit() for w in wa)


def test_terms_the_reference_lacks_go_to_the_rarest_terms(mapper):
    rare = int(mapper.synth.df[mapper.term("zzqxvkw")])
    assert rare <= max(0.5 * mapper.scale, int(np.min(mapper.synth.df)))
    assert rare < int(mapper.synth.df[mapper.term("film")])


def test_stopwords_alone_map_to_nothing(mapper):
    assert mapper("the of and, is it?") == ""


def test_the_searcher_sees_the_mapped_terms(mapper, synth):
    s = Searcher(synth, backend="cpu")
    mapped = mapper(QUESTIONS[1])
    q = s.analyze(mapped)
    assert sorted(q.term_ids.tolist()) == sorted({int(w) for w in mapped.split()})
    assert not q.unknown and len(s.search(mapped, k=5)) == 5
    s.close()


def test_map_queries_maps_each_topic_and_drops_empty_ones(tmp_path, synth, hotpot_index, mapper):
    topics = tmp_path / "topics.tsv"
    topics.write_text("".join(f"q{i}\t{t}\n" for i, t in enumerate([*QUESTIONS, "the of and"])))
    rows = map_queries(synth, hotpot_index, topics)
    assert rows == [(f"q{i}", mapper(t)) for i, t in enumerate(QUESTIONS)]
    assert map_queries(synth, hotpot_index, topics, limit=1) == rows[:1]
    assert isinstance(mapper.synth, IndexReader)
