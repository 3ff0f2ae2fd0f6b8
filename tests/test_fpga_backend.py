"""The FPGA host path: ``ragserve search --backend fpga-sim`` end to end, the clear failure of ``--backend fpga``
without XRT, the pyxrt buffer/launch plumbing (through a thin fake pyxrt whose kernel call runs the C simulation),
and the host's input checks."""
from __future__ import annotations

import ctypes
import json
import re
import sys
import types

import numpy as np
import pytest

from indexer.reader import IndexReader
from ragserve.kernels.fpga.csim import library as fpga_sim
from ragserve.kernels.fpga.backend import FpgaUnavailableError
from ragserve.cli import main
from ragserve.kernels.contract import SearchError
from ragserve.retrieval.searcher import Searcher

QUERY = "What government position was held by the woman who portrayed Corliss Archer in the film Kiss and Tell?"


def _search_json(capsys, index, backend: str, k: int = 20) -> list[dict]:
    assert main(["search", QUERY, "--index", str(index), "--backend", backend, "-k", str(k), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_search_fpga_sim_equals_cpu(capsys, hotpot_index):
    sim = _search_json(capsys, hotpot_index, "fpga-sim")
    cpu = _search_json(capsys, hotpot_index, "cpu")
    assert len(sim) == 20
    assert sim == cpu  # ids, scores, titles and texts
    assert "Kiss and Tell (1945 film)" in {h["title"] for h in sim[:3]}


def test_cli_search_fpga_without_pyxrt_is_one_clear_line(capsys, monkeypatch, hotpot_index):
    monkeypatch.setitem(sys.modules, "pyxrt", None)  # import pyxrt -> ImportError, as on a machine without XRT
    assert main(["search", QUERY, "--index", str(hotpot_index), "--backend", "fpga"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert "pyxrt" in err and "Xilinx XRT" in err and "source /opt/xilinx/xrt/setup.sh" in err and "--xclbin" in err


def test_fpga_sim_rejects_k_above_the_kernel_limit(hotpot_index):
    s = Searcher(hotpot_index, backend="fpga-sim")
    assert s.max_k == 1024  # declared by the backend, checked by the retrieval contract before any launch
    with pytest.raises(SearchError, match="between 1 and 1024 on the fpga-sim backend"):
        s.search(QUERY, k=1025)
    with pytest.raises(SearchError, match="at most k=1024"):  # the backend itself still refuses it
        s.backend.search_terms([s.analyze(QUERY)], 1025, 0.9, 0.4)
    assert len(s.search(QUERY, k=1024)) > 0


def test_fpga_sim_rejects_blocks_smaller_than_a_norm_word(tmp_path):
    from indexer.options import BuildOptions
    from indexer.writer import build_index

    corpus = tmp_path / "c.jsonl"
    corpus.write_text("".join(json.dumps({"_id": str(i), "title": "", "text": f"doc {i} word"}) + "\n" for i in range(40)))
    build_index([corpus], tmp_path / "idx", BuildOptions(block_size=16, progress=False))
    with pytest.raises(FpgaUnavailableError, match="doc blocks of 64 to 262144"):
        Searcher(tmp_path / "idx", backend="fpga-sim")


def test_missing_compiler_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setattr(fpga_sim, "_cache_dirs", lambda: [tmp_path / "cache"])
    monkeypatch.setenv("CXX", "no-such-g++")
    with pytest.raises(FpgaUnavailableError, match=r"'no-such-g\+\+' was not found; install g\+\+"):
        fpga_sim.library_path()


# ---- pyxrt plumbing -------------------------------------------------------------------------------------------


class FakeXrt:
    """The slice of pyxrt the fpga backend uses. A kernel call checks that every buffer lives in the CU's own
    bank and runs the C simulation on the buffers' bytes; reads return only what a sync from the device copied."""

    def __init__(self, num_cus: int) -> None:
        self.num_cus = num_cus
        self.calls: list[str] = []
        lib = fpga_sim.load_library()
        xrt = self

        class xclBOSyncDirection:
            XCL_BO_SYNC_BO_TO_DEVICE = "to_device"
            XCL_BO_SYNC_BO_FROM_DEVICE = "from_device"

        class ert_cmd_state:
            ERT_CMD_STATE_COMPLETED = "completed"

        class device:
            def __init__(self, index: int) -> None:
                self.index = index

            def load_xclbin(self, xb) -> str:
                return "uuid"

        class xclbin:
            def __init__(self, path: str) -> None:
                self.path = path

        class bo:
            normal = 0

            def __init__(self, dev, size: int, flags: int, group: int) -> None:
                self.host = np.zeros(size, np.uint8)
                self.device_mem = np.zeros(size, np.uint8)
                self.group = group

            def write(self, a: np.ndarray, seek: int) -> None:
                raw = np.ascontiguousarray(a).reshape(-1).view(np.uint8)
                self.host[seek:seek + raw.size] = raw

            def sync(self, direction: str, size: int, offset: int) -> None:
                src, dst = (self.host, self.device_mem) if direction == "to_device" else (self.device_mem, self.host)
                dst[offset:offset + size] = src[offset:offset + size]
                xrt.calls.append(f"sync {direction} {size}")

            def read(self, size: int, skip: int) -> np.ndarray:
                return self.host[skip:skip + size].view(np.int8).copy()

        class run:
            def wait(self) -> str:
                return "completed"

        class kernel:
            def __init__(self, dev, uuid: str, name: str) -> None:
                cu = int(re.fullmatch(r"bm25_topk:\{bm25_topk_(\d+)\}", name).group(1))
                if cu > xrt.num_cus:
                    raise RuntimeError(f"no compute unit {name}")
                self.bank = cu - 1

            def group_id(self, arg: int) -> int:
                return self.bank

            def __call__(self, *args):
                bos, scalars = args[:13], args[13:]
                assert all(isinstance(b, bo) for b in bos) and all(isinstance(s, int) for s in scalars)
                assert {b.group for b in bos} == {self.bank}, "a buffer is outside the CU's bank"
                # Device memory as the kernel sees it: 64-byte aligned copies of the bank contents.
                mems = [np.require(b.device_mem, requirements="CA").copy() for b in bos]
                ptrs = [m.ctypes.data_as(ctypes.c_void_p) for m in mems]
                fn = ctypes.CDLL(lib._name).bm25_topk
                fn.argtypes = [ctypes.c_void_p] * 13 + [ctypes.c_uint32] * 8
                fn(*ptrs, *scalars)
                for b, m in zip(bos[9:], mems[9:]):
                    b.device_mem[:] = m
                xrt.calls.append(f"run cu{self.bank + 1}")
                return run()

        self.module = types.SimpleNamespace(device=device, xclbin=xclbin, bo=bo, kernel=kernel,
                                            xclBOSyncDirection=xclBOSyncDirection, ert_cmd_state=ert_cmd_state)


def test_fpga_backend_places_shards_in_their_banks_and_matches_cpu(monkeypatch, tmp_path, hotpot_index):
    ix = IndexReader(hotpot_index)
    fake = FakeXrt(num_cus=len(ix.shards) + 2)
    monkeypatch.setitem(sys.modules, "pyxrt", fake.module)
    xclbin = tmp_path / "bm25_topk_8cu.xclbin"
    xclbin.write_bytes(b"xclbin")
    fpga = Searcher(ix, backend="fpga", xclbin=str(xclbin), batch_size=4)
    cpu = Searcher(ix, backend="cpu")
    questions = [QUERY, "What science fantasy young adult series, told in first person, has a set of companion books",
                 'The director of the romantic comedy "Big Stone Gap" is based in what New York city?',
                 "zzzunknownterm", "magazine"]
    assert [[(h.id, h.score) for h in r] for r in fpga.search_batch(questions, k=50)] == \
        [[(h.id, h.score) for h in r] for r in cpu.search_batch(questions, k=50)]
    assert [b.group for shard in fpga.backend.shard_bos for b in shard] == \
        [i for i in range(len(ix.shards)) for _ in range(5)]
    runs = [c for c in fake.calls if c.startswith("run")]
    assert runs == [f"run cu{i + 1}" for _ in range(2) for i in range(len(ix.shards))]  # 2 launches of <= 4 queries


def test_fpga_backend_needs_one_cu_per_shard_and_an_xclbin(monkeypatch, tmp_path, hotpot_index):
    ix = IndexReader(hotpot_index)
    monkeypatch.setitem(sys.modules, "pyxrt", FakeXrt(num_cus=len(ix.shards) - 1).module)
    monkeypatch.delenv("RAGSERVE_XCLBIN", raising=False)
    with pytest.raises(FpgaUnavailableError, match="pass --xclbin PATH"):
        Searcher(ix, backend="fpga")
    xclbin = tmp_path / "k.xclbin"
    xclbin.write_bytes(b"x")
    with pytest.raises(FpgaUnavailableError, match=f"{len(ix.shards)} shards but the xclbin has {len(ix.shards) - 1}"):
        Searcher(ix, backend="fpga", xclbin=str(xclbin))
