"""Running a Lua script whose arguments are many: packed by hiredis in one C call.

redis-py's ``Script.__call__`` goes through ``execute_command``, whose serializer walks every argument in
Python (a generator with an ``isinstance`` per argument) before hiredis packs them: for an epoch commit of
a few thousand rows that walk cost more than the script itself. Here the arguments (bytes, str or int)
go to ``hiredis.pack_command`` as they are, on a connection of the client's pool.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis
from hiredis import pack_command
from redis.commands.core import Script
from redis.exceptions import NoScriptError


def run_script(client: redis.Redis, script: Script, keys: Sequence[str], args: Sequence[bytes | str | int]) -> Any:
    """``script(keys=keys, args=args)``: the same reply, the same errors, the same retries (the client's
    policy: :mod:`mvlog.connectors.redis.redis_client` waits through a Redis restart, whose empty script cache
    the NOSCRIPT fallback refills)."""
    if type(client) is not redis.Redis:  # another client (a cluster, a pipeline): its own way
        return script(keys=keys, args=args)
    command: tuple[Any, ...] = ("EVALSHA", script.sha, len(keys), *keys, *args)
    packed = [bytes(pack_command(command))]
    retry = client.get_retry()
    if retry is None:
        return _evalsha(client, script, packed)
    return retry.call_with_retry(lambda: _evalsha(client, script, packed), lambda _error: None)


def _evalsha(client: redis.Redis, script: Script, packed: list[bytes]) -> Any:
    """One attempt on a connection of the client's pool (a broken connection is closed, not reused)."""
    pool = client.connection_pool
    conn: Any = pool.get_connection()
    try:
        try:
            conn.send_packed_command(packed)
            return conn.read_response()
        except NoScriptError:  # flushed since it was loaded (SCRIPT FLUSH, a restarted server)
            client.script_load(script.script)
            conn.send_packed_command(packed)
            return conn.read_response()
    except redis.ResponseError:
        raise  # the script's own error: the connection is fine
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)
