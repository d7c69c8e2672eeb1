"""Fixtures of the real CDC pipeline: PostgreSQL -> Debezium (Kafka Connect standalone) -> the test broker.

Loaded by ``tests/conftest.py``. The processes are started by :mod:`mvlog.infra.postgres` and
:mod:`mvlog.infra.kafka_connect` (reusable outside the tests); these fixtures only tie them to a test.

``postgres`` (function)
    A :class:`~mvlog.infra.postgres.PostgresServer` with ``wal_level=logical`` on a free loopback port,
    in its own temp folder, stopped and deleted at teardown. Connect with ``psycopg.connect(pg.dsn)``.
``debezium`` (function)
    ``debezium(tables, schemas=...)`` starts a Kafka Connect standalone worker running Debezium's
    PostgreSQL connector (``pgoutput``) on ``postgres``, writing ``<prefix>.cdc.public.<table>`` topics to
    the test broker; returns a :class:`CdcPipeline` (``topic(table)``, ``kill_worker()``,
    ``start_worker()``). The tables must exist in PostgreSQL first (the connector's publication names them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from mvlog.config import Settings
from mvlog.infra.kafka_connect import ConnectWorker, debezium_postgres_connector
from mvlog.infra.local_stack import free_port
from mvlog.infra.postgres import SUPERUSER, PostgresServer


@pytest.fixture
def postgres() -> Iterator[PostgresServer]:
    server = PostgresServer(free_port()).start()
    try:
        yield server
    finally:
        server.stop()


@dataclass
class CdcPipeline:
    """PostgreSQL and the Kafka Connect worker streaming its tables' changes into the test broker."""

    postgres: PostgresServer
    settings: Settings
    folder: Path
    connector: dict[str, str]
    schemas: bool
    flush_ms: int
    workers: list[ConnectWorker] = field(default_factory=list)

    @property
    def topic_prefix(self) -> str:
        return self.connector["topic.prefix"]

    def topic(self, table: str, schema: str = "public") -> str:
        return f"{self.topic_prefix}.{schema}.{table}"

    @property
    def worker(self) -> ConnectWorker:
        return self.workers[-1]

    def start_worker(self) -> ConnectWorker:
        """A worker on the same folder (so the same offsets file): a restart resumes from its last flush."""
        worker = ConnectWorker(self.folder, self.settings.bootstrap_servers, free_port(), self.connector,
                               schemas=self.schemas, flush_ms=self.flush_ms)
        self.workers.append(worker)
        return worker.start()

    def kill_worker(self) -> None:
        self.worker.kill()

    def stop(self) -> None:
        for worker in self.workers:
            worker.stop()


@pytest.fixture
def debezium(postgres: PostgresServer, settings: Settings, tmp_path: Path
             ) -> Iterator[Callable[..., CdcPipeline]]:
    pipelines: list[CdcPipeline] = []

    def start(tables: list[str], *, schemas: bool = False, flush_ms: int = 1000) -> CdcPipeline:
        slot = f"mvlog_{settings.topic_prefix}"  # slot names: lower case, digits, underscores
        connector = debezium_postgres_connector(
            "mvlog-cdc", host="127.0.0.1", port=postgres.port, user=SUPERUSER, database=postgres.database,
            topic_prefix=f"{settings.topic_prefix}.cdc", tables=[f"public.{t}" for t in tables], slot=slot)
        pipeline = CdcPipeline(postgres, settings, tmp_path / "connect", connector, schemas, flush_ms)
        pipelines.append(pipeline)
        pipeline.start_worker()
        return pipeline

    try:
        yield start
    finally:
        for pipeline in pipelines:
            pipeline.stop()
