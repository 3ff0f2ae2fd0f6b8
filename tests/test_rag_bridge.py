"""The bridge method's passage choice: the top passage, then the candidates it (or the question) names."""
from __future__ import annotations

import pytest

from ragserve.rag.base import MethodError
from ragserve.rag.bridge import BridgeRetrieval, bridge_passages
from ragserve.rag.methods import METHODS
from ragserve.retrieval.contract import Hit


def hit(title: str, text: str = "", score: float = 0.0) -> Hit:
    return Hit(-1, title, score, title, text)


ABBEY = hit("Abbey Road", "Abbey Road is the eleventh studio album by the English rock band The Beatles.", 9)
LET_IT_BE = hit("Let It Be", "Let It Be is the twelfth and final studio album by the band.", 8)
REVOLVER = hit("Revolver (album)", "Revolver is the seventh studio album by the Beatles.", 7)
BEATLES = hit("The Beatles", "The Beatles were an English rock band formed in Liverpool in 1960.", 2)


def titles(hits: list[Hit]) -> list[str]:
    return [h.title for h in hits]


def test_a_passage_the_top_one_names_comes_second():
    q = "The band that recorded the album Abbey Road was formed in which city?"
    assert titles(bridge_passages(q, [ABBEY, LET_IT_BE, REVOLVER, BEATLES], 2)) == ["Abbey Road", "The Beatles"]
    # without a link the retriever's order stands
    unlinked = bridge_passages("In which city was it formed?", [LET_IT_BE, REVOLVER, ABBEY], 3)
    assert titles(unlinked) == ["Let It Be", "Revolver (album)", "Abbey Road"]


def test_question_names_count_and_qualifiers_are_dropped():
    q = "Were Revolver and Let It Be released by the same band?"
    top = hit("Rubber Soul", "Rubber Soul is the sixth studio album by the Beatles.", 10)
    # "Revolver (album)" is named as "Revolver"; linked hits keep the retriever's order among themselves
    assert titles(bridge_passages(q, [top, ABBEY, BEATLES, REVOLVER, LET_IT_BE], 4)) == [
        "Rubber Soul", "The Beatles", "Revolver (album)", "Let It Be"]


def test_only_whole_words_link_and_titles_are_not_repeated():
    top = hit("Ramones", "Ramones were an American punk rock band; Rabbit is not their song.", 5)
    ra = hit("Ra", "Ra is the sun god.", 4)
    again = hit("Ramones", "Another paragraph of the same article.", 3)
    rabbit = hit("Rabbit", "A rabbit is a mammal.", 1)
    assert titles(bridge_passages("Who sang?", [top, ra, again, rabbit], 3)) == ["Ramones", "Rabbit", "Ra"]
    assert bridge_passages("q", [], 3) == []


def test_bridge_is_registered_reads_two_passages_and_needs_depth_of_at_least_k():
    assert METHODS["bridge"] is BridgeRetrieval
    assert BridgeRetrieval(None, None, object()).k == 2  # unless k is given (the eval's -k, a request's options)
    assert BridgeRetrieval(None, None, object(), k=3).k == 3
    with pytest.raises(MethodError, match="needs a retriever"):
        BridgeRetrieval(None, None, None)
    with pytest.raises(MethodError, match="depth"):
        BridgeRetrieval(None, None, object(), k=3, depth=2)
