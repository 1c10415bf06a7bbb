"""Alertmanager silences through its v2 API: create (``POST /api/v2/silences``) and expire
(``DELETE /api/v2/silence/{id}``), on the ``[actions]`` Alertmanager URL and token.

Alertmanager has no dry run. The card's "dry run" for a silence is a read: the alerts its matchers
select right now (``GET /api/v2/alerts?filter=...``), and the silence object that would be posted;
for an expiry, the silence as it stands (``GET /api/v2/silence/{id}``).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import aiohttp

from bot.actions.catalog import ActionSpec
from bot.actions.kube_apply import Applied, ApplyError
from bot.config import ActionsSettings


class Silences:
    """Create and expire silences in one Alertmanager."""

    def __init__(self, settings: ActionsSettings) -> None:
        self.settings = settings
        self._session: aiohttp.ClientSession | None = None

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(self, method: str, path: str, **kwargs: Any) -> Any:
        """One v2 API call as JSON; :class:`ApplyError` for any failure."""
        base = self.settings.alertmanager_url
        if not base:
            raise ApplyError("no Alertmanager for silences: set actions.alertmanager_url")
        if self._session is None:
            headers = {}
            if self.settings.alertmanager_token is not None:
                headers["Authorization"] = f"Bearer {self.settings.alertmanager_token.get_secret_value()}"
            self._session = aiohttp.ClientSession(
                headers=headers, timeout=aiohttp.ClientTimeout(total=self.settings.timeout_s)
            )
        url = base.rstrip("/") + "/api/v2" + path
        try:
            async with self._session.request(method, url, **kwargs) as resp:
                text = await resp.text()
                if not 200 <= resp.status <= 299:
                    raise ApplyError(f"{method} {path}: HTTP {resp.status}: {text[:300]}")
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ApplyError(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        return json.loads(text) if text.strip() else None

    async def run(self, spec: ActionSpec, *, dry_run: bool, created_by: str = "opsbot") -> Applied:
        """Create or expire (``dry_run``: only read what it would touch)."""
        p = spec.params
        if spec.action == "silence":
            now = datetime.now(UTC)
            body = {
                "matchers": [{"isRegex": False, "isEqual": True, **m} for m in p["matchers"]],
                "startsAt": now.isoformat().replace("+00:00", "Z"),
                "endsAt": (now + timedelta(minutes=p["duration_m"])).isoformat().replace("+00:00", "Z"),
                "createdBy": created_by,
                "comment": p["comment"],
            }
            filters = [("filter", _filter(m)) for m in body["matchers"]] + [("silenced", "false")]
            alerts = await self.call("GET", "/alerts", params=filters) or []
            names = sorted({_alert_line(a) for a in alerts})
            diff = "\n".join(
                [f"+ silence {spec.target} for {p['duration_m']} min, comment {p['comment']!r}"]
                + [f"~ mutes {line}" for line in names[:20]]
                + ([f"~ ... and {len(names) - 20} more"] if len(names) > 20 else [])
                + ([] if names else ["~ (no alert matches now)"])
            )
            if dry_run:
                return Applied(diff, f"would mute {len(names)} alert(s)", None, body, None)
            created = await self.call("POST", "/silences", json=body) or {}
            silence_id = str(created.get("silenceID", ""))
            inverse = ActionSpec("expire_silence", {"silence_id": silence_id}) if silence_id else None
            return Applied(
                diff, f"silence {silence_id} created, muting {len(names)} alert(s)", None, created, inverse
            )
        if spec.action == "expire_silence":
            silence = await self.call("GET", f"/silence/{p['silence_id']}")
            state = ((silence or {}).get("status") or {}).get("state", "?")
            if state == "expired":
                raise ApplyError(f"silence {p['silence_id']} is already expired")
            matchers = ",".join(_filter(m) for m in (silence or {}).get("matchers", []))
            diff = (
                f"- silence {p['silence_id']} ({state}) {matchers} until {(silence or {}).get('endsAt', '?')}"
            )
            if not dry_run:
                await self.call("DELETE", f"/silence/{p['silence_id']}")
            return Applied(diff, f"silence {p['silence_id']} expired", silence, None, None)
        raise ApplyError(f"{spec.action} is not an Alertmanager action")


def _filter(m: dict[str, Any]) -> str:
    op = (
        ("=~" if m.get("isRegex") else "=")
        if m.get("isEqual", True)
        else ("!~" if m.get("isRegex") else "!=")
    )
    return f'{m["name"]}{op}"{m["value"]}"'


def _alert_line(alert: dict[str, Any]) -> str:
    labels = alert.get("labels") or {}
    extra = ",".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "alertname")
    return f"{labels.get('alertname', '?')}{{{extra}}}"
