"""The first ten minutes: the README's set-up commands and the demo corpus it serves. The demo itself runs from a
runtime-only venv in tests/test_runtime_install.py, with these helpers (the README's queries, the page's
placeholders)."""
from __future__ import annotations

import json
import re
from pathlib import Path

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
