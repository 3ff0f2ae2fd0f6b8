"""The performance model (tools/fpga_model.py) predicts, from the index's block tables and posting
lists alone, every loop counter the C-simulated kernel reports, query by query and shard by shard."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tools import fpga_model as M
from ragserve.retrieval.searcher import Searcher
from tests.conftest import shared


@pytest.mark.parametrize("dataset,k", [("arguana", 10), ("hotpot", 1000)])
def test_model_counts_equal_simulated_counts(dataset, k, request):
    if dataset == "arguana":
        index = request.getfixturevalue("arguana_index")
        texts = [q.text for q in request.getfixturevalue("arguana_queries")][:250]
    else:
        index = request.getfixturevalue("hotpot_index")
        with open(shared("hotpotqa-dev500-ircot", "dev_subsampled.jsonl"), encoding="utf-8") as f:
            texts = [json.loads(line)["question_text"] for line in f]
    sim = Searcher(index, backend="fpga-sim", batch_size=16)
    queries = [sim.analyze(t) for t in texts]
    sim.backend.search_terms(queries, k, sim.index.k1, sim.index.b)
    simulated = sim.backend.last_stats.astype(np.int64)
    predicted = M.predict_counts(sim.index, queries, k)
    assert simulated.shape == predicted.shape == (len(queries), len(sim.index.shards), len(M.STAT_NAMES))
    for name in M.PREDICTED:
        i = M.S[name]
        assert np.array_equal(simulated[..., i], predicted[..., i]), name
    # Non-trivial workload: every counter is exercised, and blocks hold several entries.
    assert (simulated.sum(axis=(0, 1))[[M.S[n] for n in M.PREDICTED]] > 0).all()
    assert simulated[..., M.S["entries"]].sum() > simulated[..., M.S["blocks"]].sum()
    # The lanes: a chunk takes at least its postings over 16 cycles and at most its postings; a flush row holds
    # up to 64 candidates, and every visited block is flushed.
    chunk_min = -(-simulated[..., M.S["posting_words"]] // M.CHUNK_BEATS)
    assert (simulated[..., M.S["chunks"]] >= chunk_min).all()
    assert (simulated[..., M.S["rounds"]] * M.LANES >= simulated[..., M.S["postings"]]).all()
    assert (simulated[..., M.S["rounds"]] <= simulated[..., M.S["postings"]]).all()
    assert (simulated[..., M.S["cand_rows"]] * 64 >= simulated[..., M.S["candidates"]]).all()
    assert (simulated[..., M.S["norm_flush"]] >= simulated[..., M.S["norm_words"]]).all()
    assert simulated[..., M.S["rounds"]].sum() < simulated[..., M.S["postings"]].sum() / 4
    # Lanes do collide: a beat's 16 postings take more than one round on average (the conflict path runs).
    assert simulated[..., M.S["rounds"]].sum() > simulated[..., M.S["posting_words"]].sum()


def test_timing_model_follows_the_code_structure():
    p = M.KernelParams()
    counts = np.zeros((2, 3, len(M.STAT_NAMES)), dtype=np.int64)
    counts[..., M.S["terms"]] = 2
    counts[..., M.S["blocks"]] = 1
    counts[..., M.S["postings"]] = counts[..., M.S["scored"]] = 160_000
    counts[..., M.S["posting_words"]] = 10_000
    counts[..., M.S["rounds"]] = 11_000
    counts[0, 1, M.S["posting_words"]] = 50_000  # the slowest CU sets the launch time
    est, serial = M.kernel_cycles(counts, p)
    # 16 postings a cycle at best, and a beat no faster than the bank delivers it.
    assert (est >= counts[..., M.S["posting_words"]] / p.words_per_cycle).all()
    assert (serial >= est - 100).all()
    launch = M.launch_seconds(est, batch=2, p=p)
    assert launch.shape == (1,)
    assert launch[0] == pytest.approx(p.launch_overhead_s + (est[:, 1].sum() + M.CACHE_SIZE) / p.clock_hz)
    # A 512-bit burst is bank-bound at 300 MHz: 14.4 GB/s per pseudo-channel is 0.75 beats per cycle.
    assert p.words_per_cycle == pytest.approx(460e9 / 32 / 300e6 / 64)
    # Reader-bound here, so each bank runs near its bandwidth; lanes with too many conflict rounds take over.
    util = M.bank_utilisation(counts, 10, p)
    assert util.shape == (3,) and (util > 0.9).all() and (util <= 1.0).all()
    counts[..., M.S["rounds"]] = 40_000
    util = M.bank_utilisation(counts, 10, p)
    assert (util[[0, 2]] < 0.5).all() and util[1] > 0.7  # bank 1's 50,000 beats of query 0 still bound it


def test_lane_statistics_bracket_the_extremes():
    # Every doc holds the term: a chunk's 512 consecutive docids fill the 16 lanes evenly.
    assert M.expected_rounds(np.array([1.0]), np.array([512.0]))[0] == pytest.approx(32, abs=0.5)
    # Rare terms: docids fall on lanes at random; the busiest of 16 lanes holds ~3.5 of 16 postings and about
    # 46 of 512 (a balls-into-bins maximum), never fewer than the even share.
    sparse = M.expected_rounds(np.array([1e-5, 1e-5]), np.array([16.0, 512.0]))
    assert 3.0 < sparse[0] < 4.2 and 40 < sparse[1] < 52
    mid = M.expected_rounds(np.array([0.3]), np.array([512.0]))[0]
    assert 32 <= mid <= sparse[1]
