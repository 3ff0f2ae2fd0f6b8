"""Effectiveness measures: hand-computed values, trec_eval's tie and -c rules, and a brute-force cross-check."""
from __future__ import annotations

import itertools
import json
import math
import random

import pytest

from ragserve.cli import main
from ragserve.ireval import EvalError, evaluate, trec_order

QRELS = {"q1": {"a": 3, "b": 2, "c": 0, "d": 1}, "q2": {"e": 1}}
RUN = {"q1": [("x", 10.0), ("a", 9.0), ("c", 8.0), ("b", 7.0), ("z", 6.0)], "q3": [("a", 1.0)]}


def test_hand_computed_values():
    r = evaluate(RUN, QRELS)
    # q1 ranking: x(unjudged) a(3) c(0) b(2) z(unjudged); ideal grades 3, 2, 1.
    dcg = 3 / math.log2(3) + 2 / math.log2(5)  # 1.8928 + 0.8614
    idcg = 3 + 2 / math.log2(3) + 1 / math.log2(4)  # 3 + 1.2619 + 0.5
    assert r.per_query["q1"]["ndcg_cut_10"] == pytest.approx(dcg / idcg, abs=1e-12)
    assert r.per_query["q1"]["ndcg_cut_10"] == pytest.approx(0.578375, abs=1e-6)
    assert r.per_query["q1"]["recall_100"] == pytest.approx(2 / 3)  # a, b of a, b, d
    assert r.per_query["q1"]["recip_rank_10"] == 0.5  # first relevant at rank 2
    # q2 has judgments but no run entries: 0 everywhere, and it counts in the mean (trec_eval -c).
    assert r.per_query["q2"] == {"ndcg_cut_10": 0.0, "recall_100": 0.0, "recip_rank_10": 0.0}
    assert r.mean["ndcg_cut_10"] == pytest.approx(dcg / idcg / 2)
    assert r.mean["recall_100"] == pytest.approx(1 / 3)
    assert r.missing == ["q2"] and r.ignored == ["q3"]


def test_cutoffs():
    hits = [(f"n{i:02d}", 100.0 - i) for i in range(10)] + [("rel", 50.0)]
    r = evaluate({"q": hits}, {"q": {"rel": 2}}, ["ndcg_cut_10", "ndcg_cut.11", "recip_rank_10", "recip_rank",
                                                  "recall_10", "recall_100", "P_10", "P_20"])
    v = r.per_query["q"]
    assert v["ndcg_cut_10"] == 0.0 and v["recip_rank_10"] == 0.0 and v["recall_10"] == 0.0
    assert v["ndcg_cut_11"] == pytest.approx(1 / math.log2(12))  # dcg 2/log2(12), ideal 2
    assert v["recip_rank"] == pytest.approx(1 / 11)
    assert v["recall_100"] == 1.0
    assert v["P_10"] == 0.0 and v["P_20"] == pytest.approx(1 / 20)


def test_ties_follow_trec_eval_and_rank_column_is_ignored():
    # Equal scores: trec_eval puts the larger docid first, whatever order the run lists them in.
    assert trec_order([("a", 1.0), ("b", 1.0), ("c", 2.0)]) == [("c", 2.0), ("b", 1.0), ("a", 1.0)]
    r = evaluate({"q": [("a", 1.0), ("b", 1.0)]}, {"q": {"a": 1}}, ["recip_rank_10"])
    assert r.mean["recip_rank_10"] == 0.5
    # A list not sorted by score is ranked by score.
    r = evaluate({"q": [("b", 1.0), ("a", 2.0)]}, {"q": {"a": 1}}, ["recip_rank_10"])
    assert r.mean["recip_rank_10"] == 1.0


def test_remove_query_drops_self_hits():
    run = {"arg1": [("arg1", 9.0), ("counter1", 5.0)]}
    qrels = {"arg1": {"counter1": 1}}
    assert evaluate(run, qrels, ["recip_rank_10"]).mean["recip_rank_10"] == 0.5
    assert evaluate(run, qrels, ["recip_rank_10"], remove_query=True).mean["recip_rank_10"] == 1.0


def test_query_without_relevant_documents_scores_zero():
    r = evaluate({"q": [("a", 1.0)]}, {"q": {"a": 0}})
    assert r.per_query["q"] == {"ndcg_cut_10": 0.0, "recall_100": 0.0, "recip_rank_10": 0.0}


@pytest.mark.parametrize("bad", ["ndcg", "recall", "map", "ndcg_cut_0", "mrr@10"])
def test_unknown_or_malformed_metric(bad):
    with pytest.raises(EvalError, match="metric"):
        evaluate(RUN, QRELS, [bad])


def brute_force(hits, judged, k):
    """Independent reference: explicit rank positions, ideal = best DCG over every ordering of the judged docs."""
    ranked = sorted(hits, key=lambda h: (-h[1], [-ord(c) for c in h[0]] + [1]))  # docid descending, as strcmp
    def dcg(docs):
        return sum(judged.get(d, 0) / math.log2(pos + 1) for pos, d in enumerate(docs[:k], 1) if judged.get(d, 0) > 0)
    ideal = max(dcg(list(p)) for p in itertools.permutations(judged))
    nd = dcg([d for d, _ in ranked]) / ideal if ideal else 0.0
    rel = {d for d, g in judged.items() if g >= 1}
    first = next((pos for pos, (d, _) in enumerate(ranked[:k], 1) if d in rel), None)
    rec = len(rel & {d for d, _ in ranked[:k]}) / len(rel) if rel else 0.0
    return nd, rec, (1 / first if first else 0.0)


def test_random_runs_match_brute_force():
    rng = random.Random(7)
    docs = [f"d{i}" for i in range(12)]
    for trial in range(200):
        judged = {d: rng.choice([0, 1, 1, 2, 3]) for d in rng.sample(docs, rng.randint(1, 6))}
        hits = [(d, float(rng.randint(0, 4))) for d in rng.sample(docs, rng.randint(0, 12))]  # many ties
        k = rng.choice([1, 3, 5])
        r = evaluate({"q": hits}, {"q": judged}, [f"ndcg_cut_{k}", f"recall_{k}", f"recip_rank_{k}"])
        nd, rec, rr = brute_force(hits, judged, k)
        v = r.per_query["q"]
        assert (v[f"ndcg_cut_{k}"], v[f"recall_{k}"], v[f"recip_rank_{k}"]) == pytest.approx((nd, rec, rr)), trial


def test_eval_run_command(tmp_path, capsys):
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q1 0 a 3\nq1 0 b 2\nq1 0 c 0\nq1 0 d 1\nq2 0 e 1\n")
    run = tmp_path / "run.txt"
    run.write_text("".join(f"q1 Q0 {d} {i} {s} t\n" for i, (d, s) in enumerate(RUN["q1"], 1)) + "q3 Q0 a 1 1 t\n")
    assert main(["eval-run", "--qrels", str(qrels), str(run), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["mean"]["ndcg_cut_10"] == pytest.approx(0.578375 / 2, abs=1e-6)
    assert out["missing"] == ["q2"] and out["num_queries"] == 2
    assert main(["eval-run", "--qrels", str(qrels), str(run), "--metrics", "recip_rank_10", "P_5"]) == 0
    text = capsys.readouterr().out
    assert "recip_rank_10" in text and "0.2500" in text and "P_5" in text
    assert main(["eval-run", "--qrels", str(qrels), str(run), "--metrics", "bogus"]) == 2
    assert "unknown metric 'bogus'" in capsys.readouterr().err
    assert main(["eval-run", "--qrels", str(tmp_path / "none.txt"), str(run)]) == 2
    assert "none.txt: no such file" in capsys.readouterr().err
