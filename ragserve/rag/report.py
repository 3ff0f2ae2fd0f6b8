"""``ragserve eval report``: evaluation rows (``ragserve eval --out``) as one self-contained HTML page.

Per method: EM and F1 with 95% confidence intervals (Wilson's for EM, a 0/1 rate; a seeded percentile bootstrap
for F1), EM against the retrievals each question took, the stage-time shares as stacked bars, and the slowest and
the wrong answers with the passages they were given. Charts are inline SVG and the style inline CSS: the file
opens anywhere, offline, with no script.
"""
from __future__ import annotations

import html
import json
import math
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ragserve.rag.trace import STAGES

Z95 = 1.959963984540054  # the normal quantile of a two-sided 95% interval
BOOTSTRAP = 2000
REQUIRED = ("id", "method", "question", "prediction", "answers", "em", "f1", "retrievals", "times", "seconds")
STAGE_COLOURS = {"prepare": "#8e6c8a", "relevancy": "#d1495b", "retrieval": "#edae49", "apply": "#00798c"}
PALETTE = ["#00798c", "#d1495b", "#edae49", "#66a182", "#2e4057", "#8e6c8a", "#f28f3b", "#5c80bc"]


class ReportError(ValueError):
    """An input that is not ``ragserve eval`` rows."""


@dataclass
class Group:
    label: str
    rows: list[dict]


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval of a binomial proportion (right at 0 and n, unlike the normal approximation)."""
    if n == 0:
        return 0.0, 0.0
    p = successes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_mean(values: list[float], resamples: int = BOOTSTRAP, seed: int = 0) -> tuple[float, float]:
    """A percentile bootstrap 95% interval of the mean (seeded: the same rows give the same report)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return 0.0, 0.0
    rng = np.random.default_rng(seed)
    means = v[rng.integers(0, v.size, size=(resamples, v.size))].mean(axis=1)
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def read_rows(paths: list[str | Path]) -> list[Group]:
    """Rows of every file, grouped by method (and dataset, when the files hold several datasets)."""
    rows = []
    for p in paths:
        path = Path(p)
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise ReportError(f"cannot read {path}: {e.strerror or e}") from None
        except UnicodeDecodeError:
            raise ReportError(f"{path} is not UTF-8 text; give the JSONL files of 'ragserve eval --out'") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                raise ReportError(f"{path}:{n}: not a JSON line; give the JSONL files of 'ragserve eval --out'") \
                    from None
            missing = [k for k in REQUIRED if not isinstance(row, dict) or k not in row]
            if missing:
                raise ReportError(f"{path}:{n}: not a ragserve eval row (no {missing[0]!r})")
            rows.append(row)
    if not rows:
        raise ReportError("no rows in " + ", ".join(str(p) for p in paths))
    datasets = {r.get("dataset") for r in rows}
    groups: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        label = r["method"] if len(datasets) == 1 else f"{r['method']} · {r.get('dataset')}"
        groups[label].append(r)
    return [Group(k, v) for k, v in groups.items()]


def summary(g: Group) -> dict:
    rows = g.rows
    n = len(rows)
    em_hits = sum(1 for r in rows if r["em"] >= 1.0)
    f1 = [float(r["f1"]) for r in rows]
    stages = {s: sum(r["times"].get(s, 0.0) for r in rows) for s in STAGES}
    total = sum(stages.values())
    return {"n": n, "em": em_hits / n, "em_ci": wilson(em_hits, n), "f1": sum(f1) / n, "f1_ci": bootstrap_mean(f1),
            "retrievals": sum(r["retrievals"] for r in rows) / n, "tokens": sum(r.get("tokens", 0) for r in rows) / n,
            "seconds": sum(r["seconds"] for r in rows) / n,
            "shares": {s: (v / total if total else 0.0) for s, v in stages.items()}}


# -- HTML pieces -------------------------------------------------------------------------------------
def esc(v) -> str:
    return html.escape(str(v), quote=True)


def pct(v: float) -> str:
    return f"{100 * v:.1f}"


def _colour(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def quality_chart(groups: list[Group], sums: list[dict]) -> str:
    """EM and F1 per method as bars with their 95% intervals as whiskers."""
    bar, gap, left, top, h = 22, 26, 150, 20, 180
    width = left + 380  # the scale's 300 px, whisker labels and the last tick's "100%"
    height = top + len(groups) * (2 * bar + gap) + 30
    x = lambda v: left + 300 * v  # noqa: E731 - a scale
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           'aria-label="EM and F1 per method with 95% confidence intervals">']
    for t in range(0, 101, 25):
        out.append(f'<line x1="{x(t / 100):.1f}" x2="{x(t / 100):.1f}" y1="{top - 6}" y2="{height - 24}" '
                   'class="grid"/><text x="{:.1f}" y="{}" class="tick">{}%</text>'.format(x(t / 100), height - 8, t))
    y = top
    for g, s in zip(groups, sums):
        out.append(f'<text x="{left - 8}" y="{y + bar + 4}" class="label" text-anchor="end">{esc(g.label)}</text>')
        for name, v, (lo, hi), cls in (("EM", s["em"], s["em_ci"], "em"), ("F1", s["f1"], s["f1_ci"], "f1")):
            out.append(f'<rect x="{left}" y="{y}" width="{x(v) - left:.1f}" height="{bar - 4}" class="{cls}">'
                       f'<title>{esc(g.label)} {name} {pct(v)}% (95% CI {pct(lo)}-{pct(hi)})</title></rect>')
            mid = y + (bar - 4) / 2
            out.append(f'<line x1="{x(lo):.1f}" x2="{x(hi):.1f}" y1="{mid}" y2="{mid}" class="ci"/>'
                       f'<line x1="{x(lo):.1f}" x2="{x(lo):.1f}" y1="{mid - 5}" y2="{mid + 5}" class="ci"/>'
                       f'<line x1="{x(hi):.1f}" x2="{x(hi):.1f}" y1="{mid - 5}" y2="{mid + 5}" class="ci"/>'
                       f'<text x="{x(hi) + 6:.1f}" y="{mid + 4}" class="value">{name} {pct(v)}</text>')
            y += bar
        y += gap
    out.append("</svg>")
    return "".join(out)


def retrieval_chart(groups: list[Group]) -> str:
    """EM against retrievals per question: one point per (method, retrieval count), its area the question count."""
    cells = {g.label: defaultdict(list) for g in groups}
    for g in groups:
        for r in g.rows:
            cells[g.label][int(r["retrievals"])].append(r["em"] >= 1.0)
    most = max((k for c in cells.values() for k in c), default=0)
    left, top, w, h = 50, 16, 420, 200
    width, height = left + w + 170, top + h + 44
    x = lambda k: left + (k + 0.5) * w / (most + 1)  # noqa: E731
    y = lambda v: top + h * (1 - v)  # noqa: E731
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           'aria-label="EM against retrievals per question">']
    for t in range(0, 101, 25):
        out.append(f'<line x1="{left}" x2="{left + w}" y1="{y(t / 100):.1f}" y2="{y(t / 100):.1f}" class="grid"/>'
                   f'<text x="{left - 6}" y="{y(t / 100) + 4:.1f}" class="tick" text-anchor="end">{t}%</text>')
    for k in range(most + 1):
        out.append(f'<text x="{x(k):.1f}" y="{top + h + 16}" class="tick" text-anchor="middle">{k}</text>')
    out.append(f'<text x="{left + w / 2}" y="{height - 6}" class="axis" text-anchor="middle">retrievals per '
               f'question</text><text x="12" y="{top + h / 2}" class="axis" transform="rotate(-90 12 '
               f'{top + h / 2})" text-anchor="middle">EM</text>')
    for i, g in enumerate(groups):
        col = _colour(i)
        pts = sorted(cells[g.label].items())
        if len(pts) > 1:
            path = " ".join(f"{x(k):.1f},{y(sum(v) / len(v)):.1f}" for k, v in pts)
            out.append(f'<polyline points="{path}" fill="none" stroke="{col}" stroke-opacity="0.5"/>')
        for k, v in pts:
            em = sum(v) / len(v)
            out.append(f'<circle cx="{x(k):.1f}" cy="{y(em):.1f}" r="{3 + 2.2 * math.sqrt(len(v)):.1f}" '
                       f'fill="{col}" fill-opacity="0.7"><title>{esc(g.label)}: {len(v)} questions with {k} '
                       f'retrieval(s), EM {pct(em)}%</title></circle>')
        out.append(f'<circle cx="{left + w + 20}" cy="{top + 10 + 20 * i}" r="6" fill="{col}"/>'
                   f'<text x="{left + w + 32}" y="{top + 14 + 20 * i}" class="label">{esc(g.label)}</text>')
    out.append("</svg>")
    return "".join(out)


def stage_chart(groups: list[Group], sums: list[dict]) -> str:
    """Where each method's time went: its stage shares as one 100% stacked bar."""
    left, bar, w = 150, 24, 420
    height = 20 + len(groups) * (bar + 12) + 30
    width = left + w + 230
    out = [f'<svg class="chart" viewBox="0 0 {width} {height}" width="{width}" height="{height}" role="img" '
           'aria-label="share of time per memory-pipeline stage">']
    y = 12
    for g, s in zip(groups, sums):
        out.append(f'<text x="{left - 8}" y="{y + bar / 2 + 4}" class="label" text-anchor="end">{esc(g.label)}'
                   '</text>')
        x0 = float(left)
        for st in STAGES:
            share = s["shares"][st]
            wid = w * share
            out.append(f'<rect x="{x0:.1f}" y="{y}" width="{wid:.1f}" height="{bar}" fill="{STAGE_COLOURS[st]}">'
                       f'<title>{esc(g.label)}: {st} {pct(share)}%</title></rect>')
            if wid > 34:
                out.append(f'<text x="{x0 + wid / 2:.1f}" y="{y + bar / 2 + 4}" class="inbar" '
                           f'text-anchor="middle">{pct(share)}%</text>')
            x0 += wid
        memory = 1.0 - s["shares"]["apply"]  # the three memory-access stages: often too thin to see
        out.append(f'<text x="{left + w + 6}" y="{y + bar / 2 + 4}" class="value">{s["seconds"]:.2f} s/q · '
                   f'retrieval stages {100 * memory:.2g}%</text>')
        y += bar + 12
    lx = left
    for st in STAGES:
        out.append(f'<rect x="{lx}" y="{height - 20}" width="12" height="12" fill="{STAGE_COLOURS[st]}"/>'
                   f'<text x="{lx + 16}" y="{height - 10}" class="tick">{st}</text>')
        lx += 100
    out.append("</svg>")
    return "".join(out)


def passages_html(row: dict) -> str:
    """Each retrieval's query and hits (id, title, score) as the row recorded them."""
    parts = []
    for s in row.get("steps", []):
        if s.get("kind") != "retrieve":
            continue
        hits = "".join(f"<li><b>{esc(h.get('title') or '(untitled)')}</b> <span class=dim>{esc(h.get('id'))} · "
                       f"{float(h.get('score', 0)):.2f}</span></li>" for h in s.get("hits", []))
        parts.append(f'<div class="q">query: “{esc(s.get("query", ""))}”</div><ol>{hits}</ol>')
    return "".join(parts) or '<div class="dim">no retrieval</div>'


def answer_card(row: dict, label: str) -> str:
    t = row["times"]
    shares = " · ".join(f"{st} {t.get(st, 0.0):.2f}s" for st in STAGES)
    ok = "right" if row["em"] >= 1.0 else "wrong"
    return (f'<div class="card {ok}"><div class="head"><span class="tag">{esc(label)}</span> '
            f'<span class="dim">{esc(row["id"])} · {row["seconds"]:.2f} s · {row["retrievals"]} retrieval(s) · '
            f'F1 {float(row["f1"]):.2f}</span></div>'
            f'<div class="question">{esc(row["question"])}</div>'
            f'<div>predicted <b>{esc(row["prediction"] or "(nothing)")}</b>; gold '
            f'<b>{esc(" | ".join(map(str, row["answers"])))}</b></div>'
            f'<div class="dim">{shares}</div>'
            f'<details><summary>passages and output</summary>{passages_html(row)}'
            f'<div class="output">{esc(row.get("output", ""))}</div></details></div>')


CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",sans-serif;margin:24px auto;max-width:1040px;color:#222;
padding:0 16px}h1{font-size:22px;margin:0 0 4px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #ddd;
padding-bottom:4px}.dim{color:#777;font-size:12px}table{border-collapse:collapse;margin:8px 0}
td,th{padding:4px 10px;border-bottom:1px solid #eee;text-align:right}th{background:#f6f6f6}
td:first-child,th:first-child{text-align:left}.chart{max-width:100%;height:auto;display:block}
.grid{stroke:#e4e4e4}.tick{font-size:11px;fill:#666}.label{font-size:12px;fill:#222}.value{font-size:11px;fill:#333}
.axis{font-size:12px;fill:#444}.inbar{font-size:11px;fill:#fff}.em{fill:#00798c}.f1{fill:#9fc9cf}
.ci{stroke:#222;stroke-width:1.4}.cards{display:grid;grid-template-columns:1fr 1fr;gap:10px}
.card{border:1px solid #ddd;border-left:4px solid #999;border-radius:4px;padding:8px 10px}
.card.wrong{border-left-color:#d1495b}.card.right{border-left-color:#66a182}.question{font-weight:600;margin:4px 0}
.tag{background:#eef;border-radius:3px;padding:0 5px;font-size:12px}ol{margin:4px 0 6px 18px;padding:0}
.q{font-size:12px;margin-top:6px;color:#444}.output{white-space:pre-wrap;font-size:12px;background:#fafafa;
padding:6px;margin-top:6px}summary{cursor:pointer;color:#00798c;font-size:12px;margin-top:4px}
"""


def render(groups: list[Group], sources: list[str], examples: int = 6) -> str:
    """The page. ``examples``: slowest answers shown, and wrong answers shown per method."""
    sums = [summary(g) for g in groups]
    total = sum(s["n"] for s in sums)
    head = ("<tr><th>method</th><th>questions</th><th>EM %</th><th>95% CI</th><th>F1 %</th><th>95% CI</th>"
            "<th>retrievals/q</th><th>tokens/q</th><th>s/q</th></tr>")
    body = "".join(
        f"<tr><td>{esc(g.label)}</td><td>{s['n']}</td><td>{pct(s['em'])}</td>"
        f"<td>{pct(s['em_ci'][0])}–{pct(s['em_ci'][1])}</td><td>{pct(s['f1'])}</td>"
        f"<td>{pct(s['f1_ci'][0])}–{pct(s['f1_ci'][1])}</td><td>{s['retrievals']:.2f}</td>"
        f"<td>{s['tokens']:.1f}</td><td>{s['seconds']:.2f}</td></tr>" for g, s in zip(groups, sums))
    labelled = [(g.label, r) for g in groups for r in g.rows]
    slowest = sorted(labelled, key=lambda lr: -lr[1]["seconds"])[:examples]
    wrong = [(g.label, r) for g in groups for r in [r for r in g.rows if r["em"] < 1.0][:examples]]
    n_wrong = sum(1 for _, r in labelled if r["em"] < 1.0)
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>ragserve evaluation report</title><style>{CSS}</style></head><body>
<h1>ragserve evaluation report</h1>
<div class="dim">{total} answers by {len(groups)} method(s) from {esc(", ".join(sources))}. EM intervals are
Wilson score intervals; F1 intervals a {BOOTSTRAP}-resample percentile bootstrap (95%).</div>
<h2>Quality per method</h2>
<table>{head}{body}</table>
{quality_chart(groups, sums)}
<h2>EM against retrievals per question</h2>
<div class="dim">Each point: the questions a method answered after that many retrievals; its area grows with their
number.</div>
{retrieval_chart(groups)}
<h2>Where the time went</h2>
<div class="dim">Share of each memory-pipeline stage in the method's total time (prepare: query formulation;
relevancy: scoring; retrieval: top-k and passage text; apply: prompting and generation).</div>
{stage_chart(groups, sums)}
<h2>Slowest answers</h2>
<div class="cards">{"".join(answer_card(r, lbl) for lbl, r in slowest)}</div>
<h2>Wrong answers <span class="dim">({n_wrong} in all; up to {examples} per method)</span></h2>
<div class="cards">{"".join(answer_card(r, lbl) for lbl, r in wrong) or "<div>none</div>"}</div>
</body></html>
"""


def write_report(paths: list[str | Path], out: str | Path, examples: int = 6) -> dict:
    """Read the rows, write the page to ``out`` (atomically: a reader never sees half a file); a summary."""
    groups = read_rows(paths)
    page = render(groups, [Path(p).name for p in paths], examples)
    out = Path(out)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(out)
    return {"methods": [g.label for g in groups], "rows": sum(len(g.rows) for g in groups), "bytes": len(page)}
