"""The key-presence filter of a table writer (mvlog.key_presence): never "absent" for a key it was given,
"absent" for nearly every other key, and harmless once saturated."""

from __future__ import annotations

import pytest

from mvlog.key_presence import KeyPresence


def _keys(start: int, count: int) -> list[bytes]:
    return [b"\x02" + i.to_bytes(8, "big") for i in range(start, start + count)]


def _saturated(presence: KeyPresence) -> bool:
    return presence.saturated


def test_every_key_added_reads_maybe_present_and_most_others_absent() -> None:
    presence = KeyPresence(words_log2=12)  # 262,144 bits for 10,000 keys: 26 bits a key
    added = _keys(0, 10_000)
    presence.add(added[:5_000])
    presence.add(added[5_000:])
    assert all(presence.maybe_present(added))  # no false "absent", ever: the writer's exactness rests on it
    others = presence.maybe_present(_keys(1_000_000, 10_000))
    assert sum(others) < 300  # false "maybe": a before-image read for nothing, at most a few percent


def test_an_empty_filter_says_absent_and_an_empty_question_has_no_answer() -> None:
    presence = KeyPresence(words_log2=4)
    assert presence.maybe_present(_keys(0, 100)) == [False] * 100
    assert presence.maybe_present([]) == []
    presence.add([])
    assert presence.inserted == 0


def test_a_saturated_filter_says_maybe_for_every_key() -> None:
    presence = KeyPresence(words_log2=1)  # 128 bits: saturated past 64 insertions
    presence.add(_keys(0, 64))
    assert not _saturated(presence)
    presence.add(_keys(64, 1))
    assert _saturated(presence)
    assert presence.maybe_present(_keys(10_000, 50)) == [True] * 50
    presence.add(_keys(0, 10))  # costs nothing any more
    assert presence.maybe_present(_keys(0, 3)) == [True] * 3


def test_the_size_is_bounded() -> None:
    with pytest.raises(ValueError, match="words_log2"):
        KeyPresence(words_log2=21)
