from __future__ import annotations

import threading

import pytest

from providers.capacity import BodyRefused, FieldRefused, Notes, Throttle, TtlCache, duration_s, parse_body, probability


def test_throttle_spaces_request_starts_across_threads() -> None:
    now = [100.0]
    slept: list[float] = []
    lock = threading.Lock()

    def sleep(seconds: float) -> None:
        with lock:
            slept.append(round(seconds, 6))

    throttle = Throttle(0.5, clock=lambda: now[0], sleep=sleep)
    threads = [threading.Thread(target=throttle.wait) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(slept) == [0.5, 1.0, 1.5]  # the first goes at once, each next one a slot later
    now[0] = 200.0
    throttle.wait()
    assert len(slept) == 3  # long after the last slot: no wait


def test_cache_answers_until_the_ttl_and_forgets_the_oldest_first() -> None:
    now = [0.0]
    cache = TtlCache(10.0, max_entries=2, clock=lambda: now[0])
    cache.put("a", 1)
    cache.put("b", 2)
    now[0] = 10.0
    assert (cache.get("a"), cache.get("b")) == (1, 2)
    cache.put("c", 3)
    assert cache.get("a") is None and cache.get("c") == 3
    now[0] = 10.5
    assert cache.get("b") is None  # older than 10 s


@pytest.mark.parametrize(("value", "message"), [
    (float("nan"), "out of range"), (float("inf"), "out of range"), (1.0000001, "out of range"),
    (None, "not a number"), ([0.5], "not a number"), (False, "not a number")])
def test_probability_refuses_what_is_not_a_0_to_1_number(value: object, message: str) -> None:
    with pytest.raises(FieldRefused, match=rf"^scores\.x: {message}"):
        probability(value, "scores.x")


def test_probability_and_duration_accept_the_documented_forms() -> None:
    assert probability(0, "f") == 0.0 and probability(1, "f") == 1.0 and probability(0.25, "f") == 0.25
    assert duration_s("0s", "f") == 0.0 and duration_s("86400.000000001s", "f") == pytest.approx(86400.0)
    for bad in ("1h", "s", "1e3s", " 60s", "60", "-60s", "1." + "0" * 20 + "s"):
        with pytest.raises(FieldRefused, match=r"^f: not a duration"):
            duration_s(bad, "f")


def test_parse_body_refuses_huge_and_non_json_answers() -> None:
    assert parse_body(b'{"a": [1, 2.5]}') == {"a": [1, 2.5]}
    for body, message in ((b"x" * 11, "over 10 bytes"), (b'{"a": Infinity}', "bare Infinity"),
                          (b"\xff\xfe", "not JSON"), (b'{"a": 1', "not JSON")):
        with pytest.raises(BodyRefused, match=message):
            parse_body(body, max_bytes=10 if body.startswith(b"x") else 1000)


def test_notes_are_kept_once_and_bounded() -> None:
    lines: list[str] = []
    notes = Notes(lines)
    for i in range(50):
        notes.add(f"x {i % 30}")
    notes.close("gcp")
    assert lines[:20] == [f"x {i}" for i in range(20)]
    assert lines[20:] == ["gcp: 10 more capacity notes left out"]
