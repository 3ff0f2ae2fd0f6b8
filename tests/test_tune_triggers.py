"""scripts/tune_triggers.py's choice of a trigger threshold from recorded rows (no model: the rows are what a run
records, both branches of every question)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("tune_triggers", ROOT / "scripts" / "tune_triggers.py")
tt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tt)


def row(value: float, quiet_f1: float, fire_f1: float) -> dict:
    return {"value": value, "fired_at_extreme": True, "retrievals_fire": 2,
            "quiet": {"f1": quiet_f1, "em": quiet_f1}, "fire": {"f1": fire_f1, "em": fire_f1}}


def choice(method: str, rows: list[dict], prior: float) -> dict:
    base = 1 if method == "flare" else 0
    return tt.choose(method, rows, tt.sweep(method, rows, base), prior, base)


def test_the_published_value_stays_when_the_questions_cannot_tell_the_cuts_apart():
    # every branch scores the same: all cuts tie, and 0.8 is kept although a cut (0.62) lies nearer to it than 1.0
    rows = [row(v, 1.0, 1.0) for v in (0.1, 0.3, 0.5, 0.62, 0.9)]
    got = choice("flare", rows, 0.8)
    assert got["threshold"] == 0.8 and got["fired"] == 0.8


def test_a_better_cut_wins_over_the_published_value():
    # retrieving helps only the two questions whose lowest token probability is below 0.2
    rows = [row(0.1, 0.0, 1.0), row(0.15, 0.0, 1.0), row(0.5, 1.0, 0.0), row(0.7, 1.0, 0.0)]
    got = choice("flare", rows, 0.8)
    assert got["f1"] == 100.0 and 0.15 < got["threshold"] < 0.5


def test_dragin_fires_above_its_threshold_and_ties_go_to_the_nearest_cut():
    # firing helps the high-score questions; every cut between 2 and 3 is best, the published 1.4 is not
    rows = [row(1.0, 1.0, 0.0), row(2.0, 1.0, 0.0), row(3.0, 0.0, 1.0), row(4.0, 0.0, 1.0)]
    got = choice("dragin", rows, 1.4)
    assert got["f1"] == 100.0 and got["threshold"] == 2.5
