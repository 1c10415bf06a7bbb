"""Alertmanager's HTTP API (``/api/v2``), read-only: active alerts and silences, for the
investigation's tools (:mod:`bot.tools.alertmanager`). The webhook receiver is another room
(:mod:`bot.adapters.alertmanager`); this one only ever sends GET."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import aiohttp

from bot.config import AlertmanagerSettings
from bot.errors import OpsbotError


class AlertmanagerApiError(OpsbotError):
    """Alertmanager answered with an error or could not be reached (the message says which)."""


class AlertmanagerApi:
    """GET calls against one Alertmanager, each within ``api_timeout_s``."""

    def __init__(self, settings: AlertmanagerSettings) -> None:
        if settings.api_url is None:
            raise ValueError("alertmanager.api_url is not set")
        self.url = settings.api_url.rstrip("/")
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Accept": "application/json"}
            if self.settings.api_bearer_token is not None:
                headers["Authorization"] = f"Bearer {self.settings.api_bearer_token.get_secret_value()}"
            self._session = aiohttp.ClientSession(
                headers=headers, timeout=aiohttp.ClientTimeout(total=self.settings.api_timeout_s)
            )
        return self._session

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> Any:
        """``GET /api/v2/<path>`` as JSON; :class:`AlertmanagerApiError` with the upstream text."""
        url = f"{self.url}/api/v2/{path}"
        try:
            async with self._client().get(url, params=dict(params or {})) as response:
                text = await response.text()
                if response.status != 200:
                    raise AlertmanagerApiError(f"HTTP {response.status} from {url}: {text[:300]}")
                try:
                    return await response.json(content_type=None)
                except ValueError:
                    raise AlertmanagerApiError(f"not JSON from {url}: {text[:200]!r}") from None
        except aiohttp.ClientError as exc:
            raise AlertmanagerApiError(f"cannot reach {url}: {exc}") from exc

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None
