"""Which chat adapters ``opsbot run`` starts, from the configuration."""

from __future__ import annotations

from bot.adapters.base import ChatAdapter
from bot.config import Settings
from bot.store import Store


def build_adapters(settings: Settings, store: Store) -> list[ChatAdapter]:
    """The enabled platforms' adapters (none enabled: an empty list; HTTP still serves)."""
    adapters: list[ChatAdapter] = []
    if settings.slack.enabled:
        from bot.adapters.slack import SlackAdapter

        adapters.append(SlackAdapter(settings.slack, store))
    if settings.mattermost.enabled:
        from bot.adapters.mattermost import MattermostAdapter

        adapters.append(MattermostAdapter(settings.mattermost, store))
    return adapters
