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


def test_timing_model_follows_the_code_structure():
    p = M.KernelParams()
    counts = np.zeros((2, 3, len(M.STAT_NAMES)), dtype=np.int64)
    counts[..., M.S["terms"]] = 2
    counts[..., M.S["postings"]] = counts[..., M.S["scored"]] = counts[..., M.S["accumulated"]] = 10_000
    counts[0, 1, M.S["postings"]] = 50_000  # the slowest CU sets the launch time
    est, serial = M.kernel_cycles(counts, p)
    assert (est >= counts[..., M.S["postings"]]).all()  # one posting per cycle per CU at best
    assert (serial >= est - 100).all()
    launch = M.launch_seconds(est, batch=2, p=p)
    assert launch.shape == (1,)
    assert launch[0] == pytest.approx(p.launch_overhead_s + (est[:, 1].sum() + M.CACHE_SIZE) / p.clock_hz)
    # A 512-bit burst is bank-bound at 300 MHz: 14.4 GB/s per pseudo-channel is 0.75 beats per cycle.
    assert p.words_per_cycle == pytest.approx(460e9 / 32 / 300e6 / 64)
