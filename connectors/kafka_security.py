"""Kafka security settings (SASL, TLS) for the clients that do not take librdkafka settings.

confluent-kafka clients take ``Settings.kafka_client_config()`` as is (``security.protocol``,
``sasl.*``, ``ssl.*`` from ``MVLOG_KAFKA``, secrets from ``kafka_secrets``/``MVLOG_KAFKA_PASSWORD``).
Faust (aiokafka) wants credential objects instead: :func:`faust_broker_credentials` builds them from
the same settings, so one configuration secures every client.
"""

from __future__ import annotations

import ssl
from typing import Any

from mvlog.config import Settings


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
