"""Stop sequences: never shown, even when split across streamed pieces."""

from __future__ import annotations

import pytest

from hearthside.core.engine.stops import StopMatcher

pytestmark = pytest.mark.beside


def feed_all(matcher: StopMatcher, pieces: list[str]) -> tuple[str, bool]:
    shown = []
    for piece in pieces:
        text, stopped = matcher.feed(piece)
        shown.append(text)
        if stopped:
            return "".join(shown), True
    return "".join(shown) + matcher.flush(), False


def test_without_stops_text_passes_straight_through() -> None:
    assert StopMatcher([]).feed("abc") == ("abc", False)


def test_stop_inside_one_piece_cuts_the_text() -> None:
    assert feed_all(StopMatcher(["END"]), ["hello END world"]) == ("hello ", True)


def test_stop_split_across_pieces_never_leaks() -> None:
    matcher = StopMatcher(["###"])
    assert matcher.feed("abc#") == ("abc", False)
    assert matcher.feed("#") == ("", False)
    assert matcher.feed("#tail") == ("", True)


def test_held_back_text_is_released_when_it_is_not_a_stop() -> None:
    assert feed_all(StopMatcher(["###"]), ["a#", "b##", "c"]) == ("a#b##c", False)


def test_earliest_of_several_stops_wins() -> None:
    assert feed_all(StopMatcher(["world", "lo w"]), ["hel", "lo world"]) == ("hel", True)


def test_flush_returns_a_partial_stop_at_the_end() -> None:
    matcher = StopMatcher(["STOP"])
    assert matcher.feed("go ST") == ("go ", False)
    assert matcher.flush() == "ST"
