"""The first ten minutes: scripts/demo.sh indexes the Wikipedia sample in corpora/demo and serves it; the
README's example queries and the page's placeholders hit it."""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import requests

from tests.serverproc import ServerProcess

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")
DEMO_DUMP = REPO / "corpora" / "demo" / "enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"


def readme_search_bodies() -> list[dict]:
    """The JSON bodies of the README's /v1/search curl examples."""
    return [json.loads(m) for m in re.findall(r"/v1/search -H 'Content-Type: application/json' -d '(\{.*?\})'",
                                              README)]


def page_placeholders() -> list[str]:
    html = (REPO / "ragserve" / "web" / "index.html").read_text(encoding="utf-8")
    return [re.search(rf'id="{i}"[^>]*placeholder="e\.g\. ([^"]+)"', html).group(1) for i in ("question",
                                                                                               "search-query")]


def test_demo_corpus_ships_with_its_attribution():
    source = (REPO / "corpora" / "demo" / "SOURCE.md").read_text(encoding="utf-8")
    assert DEMO_DUMP.name in source and "CC BY-SA" in source and "gensim" in source
    assert DEMO_DUMP.stat().st_size == 1_695_871
    assert README.count("```bash\nbash scripts/") == 1  # the two set-up commands, in one block
    setup = README[README.index("## Set-up on a fresh machine"):].split("```")[1]
    assert [line.split("#")[0].strip() for line in setup.strip().splitlines()[1:]] == [
        "bash scripts/demo.sh", "bash scripts/test.sh"]


@pytest.mark.slow
def test_demo_script_serves_real_wikipedia_text(tmp_path):
    ragserve = tmp_path / "ragserve"  # this checkout's code (the venv's console script may be another's)
    ragserve.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m ragserve "$@"\n')
    ragserve.chmod(0o755)
    env = {"WORK": str(tmp_path), "PORT": "0", "DRY_RUN": "1",  # DRY_RUN: setup.sh prints its pip command only
           "RAGSERVE": str(ragserve)}
    srv = ServerProcess(command=["bash", "-c", "exec bash scripts/demo.sh 1>&2"], env=env, startup_timeout=300)
    try:
        srv.wait_ready()
        log = srv.log()
        assert "-e .\n" in log and "[dev]" not in log  # the demo installs the runtime dependencies only
        manifest = json.loads((tmp_path / "demo-wikipedia" / "manifest.json").read_text())
        assert manifest["source"]["format"] == "mediawiki" and manifest["stats"]["num_docs"] > 4000
        bodies = readme_search_bodies()
        assert len(bodies) >= 2
        for body in bodies:
            r = requests.post(srv.url + "/v1/search", json=body, timeout=30)
            assert r.status_code == 200, r.text
            results = r.json().get("results") or [r.json()]
            assert all(res["hits"] for res in results), (body, r.json())
        for query in page_placeholders():
            hits = requests.post(srv.url + "/v1/search", json={"query": query, "k": 3}, timeout=30).json()["hits"]
            assert hits and all(h["text"] for h in hits), query
        relativity = requests.post(srv.url + "/v1/search", json={"query": "theory of relativity", "k": 1},
                                   timeout=30).json()["hits"][0]
        assert relativity["title"] == "Albert Einstein"  # real article text, not synthetic words
    finally:
        assert srv.terminate() == 0, srv.log()
