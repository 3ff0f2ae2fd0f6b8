"""Answer extraction, SQuAD normalisation, EM/F1/precision/recall, yes/no, supporting-passage recall, and
the eval summary."""
from __future__ import annotations

import pytest

from ragserve.rag.evaluate import format_summary, summarize
from ragserve.rag.metrics import extract_answer, normalize_answer, score_answer, support_recall, to_yes_no


@pytest.mark.parametrize("text,expected", [
    ("Titanic was directed by James Cameron. So the answer is James Cameron.", "James Cameron"),
    ("So the answer is: Phnom Penh", "Phnom Penh"),
    ('Thus... So The Answer Is "the Vltava". Question: next', "the Vltava"),
    ("the answer is 6 March 1927.\nQuestion: who", "6 March 1927"),
    ("First the answer is A. Then, on reflection, the answer is B.", "B"),
    ("It was built in 1889. So the answer is yes", "yes"),
    ("So the answer is Washington, D.C.", "Washington, D.C"),
    ("no marker here", None),
])
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_normalize_answer_squad():
    assert normalize_answer("The  Vltava River!") == "vltava river"
    assert normalize_answer("An apple, a day") == "apple day"
    assert normalize_answer("Theatre") == "theatre"  # "the" only as a whole word


def test_em_f1_precision_recall():
    s = score_answer("the Chief of Protocol", ["Chief of Protocol"])
    assert s == {"em": 1.0, "f1": 1.0, "precision": 1.0, "recall": 1.0}
    s = score_answer("Chief of Protocol of the United States", ["Chief of Protocol"])
    # prediction tokens: chief of protocol of united states (6); gold: chief of protocol (3); overlap 3
    assert s["em"] == 0.0 and s["precision"] == pytest.approx(0.5) and s["recall"] == 1.0
    assert s["f1"] == pytest.approx(2 * 0.5 * 1.0 / 1.5)
    assert score_answer("Paris", ["London"]) == {"em": 0.0, "f1": 0.0, "precision": 0.0, "recall": 0.0}


def test_aliases_take_the_best_match():
    s = score_answer("Wolfgang Mozart", ["Wolfgang Amadeus Mozart", "Mozart"])
    assert s["em"] == 0.0
    # against "Wolfgang Amadeus Mozart": p=1, r=2/3 -> f1 0.8; against "Mozart": p=0.5, r=1 -> f1 0.667
    assert s["f1"] == pytest.approx(0.8) and s["precision"] == 1.0
    assert score_answer("mozart", ["Wolfgang Amadeus Mozart", "Mozart"])["em"] == 1.0


def test_yes_no_rules():
    # HotpotQA: a yes/no answer scores only on an exact match, never by token overlap
    assert score_answer("no", ["no way"])["f1"] == 0.0
    assert score_answer("yes it is", ["yes"])["f1"] == 0.0
    assert score_answer("yes", ["yes"])["f1"] == 1.0
    assert score_answer("Yes, it is.", ["yes"], yes_no=True)["em"] == 1.0
    assert to_yes_no("No.") == "no" and to_yes_no("maybe") == "maybe"
    assert score_answer("maybe", ["no"], yes_no=True)["em"] == 0.0


def test_support_recall():
    gold = ["Shirley Temple", "Kiss and Tell (1945 film)"]
    assert support_recall(["Shirley Temple", "Meet Corliss Archer"], gold) == 0.5
    assert support_recall(["shirley  temple", "Kiss and Tell (1945 film)"], gold) == 1.0
    assert support_recall(["x"], []) is None


def _row(em, f1, sup, ret, tok, times):
    return {"em": em, "f1": f1, "precision": f1, "recall": f1, "support_recall": sup, "retrievals": ret,
            "tokens": tok, "seconds": sum(times.values()), "times": times}


def test_summary_shares_and_means():
    rows = [_row(1.0, 1.0, 0.5, 2, 100, {"prepare": 1.0, "relevancy": 2.0, "retrieval": 1.0, "apply": 6.0}),
            _row(0.0, 0.5, None, 4, 50, {"prepare": 0.0, "relevancy": 0.0, "retrieval": 0.0, "apply": 10.0})]
    s = summarize(rows)
    assert s["questions"] == 2 and s["em"] == 50.0 and s["f1"] == 75.0
    assert s["support_recall"] == 50.0  # averaged over questions that have supports
    assert s["retrievals_per_question"] == 3.0 and s["tokens_per_question"] == 75.0
    assert s["stage_shares"]["apply"] == pytest.approx(0.8)
    assert s["retrieval_share"] == pytest.approx(0.2)
    table = format_summary("flare", s)
    assert "flare" in table and "20.0" in table and "80.0" in table
    assert summarize([]) == {"questions": 0}
