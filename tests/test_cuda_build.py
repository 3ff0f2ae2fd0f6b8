"""Every CUDA C kernel builds for Hopper (sm_90) with no GPU needed, so a kernel that stops building fails CI instead of
the next H200 run: NVRTC from its wheel (``nvidia-cuda-nvrtc``, pinned in the ``dev`` extra) compiles each of
``ragserve/kernels/gpu/cuda/*.cu`` alone and the program the loader compiles (``cuda.kernels.source()``), with the
loader's own options and defines, at the production tile size and at others the backend may choose; every kernel the
host binds is in the machine code. Where nvcc is installed, ptxas' report also shows that at the production tile size
every scoring kernel fits its launch bounds' registers without spilling, and its shared memory leaves room for the
blocks ``min_blocks`` / ``filter_blocks`` plan on (a spill or a lost block slows the kernel; only a GPU run would show
it otherwise)."""
from __future__ import annotations

import fnmatch
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from ragserve.kernels.gpu.cuda import kernels as CK
from ragserve.kernels.gpu.cuda.rtc import compile_cubin, nvrtc_version
from ragserve.kernels.gpu.settings import GpuSettings

ROOT = Path(__file__).resolve().parents[1]
CUDA_DIR = ROOT / "ragserve" / "kernels" / "gpu" / "cuda"
NVCC = shutil.which("nvcc")
SM_REGISTERS, SM_SHARED, RESERVED = 65536, 228 << 10, 1 << 10  # Hopper, per multiprocessor; per block reserved
PRODUCTION = (2048, 128)  # tile docs, tiles a doc block: the default tile_max in 256K-doc blocks
OTHER_TILES = [(1024, 256), (64, 4096), (32, 8192), (64, 1)]
# extern "C" kernels the host binds (TileKernels), by the file that holds them
KERNELS = {"relevancy.cu": {"bm25_tiles", "bm25_listed", "bm25_filter"},
           "planning.cu": {"make_samples", "tile_bounds", "query_in", "plan_single"},
           "selection.cu": {"kth_largest", "collect", "rank_candidates"}}


def test_nvrtc_from_its_wheel_is_the_pinned_cuda_13():
    assert nvrtc_version()[0] == 13


def test_the_sources_are_the_program_and_ship_with_the_package():
    """The loader compiles exactly the files in cuda/ (no kernel left in a Python string), and pyproject's package
    data installs each of them."""
    files = sorted(p.name for p in CUDA_DIR.iterdir() if p.suffix in (".cu", ".cuh"))
    assert files == sorted(CK.SOURCES) == sorted(KERNELS)
    assert CK.source() == "".join((CUDA_DIR / n).read_text() for n in CK.SOURCES)
    patterns = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["ragserve"]
    for name in files:
        assert any(fnmatch.fnmatch(f"kernels/gpu/cuda/{name}", p) for p in patterns), name
    for name, kernels in KERNELS.items():
        found = set(re.findall(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\)\s*)?(\w+)\(',
                               (CUDA_DIR / name).read_text()))
        assert found == kernels, name


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_each_source_builds_for_sm90(name):
    """A file alone, with the defines of the production tile size: its kernels are in the machine code."""
    cubin = compile_cubin(CK.read_source(name), CK.options(*PRODUCTION, GpuSettings()), CK.ARCH, name[:-3])
    for kernel in KERNELS[name]:
        assert b"\0" + kernel.encode() + b"\0" in cubin, kernel


@pytest.mark.parametrize("tile, tpb", [PRODUCTION] + OTHER_TILES)
def test_the_program_builds_for_sm90(tile, tpb):
    """What ``TileKernels.build`` compiles (the loader's source, options and defines), for sm_90."""
    cubin = compile_cubin(CK.source(), CK.options(tile, tpb, GpuSettings()), CK.ARCH, "bm25_tiles")
    for kernel in set().union(*KERNELS.values()):
        assert b"\0" + kernel.encode() + b"\0" in cubin, kernel


def ptxas_report(tile: int, tpb: int, tmp_path) -> dict[str, dict[str, int]]:
    """Per kernel: registers, spill stores and loads, static shared bytes, from ``ptxas -v``."""
    src = tmp_path / f"tiles_{tile}.cu"
    src.write_text(CK.source())
    defines = [f"-D{k}={v}" for k, v in CK.defines(tile, tpb, GpuSettings()).items()]
    out = subprocess.run([NVCC, f"-arch={CK.ARCH}", *CK.OPTIONS, *defines, "-cubin", "-o", str(tmp_path / "k.cubin"),
                          str(src), "-Xptxas", "-v"], capture_output=True, text=True, timeout=300)
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


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_production_tile_kernels_fit_their_blocks(tmp_path):
    tile, tpb = PRODUCTION
    report = ptxas_report(tile, tpb, tmp_path)
    assert {"bm25_tiles", "bm25_listed", "bm25_filter", "tile_bounds", "kth_largest", "collect"} <= set(report)
    threads = CK.threads(tile)
    for name, blocks in (("bm25_tiles", CK.min_blocks(tile)), ("bm25_listed", CK.min_blocks(tile)),
                         ("bm25_filter", CK.filter_blocks(tile, tpb))):
        r = report[name]
        assert r["spills"] == 0, (name, r)
        assert r["registers"] * threads * blocks <= SM_REGISTERS, (name, r, blocks)
        assert (r["smem"] + RESERVED) * blocks <= SM_SHARED, (name, r, blocks)
    # the filter's 16-bit sums are what buy it more resident blocks than the f64 scorer, two tiles a block
    assert CK.filter_span(tpb) == 2 and CK.filter_blocks(tile, tpb) > CK.min_blocks(tile)
