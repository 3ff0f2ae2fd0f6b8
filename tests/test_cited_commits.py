"""Benchmark figures are traceable: every commit that RESULTS.md, the raw runs' MANIFEST.json and the README cite
exists in the history, and a benchmark JSON records the tree it measured (``tools/provenance.py``)."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.conftest import REPO
from tools.provenance import files_sha256, stamp, tree_state

# A short commit id as these files cite them: 7-12 hex digits with a letter and a digit, standing alone. (A 40-digit
# id is another repository's, as the MTEB results' commit; figures such as "1,024" have no letters.)
SHORT_ID = re.compile(r"(?<![0-9a-zA-Z])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,12}(?![0-9a-zA-Z])")
CITING = ("benchmarks/RESULTS.md", "benchmarks/raw/MANIFEST.json", "README.md")


def _git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def full_history() -> None:
    if shutil.which("git") is None or _git("rev-parse", "HEAD").returncode != 0:
        pytest.skip("not a git checkout")
    if _git("rev-parse", "--is-shallow-repository").stdout.strip() == "true":
        pytest.skip("a shallow clone holds only part of the history")


def test_the_pattern_finds_commit_ids_and_nothing_else():
    text = "commit 3bed766, code at e17ceed (model at 404d3c3); 1,024 ms; sha 0123456789abcdef0123456789abcdef01234567"
    assert SHORT_ID.findall(text) == ["3bed766", "e17ceed", "404d3c3"]


@pytest.mark.parametrize("path", CITING)
def test_every_cited_commit_exists(full_history, path):
    cited = sorted(set(SHORT_ID.findall((REPO / path).read_text(encoding="utf-8"))))
    assert cited or path == "README.md"
    missing = [c for c in cited if _git("cat-file", "-e", f"{c}^{{commit}}").returncode != 0]
    assert not missing, f"{path} cites commits that are not in the history: {missing}"


def test_a_report_records_the_tree_it_measured(tmp_path):
    report = stamp({"figure": 1.0})
    tree = report["tree"]
    assert report["figure"] == 1.0 and len(tree["files_sha256"]) == 64
    if tree["commit"] is not None:
        assert _git("cat-file", "-e", f"{tree['commit']}^{{commit}}").returncode == 0
        assert isinstance(tree["dirty"], bool)
    # The hash is the code's files, with or without .git: a copy of the code gives the same; an edit changes it,
    # an added result does not.
    copy = tmp_path / "copy"
    for top in ("ragserve", "indexer", "hls_bm25", "scripts", "tools", "tests", ".ci"):
        if (REPO / top).is_dir():
            shutil.copytree(REPO / top, copy / top, ignore=shutil.ignore_patterns("__pycache__", "build"))
    for f in ("pyproject.toml", "requirements.lock"):
        shutil.copy(REPO / f, copy / f)
    assert tree_state(copy) == {"commit": None, "dirty": None, "files_sha256": files_sha256(REPO)}
    (copy / "benchmarks").mkdir()
    (copy / "benchmarks" / "new.json").write_text("{}")
    assert files_sha256(copy) == files_sha256(REPO)
    (copy / "tools" / "provenance.py").write_text((copy / "tools" / "provenance.py").read_text() + "\n")
    assert files_sha256(copy) != files_sha256(REPO)
