"""Runbooks as context: the runbook of each alert an answer is about, fetched and fenced like any data.

Which alerts: those of the Alertmanager payload being summarised, then the alert names the question
(or the alert thread it is asked in) names, up to ``runbooks.max_runbooks``. Where each runbook is
looked for, first found wins:

1. the alert's ``runbook_url`` annotation: from the payload, else from the cluster's Prometheus
   (its active alert, else its alerting rule). ``http(s)://`` URLs are fetched; ``file:`` URLs and
   relative values are read from ``runbooks.folder`` or joined to ``runbooks.base_url``;
2. ``runbooks.folder``/``<alertname>.md``;
3. ``runbooks.base_url`` with ``{alertname}`` filled in (or ``/<alertname>.md`` appended).

HTTP fetches have their own deadline (``runbooks.timeout_s``), read at most ``runbooks.max_bytes``
(a longer runbook is cut, and says so), go only to ``runbooks.allowed_hosts`` when that is set
(redirects included) and turn HTML into text. Local files are read only inside the folder (no
``..`` or symlink leaves it). The gatherer redacts what comes back, the prompt fences it as
untrusted data, and the footer links each runbook used.
"""

from __future__ import annotations

import asyncio
import html
import logging
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import aiohttp

from bot.config import RunbookSettings
from bot.context.base import ContextProvider, ContextRequest, ContextSection, ProviderResult, ProviderStatus
from bot.errors import OpsbotError

logger = logging.getLogger(__name__)

SOURCE = "Runbook"
_TEXT_TYPES = ("text/", "application/json", "application/xml", "application/x-yaml", "application/yaml")
_MAX_REDIRECTS = 3
_DROP_BLOCKS = re.compile(r"<(script|style|head|nav|footer)\b.*?</\1\s*>", re.IGNORECASE | re.DOTALL)
_BREAKS = re.compile(r"<(?:br|/p|/div|/h[1-6]|/tr|/pre)\b[^>]*>", re.IGNORECASE)
_ITEMS = re.compile(r"<li\b[^>]*>", re.IGNORECASE)
_HEADINGS = re.compile(r"<h([1-6])\b[^>]*>", re.IGNORECASE)
_TAGS = re.compile(r"<[^>]+>")


class RunbookError(OpsbotError):
    """A runbook could not be read (the message names where and why)."""


class AlertRuleSource(Protocol):
    """Where an alert's ``runbook_url`` annotation can be looked up (a cluster's Prometheus)."""

    async def runbook_urls(self, alert_names: Sequence[str]) -> dict[str, str]:
        """``runbook_url`` by alert name, for the names it knows."""


@dataclass(frozen=True, slots=True)
class _Wanted:
    alert: str
    annotation: str | None
    """The ``runbook_url`` annotation, when the payload or Prometheus gave one."""


@dataclass(frozen=True, slots=True)
class Runbook:
    """One runbook as read: its text, where it came from, and whether it was cut."""

    alert: str
    location: str
    """URL or file path (what the footer links)."""
    text: str
    truncated: bool = False


def html_to_text(markup: str) -> str:
    """Readable text of an HTML page: scripts and navigation dropped, headings and list items kept
    as Markdown marks, entities decoded, blank runs collapsed."""
    text = _DROP_BLOCKS.sub("", markup)
    text = _HEADINGS.sub(lambda m: "\n" + "#" * int(m.group(1)) + " ", text)
    text = _ITEMS.sub("\n- ", text)
    text = _BREAKS.sub("\n", text)
    text = html.unescape(_TAGS.sub("", text))
    lines = [line.rstrip() for line in text.splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()


class RunbookProvider(ContextProvider):
    """Runbooks of the alerts a question is about (shared by every cluster)."""

    name = SOURCE

    def __init__(self, settings: RunbookSettings, rules: Mapping[str, AlertRuleSource] | None = None) -> None:
        """``rules``: each cluster's Prometheus, where alerts without an annotation in the question's
        payload are looked up."""
        self.settings = settings
        self.rules = dict(rules or {})
        self._session: aiohttp.ClientSession | None = None

    @property
    def target(self) -> str:
        """Where runbooks come from, for notes."""
        places = [str(p) for p in (self.settings.folder, self.settings.base_url) if p]
        return ", ".join(places) or "runbook_url annotations"

    @property
    def timeout_s(self) -> float:
        """Two fetches' worth: an annotation URL that fails may fall back to the folder or base URL."""
        return self.settings.timeout_s * 2

    def cache_key(self, request: ContextRequest) -> tuple[object, ...]:
        """The alerts and their annotated URLs (two payloads of one alert may point elsewhere)."""
        return (request.cluster, tuple(self._from_request(request)))

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    # -- which runbooks --------------------------------------------------------------------------

    def _from_request(self, request: ContextRequest) -> list[_Wanted]:
        wanted: dict[str, str | None] = {}
        payload = request.alert or {}
        common = payload.get("commonAnnotations") or {}
        common_labels = payload.get("commonLabels") or {}
        alerts = [a for a in payload.get("alerts") or [] if isinstance(a, Mapping)]
        # Firing alerts first: their runbooks are the ones to follow now.
        for alert in sorted(alerts, key=lambda a: a.get("status") != "firing"):
            name = (alert.get("labels") or {}).get("alertname") or common_labels.get("alertname")
            url = (alert.get("annotations") or {}).get("runbook_url") or common.get("runbook_url")
            if isinstance(name, str) and name and wanted.get(name) is None:
                wanted[name] = url if isinstance(url, str) and url else None
        if isinstance(common_labels.get("alertname"), str) and common_labels["alertname"] not in wanted:
            url = common.get("runbook_url")
            wanted[common_labels["alertname"]] = url if isinstance(url, str) and url else None
        for name in request.entities.alert_names:
            wanted.setdefault(name, None)
        return [_Wanted(n, u) for n, u in list(wanted.items())[: self.settings.max_runbooks]]

    async def fetch(self, request: ContextRequest) -> ProviderResult:
        """The runbooks of the request's alerts, one section each."""
        wanted = self._from_request(request)
        if not wanted:
            return ProviderResult(SOURCE, ProviderStatus.SKIPPED, query="no alert named", target=self.target)
        errors: list[str] = []
        missing = [w.alert for w in wanted if w.annotation is None]
        rules = self.rules.get(request.cluster)
        if missing and rules is not None:
            try:
                found = await rules.runbook_urls(missing)
            except Exception as exc:  # Prometheus down: the folder and base URL may still have it
                if isinstance(exc, asyncio.CancelledError):
                    raise
                errors.append(f"runbook_url lookup in Prometheus: {exc}")
                found = {}
            wanted = [_Wanted(w.alert, w.annotation or found.get(w.alert)) for w in wanted]
        outcomes = await asyncio.gather(*(self._first_found(w) for w in wanted))
        sections: list[ContextSection] = []
        links: list[str] = []
        queries: list[str] = []
        for want, (runbook, tried, failures) in zip(wanted, outcomes, strict=True):
            queries.extend(tried)
            errors.extend(failures)
            if runbook is None:
                if not tried:
                    errors.append(f"{want.alert}: no runbook_url annotation, runbooks.folder or base_url")
                continue
            links.append(runbook.location)
            body = runbook.text + (
                f"\n[... runbook cut at {self.settings.max_bytes} bytes]" if runbook.truncated else ""
            )
            sections.append(
                ContextSection(
                    source=SOURCE,
                    title=f"Runbook for {runbook.alert} ({runbook.location})",
                    body=body,
                    priority=4,
                    unit=f"runbook lines of {runbook.alert}",
                    drop_from="end",
                )
            )
        query = "; ".join(queries)
        if not sections:
            status = ProviderStatus.FAILED if errors and queries else ProviderStatus.EMPTY
            return ProviderResult(
                SOURCE, status, query=query, error="; ".join(errors) or None, target=self.target
            )
        return ProviderResult(
            SOURCE,
            ProviderStatus.OK,
            sections=sections,
            query=query,
            error="; ".join(errors) or None,
            target=self.target,
            links=links,
        )

    def _candidates(self, want: _Wanted) -> list[str]:
        """Where to look for ``want``'s runbook, in order (URLs, or paths inside the folder)."""
        s = self.settings
        places: list[str] = []
        if want.annotation:
            value = want.annotation.strip()
            scheme = urllib.parse.urlsplit(value).scheme.lower()
            if scheme in ("http", "https", "file"):
                places.append(value)
            elif s.base_url:
                places.append(urllib.parse.urljoin(s.base_url.rstrip("/") + "/", value))
            elif s.folder is not None:
                places.append(value)
        if s.folder is not None:
            places.append(f"{want.alert}.md")
        if s.base_url:
            if "{alertname" in s.base_url:
                places.append(
                    s.base_url.format(
                        alertname=urllib.parse.quote(want.alert),
                        alertname_lower=urllib.parse.quote(want.alert.lower()),
                    )
                )
            else:
                places.append(f"{s.base_url.rstrip('/')}/{urllib.parse.quote(want.alert)}.md")
        return list(dict.fromkeys(places))

    async def _first_found(self, want: _Wanted) -> tuple[Runbook | None, list[str], list[str]]:
        tried: list[str] = []
        failures: list[str] = []
        for place in self._candidates(want):
            tried.append(f"runbook {want.alert}: {place}")
            try:
                return await self.read(want.alert, place), tried, failures
            except RunbookError as exc:
                failures.append(f"{want.alert}: {exc}")
        return None, tried, failures

    # -- reading ---------------------------------------------------------------------------------

    async def read(self, alert: str, place: str) -> Runbook:
        """The runbook at ``place`` (an http(s) URL, a ``file:`` URL or a path in the folder)."""
        scheme = urllib.parse.urlsplit(place).scheme.lower()
        if scheme in ("http", "https"):
            return await self._read_http(alert, place)
        if scheme == "file":
            path = urllib.parse.unquote(urllib.parse.urlsplit(place).path)
            return await asyncio.to_thread(self._read_file, alert, path)
        return await asyncio.to_thread(self._read_file, alert, place)

    def _read_file(self, alert: str, relative: str) -> Runbook:
        folder = self.settings.folder
        if folder is None:
            raise RunbookError(f"{relative}: a local runbook needs runbooks.folder")
        root = folder.resolve()
        path = (root / relative).resolve()
        if not path.is_relative_to(root):
            raise RunbookError(f"{relative}: outside runbooks.folder {root}")
        if not path.is_file():
            # Alert names are CamelCase; runbook files are often lowercase.
            lower = path.with_name(path.name.lower())
            if not lower.is_file():
                raise RunbookError(f"no file {path}")
            path = lower
        with path.open("rb") as handle:
            data = handle.read(self.settings.max_bytes + 1)
        truncated = len(data) > self.settings.max_bytes
        text = data[: self.settings.max_bytes].decode("utf-8", errors="replace")
        return Runbook(alert, str(path), text.strip(), truncated)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            headers = {"Accept": "text/markdown, text/plain;q=0.9, text/html;q=0.8, */*;q=0.1"}
            if self.settings.bearer_token is not None:
                headers["Authorization"] = f"Bearer {self.settings.bearer_token.get_secret_value()}"
            self._session = aiohttp.ClientSession(
                headers=headers, timeout=aiohttp.ClientTimeout(total=self.settings.timeout_s)
            )
        return self._session

    def _check_host(self, url: str) -> None:
        allowed = {h.lower() for h in self.settings.allowed_hosts}
        host = (urllib.parse.urlsplit(url).hostname or "").lower()
        if allowed and host not in allowed:
            raise RunbookError(f"{url}: host {host} is not in runbooks.allowed_hosts")

    async def _read_http(self, alert: str, url: str) -> Runbook:
        limit = self.settings.max_bytes
        current = url
        try:
            # Redirects are followed here, one by one, so each hop's host is checked too.
            for _ in range(_MAX_REDIRECTS + 1):
                self._check_host(current)
                async with self._client().get(current, allow_redirects=False) as response:
                    if response.status in (301, 302, 303, 307, 308) and "Location" in response.headers:
                        current = urllib.parse.urljoin(current, response.headers["Location"])
                        continue
                    if response.status != 200:
                        reason = (await response.content.read(200)).decode("utf-8", errors="replace")
                        raise RunbookError(
                            f"{current}: HTTP {response.status} {reason.strip()[:120]}".rstrip()
                        )
                    kind = response.headers.get("Content-Type", "text/plain").lower()
                    if not kind.startswith(_TEXT_TYPES):
                        raise RunbookError(f"{current}: {kind.split(';')[0]} is not a text runbook")
                    data = await response.content.read(limit + 1)
                    truncated = len(data) > limit
                    text = data[:limit].decode(response.charset or "utf-8", errors="replace")
                    if kind.startswith(("text/html", "application/xhtml")):
                        text = html_to_text(text)
                    return Runbook(alert, url, text.strip(), truncated)
            raise RunbookError(f"{url}: more than {_MAX_REDIRECTS} redirects")
        except TimeoutError:
            raise RunbookError(f"{current}: no answer within {self.settings.timeout_s:g} s") from None
        except aiohttp.ClientError as exc:
            raise RunbookError(f"{current}: {type(exc).__name__}: {exc}") from None
