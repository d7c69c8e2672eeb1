"""What ``mvlog status --watch`` says about Redis and the broker being away (``_Outages``, pure)."""

from __future__ import annotations

from mvlog.config import Settings
from mvlog.services.commands.status import _Outages


def test_an_outage_is_timed_from_its_first_failure_and_forgotten_once_redis_answers() -> None:
    settings = Settings(redis_url="redis://:secret@127.0.0.1:16379/0", bootstrap_servers="127.0.0.1:19092")
    outages = _Outages()
    assert outages.lines(settings, 0.0) == [] and outages.state() == (False, None)
    outages.redis_down(10.0, ConnectionError("refused"))
    outages.redis_down(12.0, ConnectionError("refused again"))
    (line,) = outages.lines(settings, 14.5)
    assert line.startswith("waiting for Redis at redis://127.0.0.1:16379/0: unreachable for 4.5s (refused again)")
    assert "secret" not in line
    assert outages.to_json(settings, 14.5)["redis"] == {"waiting_for": "redis://127.0.0.1:16379/0", "down_s": 4.5,
                                                        "error": "refused again"}
    outages.broker_problem = "connection refused"
    assert outages.state() == (True, "connection refused") and len(outages.lines(settings, 15.0)) == 2
    outages.redis_back()
    assert outages.to_json(settings, 16.0) == {
        "redis": None, "broker": {"unreachable": "127.0.0.1:19092", "error": "connection refused"}}
