"""Whether a Kafka broker accepts connections at all: a TCP probe that fails fast.

librdkafka retries an unreachable broker until its timeouts, which says nothing for seconds; commands and
the dashboard ask this first to say "broker unreachable" at once.
"""

from __future__ import annotations

import socket


def unreachable_broker(bootstrap_servers: str, timeout: float) -> str | None:
    """None when any bootstrap address accepts a TCP connection, else why not (fails fast on a closed
    port or an unknown host, where librdkafka would retry until the timeout)."""
    problem = "no address"
    for address in bootstrap_servers.split(","):
        host, _, port = address.strip().rpartition("://")[2].rpartition(":")
        try:
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
                return None
        except ValueError:
            problem = f"{address.strip()!r} is not HOST:PORT"
        except OSError as error:
            problem = error.strerror or str(error)
    return problem
