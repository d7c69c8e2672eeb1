"""Runs Spark consumers of views in their own process, so a test can SIGKILL them at random points.

Usage: python -m tests.integration.processes.view_runner SETTINGS_JSON VIEW [VIEW ...]
Prints ``ready`` once the streaming queries run, then ``mce <view> <epoch>`` as epochs commit.
"""

from __future__ import annotations

import sys
import time

from mvlog.config import Settings
from mvlog.services.view_consumer import ViewConsumer


def main() -> None:
    settings = Settings.model_validate_json(sys.argv[1])
    consumers: list[ViewConsumer] = []
    for view in sys.argv[2:]:
        spark = consumers[0].spark if consumers else None
        consumers.append(ViewConsumer(settings, view, spark=spark, max_epochs_per_trigger=20,
                                      trigger_interval="100 milliseconds"))
    for consumer in consumers:
        consumer.start()
    print("ready", flush=True)
    reported = {c.entry.name: c.mce for c in consumers}
    while True:
        for consumer in consumers:
            if consumer.mce != reported[consumer.entry.name]:
                reported[consumer.entry.name] = consumer.mce
                print(f"mce {consumer.entry.name} {consumer.mce}", flush=True)
        time.sleep(0.05)


if __name__ == "__main__":
    main()
