"""The clusters opsbot reads: each with its own providers (and so its own timeouts) and its own cache.

The default cluster is the one ``[kubernetes]`` / ``[prometheus]`` describe, named
``context.default_cluster`` (or the ``[clusters.<name>]`` entry of that name); every
``[clusters.<name>]`` entry adds one more, with its own kubeconfig context (or in-cluster / token
configuration) and its own Prometheus. A question picks a cluster by naming it ("in eu-west ...",
see :mod:`bot.context.entities`); a channel's scope (:mod:`bot.context.scope`) decides which
clusters and namespaces it may read at all.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from bot.config import KubernetesSettings, PrometheusSettings, Settings
from bot.context.base import ContextProvider, ProviderResult

logger = logging.getLogger(__name__)

_CacheKey = tuple[str, tuple[object, ...]]


class ResultCache:
    """One cluster's short-lived provider answers, and the fetches in flight that callers share."""

    def __init__(self, ttl_s: float, max_entries: int = 256) -> None:
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._entries: dict[_CacheKey, tuple[float, ProviderResult]] = {}
        self.in_flight: dict[_CacheKey, asyncio.Task[ProviderResult]] = {}

    def get(self, key: _CacheKey) -> ProviderResult | None:
        """The cached answer for ``key`` while it is fresh."""
        entry = self._entries.get(key)
        if entry is not None and entry[0] > time.monotonic():
            return entry[1]
        return None

    def put(self, key: _CacheKey, result: ProviderResult) -> None:
        """Keep ``result`` for ``ttl_s`` seconds (a TTL of 0 keeps nothing)."""
        if self.ttl_s <= 0:
            return
        now = time.monotonic()
        self._entries[key] = (now + self.ttl_s, result)
        if len(self._entries) > self.max_entries:
            self._entries = {k: v for k, v in self._entries.items() if v[0] > now}

    def clear(self) -> None:
        """Forget every answer."""
        self._entries.clear()


@dataclass(slots=True)
class Cluster:
    """One cluster: its name, the words that name it, its configured namespaces and providers."""

    name: str
    providers: list[ContextProvider]
    namespaces: tuple[str, ...] = ()
    """``kubernetes.namespaces`` of this cluster (empty: all it may list)."""
    aliases: tuple[str, ...] = ()
    cache: ResultCache = field(default_factory=lambda: ResultCache(15.0))

    def words(self) -> list[str]:
        """The name and aliases, lowercased (what a question may call it)."""
        return list(dict.fromkeys(w.lower() for w in (self.name, *self.aliases)))


def _providers(kubernetes: KubernetesSettings, prometheus: PrometheusSettings) -> list[ContextProvider]:
    providers: list[ContextProvider] = []
    # Imported only when enabled: the cluster clients are heavy and optional.
    if kubernetes.enabled:
        from bot.context.kubernetes import KubernetesProvider

        providers.append(KubernetesProvider(kubernetes))
    if prometheus.enabled:
        from bot.context.prometheus import PrometheusProvider

        providers.append(PrometheusProvider(prometheus, kubernetes.namespaces))
    return providers


def clusters_from_settings(settings: Settings) -> list[Cluster]:
    """Every configured cluster, the default one first (it exists even with no provider enabled, so
    a channel scope can name it and alert payloads still become context)."""
    default = settings.context.default_cluster
    ttl = settings.context.cache_ttl_s
    clusters: list[Cluster] = []
    entry = settings.clusters.get(default)
    if entry is None:
        clusters.append(
            Cluster(
                name=default,
                providers=_providers(settings.kubernetes, settings.prometheus),
                namespaces=tuple(settings.kubernetes.namespaces),
                aliases=tuple(settings.context.default_cluster_aliases),
                cache=ResultCache(ttl),
            )
        )
    for name, cluster in sorted(settings.clusters.items(), key=lambda item: item[0] != default):
        aliases = cluster.aliases + (settings.context.default_cluster_aliases if name == default else [])
        clusters.append(
            Cluster(
                name=name,
                providers=_providers(cluster.kubernetes, cluster.prometheus),
                namespaces=tuple(cluster.kubernetes.namespaces),
                aliases=tuple(aliases),
                cache=ResultCache(ttl if cluster.cache_ttl_s is None else cluster.cache_ttl_s),
            )
        )
    return clusters


def single_cluster(
    providers: Sequence[ContextProvider],
    *,
    name: str = "default",
    namespaces: Iterable[str] = (),
    ttl_s: float = 15.0,
) -> Cluster:
    """One cluster around ready-made providers (tests, embedding)."""
    return Cluster(
        name=name, providers=list(providers), namespaces=tuple(namespaces), cache=ResultCache(ttl_s)
    )
