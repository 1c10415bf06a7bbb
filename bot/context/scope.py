"""Per-channel scope: which clusters and namespaces an answer in a channel may read.

``[[scope.channels]]`` entries map channels (ids, or ``#name`` shell patterns) to clusters and
namespaces; the first entry that matches wins. A channel outside every entry gets the default scope
(any cluster: one the question names, else the default cluster, each with its configured
namespaces) or, with ``scope.unmapped = "none"``, no cluster context at all.

Within a scope, a question naming clusters picks those it may read; one outside the scope is
noted, never read. The namespaces of each picked cluster are the scope's namespaces inside the
cluster's configured ones (configuration checks that they overlap, :mod:`bot.config`). The
providers then read only those namespaces, and the gatherer's cache is keyed by them, so one
channel's answer is never served from another channel's namespaces.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from bot.config import ChannelScopeSettings, ScopeSettings
from bot.context.base import UsedScope
from bot.context.clusters import Cluster


@dataclass(frozen=True, slots=True)
class ChannelRef:
    """Where a question was asked: platform, channel id and (when known) the channel's name."""

    platform: str
    channel: str
    name: str | None = None


@dataclass(frozen=True, slots=True)
class ChannelScope:
    """What answers in one channel may read."""

    clusters: tuple[str, ...]
    """Clusters it may read, in order of preference (empty: none)."""
    namespaces: tuple[str, ...] = ()
    """Namespaces it may read in them (empty: each cluster's configured namespaces)."""
    rule: str = "default scope"
    """Which rule gave this scope, for notes (``scope.channels[0]``, ``default scope``)."""


class ScopeResolver:
    """Channel -> :class:`ChannelScope`, and a scope plus the clusters a question names -> what to read."""

    def __init__(self, settings: ScopeSettings, clusters: Sequence[Cluster]) -> None:
        self.settings = settings
        self.clusters = {c.name: c for c in clusters}
        self.default = clusters[0].name if clusters else "default"

    @property
    def needs_channel_names(self) -> bool:
        """True when some scope matches channels by name (``#pattern``), not only by id."""
        return any(entry.startswith("#") for scope in self.settings.channels for entry in scope.match)

    def for_channel(self, channel: ChannelRef | None) -> ChannelScope:
        """The scope of ``channel`` (``None``: not asked in a channel, e.g. a test or the terminal
        without a mapping: the default scope)."""
        if channel is not None:
            for index, scope in enumerate(self.settings.channels):
                if _matches(scope, channel):
                    return ChannelScope(
                        clusters=tuple(scope.clusters or [self.default]),
                        namespaces=tuple(scope.namespaces),
                        rule=f"scope.channels[{index}]",
                    )
            if self.settings.unmapped == "none":
                return ChannelScope(clusters=(), rule="scope.unmapped = none")
        return ChannelScope(clusters=tuple(self.clusters), rule="default scope")

    def pick(self, scope: ChannelScope, named: Iterable[str]) -> tuple[list[UsedScope], list[str]]:
        """The clusters (with namespaces) to read for a question naming ``named`` clusters, and notes
        on what the scope kept out."""
        names = [n for n in dict.fromkeys(named) if n in self.clusters]
        inside = [n for n in names if n in scope.clusters]
        outside = [n for n in names if n not in scope.clusters]
        notes = [f"cluster {name} is outside this channel's scope ({scope.rule})" for name in outside]
        used: list[UsedScope] = []
        for name in inside or list(scope.clusters[:1]):
            spaces = self.namespaces(scope, self.clusters[name])
            if spaces == ():  # configuration rules this out; never let "none" widen to "all"
                notes.append(f"cluster {name} has none of this channel's namespaces")
                continue
            used.append(UsedScope(name, spaces))
        return used, notes

    @staticmethod
    def namespaces(scope: ChannelScope, cluster: Cluster) -> tuple[str, ...] | None:
        """The namespaces ``scope`` may read in ``cluster`` (``None``: all the cluster lets it list)."""
        if scope.namespaces and cluster.namespaces:
            return tuple(n for n in scope.namespaces if n in cluster.namespaces)
        if scope.namespaces:
            return scope.namespaces
        return cluster.namespaces or None


def _matches(scope: ChannelScopeSettings, channel: ChannelRef) -> bool:
    if scope.platform is not None and scope.platform != channel.platform:
        return False
    for entry in scope.match:
        if entry.startswith("#"):
            if channel.name and fnmatch.fnmatchcase(channel.name.lower().lstrip("#"), entry[1:].lower()):
                return True
        elif entry == channel.channel:
            return True
    return False
