"""Safe defaults: loopback binding, secrets that never show, Kafka security reaching every client, and the
token that state-changing HTTP endpoints require."""

from __future__ import annotations

import ast
import asyncio
import logging
import os
from pathlib import Path

import pytest
from pydantic import SecretStr

from mvlog.config import Settings, load_settings
from mvlog.connectors.kafka.kafka_security import faust_broker_credentials
from mvlog.services.http_auth import authorize, token_middleware

REPO = Path(__file__).resolve().parents[2]
SECRETS = ("hunter2", "jaas-secret", "redis-pass", "tok-123", "keypass")


def secret_settings() -> Settings:
    return Settings(kafka={"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "svc",
                           "sasl.jaas.config": "jaas-secret", "ssl.key.password": "keypass"},
                    kafka_password=SecretStr("hunter2"), redis_url="redis://app:redis-pass@db:6379/0",
                    http_token=SecretStr("tok-123"))


def test_servers_bind_loopback_by_default() -> None:
    assert Settings().bind_host == "127.0.0.1"


def test_secrets_never_show_in_repr_str_json_or_logs(caplog: pytest.LogCaptureFixture) -> None:
    settings = secret_settings()
    with caplog.at_level(logging.INFO):
        logging.getLogger("mvlog.test").info("settings: %s / %r", settings, settings)
    shown = [repr(settings), str(settings), settings.model_dump_json(), str(settings.model_dump()), caplog.text]
    for text in shown:
        for secret in SECRETS:
            assert secret not in text, (secret, text)
    assert "redis://app:***@db:6379/0" in repr(settings)
    assert settings.kafka == {"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "svc"}


def test_kafka_security_settings_reach_the_client_config_and_executors() -> None:
    settings = secret_settings()
    config = settings.kafka_client_config()
    assert config["security.protocol"] == "SASL_SSL" and config["sasl.username"] == "svc"
    assert config["sasl.password"] == "hunter2" and config["sasl.jaas.config"] == "jaas-secret"
    assert config["ssl.key.password"] == "keypass"
    # Spark executors get the settings as JSON (PartitionRange.settings_json): secrets must survive the trip.
    executor = Settings.model_validate_json(settings.to_executor_json())
    assert executor.kafka_client_config() == config and executor.redis_url == settings.redis_url


def test_environment_settings_keep_their_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MVLOG_KAFKA", '{"security.protocol": "SASL_PLAINTEXT", "sasl.password": "hunter2"}')
    monkeypatch.setenv("MVLOG_HTTP_TOKEN", "tok-123")
    settings = load_settings(Path("/nonexistent/mvlog.toml"))
    assert settings.kafka_client_config()["sasl.password"] == "hunter2"
    assert settings.http_token is not None and settings.http_token.get_secret_value() == "tok-123"
    assert "hunter2" not in repr(settings)


def _kafka_client_calls() -> list[tuple[str, int, str]]:
    """(file, line, source of the enclosing function) of every Producer/Consumer/AdminClient built by mvlog."""
    found = []
    for folder in ("core", "connectors", "services"):
        for path in (REPO / folder).rglob("*.py"):
            source = path.read_text()
            tree = ast.parse(source)
            for function in ast.walk(tree):
                if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                    continue
                for node in ast.walk(function):
                    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                            and node.func.id in {"Producer", "Consumer", "AdminClient"}):
                        found.append((str(path.relative_to(REPO)), node.lineno,
                                      ast.get_source_segment(source, function) or ""))
    return found


def test_every_kafka_client_is_configured_from_the_settings() -> None:
    """Security settings pass to every producer, consumer and admin client because each is built from
    ``Settings.kafka_client_config()`` (the Spark data source's executors build theirs from the same)."""
    calls = _kafka_client_calls()
    assert len(calls) >= 6
    for path, line, function in calls:
        assert "kafka_client_config()" in function, f"{path}:{line} builds a Kafka client without the settings"


def test_faust_gets_the_same_credentials() -> None:
    settings = Settings(kafka={"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
                               "sasl.username": "svc"}, kafka_password=SecretStr("hunter2"))
    credentials = faust_broker_credentials(settings)
    assert credentials is not None and credentials.username == "svc" and credentials.password == "hunter2"
    assert "hunter2" not in repr(credentials)
    assert faust_broker_credentials(Settings()) is None


def test_token_check() -> None:
    open_server, guarded = Settings(), Settings(http_token=SecretStr("tok-123"))
    assert authorize(open_server, "GET", None).allowed
    refused = authorize(open_server, "POST", "Bearer tok-123")
    assert not refused.allowed and refused.status == 403 and "MVLOG_HTTP_TOKEN" in refused.reason
    assert authorize(guarded, "DELETE", None).status == 401
    assert authorize(guarded, "POST", "Bearer wrong").status == 401
    assert authorize(guarded, "POST", "Basic tok-123").status == 401
    assert authorize(guarded, "POST", "Bearer tok-123").allowed
    assert all("tok-123" not in authorize(guarded, "POST", h).reason for h in (None, "Bearer x"))


def test_token_middleware_on_a_real_aiohttp_server() -> None:
    from aiohttp import ClientSession, web
    from aiohttp.test_utils import TestServer

    async def status(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def pause(request: web.Request) -> web.Response:
        return web.json_response({"paused": True})

    async def scenario() -> list[int]:
        app = web.Application(middlewares=[token_middleware(Settings(http_token=SecretStr("tok-123")))])
        app.router.add_get("/status", status)
        app.router.add_post("/pause", pause)
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            async with ClientSession() as http:
                statuses = []
                for method, path, headers in [("GET", "/status", {}), ("POST", "/pause", {}),
                                              ("POST", "/pause", {"Authorization": "Bearer nope"}),
                                              ("POST", "/pause", {"Authorization": "Bearer tok-123"})]:
                    async with http.request(method, server.make_url(path), headers=headers) as response:
                        statuses.append(response.status)
                return statuses
        finally:
            await server.close()

    assert asyncio.run(scenario()) == [200, 401, 401, 200]


def test_to_env_gives_a_child_process_the_same_settings_secrets_included(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings(topic_prefix="envtest", partitions=7, backfill_target_share=0.5,
                        kafka={"security.protocol": "SASL_SSL", "sasl.password": "hunter2"},
                        redis_url="redis://:pw@127.0.0.1:1/0", stack_dir=Path("/tmp/x"))
    for name in list(os.environ):
        if name.startswith("MVLOG_"):
            monkeypatch.delenv(name)
    for name, value in settings.to_env().items():
        monkeypatch.setenv(name, value)
    child = Settings()
    assert child == settings
    assert child.kafka_secrets["sasl.password"].get_secret_value() == "hunter2"
    assert child.redis_url == "redis://:pw@127.0.0.1:1/0"


def test_refusal_watch_keeps_only_what_retrying_cannot_cure() -> None:
    """Transport errors come and go while a broker starts: only a refused login or TLS handshake is final."""
    from confluent_kafka import KafkaError

    from mvlog.connectors.kafka.kafka_security import KafkaAccessError, RefusalWatch

    watch = RefusalWatch("broker:9093")
    watch(KafkaError(KafkaError._TRANSPORT, "connection refused"))
    watch.check()  # not a refusal: no error
    watch(KafkaError(KafkaError._AUTHENTICATION, "SASL authentication error: unknown-user"))
    watch(KafkaError(KafkaError._SSL, "certificate verify failed"))
    with pytest.raises(KafkaAccessError, match=r"broker:9093 refused the connection: SASL authentication error"):
        watch.check()  # the first refusal is the one reported
