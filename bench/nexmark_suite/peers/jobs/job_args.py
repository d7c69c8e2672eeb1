"""The command line every peer job takes (stdlib only: it runs in each engine's venv, not mvlog's)."""

from __future__ import annotations

import argparse
import sys
import time

READY = "MVLOG-PEER-READY"


def parse(argv: list[str] | None = None, **extra: str) -> argparse.Namespace:
    """``--query --bootstrap --person --auction --bid --output --workdir --parallelism --group``, plus
    ``extra`` options (name -> help) that the engine needs."""
    parser = argparse.ArgumentParser()
    for name in ("query", "bootstrap", "person", "auction", "bid", "output", "workdir", "group"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--parallelism", type=int, default=2)
    for name, text in extra.items():
        parser.add_argument(f"--{name}", default="", help=text)
    return parser.parse_args(argv)


def ready() -> None:
    """Tell the parent the engine is up and the query is about to start (its catch-up clock starts here)."""
    print(f"{READY} {time.time():.3f}", flush=True)
    sys.stdout.flush()


def topics(args: argparse.Namespace) -> dict[str, str]:
    return {"person": args.person, "auction": args.auction, "bid": args.bid}
