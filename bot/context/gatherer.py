"""``ContextGatherer``: ask every enabled provider at once, each within its own timeout and all within
one overall deadline, and turn what comes back into redacted sections plus footer notes.

A provider that fails or is slow costs the answer one note ("Prometheus timed out after 2 s at
http://prometheus:9090"), never the answer. Answers are cached for ``context.cache_ttl_s`` and
identical requests in flight are shared, so a burst of questions about one incident asks each
source once.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from bot import metrics
from bot.config import Settings
from bot.context import entities as entity_extraction
from bot.context.alertmanager import alert_section
from bot.context.base import (
    ContextBundle,
    ContextProvider,
    ContextRequest,
    ContextSection,
    ProviderResult,
    ProviderStatus,
)
from bot.redact import redact
from bot.types import SourceNote

logger = logging.getLogger(__name__)

_CacheKey = tuple[str, tuple[object, ...]]


class ContextGatherer:
    """Gathers cluster context for one question from every configured provider."""

    def __init__(
        self,
        providers: Sequence[ContextProvider],
        *,
        timeout_s: float = 4.0,
        cache_ttl_s: float = 15.0,
        known_namespaces: Iterable[str] = (),
    ) -> None:
        self.providers = list(providers)
        self.timeout_s = timeout_s
        self.cache_ttl_s = cache_ttl_s
        self.known_namespaces = list(known_namespaces)
        self._cache: dict[_CacheKey, tuple[float, ProviderResult]] = {}
        self._in_flight: dict[_CacheKey, asyncio.Task[ProviderResult]] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> ContextGatherer:
        """A gatherer with the providers enabled in ``settings`` (none enabled: only alert payloads
        become context)."""
        providers: list[ContextProvider] = []
        if settings.kubernetes.enabled:
            from bot.context.kubernetes import KubernetesProvider

            providers.append(KubernetesProvider(settings.kubernetes))
        if settings.prometheus.enabled:
            from bot.context.prometheus import PrometheusProvider

            providers.append(PrometheusProvider(settings.prometheus, settings.kubernetes.namespaces))
        return cls(
            providers,
            timeout_s=settings.context.timeout_s,
            cache_ttl_s=settings.context.cache_ttl_s,
            known_namespaces=settings.kubernetes.namespaces,
        )

    async def gather(
        self, question: str, *, scenario: str, alert: Mapping[str, Any] | None = None
    ) -> ContextBundle:
        """Context for ``question`` (and the Alertmanager payload ``alert``, when it is one)."""
        started = time.perf_counter()
        deadline = time.monotonic() + self.timeout_s
        request = ContextRequest(
            question=question,
            scenario=scenario,
            entities=entity_extraction.extract(question, alert, self.known_namespaces),
            alert=dict(alert) if alert is not None else None,
        )
        sections: list[ContextSection] = []
        notes: list[SourceNote] = []
        if alert is not None:
            section = alert_section(alert)
            if section is not None:
                sections.append(section)
                notes.append(SourceNote("Alertmanager", ProviderStatus.OK.value, section.title))
        results = await asyncio.gather(*(self._ask(p, request, deadline) for p in self.providers))
        for provider, result in zip(self.providers, results, strict=True):
            sections.extend(result.sections)
            notes.append(_note(provider, result))
            metrics.CONTEXT_SOURCE.labels(source=provider.name, status=result.status.value).inc()
        # Redaction is regex work over up to a few hundred KB of logs: off the event loop.
        cleaned = await asyncio.to_thread(lambda: [_redacted(section) for section in sections])
        for note in notes:
            note.detail = redact(note.detail, where="context")
        return ContextBundle(sections=cleaned, notes=notes, elapsed_ms=(time.perf_counter() - started) * 1000)

    async def _ask(
        self, provider: ContextProvider, request: ContextRequest, deadline: float
    ) -> ProviderResult:
        key: _CacheKey = (provider.name, request.cache_key())
        now = time.monotonic()
        cached = self._cache.get(key)
        if cached is not None and cached[0] > now:
            return cached[1]
        task = self._in_flight.get(key)
        if task is None:
            task = asyncio.create_task(self._fetch(provider, request), name=f"context-{provider.name}")
            self._in_flight[key] = task
            task.add_done_callback(functools.partial(self._done, key))
        wait_s = max(0.0, min(provider.timeout_s, deadline - now))
        try:
            # shield: one caller giving up must not cancel the fetch other callers share.
            return await asyncio.wait_for(asyncio.shield(task), timeout=wait_s)
        except TimeoutError:
            return ProviderResult(
                source=provider.name,
                status=ProviderStatus.TIMEOUT,
                query="",
                error=f"{provider.name} timed out after {_seconds(wait_s)} s at {provider.target}",
                target=provider.target,
                elapsed_ms=wait_s * 1000,
            )

    async def _fetch(self, provider: ContextProvider, request: ContextRequest) -> ProviderResult:
        started = time.perf_counter()
        try:
            result = await asyncio.wait_for(provider.fetch(request), timeout=provider.timeout_s)
        except TimeoutError:
            result = ProviderResult(
                source=provider.name,
                status=ProviderStatus.TIMEOUT,
                error=f"{provider.name} timed out after {_seconds(provider.timeout_s)} s "
                f"at {provider.target}",
                target=provider.target,
            )
        except Exception as exc:  # a provider bug must not fail the answer
            logger.exception("context provider %s raised", provider.name)
            result = ProviderResult.failed(provider.name, provider.target, "", f"{type(exc).__name__}: {exc}")
        result.elapsed_ms = (time.perf_counter() - started) * 1000
        metrics.CONTEXT_PROVIDER.labels(provider=provider.name, status=result.status.value).observe(
            result.elapsed_ms / 1000
        )
        return result

    def _done(self, key: _CacheKey, task: asyncio.Task[ProviderResult]) -> None:
        self._in_flight.pop(key, None)
        if task.cancelled() or task.exception() is not None:
            return
        result = task.result()
        # Only answers are cached: a failed source is asked again on the next question.
        if self.cache_ttl_s > 0 and result.status in (ProviderStatus.OK, ProviderStatus.EMPTY):
            self._cache[key] = (time.monotonic() + self.cache_ttl_s, result)
            if len(self._cache) > 256:
                now = time.monotonic()
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}

    def clear_cache(self) -> None:
        """Forget cached answers (tests, configuration reloads)."""
        self._cache.clear()

    async def close(self) -> None:
        """Cancel fetches in flight and close every provider's connections."""
        for task in list(self._in_flight.values()):
            task.cancel()
        for task in list(self._in_flight.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for provider in self.providers:
            try:
                await provider.close()
            except Exception:
                logger.warning("closing context provider %s failed", provider.name, exc_info=True)


def _seconds(value: float) -> str:
    return f"{round(value, 1):g}" if value >= 0.1 else f"{value:.2f}"


def _redacted(section: ContextSection) -> ContextSection:
    # A copy: cached results are shared between requests.
    return replace(
        section, title=redact(section.title, where="context"), body=redact(section.body, where="context")
    )


def _note(provider: ContextProvider, result: ProviderResult) -> SourceNote:
    status = result.status.value
    if result.status is ProviderStatus.TIMEOUT:
        detail = result.error or f"{provider.name} timed out at {provider.target}"
    elif result.status is ProviderStatus.FAILED:
        query = f" (query: {result.query})" if result.query else ""
        detail = f"{provider.name} failed at {result.target or provider.target}: {result.error}{query}"
    elif result.status is ProviderStatus.OK:
        titles = ", ".join(dict.fromkeys(s.title for s in result.sections))
        detail = titles + (f"; partly failed: {result.error}" if result.error else "")
    else:
        detail = result.error or result.query
    return SourceNote(provider.name, status, detail)
