"""run_script: a script run with its arguments packed by hiredis gives what ``script(keys, args)`` gives,
survives a flushed script cache, and leaves the connection usable after the script's own error."""

from __future__ import annotations

import pytest
import redis

from mvlog.connectors.redis.packed_script import run_script

ECHO = "redis.call('SET', KEYS[1], ARGV[1]) return {#KEYS, #ARGV, ARGV[#ARGV]}"


def test_the_reply_is_the_scripts(redis_client: redis.Redis) -> None:
    script = redis_client.register_script(ECHO)
    args: list[bytes | str | int] = [b"\x00bytes", "text", 7] * 3000
    assert run_script(redis_client, script, ["k"], args) == script(keys=["k"], args=args) == [1, 9000, b"7"]
    assert redis_client.get("k") == b"\x00bytes"


def test_a_flushed_script_cache_is_loaded_again(redis_client: redis.Redis) -> None:
    script = redis_client.register_script(ECHO)
    assert run_script(redis_client, script, ["k"], [b"one"]) == [1, 1, b"one"]
    redis_client.script_flush()
    assert run_script(redis_client, script, ["k"], [b"two"]) == [1, 1, b"two"]


def test_the_scripts_error_is_raised_and_the_connection_stays_usable(redis_client: redis.Redis) -> None:
    failing = redis_client.register_script("return redis.error_reply('refused: ' .. ARGV[1])")
    with pytest.raises(redis.ResponseError, match="refused: no"):
        run_script(redis_client, failing, [], ["no"])
    assert redis_client.ping()
    assert run_script(redis_client, redis_client.register_script(ECHO), ["k"], ["ok"]) == [1, 1, b"ok"]
