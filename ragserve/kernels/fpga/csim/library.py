"""The FPGA kernels' C simulation: each HLS kernel (``hls_bm25/bm25_topk.cpp``, ``attn_topk.cpp``) compiled with g++
as a shared library (the same source and flags as ``make -C hls_bm25 lib``), cached under a build directory keyed by
the hash of the sources and flags, and loaded through ctypes. The sources are the ``hls_bm25`` package's files,
found through ``importlib.resources``: the same lookup in a source checkout and in an installed wheel.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np

from ragserve.kernels.fpga.backend import FpgaUnavailableError

# Each kernel's source and every file it includes (the cache key hashes them all).
KERNEL_SOURCES = {
    "bm25_topk": ("bm25_topk.cpp", "bm25_topk.h", "topk_select.h", "shim/hls_stream.h"),
    "attn_topk": ("attn_topk.cpp", "attn_topk.h", "topk_select.h", "shim/hls_stream.h"),
}
# Same flags as the Makefile's `lib` target. -ffp-contract=off keeps 1 + tf * cache two rounded operations.
CXXFLAGS = ("-std=c++17", "-O3", "-fPIC", "-shared", "-ffp-contract=off", "-Wno-unknown-pragmas")

_u32p = np.ctypeslib.ndpointer(np.uint32, flags="C_CONTIGUOUS")
_f32p = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
_u8p = np.ctypeslib.ndpointer(np.uint8, flags="C_CONTIGUOUS")
_ARGTYPES = [_u32p, _u8p, _u32p, _u32p, _u32p, _f32p, _u32p, _u32p, _f32p, _u32p, _f32p, _u32p, _u32p] + \
    [ctypes.c_uint32] * 8

# The kernel keeps its accumulator in static memory (on-chip RAM in hardware): one call at a time per process.
CALL_LOCK = threading.Lock()


@cache
def hls_dir() -> Path:
    """The folder of the ``hls_bm25`` package (a checkout's ``hls_bm25/`` or the installed package's)."""
    try:
        root = resources.files("hls_bm25")
    except ModuleNotFoundError:
        raise FpgaUnavailableError("the HLS kernel sources (the hls_bm25 package) are not installed; reinstall "
                                   "ragserve") from None
    return Path(str(root))


def _cache_dirs() -> list[Path]:
    # The user's cache first: an installed package's folder may be read-only, and is no place for build outputs.
    return [Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ragserve" / "fpga-sim",
            hls_dir() / "build" / "sim"]


def library_path(kernel: str = "bm25_topk") -> Path:
    """Build the C-simulation library of ``kernel`` if needed (g++), and return its path."""
    sources = KERNEL_SOURCES[kernel]
    src = hls_dir()
    missing = [s for s in sources if not (src / s).is_file()]
    if missing:
        raise FpgaUnavailableError(f"the kernel source is missing ({src}/{missing[0]}); reinstall ragserve")
    h = hashlib.sha256(" ".join(CXXFLAGS).encode())
    for s in sources:
        h.update(s.encode() + b"\0" + (src / s).read_bytes())
    key = h.hexdigest()[:16]
    for d in _cache_dirs():
        so = d / key / f"lib{kernel}.so"
        if so.is_file():
            return so
    cxx = os.environ.get("CXX", "g++")
    if shutil.which(cxx) is None:
        raise FpgaUnavailableError(f"fpga-sim compiles the HLS kernel with a C++ compiler, and {cxx!r} was not found; "
                                   f"install g++ (e.g. apt-get install g++) or set CXX")
    errors = []
    for d in _cache_dirs():
        out_dir = d / key
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            # Compile to a temporary name and rename, so concurrent builders never load a partial file.
            fd, tmp = tempfile.mkstemp(suffix=".so", dir=out_dir)
            os.close(fd)
        except OSError as e:
            errors.append(f"{out_dir}: {e}")
            continue
        cmd = [cxx, *CXXFLAGS, f"-I{src / 'shim'}", f"-I{src}", "-o", tmp, str(src / sources[0])]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            os.unlink(tmp)
            raise FpgaUnavailableError(f"compiling the HLS kernel failed ({' '.join(cmd)}):\n{proc.stderr.strip()}")
        so = out_dir / f"lib{kernel}.so"
        os.replace(tmp, so)
        return so
    raise FpgaUnavailableError("no writable build directory for the fpga-sim library: " + "; ".join(errors))


_LIBS: dict[str, ctypes.CDLL] = {}


def load_kernel(kernel: str, argtypes: list) -> ctypes.CDLL:
    """The C-simulation library of ``kernel`` (built on first use), its entry point typed with ``argtypes``."""
    with CALL_LOCK:
        if kernel not in _LIBS:
            lib = ctypes.CDLL(str(library_path(kernel)))
            fn = getattr(lib, kernel)
            fn.argtypes = argtypes
            fn.restype = None
            _LIBS[kernel] = lib
        return _LIBS[kernel]


def load_library() -> ctypes.CDLL:
    return load_kernel("bm25_topk", _ARGTYPES)
