"""The CUDA C tile kernels build with nvcc for Hopper (sm_90), where nvcc is installed, with no GPU needed: at the
production tile size every scoring kernel fits its launch bounds' registers without spilling, and its shared memory
leaves room for the blocks ``min_blocks`` / ``filter_blocks`` plan on (a spill or a lost block slows the kernel;
only a GPU run would show it otherwise). Small test tiles must at least build."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from ragserve.kernels.gpu import tiles_cuda as TC

NVCC = shutil.which("nvcc")
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
SM_REGISTERS, SM_SHARED, RESERVED = 65536, 228 << 10, 1 << 10  # Hopper, per multiprocessor; per block reserved


def ptxas_report(tile: int, tpb: int, tmp_path) -> dict[str, dict[str, int]]:
    """Per kernel: registers, spill stores and loads, static shared bytes, from ``ptxas -v``."""
    src = tmp_path / f"tiles_{tile}.cu"
    src.write_text("".join(f"#define {k} {v}\n" for k, v in TC.defines(tile, tpb).items())
                   + TC.SOURCE + TC.SELECT_SOURCE)
    out = subprocess.run([NVCC, "-arch=sm_90", "--fmad=false", "-cubin", "-o", str(tmp_path / "k.cubin"), str(src),
                          "-Xptxas", "-v"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    report, name = {}, None
    for line in out.stderr.splitlines():
        if m := re.search(r"Compiling entry function '(\w+)'", line):
            name = m.group(1)
            report[name] = {}
        elif name and (m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)):
            report[name]["spills"] = int(m.group(1)) + int(m.group(2))
        elif name and (m := re.search(r"Used (\d+) registers.*?(\d+) bytes smem", line)):
            report[name]["registers"], report[name]["smem"] = int(m.group(1)), int(m.group(2))
    return report


def test_production_tile_kernels_fit_their_blocks(tmp_path):
    tile = 2048
    report = ptxas_report(tile, 128, tmp_path)
    assert {"bm25_tiles", "bm25_listed", "bm25_filter", "tile_bounds", "kth_largest", "collect"} <= set(report)
    threads = TC.threads(tile)
    for name, blocks in (("bm25_tiles", TC.min_blocks(tile)), ("bm25_listed", TC.min_blocks(tile)),
                         ("bm25_filter", TC.filter_blocks(tile, 128))):
        r = report[name]
        assert r["spills"] == 0, (name, r)
        assert r["registers"] * threads * blocks <= SM_REGISTERS, (name, r, blocks)
        assert (r["smem"] + RESERVED) * blocks <= SM_SHARED, (name, r, blocks)
    # the filter's 16-bit sums are what buy it more resident blocks than the f64 scorer, two tiles a block
    assert TC.filter_span(128) == 2 and TC.filter_blocks(tile, 128) > TC.min_blocks(tile)


@pytest.mark.parametrize("tile, tpb", [(1024, 256), (64, 4096), (32, 8192), (64, 1)])
def test_other_tile_sizes_build(tile, tpb, tmp_path):
    assert {"bm25_tiles", "bm25_listed", "bm25_filter"} <= set(ptxas_report(tile, tpb, tmp_path))
