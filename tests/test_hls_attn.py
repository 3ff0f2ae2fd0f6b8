"""The attn_topk HLS kernel in C simulation (hls_bm25/tb_attn_topk.cpp built with g++ through the Makefile): each
sparse attention method's launch, exported with the CPU reference's results by hls_bm25/tb_attn_export.py, gives
the same unit score bits and the same top-k ids; the kernel shares its top-k stage with bm25_topk (one header)."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.conftest import REPO

HLS = REPO / "hls_bm25"


@pytest.fixture(scope="module")
def testbench(tmp_path_factory):
    build = tmp_path_factory.mktemp("attn_build")
    subprocess.run(["make", "-s", "-C", str(HLS), "attn_tb", f"BUILD={build}"], check=True, capture_output=True)
    return build / "tb_attn_topk"


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    out = tmp_path_factory.mktemp("attn_cases")
    subprocess.run([sys.executable, str(HLS / "tb_attn_export.py"), "--out", str(out)], check=True,
                   capture_output=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    return out / "cases.txt"


def test_every_case_matches_the_cpu_reference(testbench, cases):
    proc = subprocess.run([str(testbench), str(cases)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert len([l for l in lines if l.endswith(": identical")]) == 7
    assert {m for m in re.findall(r"\(mode (\d)", proc.stdout)} == {"0", "1", "2"}
    assert "k 2048" in proc.stdout and lines[-1] == "PASS"


def test_one_changed_score_bit_fails(testbench, cases, tmp_path):
    lines = cases.read_text().splitlines()
    # the first case's expected unit scores: header, q, w, keys, hi, scores
    header = next(i for i, l in enumerate(lines) if l.startswith("case "))
    scores = lines[header + 5].split()
    scores[7] = f"{int(scores[7], 16) ^ 1:08x}"
    lines[header + 5] = " ".join(scores)
    bad = tmp_path / "cases.txt"
    bad.write_text("\n".join(lines) + "\n")
    proc = subprocess.run([str(testbench), str(bad)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert "1 unit scores and 0 top-k ids differ" in proc.stderr and "FAIL: 1 cases differ" in proc.stdout


def test_both_kernels_include_the_one_top_k_stage():
    for kernel in ("bm25_topk.cpp", "attn_topk.cpp"):
        src = (HLS / kernel).read_text()
        assert '#include "topk_select.h"' in src and ("topk_offer<" in src or "topk_offer_row<" in src)
        assert "rank_of" not in src  # the network lives in the header only
