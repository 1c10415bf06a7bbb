"""``ContextGatherer``: ask every enabled provider at once, each within its own timeout and all within
one overall deadline, and turn what comes back into redacted sections plus footer notes.

Which providers: the channel's scope (:mod:`bot.context.scope`) and the clusters the question
names pick the clusters (:mod:`bot.context.clusters`) and their namespaces; each picked cluster's
providers are asked, plus the shared ones (runbooks). A provider that fails or is slow costs the
answer one note ("Prometheus timed out after 2 s at http://prometheus:9090"), never the answer.
Answers are cached per cluster (``context.cache_ttl_s`` or the cluster's own ``cache_ttl_s``) and
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
from bot.config import ScopeSettings, Settings
from bot.context import entities as entity_extraction
from bot.context.alertmanager import alert_section
from bot.context.base import (
    ContextBundle,
    ContextProvider,
    ContextRequest,
    ContextSection,
    Findings,
    ProviderResult,
    ProviderStatus,
    UsedScope,
)
from bot.context.clusters import Cluster, ResultCache, clusters_from_settings, single_cluster
from bot.context.scope import ChannelRef, ScopeResolver
from bot.redact import redact
from bot.types import SourceNote

logger = logging.getLogger(__name__)

_CacheKey = tuple[str, tuple[object, ...]]
_MIN_FOLLOW_S = 0.05
"""Less time than this left of the deadline: no second round."""


class ContextGatherer:
    """Gathers cluster context for one question from the providers of the clusters its channel may read."""

    def __init__(
        self,
        providers: Sequence[ContextProvider] = (),
        *,
        timeout_s: float = 4.0,
        cache_ttl_s: float = 15.0,
        known_namespaces: Iterable[str] = (),
        clusters: Sequence[Cluster] | None = None,
        scope: ScopeSettings | None = None,
        shared: Sequence[ContextProvider] = (),
    ) -> None:
        """``providers``: one default cluster's (when ``clusters`` is not given); ``shared``:
        providers asked for every question whatever its cluster (runbooks)."""
        self.clusters = (
            list(clusters)
            if clusters is not None
            else [single_cluster(providers, namespaces=known_namespaces, ttl_s=cache_ttl_s)]
        )
        self.shared = list(shared)
        self.timeout_s = timeout_s
        self.scopes = ScopeResolver(scope or ScopeSettings(), self.clusters)
        self._by_name = {c.name: c for c in self.clusters}
        self._shared_cache = ResultCache(cache_ttl_s)
        self._cluster_words = {word: c.name for c in self.clusters for word in c.words()}

    @property
    def providers(self) -> list[ContextProvider]:
        """Every provider: each cluster's, then the shared ones."""
        return [p for c in self.clusters for p in c.providers] + self.shared

    @classmethod
    def from_settings(cls, settings: Settings) -> ContextGatherer:
        """A gatherer with the clusters, providers and channel scopes of ``settings`` (no provider
        enabled: only alert payloads become context)."""
        clusters = clusters_from_settings(settings)
        shared: list[ContextProvider] = []
        if settings.runbooks.enabled:
            from bot.context.prometheus import PrometheusProvider
            from bot.context.runbooks import RunbookProvider

            rules = {c.name: p for c in clusters for p in c.providers if isinstance(p, PrometheusProvider)}
            shared.append(RunbookProvider(settings.runbooks, rules))
        return cls(
            timeout_s=settings.context.timeout_s,
            cache_ttl_s=settings.context.cache_ttl_s,
            clusters=clusters,
            scope=settings.scope,
            shared=shared,
        )

    async def gather(
        self,
        question: str,
        *,
        scenario: str,
        alert: Mapping[str, Any] | None = None,
        channel: ChannelRef | None = None,
    ) -> ContextBundle:
        """Context for ``question`` asked in ``channel`` (and the Alertmanager payload ``alert``,
        when it is one); ``channel`` unset: the default scope."""
        started = time.perf_counter()
        deadline = time.monotonic() + self.timeout_s
        scope = self.scopes.for_channel(channel)
        readable = [self._by_name[name] for name in scope.clusters]
        known_namespaces = {
            n for c in readable for n in (self.scopes.namespaces(scope, c) or ()) if c.providers
        }
        entities = entity_extraction.extract(question, alert, sorted(known_namespaces), self._cluster_words)
        named = [self._cluster_words.get(c.lower(), c) for c in entities.clusters]
        used, scope_notes = self.scopes.pick(scope, named)
        payload = dict(alert) if alert is not None else None
        jobs: list[tuple[ResultCache, ContextProvider, ContextRequest, str]] = []
        for use in used:
            request = ContextRequest(question, scenario, entities, payload, use.cluster, use.namespaces)
            label = use.cluster if len(used) > 1 else ""
            jobs.extend(
                (self._by_name[use.cluster].cache, p, request, label)
                for p in self._by_name[use.cluster].providers
            )
        first = used[0] if used else UsedScope("")
        shared_request = ContextRequest(
            question, scenario, entities, payload, first.cluster, first.namespaces
        )
        jobs.extend((self._shared_cache, p, shared_request, "") for p in self.shared)

        sections: list[ContextSection] = []
        notes: list[SourceNote] = []
        if alert is not None:
            section = alert_section(alert)
            if section is not None:
                sections.append(section)
                notes.append(SourceNote("Alertmanager", ProviderStatus.OK.value, section.title))
        results = list(await asyncio.gather(*(self._ask(cache, p, r, deadline) for cache, p, r, _ in jobs)))
        await self._follow(jobs, results, len(jobs) - len(self.shared), deadline)
        for (_, provider, _, label), result in zip(jobs, results, strict=True):
            found = result.sections
            if label:  # several clusters in one answer: say which one each block is from
                found = [replace(s, source=f"{s.source} ({label})") for s in found]
            sections.extend(found)
            note = _note(provider, result)
            if label:
                note.name = f"{note.name} ({label})"
            notes.append(note)
            metrics.CONTEXT_SOURCE.labels(source=provider.name, status=result.status.value).inc()
        # Redaction is regex work over up to a few hundred KB of logs: off the event loop.
        cleaned = await asyncio.to_thread(lambda: [_redacted(section) for section in sections])
        for note in notes:
            note.detail = redact(note.detail, where="context")
            note.links = [redact(link, where="context") for link in note.links]
        return ContextBundle(
            sections=cleaned,
            notes=notes,
            elapsed_ms=(time.perf_counter() - started) * 1000,
            scope=[u for u in used if self._by_name[u.cluster].providers],
            scope_notes=scope_notes,
            scoped=any(c.providers for c in self.clusters),
        )

    async def _follow(
        self,
        jobs: Sequence[tuple[ResultCache, ContextProvider, ContextRequest, str]],
        results: list[ProviderResult],
        cluster_jobs: int,
        deadline: float,
    ) -> None:
        """The second round: each cluster's providers follow what the others found there (Prometheus
        queries what Kubernetes found), within what is left of the deadline; merged in place."""
        by_cluster: dict[str, list[int]] = {}
        for index in range(cluster_jobs):
            by_cluster.setdefault(jobs[index][2].cluster, []).append(index)
        rounds = []
        for indexes in by_cluster.values():
            found = [results[i].findings for i in indexes if results[i].findings]
            if not found:
                continue
            findings = merge_findings(f for f in found if f is not None)
            # A source that failed or timed out in the first round is not asked again.
            answered = (ProviderStatus.OK, ProviderStatus.EMPTY)
            rounds += [(i, findings) for i in indexes if results[i].status in answered]
        if not rounds or deadline - time.monotonic() < _MIN_FOLLOW_S:
            return
        followed = await asyncio.gather(
            *(
                self._ask(
                    jobs[i][0],
                    jobs[i][1],
                    jobs[i][2],
                    deadline,
                    follow=findings,
                )
                for i, findings in rounds
            )
        )
        for (i, _), extra in zip(rounds, followed, strict=True):
            results[i] = _merged(results[i], extra)

    async def _ask(
        self,
        cache: ResultCache,
        provider: ContextProvider,
        request: ContextRequest,
        deadline: float,
        *,
        follow: Findings | None = None,
    ) -> ProviderResult:
        key: _CacheKey = (provider.name, provider.cache_key(request))
        if follow is not None:
            key = (f"{provider.name} follow", (*key[1], follow.key()))
        now = time.monotonic()
        cached = cache.get(key)
        if cached is not None:
            return cached
        task = cache.in_flight.get(key)
        if task is None:
            fetch = self._fetch(provider, request, follow)
            task = asyncio.create_task(fetch, name=f"context-{provider.name}")
            cache.in_flight[key] = task
            task.add_done_callback(functools.partial(self._done, cache, key))
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

    async def _fetch(
        self, provider: ContextProvider, request: ContextRequest, follow: Findings | None = None
    ) -> ProviderResult:
        started = time.perf_counter()
        try:
            if follow is None:
                result = await asyncio.wait_for(provider.fetch(request), timeout=provider.timeout_s)
            else:
                followed = await asyncio.wait_for(
                    provider.follow(request, follow), timeout=provider.timeout_s
                )
                result = followed or ProviderResult(source=provider.name, status=ProviderStatus.SKIPPED)
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

    @staticmethod
    def _done(cache: ResultCache, key: _CacheKey, task: asyncio.Task[ProviderResult]) -> None:
        cache.in_flight.pop(key, None)
        if task.cancelled() or task.exception() is not None:
            return
        result = task.result()
        # Only answers are cached: a failed source is asked again on the next question.
        if result.status in (ProviderStatus.OK, ProviderStatus.EMPTY):
            cache.put(key, result)

    def clear_cache(self) -> None:
        """Forget cached answers (tests, configuration reloads)."""
        for cache in self._caches():
            cache.clear()

    def _caches(self) -> list[ResultCache]:
        return [c.cache for c in self.clusters] + [self._shared_cache]

    async def close(self) -> None:
        """Cancel fetches in flight and close every provider's connections."""
        tasks = [task for cache in self._caches() for task in cache.in_flight.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for provider in self.providers:
            try:
                await provider.close()
            except Exception:
                logger.warning("closing context provider %s failed", provider.name, exc_info=True)


def merge_findings(found: Iterable[Findings]) -> Findings:
    """One :class:`Findings` of several providers' (each part once, in order)."""
    parts = list(found)
    return Findings(
        workloads=tuple(dict.fromkeys(w for f in parts for w in f.workloads)),
        nodes=tuple(dict.fromkeys(n for f in parts for n in f.nodes)),
        node_pods=tuple(dict.fromkeys(p for f in parts for p in f.node_pods)),
        pressure=tuple(dict.fromkeys(p for f in parts for p in f.pressure)),
    )


def _merged(first: ProviderResult, extra: ProviderResult) -> ProviderResult:
    """A provider's answer with its second round added (a skipped or failed second round only adds
    its error)."""
    if extra.status is ProviderStatus.SKIPPED:
        return first
    errors = [e for e in (first.error, extra.error) if e]
    sections = [*first.sections, *extra.sections]
    status = first.status
    if sections and status in (ProviderStatus.EMPTY, ProviderStatus.SKIPPED):
        status = ProviderStatus.OK
    return replace(
        first,
        status=status,
        sections=sections,
        query="; ".join(q for q in (first.query, extra.query) if q),
        error="; ".join(errors) or None,
        elapsed_ms=first.elapsed_ms + extra.elapsed_ms,
    )


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
        query = f" (query: {_clipped(result.query)})" if result.query else ""
        detail = f"{provider.name} failed at {result.target or provider.target}: {result.error}{query}"
    elif result.status is ProviderStatus.OK:
        titles = ", ".join(dict.fromkeys(s.title for s in result.sections))
        detail = titles + (f"; partly failed: {result.error}" if result.error else "")
    else:
        detail = result.error or _clipped(result.query)
    return SourceNote(provider.name, status, detail, links=list(result.links))


def _clipped(query: str, limit: int = 300) -> str:
    """A source's queries for a note: derived queries can name hundreds of pods, a note stays short."""
    return query if len(query) <= limit else f"{query[:limit]}… ({query.count('; ') + 1} queries)"
