"""The wheel as a user installs it: built from this tree, installed into a fresh venv, run from outside the tree.

The fresh venv sees no checkout (PYTHONPATH cleared, its working directory a temporary folder) and borrows only
the test venv's third-party packages (a path line in a .pth file: the editable install of ragserve there is a
.pth *hook*, which a path line does not run), so `ragserve` here is the wheel's. It indexes a corpus, searches it
on `cpu` and on `fpga-sim` (which compiles the HLS kernel from the sources the wheel ships) and serves it over HTTP.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.conftest import REPO, shared
from tests.serverproc import ServerProcess

pytestmark = pytest.mark.slow

QUERIES = ["nuclear power is safe", "school uniforms", "animal testing for medicine"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    """(venv's bin dir, env, a cwd outside the tree) with the wheel built from this checkout installed."""
    tmp = tmp_path_factory.mktemp("wheel")
    run = dict(check=True, capture_output=True, text=True, timeout=300)
    # Built from a copy of the tree: an in-place build would leave build/ and an egg-info in the checkout. The
    # venvs (.venv, CI's .venv-runtime: 2.3 GB) and other generated folders are not the package's and stay behind.
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=shutil.ignore_patterns(".git", ".venv*", "build", "*.egg-info", "__pycache__",
                                                             ".pytest_cache", "runs", "indexes", "benchmarks",
                                                             "work"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(tmp / "dist"), str(src)], **run)
    wheel, = (tmp / "dist").glob("ragserve-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], **run)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               **run).stdout.strip())
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "--no-deps", "--no-index", "-q",
                    str(wheel)], env=env, **run)
    # After the install: pip would take the borrowed editable ragserve for an installed one.
    (site / "borrowed_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _offer_compiled_search_kernels(site)
    cwd = tmp / "elsewhere"
    cwd.mkdir()
    return {"bin": venv / "bin", "env": env, "cwd": cwd, "venv": venv}


def _offer_compiled_search_kernels(site: Path) -> None:
    """The search kernels this checkout compiled (other tests' searches), offered to the wheel's copies: numba
    keys its cache folder by the source folder's path, but takes an entry only if the source file's content hash
    is the one it was compiled from, so a kernel the wheel ships different still compiles (~11 CPU-s saved on two
    cores). The index kernels (indexer/) are left to compile from site-packages into the per-user cache, as on a
    user's first run."""
    import indexer  # noqa: F401  (first: it sets NUMBA_CACHE_DIR, which the wheel's processes inherit)
    from numba.core.caching import _CacheLocator  # the cache folder numba derives from a source file's path

    root = Path(os.environ["NUMBA_CACHE_DIR"])
    kernel = Path("ragserve", "kernels", "cpu", "search.py")  # its folder holds every search kernel
    have = root / _CacheLocator.get_suitable_cache_subpath(str(REPO / kernel))
    if have.is_dir():
        shutil.copytree(have, root / _CacheLocator.get_suitable_cache_subpath(str(site / kernel)), dirs_exist_ok=True)


def _run(inst: dict, *args: str, timeout: float = 600) -> str:
    proc = subprocess.run([str(inst["bin"] / args[0]), *args[1:]], cwd=inst["cwd"], env=inst["env"],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_the_wheel_imports_from_the_venv_not_the_checkout_nor_the_writer(installed):
    out = _run(installed, "python", "-c",
               "import json, ragserve, indexer, hls_bm25; from ragserve.kernels.fpga.csim.library import hls_dir;"
               "import sys, ragserve.retrieval.searcher, ragserve.kernels.cpu.backend;"
               "build = {'indexer.writer', 'indexer.analysis', 'indexer.ingest', 'indexer.packing'};"
               "assert not build & set(sys.modules), 'the query path loads the index build';"
               "print(json.dumps([ragserve.__file__, indexer.__file__, str(hls_dir())]))")
    venv = str(installed["venv"].resolve())
    for path in json.loads(out):
        assert str(Path(path).resolve()).startswith(venv), path
        assert not str(Path(path).resolve()).startswith(str(REPO)), path
    assert (Path(json.loads(out)[2]) / "bm25_topk.cpp").is_file()


def test_index_search_cpu_and_fpga_sim_and_serve_from_the_wheel(installed):
    corpus = shared("beir-arguana", "corpus.jsonl.gz")
    index = installed["cwd"] / "arguana"
    _run(installed, "ragserve", "index", str(corpus), "--out", str(index), "--block-size", "2048",
         "--bank-bytes", str(3 << 20), "--quiet")
    # One process a backend searches all the queries (a TREC run: ids and the shortest f32 score text).
    topics = installed["cwd"] / "queries.tsv"
    topics.write_text("".join(f"q{i}\t{q}\n" for i, q in enumerate(QUERIES)))
    runs = {}
    for backend in ("cpu", "fpga-sim"):
        run = installed["cwd"] / f"{backend}.trec"
        _run(installed, "ragserve", "search", "--index", str(index), "--backend", backend, "-k", "10", "--queries",
             str(topics), "--output", str(run))
        runs[backend] = [line.split()[:5] for line in run.read_text().splitlines()]
    assert runs["cpu"] == runs["fpga-sim"]  # same ids, same scores (f32 printed exactly)
    assert [sum(1 for r in runs["cpu"] if r[0] == f"q{i}") for i in range(len(QUERIES))] == [10] * len(QUERIES)

    import requests

    from ragserve.trec import format_score

    # PYTHONPATH empty (ignored by Python): ServerProcess starts from os.environ, which holds the checkout's.
    serve = [str(installed["bin"] / "ragserve"), "serve", "--host", "127.0.0.1", "--port", "0", "--index", str(index),
             "--backend", "cpu"]
    srv = ServerProcess(env={"PYTHONPATH": ""}, command=serve, startup_timeout=300)
    try:
        r = requests.post(srv.url + "/v1/search", json={"query": QUERIES[0], "k": 10}, timeout=120)
        assert r.status_code == 200, r.text
        assert [[h["id"], format_score(h["score"])] for h in r.json()["hits"]] == \
            [row[2:5:2] for row in runs["cpu"] if row[0] == "q0"]
    finally:
        assert srv.terminate() == 0, srv.log()
