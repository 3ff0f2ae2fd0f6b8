"""The C++ testbench (hls_bm25/tb_bm25_topk.cpp): built with g++ from the kernel source through the Makefile, it
reads an index written by the indexer, runs pre-analysed HotpotQA questions (exported by hls_bm25/tb_export.py)
several per launch over every shard, and matches the CPU backend's exported top-k bit for bit."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, shared

HLS = REPO / "hls_bm25"
KS = (1, 10, 100, 1000)


@pytest.fixture(scope="module")
def testbench(tmp_path_factory) -> Path:
    build = tmp_path_factory.mktemp("hls_build")
    subprocess.run(["make", "-s", "-C", str(HLS), "tb", f"BUILD={build}"], check=True, capture_output=True)
    return build / "tb_bm25_topk"


@pytest.fixture(scope="module")
def exported(tmp_path_factory, hotpot_index) -> tuple[Path, Path]:
    out = tmp_path_factory.mktemp("tb_inputs")
    subprocess.run([sys.executable, str(HLS / "tb_export.py"), "--index", str(hotpot_index), "--queries",
                    str(shared("hotpotqa-dev500-ircot", "dev_subsampled.jsonl")), "--k", *map(str, KS),
                    "--out", str(out)], check=True, capture_output=True)
    return out / "queries.txt", out / "expected.txt"


def test_testbench_matches_cpu_backend_for_every_question(testbench, exported, hotpot_index):
    queries, expected = exported
    n_shards = len(json.loads((hotpot_index / "manifest.json").read_text())["shards"])
    assert n_shards >= 2
    proc = subprocess.run([str(testbench), str(hotpot_index), str(queries), str(expected), "7"],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for k in KS:
        assert f"k={k}: 500/500 queries identical ({n_shards} shards, batch 7)" in proc.stdout
    assert proc.stdout.rstrip().endswith("PASS")


def test_testbench_fails_on_one_changed_score_bit(testbench, exported, hotpot_index, tmp_path):
    queries, expected = exported
    lines = expected.read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if not line.startswith("k ") and line.split()[0] != "0")
    fields = lines[i].split()
    fields[2] = f"{int(fields[2], 16) ^ 1:08x}"  # the best hit's score, one ulp off
    lines[i] = " ".join(fields)
    bad = tmp_path / "expected.txt"
    bad.write_text("\n".join(lines) + "\n")
    proc = subprocess.run([str(testbench), str(hotpot_index), str(queries), str(bad)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert re.search(rf"k=1 query {i - 1} differs.*rank 0", proc.stderr)  # line 0 is the "k 1" header
    assert "FAIL: 1 mismatches" in proc.stdout
