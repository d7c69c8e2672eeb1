"""Kafka security settings (SASL, TLS) for the clients that do not take librdkafka settings.

confluent-kafka clients take ``Settings.kafka_client_config()`` as is (``security.protocol``,
``sasl.*``, ``ssl.*`` from ``MVLOG_KAFKA``, secrets from ``kafka_secrets``/``MVLOG_KAFKA_PASSWORD``).
Faust (aiokafka) wants credential objects instead: :func:`faust_broker_credentials` builds them from
the same settings, so one configuration secures every client.

librdkafka reports a refused login or TLS handshake only to its log and ``error_cb``; a caller waiting
for metadata sees a generic timeout. :class:`RefusalWatch` keeps that reason so mvlog fails at once with
:class:`KafkaAccessError`, naming it (never a secret).
"""

from __future__ import annotations

import ssl
import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata  # type: ignore[attr-defined]

from mvlog.config import Settings

#: librdkafka errors that retrying cannot cure: the broker refused the credentials or the TLS handshake.
_REFUSALS = frozenset({KafkaError._AUTHENTICATION, KafkaError._SSL})


class KafkaAccessError(RuntimeError):
    """The broker refused mvlog's SASL credentials or TLS handshake; waiting longer will not help."""


class RefusalWatch:
    """``error_cb`` of a librdkafka client that remembers the first authentication or TLS refusal."""

    def __init__(self, bootstrap_servers: str) -> None:
        self.bootstrap_servers = bootstrap_servers
        self.refusal: KafkaError | None = None

    def __call__(self, error: KafkaError) -> None:
        if self.refusal is None and error.code() in _REFUSALS:
            self.refusal = error

    def check(self) -> None:
        """Raise :class:`KafkaAccessError` if the broker refused this client."""
        if self.refusal is not None:
            raise KafkaAccessError(
                f"Kafka at {self.bootstrap_servers} refused the connection: {self.refusal.str()}. Check "
                f"security.protocol, sasl.* and ssl.* in MVLOG_KAFKA and the password (MVLOG_KAFKA_PASSWORD)")


def watched_admin(settings: Settings) -> tuple[AdminClient, RefusalWatch]:
    """An admin client whose refusals :func:`cluster_metadata` reports (instead of a metadata timeout)."""
    watch = RefusalWatch(settings.bootstrap_servers)
    config: dict[str, Any] = {**settings.kafka_client_config(), "error_cb": watch}
    return AdminClient(config), watch


def cluster_metadata(admin: AdminClient, watch: RefusalWatch, topic: str | None = None,
                     timeout: float = 30.0) -> ClusterMetadata:
    """``admin.list_topics`` that raises :class:`KafkaAccessError` as soon as the broker refuses the client."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        try:
            return admin.list_topics(topic, timeout=max(0.1, min(1.0, remaining)))
        except KafkaException:
            admin.poll(0)  # serves error_cb
            watch.check()
            if remaining <= 1.0:
                raise


def faust_broker_credentials(settings: Settings) -> Any | None:
    """``faust.App(broker_credentials=...)`` for the settings' security protocol (None: PLAINTEXT)."""
    from faust.auth import SASLCredentials, SSLCredentials

    config = settings.kafka_client_config()
    protocol = str(config.get("security.protocol", "PLAINTEXT")).upper()
    if protocol == "PLAINTEXT":
        return None
    context: ssl.SSLContext | None = None
    if protocol in ("SSL", "SASL_SSL"):
        context = ssl.create_default_context(cafile=config.get("ssl.ca.location"))
        if config.get("ssl.certificate.location"):
            context.load_cert_chain(config["ssl.certificate.location"], config.get("ssl.key.location"),
                                    config.get("ssl.key.password"))
        if str(config.get("enable.ssl.certificate.verification", "true")).lower() == "false":
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
    if protocol == "SSL":
        return SSLCredentials(context)
    return SASLCredentials(username=config.get("sasl.username"), password=config.get("sasl.password"),
                           mechanism=str(config.get("sasl.mechanism", "PLAIN")), ssl_context=context)
