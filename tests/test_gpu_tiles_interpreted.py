"""The tiled gpu path's Triton kernels (bounds, tile scoring, collect), run by Triton's interpreter on the CPU,
return exactly the cpu backend's top-k: HotpotQA paragraphs (k = 1 and 1000, several batches, streamed shards)
and ArguAna's long queries (both ranking paths). On a GPU the same kernels run compiled (tests marked ``gpu``)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import shared

pytest.importorskip("triton")
ROOT = Path(__file__).resolve().parents[1]


def test_tiled_kernels_interpreted_match_cpu(hotpot_index, arguana_index):
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=path)
    r = subprocess.run([sys.executable, "-m", "tests.tiles_interpreted", str(hotpot_index),
                        str(shared("hotpotqa-dev500-ircot", "dev_subsampled.jsonl")), str(arguana_index),
                        str(shared("beir-arguana", "queries.jsonl.gz"))],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert '"hotpot k=1000": 0' in r.stdout and '"arguana k=1000, device ranking": 0' in r.stdout
