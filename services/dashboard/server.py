"""Runs the dashboard (and, by default, the lag sampler) in a background thread of any process.

The demo and the tests need the dashboard next to other work in one process; ``mvlog dashboard`` uses
the same object in the foreground. The server binds ``settings.bind_host`` (127.0.0.1) by default.
"""

from __future__ import annotations

import asyncio
import threading

from aiohttp import web

from mvlog.config import Settings
from mvlog.services.dashboard.app import create_app
from mvlog.services.lag_sampler import LagSampler


class DashboardServer:
    def __init__(self, settings: Settings, host: str | None = None, port: int | None = None,
                 sample: bool = True) -> None:
        self.settings = settings
        self.host = host or settings.bind_host
        self.port = settings.dashboard_port if port is None else port
        self.sampler = LagSampler(settings) if sample else None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._thread: threading.Thread | None = None
        self._started = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/"

    async def _serve(self) -> None:
        self._runner = web.AppRunner(create_app(self.settings), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        if self.port == 0:  # an ephemeral port: report the one the OS chose
            server = site._server
            assert server is not None
            self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as error:
            self._error = error
            self._started.set()
            loop.close()
            return
        self._started.set()
        try:
            loop.run_forever()
        finally:
            if self._runner is not None:
                loop.run_until_complete(self._runner.cleanup())
            loop.close()

    def start(self, timeout: float = 10.0) -> DashboardServer:
        """Serve in a daemon thread; raises OSError when the port cannot be bound."""
        self._thread = threading.Thread(target=self._run, name="mvlog-dashboard", daemon=True)
        self._thread.start()
        if not self._started.wait(timeout):
            raise TimeoutError(f"the dashboard did not start within {timeout}s")
        if self._error is not None:
            raise self._error
        if self.sampler is not None:
            self.sampler.start()
        return self

    def stop(self) -> None:
        if self.sampler is not None:
            self.sampler.stop()
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
            self._thread = None

    def __enter__(self) -> DashboardServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
