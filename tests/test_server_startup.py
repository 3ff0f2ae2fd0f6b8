"""A new server's first minutes: model paths checked before it listens, a model that cannot load stops it,
the warm-up that compiles the search kernels before /readyz, and the per-user kernel cache."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from ragserve.model_path import model_path_problem
from tests.serverproc import ServerProcess, run_cli


def test_model_path_problems(tmp_path):
    assert model_path_problem("/nonexistent") == "no model directory at /nonexistent"
    assert model_path_problem("./models/missing") == "no model directory at ./models/missing"
    (tmp_path / "f").write_text("x")
    assert "is a file, not a model directory" in model_path_problem(str(tmp_path / "f"))
    assert "no config.json" in model_path_problem(str(tmp_path))
    (tmp_path / "config.json").write_text("{}")
    assert model_path_problem(str(tmp_path)) is None
    # a hub id is looked up in the local Hugging Face cache only (tests/test_models.py), never downloaded
    assert model_path_problem("Qwen/Qwen2.5-0.5B").startswith("no model directory at Qwen/Qwen2.5-0.5B, no installed")


@pytest.mark.parametrize("flag", ["--model", "--reranker"])
def test_serve_refuses_a_missing_model_before_listening(arguana_index, flag):
    args = ["--model", "/nonexistent"] if flag == "--model" else ["--model", "/nonexistent-too", flag, "/nonexistent"]
    r = run_cli("serve", "--index", str(arguana_index), "--port", "0", *args, timeout=30)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines() == ["ragserve serve: error: no model directory at /nonexistent"
                                             + ("-too" if flag == "--reranker" else "")]


def test_eval_refuses_a_missing_model(arguana_index, tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"id": "1", "question": "q?", "golden_answers": ["a"]}) + "\n")
    r = run_cli("eval", "--dataset", str(data), "--method", "single", "--model", "/nonexistent",
                "--index", str(arguana_index), "--out", str(tmp_path / "rows.jsonl"), timeout=30)
    assert r.returncode == 2 and r.stderr.strip() == "ragserve eval: error: no model directory at /nonexistent"


def test_server_stops_on_a_model_it_cannot_load(arguana_index, tmp_path):
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # passes the path check, fails in transformers
    srv = ServerProcess("--index", str(arguana_index), "--backend", "cpu", "--model", str(broken), "--device", "cpu")
    assert srv.wait_exit(180) == 2, srv.log()
    log = srv.log()
    assert "Traceback" not in log
    assert log.strip().splitlines()[-1].startswith(f"ragserve serve: error: cannot load the model {broken}: ")


# A fresh process: how many compiled signatures each numba kernel of ragserve/indexer has, before the warm-up,
# after it, and after searches unlike the warm-up's (other words, k, BM25 parameters, batch size).
_KERNELS_SCRIPT = textwrap.dedent("""
    import json, sys
    from numba.core.registry import CPUDispatcher
    from ragserve.retrieval.searcher import Searcher
    from ragserve.server.warmup import Warmup

    def compiled():
        return {f"{name}.{attr}": len(v.signatures) for name, mod in list(sys.modules.items())
                if name.startswith(("ragserve", "indexer")) for attr, v in list(vars(mod).items())
                if isinstance(v, CPUDispatcher) and v.signatures}

    searcher = Searcher(sys.argv[1], backend="cpu")
    before = compiled()
    warmup = Warmup(searcher)
    warmup.start()
    warmup.done.wait()
    after = compiled()
    searcher.search_batch(["nuclear power is dangerous", "animals", "the tax on sugar"], k=37, k1=1.2, b=0.75)
    searcher.search("vegetarian", k=1)
    print(json.dumps({"before": before, "after": after, "final": compiled(), "status": warmup.status()}))
""")


def test_warmup_compiles_every_kernel_the_searches_use(arguana_index):
    r = subprocess.run([sys.executable, "-c", _KERNELS_SCRIPT, str(arguana_index)], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["status"]["state"] == "done" and "search" in out["status"]["seconds"]
    # Opening the cpu backend runs only the kernel that builds its resident postings (norms fused in)...
    assert set(out["before"]) <= {"ragserve.kernels.cpu.relevancy.fuse_norms"}
    assert set(out["after"]) - set(out["before"])  # ...the warm-up compiled (or loaded) the search kernels...
    assert out["final"] == out["after"]  # ...and later searches needed no other


_CACHE_SCRIPT = textwrap.dedent("""
    import ragserve  # sets NUMBA_CACHE_DIR unless the environment already does
    import sys
    sys.path.insert(0, sys.argv[1])
    import tinykernel
    print(tinykernel.twice(21))
""")


@pytest.mark.parametrize("env, where", [
    ({"XDG_CACHE_HOME": "{tmp}/xdg"}, "{tmp}/xdg/ragserve/numba"),
    ({"XDG_CACHE_HOME": "{tmp}/xdg", "RAGSERVE_CACHE_DIR": "{tmp}/rc"}, "{tmp}/rc/numba"),
    ({"RAGSERVE_CACHE_DIR": "{tmp}/rc", "NUMBA_CACHE_DIR": "{tmp}/nb"}, "{tmp}/nb"),
])
def test_compiled_kernels_go_to_the_per_user_cache(tmp_path, env, where):
    src = tmp_path / "src"
    src.mkdir()
    (src / "tinykernel.py").write_text("from numba import njit\n\n\n@njit(cache=True)\ndef twice(x):\n"
                                       "    return 2 * x\n")
    base = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "RAGSERVE_CACHE_DIR", "XDG_CACHE_HOME")}
    env = {k: v.format(tmp=tmp_path) for k, v in env.items()}
    r = subprocess.run([sys.executable, "-c", _CACHE_SCRIPT, str(src)], capture_output=True, text=True, timeout=120,
                       env={**base, **env})
    assert r.returncode == 0 and r.stdout.strip() == "42", r.stderr
    cached = list((tmp_path / where.format(tmp=tmp_path).removeprefix(str(tmp_path) + "/")).rglob("*.nbi"))
    assert [p.name.split(".")[0] for p in cached] == ["tinykernel"]
    assert not list(src.rglob("*.nbi"))  # nothing beside the sources
