"""Accept header parsing and q-value lookup (RFC 9110 §12.5.1), as the invoke route uses them."""
from __future__ import annotations

import pytest

from frontend.negotiation import MediaRange, parse_accept, quality

SSE = "text/event-stream"
JSON = "application/json"


@pytest.mark.parametrize("header", [None, ""])
def test_no_accept_header_accepts_anything(header: str | None) -> None:
    assert parse_accept(header) == [MediaRange("*", "*", 1.0)]
    assert quality(parse_accept(header), SSE) == 1.0


def test_ranges_parameters_and_q_values_are_parsed_case_insensitively() -> None:
    ranges = parse_accept("Text/Event-Stream;charset=utf-8; Q=0.8 , application/json;q=0.2,*/*;q=0")
    assert ranges == [MediaRange("text", "event-stream", 0.8), MediaRange("application", "json", 0.2),
                      MediaRange("*", "*", 0.0)]


@pytest.mark.parametrize(("raw", "q"), [("2", 1.0), ("-1", 0.0), ("0.5", 0.5), ("x", 0.0), ("", 0.0)])
def test_q_is_clamped_to_0_1_and_a_bad_q_means_refused(raw: str, q: float) -> None:
    assert parse_accept(f"text/plain;q={raw}") == [MediaRange("text", "plain", q)]


def test_entries_that_are_not_media_ranges_are_skipped() -> None:
    assert parse_accept("garbage, ,text/html") == [MediaRange("text", "html", 1.0)]


def test_the_most_specific_range_wins_even_with_a_lower_q() -> None:
    ranges = parse_accept("*/*;q=1, text/*;q=0.9, text/event-stream;q=0")
    assert quality(ranges, SSE) == 0.0            # refused by name, whatever the wildcards say
    assert quality(ranges, "text/plain") == 0.9   # text/* beats */*
    assert quality(ranges, JSON) == 1.0           # only */* matches


def test_among_equally_specific_ranges_the_highest_q_counts() -> None:
    assert quality(parse_accept("text/event-stream;q=0.1, text/event-stream;q=0.7"), SSE) == 0.7


def test_without_wildcards_only_the_named_type_counts() -> None:
    ranges = parse_accept("*/*, text/*")
    assert quality(ranges, SSE, wildcards=False) == 0.0
    assert quality(parse_accept(SSE), SSE, wildcards=False) == 1.0


def test_unmentioned_tells_not_listed_from_refused() -> None:
    assert quality(parse_accept("text/html"), JSON, unmentioned=-1.0) == -1.0
    assert quality(parse_accept("application/json;q=0"), JSON, unmentioned=-1.0) == 0.0
