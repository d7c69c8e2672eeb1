"""I2 for Spark consumers on the driver's path (``local[2]``): the consumer process SIGKILLed at random
points loses no epoch and applies none twice (:mod:`.view_kills`)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from mvlog.config import Settings

from .view_kills import killed_at_random_points

pytestmark = [pytest.mark.integration, pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(1200)]


def test_consumers_killed_at_random_points_lose_nothing_and_apply_nothing_twice(
        make_settings: Callable[..., Settings], redis_client: redis.Redis, report: Callable[[str], None]) -> None:
    killed_at_random_points("driver", make_settings, redis_client, report)
