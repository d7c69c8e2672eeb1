"""Kafka security (mutual TLS, SASL SCRAM) against a real secured Apache Kafka, configured through Settings only.

One Apache Kafka broker (KRaft, started by :class:`~mvlog.infra.local_stack.LocalStack` with its own
folder, Redis and free loopback ports) serves this module on four listeners, each advertising itself:

* ``PLAINTEXT``: the stack's health check and the tests' own setup (SCRAM users, through
  ``AdminClient.alter_user_scram_credentials``); mvlog's clients never use it here.
* ``SSL`` with ``ssl.client.auth=required``: mutual TLS served by the broker itself. The certificates come
  from a throwaway CA made with the ``openssl`` CLI and are given to the broker as PEM stores. The
  client's key is encrypted; its passphrase (``ssl.key.password``) is a secret that must never show in
  errors, logs, librdkafka's output or the broker's log.
* ``SASL_PLAINTEXT`` and ``SASL_SSL`` with SCRAM-SHA-512 only; the SCRAM user is created on the broker
  before the tests run. Its password (``MVLOG_KAFKA_PASSWORD``) must never show either.

What is shown:

* over mutual TLS: a table's epochs commit and read back (Settings.kafka / kafka_secrets only); the
  listener answers a Kafka request made with the client certificate and refuses one made without it (raw
  TLS socket: the listener really requires the certificate); a broker certificate from another CA is
  refused at once with "certificate verify failed"; the Faust log-cache worker caches epochs.
* over SCRAM-SHA-512: a table's epochs commit and read back over SASL_PLAINTEXT and SASL_SSL with the
  user created on the broker; a wrong password is refused at once (table writer, its transactional
  producer alone, changelog reader) with the broker's reason and without either password anywhere; the
  SASL listener drops clients without SASL (which the PLAINTEXT one answers); Faust's credentials
  (:func:`faust_broker_credentials`) log aiokafka in with the right password and bring the broker's
  refusal back, not a hang, with a wrong one; the cache worker caches epochs over SASL_SSL, and with a
  wrong password it exits at once without showing it.

Known limit: librdkafka reports a client certificate the broker refuses (TLS 1.3: an alert after the
handshake) as a transport failure, not an SSL one, so ``RefusalWatch`` does not see it and mvlog waits
for its metadata timeout; the raw-socket test shows the broker's side instead.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import shutil
import socket
import ssl
import struct
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    NewTopic,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from pydantic import SecretStr

from mvlog.config import Settings
from mvlog.connectors.kafka.changelog_reader import ChangelogReader
from mvlog.connectors.kafka.changelog_writer import ChangelogWriter
from mvlog.connectors.kafka.kafka_security import KafkaAccessError, faust_broker_credentials
from mvlog.connectors.redis.view_store import ViewStore
from mvlog.infra.kafka_broker import LAPTOP_SETTINGS
from mvlog.infra.local_stack import LocalStack, free_ports
from mvlog.services.tables.writer import Table

from .processes.cache_worker import CacheWorkerProcess

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl CLI to make certificates"),
]

LOOPBACK = "127.0.0.1"
COLUMNS = {"id": "int", "v1": "int"}
KEY_PASSPHRASE = "tls-key-passphrase-7c1e"  # the client key's passphrase: ssl.key.password
USERNAME = "mvlog"
PASSWORD = "scram-password-4b9d"  # the SCRAM user's password: MVLOG_KAFKA_PASSWORD
WRONG_PASSWORD = "scram-wrong-password-91fa"  # what the refused logins present
SECRETS = (KEY_PASSPHRASE, PASSWORD, WRONG_PASSWORD)
REFUSAL_BOUND_S = 10.0  # a refusal must come well before ensure_topic's 30 s metadata timeout
SASL_PROTOCOLS = ("SASL_PLAINTEXT", "SASL_SSL")
#: The broker's reason for a wrong SCRAM password, as librdkafka and aiokafka report it.
SCRAM_REFUSAL = ("Authentication failed during authentication due to invalid credentials "
                 "with SASL mechanism SCRAM-SHA-512")


# ------------------------------------------------------------------------------------- certificates


@dataclass(frozen=True)
class Certificates:
    ca: Path
    server_keystore: Path  # the server's key (PKCS#8) and certificate: the broker's PEM key store
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
    keystore = folder / "server-keystore.pem"
    keystore.write_text((folder / "server.key").read_text() + (folder / "server.pem").read_text())
    return Certificates(folder / "ca.pem", keystore, folder / "client.pem", folder / "client.key",
                        folder / "other-ca.pem")


# ---------------------------------------------------------------------------------------- the broker


@dataclass(frozen=True)
class SecuredKafka:
    """The module's stack: a secured Apache Kafka (listener name -> port) and its own Redis."""

    stack: LocalStack
    ports: dict[str, int]
    certificates: Certificates

    def address(self, listener: str) -> str:
        return f"{LOOPBACK}:{self.ports[listener]}"

    @property
    def broker_log(self) -> Path:
        return self.stack.log_dir / "kafka.log"

    def admin(self) -> AdminClient:
        """An admin client on the PLAINTEXT listener, for the tests' own setup."""
        config: dict[str, Any] = {"bootstrap.servers": self.address("PLAINTEXT")}
        return AdminClient(config)


def _broker_settings(ports: dict[str, int], controller_port: int, certificates: Certificates) -> dict[str, str]:
    """PLAINTEXT (kept for the stack's health check), SSL requiring client certificates, SASL_PLAINTEXT and
    SASL_SSL with SCRAM-SHA-512, over LocalStack's own broker configuration."""
    scram_login = "org.apache.kafka.common.security.scram.ScramLoginModule required;"
    listeners = [f"{name}://{LOOPBACK}:{port}" for name, port in ports.items()]
    return {
        "listeners": ",".join([*listeners, f"CONTROLLER://{LOOPBACK}:{controller_port}"]),
        "advertised.listeners": ",".join(listeners),
        "listener.security.protocol.map": ",".join([*(f"{name}:{name}" for name in ports), "CONTROLLER:PLAINTEXT"]),
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(certificates.server_keystore),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(certificates.ca),
        "listener.name.ssl.ssl.client.auth": "required",
        "sasl.enabled.mechanisms": "SCRAM-SHA-512",
        "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": scram_login,
        "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config": scram_login,
    }


def _until(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def _create_scram_user(kafka: SecuredKafka) -> None:
    """The SCRAM-SHA-512 user, created through the PLAINTEXT listener; returns once a login succeeds."""
    upsert = UserScramCredentialUpsertion(USERNAME, ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192),
                                          PASSWORD.encode())
    admin = kafka.admin()  # held: the futures fail when their client is destroyed
    for future in admin.alter_user_scram_credentials([upsert]).values():
        future.result(timeout=30)

    def logs_in() -> bool:  # the broker applies the new credential from the metadata log a moment later
        config: dict[str, Any] = {"bootstrap.servers": kafka.address("SASL_PLAINTEXT"),
                                  "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                                  "sasl.username": USERNAME, "sasl.password": PASSWORD,
                                  "logger": logging.getLogger("quiet")}
        try:
            return bool(AdminClient(config).list_topics(timeout=2.0).brokers)
        except KafkaException:
            return False

    _until(logs_in, 30, f"the SCRAM user {USERNAME} to log in")


def _transaction_partition(transactional_id: str, partitions: int) -> int:
    """Kafka's ``Utils.abs(transactionalId.hashCode) % partitions`` (ASCII ids: one UTF-16 unit a char)."""
    value = 0
    for char in transactional_id:
        value = (31 * value + ord(char)) & 0xFFFFFFFF
    signed = value - (1 << 32) if value >= 1 << 31 else value
    return (0 if signed == -(1 << 31) else abs(signed)) % partitions


def _warm_up_transactions(kafka: SecuredKafka) -> None:
    """Have every partition of ``__transaction_state`` loaded before the tests run.

    A fresh broker creates that topic at the first transactional producer and answers
    COORDINATOR_LOAD_IN_PROGRESS while it loads a partition; ``ChangelogWriter._init_transactions`` retries
    only librdkafka's ``_TIMED_OUT``, so a writer that is first on a fresh broker can fail on that
    retriable error (reported with this rewrite). librdkafka's own ``init_transactions`` retries it: one
    transactional id per partition (Kafka's ``abs(hashCode) % partitions``) waits for them all.
    """
    partitions = int(LAPTOP_SETTINGS["transaction.state.log.num.partitions"])
    ids: dict[int, str] = {}
    candidate = 0
    while len(ids) < partitions:
        transactional_id = f"mvlog-test-warm-up-{candidate}"
        ids.setdefault(_transaction_partition(transactional_id, partitions), transactional_id)
        candidate += 1
    for transactional_id in ids.values():
        config: dict[str, Any] = {"bootstrap.servers": kafka.address("PLAINTEXT"),
                                  "transactional.id": transactional_id, "logger": logging.getLogger("quiet")}
        producer = Producer(config)
        producer.init_transactions(60.0)
        producer.flush(1.0)


@pytest.fixture(scope="module")
def secured_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafka]:
    certificates = _make_certificates(tmp_path_factory.mktemp("certs"))
    kafka_port, controller_port, redis_port, *others = free_ports(6)
    ports = dict(zip(("PLAINTEXT", "SSL", *SASL_PROTOCOLS), (kafka_port, *others), strict=True))
    stack = LocalStack(
        data_dir=tmp_path_factory.mktemp("secured-stack"),
        kafka_port=kafka_port,
        controller_port=controller_port,
        redis_port=redis_port,
        broker_settings=_broker_settings(ports, controller_port, certificates),
        die_with_parent=True,  # a killed pytest leaves no broker behind
    )
    stack.start()
    try:
        kafka = SecuredKafka(stack, ports, certificates)
        _create_scram_user(kafka)
        _warm_up_transactions(kafka)
        yield kafka
    finally:
        gc.collect()  # release Kafka clients nobody holds while the broker still answers them
        stack.stop()


@pytest.fixture
def secured_redis(secured_kafka: SecuredKafka) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(secured_kafka.stack.redis_url)
    try:
        yield client
    finally:
        client.close()


@pytest.fixture
def make_secured_settings(secured_kafka: SecuredKafka, tmp_path: Path) -> Callable[..., Settings]:
    """``make(listener, **overrides)``: Settings on one of the broker's listeners, on the module's Redis, with
    a prefix of this test's own."""
    prefix = f"t{uuid.uuid4().hex[:8]}"

    def make(listener: str, **overrides: Any) -> Settings:
        values: dict[str, Any] = {"bootstrap_servers": secured_kafka.address(listener), "topic_prefix": prefix,
                                  "barrier_interval_ms": 200, "partitions": 3, "stack_dir": tmp_path / "mvlog"}
        return secured_kafka.stack.settings(**{**values, **overrides})

    return make


def _tls_settings(make: Callable[..., Settings], certificates: Certificates, **kafka: str) -> Settings:
    """Mutual TLS from settings alone, as MVLOG_KAFKA would give them (the key passphrase included)."""
    return make("SSL", kafka={
        "security.protocol": "SSL",
        "ssl.ca.location": str(certificates.ca),
        "ssl.certificate.location": str(certificates.client_cert),
        "ssl.key.location": str(certificates.client_key),
        "ssl.key.password": KEY_PASSPHRASE,
        **kafka,
    })


def _sasl_settings(make: Callable[..., Settings], protocol: str, certificates: Certificates,
                   password: str = PASSWORD) -> Settings:
    tls = {"ssl.ca.location": str(certificates.ca)} if protocol == "SASL_SSL" else {}
    return make(protocol, kafka_password=SecretStr(password), kafka={
        "security.protocol": protocol, "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": USERNAME, **tls})


def _assert_no_secret(**texts: str) -> None:
    for where, text in texts.items():
        for secret in SECRETS:
            assert secret not in text, f"{secret!r} shows in {where}"


def _commit_and_read_back(settings: Settings, client: redis.Redis) -> None:
    """The table writer commits two epochs and the changelog reader reads them back, row for row."""
    with Table.create(settings, "t1", COLUMNS, ["id"], client=client, auto_commit=False) as table:
        table.upsert([{"id": i, "v1": i} for i in range(10)])
        first = table.flush()
        table.upsert([{"id": 3, "v1": 33}])
        table.delete([4])
        second = table.flush()
    assert second > first
    store = ViewStore(client, settings.topic_prefix)
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


# ---------------------------------------------------------------------------------------- mutual TLS


def test_table_epochs_commit_and_read_back_over_mutual_tls(
        secured_kafka: SecuredKafka, make_secured_settings: Callable[..., Settings], secured_redis: redis.Redis,
        caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    """The table writer commits epochs and the changelog reader reads them back, every Kafka connection on
    the SSL listener (which requires a client certificate), and the key passphrase never shows."""
    caplog.set_level(logging.DEBUG)
    settings = _tls_settings(make_secured_settings, secured_kafka.certificates)
    assert "ssl.key.password" not in settings.kafka and "ssl.key.password" in settings.kafka_secrets
    assert KEY_PASSPHRASE not in repr(settings) and KEY_PASSPHRASE not in settings.model_dump_json()
    _commit_and_read_back(settings, secured_redis)
    _assert_no_secret(caplog=caplog.text, output="".join(capfd.readouterr()),
                      broker_log=secured_kafka.broker_log.read_text())


def _api_versions(certificates: Certificates, port: int, *, client_certificate: bool) -> bytes:
    """One ApiVersions request (v0) over TLS to ``port``, with or without the client certificate; the reply."""
    context = ssl.create_default_context(cafile=str(certificates.ca))
    if client_certificate:
        context.load_cert_chain(certificates.client_cert, certificates.client_key, KEY_PASSPHRASE)
    client_id = b"mvlog-test"
    request = struct.pack(">hhih", 18, 0, 7, len(client_id)) + client_id  # ApiVersions v0, correlation id 7
    with socket.create_connection((LOOPBACK, port), timeout=REFUSAL_BOUND_S) as raw, \
            context.wrap_socket(raw, server_hostname=LOOPBACK) as tls:
        tls.sendall(struct.pack(">i", len(request)) + request)
        size = struct.unpack(">i", _read_exactly(tls, 4))[0]
        return _read_exactly(tls, size)


def _read_exactly(sock: ssl.SSLSocket, count: int) -> bytes:
    data = b""
    while len(data) < count:
        chunk = sock.recv(count - len(data))
        if not chunk:
            raise ConnectionError(f"closed after {len(data)} of {count} bytes")
        data += chunk
    return data


def test_the_ssl_listener_requires_a_client_certificate(secured_kafka: SecuredKafka) -> None:
    """The SSL listener really is mutual TLS, so what succeeds over it used the client's certificate: a
    Kafka request with the certificate is answered, the same request without one is refused by the broker
    (TLS 1.3: with an alert right after the handshake)."""
    port = secured_kafka.ports["SSL"]
    reply = _api_versions(secured_kafka.certificates, port, client_certificate=True)
    correlation_id, error_code = struct.unpack(">ih", reply[:6])
    assert (correlation_id, error_code) == (7, 0)
    with pytest.raises(ssl.SSLError, match=r"ALERT_(BAD_CERTIFICATE|CERTIFICATE_REQUIRED)"):
        _api_versions(secured_kafka.certificates, port, client_certificate=False)


def test_an_untrusted_broker_certificate_is_refused_at_once(
        secured_kafka: SecuredKafka, make_secured_settings: Callable[..., Settings],
        secured_redis: redis.Redis) -> None:
    """A broker whose certificate the configured CA did not sign: a clear error in seconds, not a timeout."""
    certificates = secured_kafka.certificates
    settings = _tls_settings(make_secured_settings, certificates, **{"ssl.ca.location": str(certificates.other_ca)})
    started = time.monotonic()
    with pytest.raises(KafkaAccessError, match="certificate verify failed") as refused:
        Table.create(settings, "t1", COLUMNS, ["id"], client=secured_redis)
    assert time.monotonic() - started < REFUSAL_BOUND_S
    _assert_no_secret(error=str(refused.value))


@pytest.mark.parametrize("listener", ["SSL", "SASL_SSL"])
def test_the_faust_cache_worker_connects_over_mutual_tls_and_scram(
        listener: str, secured_kafka: SecuredKafka, make_secured_settings: Callable[..., Settings],
        secured_redis: redis.Redis) -> None:
    """The Faust log-cache worker (aiokafka, credentials from faust_broker_credentials) joins its group
    on the SSL listener (client certificate) or the SASL_SSL one (SCRAM login), caches epochs, and its
    log never shows the key passphrase or the password."""
    certificates = secured_kafka.certificates
    settings = (_tls_settings(make_secured_settings, certificates) if listener == "SSL"
                else _sasl_settings(make_secured_settings, listener, certificates))
    with Table.create(settings, "t1", COLUMNS, ["id"], client=secured_redis) as table:
        table.upsert([{"id": i, "v1": i} for i in range(20)])
        table.flush()
        worker = CacheWorkerProcess(settings, "t1")
        try:
            worker.wait_ready("t1", settings.partitions)
            _until(lambda: worker.upstream("t1")["epochs_cached"] >= 1, 30, "the worker to cache an epoch")
        finally:
            worker.stop()
    worker_log = worker.log_path.read_text()
    assert "t1" in worker_log  # the worker logged its run: its log is worth checking
    _assert_no_secret(worker_log=worker_log, broker_log=secured_kafka.broker_log.read_text())


# ----------------------------------------------------------------------------------------- SASL SCRAM


@pytest.mark.parametrize("protocol", SASL_PROTOCOLS)
def test_table_epochs_commit_and_read_back_with_a_scram_login(
        protocol: str, secured_kafka: SecuredKafka, make_secured_settings: Callable[..., Settings],
        secured_redis: redis.Redis, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    """The SCRAM user created on the broker logs in: the table writer commits epochs and the reader reads
    them back over the SASL listener, and the password never shows."""
    caplog.set_level(logging.DEBUG)
    settings = _sasl_settings(make_secured_settings, protocol, secured_kafka.certificates)
    assert settings.kafka_client_config()["sasl.password"] == PASSWORD and PASSWORD not in repr(settings)
    _commit_and_read_back(settings, secured_redis)
    _assert_no_secret(caplog=caplog.text, output="".join(capfd.readouterr()),
                      broker_log=secured_kafka.broker_log.read_text())


@pytest.mark.parametrize("protocol", SASL_PROTOCOLS)
def test_a_refused_scram_login_fails_at_once_and_never_shows_the_password(
        protocol: str, secured_kafka: SecuredKafka, make_secured_settings: Callable[..., Settings],
        secured_redis: redis.Redis, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]) -> None:
    """A wrong password: the table writer (at topic creation, and its transactional producer alone, as
    ``Table.open`` builds it) and the changelog reader fail within seconds with the broker's reason, and
    neither password shows anywhere."""
    caplog.set_level(logging.DEBUG)
    settings = _sasl_settings(make_secured_settings, protocol, secured_kafka.certificates, WRONG_PASSWORD)
    started = time.monotonic()
    with pytest.raises(KafkaAccessError) as refused:
        Table.create(settings, "t1", COLUMNS, ["id"], client=secured_redis)
    assert time.monotonic() - started < REFUSAL_BOUND_S
    message = str(refused.value)
    assert f"{protocol.lower()}://" in message and SCRAM_REFUSAL in message, message
    started = time.monotonic()
    with pytest.raises(KafkaAccessError, match=SCRAM_REFUSAL) as writer_refused:
        ChangelogWriter(settings, "t1", ("id",), settings.partitions)
    assert time.monotonic() - started < REFUSAL_BOUND_S
    started = time.monotonic()
    with ChangelogReader(settings, "t1", ("id",), settings.partitions) as reader, \
            pytest.raises(KafkaAccessError, match=SCRAM_REFUSAL) as reader_refused:
        list(reader.epochs(idle_timeout=3 * REFUSAL_BOUND_S))  # idling out is not the refusal
    assert time.monotonic() - started < REFUSAL_BOUND_S
    output = "".join(capfd.readouterr())
    # librdkafka's own log goes to the mvlog.kafka logger (mvlog.client_log): it is checked too.
    assert "SASL authentication error" in caplog.text, caplog.text
    _assert_no_secret(error=message, writer_error=str(writer_refused.value),
                      reader_error=str(reader_refused.value), caplog=caplog.text, output=output,
                      broker_log=secured_kafka.broker_log.read_text())


def test_the_sasl_listener_drops_clients_without_sasl(secured_kafka: SecuredKafka) -> None:
    """The refusals above are the broker's doing: a client without SASL gets no metadata from the SASL
    listener, while the same client gets it from the PLAINTEXT one."""
    def admin(listener: str) -> AdminClient:
        config: dict[str, Any] = {"bootstrap.servers": secured_kafka.address(listener),
                                  "logger": logging.getLogger("quiet")}
        return AdminClient(config)

    assert admin("PLAINTEXT").list_topics(timeout=10.0).brokers
    with pytest.raises(KafkaException, match=r"transport failure|timed out|Timed out"):
        admin("SASL_PLAINTEXT").list_topics(timeout=3.0)


@pytest.mark.parametrize("protocol", SASL_PROTOCOLS)
def test_faust_credentials_carry_scram_to_the_broker_and_its_refusal_back(
        protocol: str, secured_kafka: SecuredKafka, make_secured_settings: Callable[..., Settings],
        caplog: pytest.LogCaptureFixture) -> None:
    """aiokafka with faust_broker_credentials (SCRAM-SHA-512): with the right password it logs in and sees
    the topics; with a wrong one the broker's refusal comes back as an error within seconds, not a hang,
    and no password is logged."""
    from aiokafka import AIOKafkaConsumer
    from aiokafka.errors import KafkaConnectionError
    from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

    caplog.set_level(logging.DEBUG)
    certificates = secured_kafka.certificates
    settings = _sasl_settings(make_secured_settings, protocol, certificates)
    topic = f"{settings.topic_prefix}.faust-login"
    admin = secured_kafka.admin()
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(timeout=30)

    async def topics(password: str) -> set[str]:
        settings = _sasl_settings(make_secured_settings, protocol, certificates, password)
        auth = credentials_to_aiokafka_auth(faust_broker_credentials(settings))
        assert auth["security_protocol"] == protocol and auth["sasl_mechanism"] == "SCRAM-SHA-512"
        consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers, request_timeout_ms=5000, **auth)
        try:
            await consumer.start()
            found: set[str] = await consumer.topics()
            return found
        finally:
            await consumer.stop()

    assert topic in asyncio.run(asyncio.wait_for(topics(PASSWORD), REFUSAL_BOUND_S))
    login_records = len(caplog.records)
    started = time.monotonic()
    with pytest.raises(KafkaConnectionError) as refused:  # not TimeoutError: a hang would be that
        asyncio.run(asyncio.wait_for(topics(WRONG_PASSWORD), REFUSAL_BOUND_S))
    assert time.monotonic() - started < REFUSAL_BOUND_S
    # aiokafka raises "Unable to bootstrap"; the broker's reason is what it logs for that bootstrap server.
    errors = [record.getMessage() for record in caplog.records[login_records:]
              if record.name.startswith("aiokafka") and record.levelno >= logging.ERROR]
    assert any("SaslAuthenticationFailed" in error and SCRAM_REFUSAL in error for error in errors), errors
    _assert_no_secret(error=repr(refused.value), caplog=caplog.text)


def test_the_cache_worker_stops_at_once_on_a_refused_scram_login(
        secured_kafka: SecuredKafka, make_secured_settings: Callable[..., Settings]) -> None:
    """A cache worker with a wrong password exits within seconds, naming the broker, and its log never
    holds the password; it says that the login was refused, not that the broker may be down."""
    settings = _sasl_settings(make_secured_settings, "SASL_SSL", secured_kafka.certificates, WRONG_PASSWORD)
    started = time.monotonic()
    worker = CacheWorkerProcess(settings, "t1")
    try:
        code = worker.process.wait(3 * REFUSAL_BOUND_S)  # a Python start, imports included
    finally:
        worker.stop()
    assert time.monotonic() - started < 3 * REFUSAL_BOUND_S
    worker_log = worker.log_path.read_text()
    assert code != 0 and settings.bootstrap_servers in worker_log, worker_log
    _assert_no_secret(worker_log=worker_log)
    assert SCRAM_REFUSAL in worker_log and "refused the connection" in worker_log, worker_log
