"""A Redis Cluster of a few masters on loopback: what the tests run mvlog against when it is told its Redis is
a cluster (``MVLOG_REDIS_CLUSTER``).

Each master is a ``redis-server --cluster-enabled yes`` child (the binary the local stack uses,
:func:`~mvlog.infra.local_stack.find_redis_server`) in a folder of its own, with no persistence: the cluster
is a test's, thrown away with it. Its cluster bus listens on a port of its own (``cluster-port``), picked
free like the client port, so no ``port + 10000`` has to be free too. ``redis-cli --cluster create`` then
spreads the 16384 slots over the masters, with no replicas, and :meth:`LocalRedisCluster.start` returns
once every master says ``cluster_state:ok`` (polled against a deadline).
"""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mvlog.infra.child_processes import die_with_parent
from mvlog.infra.local_stack import LOOPBACK, BinaryNotFoundError, StackError, find_redis_server, free_ports

#: How long the masters have to answer and agree on the slots (seconds; they do in well under one here).
START_TIMEOUT_S = 30.0


def find_redis_cli(redis_server: Path) -> Path:
    """``redis-cli``: next to ``redis-server``, else on PATH (Debian's redis-tools ships both)."""
    beside = redis_server.with_name("redis-cli")
    if beside.exists():
        return beside
    found = shutil.which("redis-cli")
    if found is None:
        raise BinaryNotFoundError("redis-cli was not found (next to redis-server or on PATH): it joins the "
                                  "masters of a Redis Cluster. Install redis-tools (Debian) or redis.")
    return Path(found)


def cluster_info(host: str, port: int, timeout: float = 2.0) -> dict[str, str]:
    """``CLUSTER INFO`` of the node at ``host:port`` as a dict ({} when it does not answer)."""
    import redis

    client = redis.Redis(host=host, port=port, socket_timeout=timeout, socket_connect_timeout=timeout)
    command: Callable[..., Any] = client.execute_command
    try:
        info = command("CLUSTER INFO")
    except (redis.RedisError, OSError):
        return {}
    finally:
        client.close()
    if isinstance(info, dict):  # redis-py parses the reply already
        return {str(k): str(v) for k, v in info.items()}
    text = info.decode() if isinstance(info, bytes) else str(info)
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


@dataclass
class LocalRedisCluster:
    """``masters`` cluster-enabled redis-servers under ``data_dir``, joined into one cluster."""

    data_dir: Path
    masters: int = 3
    host: str = LOOPBACK
    ports: list[int] = field(default_factory=list)
    bus_ports: list[int] = field(default_factory=list)
    _processes: list[subprocess.Popen[bytes]] = field(default_factory=list, repr=False)

    @property
    def url(self) -> str:
        """A URL of one master: the client finds the others from it (``CLUSTER SLOTS``)."""
        return f"redis://{self.host}:{self.ports[0]}/0"

    def start(self) -> LocalRedisCluster:
        """Start the masters, assign the slots, and return once the cluster is ``ok``; raises
        :class:`~mvlog.infra.local_stack.StackError` (after stopping what it started) otherwise."""
        server = find_redis_server()
        free = free_ports(2 * self.masters, self.host)
        self.ports, self.bus_ports = free[:self.masters], free[self.masters:]
        try:
            for port, bus_port in zip(self.ports, self.bus_ports, strict=True):
                self._processes.append(self._start_master(server, port, bus_port))
            self._wait(lambda: all(cluster_info(self.host, p, 0.5) for p in self.ports), "the masters to answer")
            created = subprocess.run(
                [str(find_redis_cli(server)), "--cluster", "create",
                 *(f"{self.host}:{p}" for p in self.ports), "--cluster-replicas", "0", "--cluster-yes"],
                capture_output=True, timeout=START_TIMEOUT_S, check=False)
            if created.returncode != 0:
                raise StackError(f"redis-cli --cluster create failed ({created.returncode}): "
                                 f"{created.stdout.decode(errors='replace')[-2000:]}"
                                 f"{created.stderr.decode(errors='replace')[-2000:]}")
            self._wait(self.ready, "cluster_state:ok on every master")
        except BaseException:
            self.stop()
            raise
        return self

    def ready(self) -> bool:
        """Every master says ``cluster_state:ok`` and knows all the masters (the slots are assigned and
        the nodes met: a client may start on any of them)."""
        for port in self.ports:
            info = cluster_info(self.host, port, 0.5)
            if info.get("cluster_state") != "ok" or int(info.get("cluster_known_nodes", 0)) < self.masters:
                return False
        return True

    def stop_master(self, index: int) -> None:
        """SIGKILL master ``index`` (an outage: its slots are unserved until :meth:`restart_master`)."""
        process = self._processes[index]
        process.kill()
        process.wait(10)

    def restart_master(self, index: int) -> None:
        """Start master ``index`` again on its ports, from its ``nodes.conf`` (the same node and slots, no
        data: nothing persists), and return once the cluster is ``ok`` again."""
        self._processes[index] = self._start_master(find_redis_server(), self.ports[index], self.bus_ports[index])
        self._wait(self.ready, "cluster_state:ok after a master's restart")

    def _start_master(self, server: Path, port: int, bus_port: int) -> subprocess.Popen[bytes]:
        folder = self.data_dir / f"node-{port}"
        folder.mkdir(parents=True, exist_ok=True)
        return subprocess.Popen(
            [str(server), "--port", str(port), "--bind", self.host, "--cluster-enabled", "yes",
             "--cluster-port", str(bus_port), "--cluster-config-file", str(folder / "nodes.conf"),
             "--cluster-node-timeout", "5000", "--dir", str(folder), "--save", "", "--appendonly", "no",
             "--daemonize", "no", "--logfile", str(folder / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, preexec_fn=die_with_parent())

    def _wait(self, check: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not check():
            dead = [str(p.args) for p in self._processes if p.poll() is not None]
            if dead:
                raise StackError(f"a redis-server of the cluster exited while waiting for {what}: {dead[0]}")
            if time.monotonic() > deadline:
                raise StackError(f"Redis Cluster under {self.data_dir}: no {what} within {START_TIMEOUT_S:.0f} s")
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop every master (SIGTERM, then SIGKILL after 10 s)."""
        for process in self._processes:
            if process.poll() is None:
                process.terminate()
        for process in self._processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        self._processes.clear()
