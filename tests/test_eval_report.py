"""``ragserve eval report``: the intervals' arithmetic, and a report of real evaluation rows (the tiny random
model's: every answer wrong, but every stage ran) opened in headless Chromium, self-contained and rendered."""
from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from ragserve.cli import main
from ragserve.rag.report import bootstrap_mean, wilson
from tests.test_rag_cli import eval_args
from tests.test_server_web import ARGS, CHROMIUM


def test_wilson_interval_matches_published_values():
    # Newcombe (1998), Statistics in Medicine 17:857, table I: 95% Wilson intervals.
    assert wilson(5, 10) == pytest.approx((0.2366, 0.7634), abs=1e-4)
    assert wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    assert wilson(10, 10) == pytest.approx((0.7225, 1.0), abs=1e-4)
    assert wilson(81, 263) == pytest.approx((0.2553, 0.3662), abs=1e-4)


def test_bootstrap_interval_holds_the_mean_and_narrows_with_data():
    assert bootstrap_mean([0.5] * 20) == (0.5, 0.5)
    few = [0.0, 1.0, 0.5, 0.25, 0.75]
    lo, hi = bootstrap_mean(few)
    assert lo < sum(few) / 5 < hi and bootstrap_mean(few) == (lo, hi)  # seeded: the same rows, the same page
    lo2, hi2 = bootstrap_mean(few * 20)
    assert hi2 - lo2 < (hi - lo) / 2


@pytest.fixture(scope="module")
def rows(tmp_path_factory) -> list[Path]:
    d = tmp_path_factory.mktemp("rows")
    paths = []
    for method in ("none", "single"):
        out = d / f"{method}.jsonl"
        assert main(eval_args(out, method, 4)) == 0
        paths.append(out)
    return paths


def test_report_is_one_self_contained_page(rows, tmp_path, capsys):
    out = tmp_path / "report" / "r.html"
    assert main(["eval", "report", *map(str, rows), "--out", str(out), "--examples", "3"]) == 0
    assert "wrote" in capsys.readouterr().out and not list(out.parent.glob("*.tmp"))
    page = out.read_text(encoding="utf-8")
    assert "<script" not in page and "src=" not in page and "href=" not in page and "@import" not in page
    data = [json.loads(line) for p in rows for line in p.read_text().splitlines()]
    for method in ("none", "single"):
        mine = [r for r in data if r["method"] == method]
        hits = sum(1 for r in mine if r["em"] >= 1.0)
        lo, hi = wilson(hits, len(mine))
        assert f"<td>{method}</td><td>{len(mine)}</td><td>{100 * hits / len(mine):.1f}</td>" in page
        assert f"<td>{100 * lo:.1f}–{100 * hi:.1f}</td>" in page
    wrong = [r for r in data if r["em"] < 1.0]
    assert f"({len(wrong)} in all; up to 3 per method)" in page
    single = next(r for r in data if r["method"] == "single")
    assert html.escape(single["question"]) in page
    titles = [h["title"] for s in single["steps"] if s["kind"] == "retrieve" for h in s["hits"]]
    assert titles and all(html.escape(t) in page for t in titles)


def test_report_renders_in_headless_chromium(rows, tmp_path):
    from playwright.sync_api import sync_playwright

    out = tmp_path / "r.html"
    assert main(["eval", "report", *map(str, rows), "--out", str(out)]) == 0
    requests = []
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        pg = b.new_page(viewport={"width": 1100, "height": 900})
        pg.on("request", lambda r: requests.append(r.url))
        errors = []
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto(out.as_uri())
        charts = pg.locator("svg.chart")
        assert charts.count() == 3
        for i in range(3):
            box = charts.nth(i).bounding_box()
            assert box["width"] > 300 and box["height"] > 60
        assert pg.locator("svg.chart").nth(2).locator("rect").count() >= 2 * 4  # a bar per stage per method
        assert pg.locator(".card.wrong").count() >= 1
        passages = pg.locator(".card details:has(ol li)").first  # a card whose answer had passages
        assert not passages.locator("ol li").first.is_visible()
        passages.locator("summary").click()
        assert passages.locator("ol li").first.is_visible()
        pg.screenshot(path=str(tmp_path / "report.png"), full_page=True)
        b.close()
    assert requests == [out.as_uri()] and errors == []  # nothing fetched but the file itself
    assert (tmp_path / "report.png").stat().st_size > 10_000


def test_report_of_a_file_that_is_not_rows(tmp_path, capsys):
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"query": "q"}\n')
    assert main(["eval", "report", str(bad), "--out", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "x.jsonl:1: not a ragserve eval row" in err
    assert main(["eval", "report", str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "r.html")]) == 2
    assert not (tmp_path / "r.html").exists()
