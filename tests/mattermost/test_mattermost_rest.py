"""The async REST v4 client: error bodies, what is retried and what is not, alert-thread posting."""

from __future__ import annotations

import socket

import pytest
from fakes.mattermost_server import FakeMattermost
from prometheus_client import REGISTRY

from bot.adapters.mattermost import MattermostAdapter
from bot.adapters.mattermost_rest import MattermostAPIError, MattermostRest
from bot.config import MattermostSettings
from bot.store import Store


def retries(reason: str, method: str) -> float:
    labels = {"platform": "mattermost", "method": method, "reason": reason}
    return REGISTRY.get_sample_value("opsbot_chat_api_retries_total", labels) or 0.0


def fast(**fields: object) -> MattermostSettings:
    retry = {"initial_s": 0.01, "max_s": 0.05, **fields.pop("retry", {})}  # type: ignore[dict-item]
    return MattermostSettings(retry=retry, request_timeout_s=5, **fields)  # type: ignore[arg-type]


async def test_a_bad_token_is_not_retried_and_the_servers_error_body_is_kept(fake: FakeMattermost) -> None:
    rest = MattermostRest(fast(**{**fake.settings_kwargs(), "token": "wrong"}))
    await rest.start()
    try:
        with pytest.raises(MattermostAPIError) as caught:
            await rest.me()
    finally:
        await rest.close()
    err = caught.value
    assert err.status == 401 and err.error_id == "api.context.session_expired.app_error"
    assert err.request_id == fake.calls[-1].request_id
    assert len(fake.calls) == 1


async def test_connection_errors_are_retried_then_reported() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there any more
    rest = MattermostRest(
        fast(url="127.0.0.1", scheme="http", port=port, token="t", retry={"max_retries": 2})
    )
    before = retries("connection", "GET /users/me")
    await rest.start()
    try:
        with pytest.raises(MattermostAPIError, match="no response"):
            await rest.me()
    finally:
        await rest.close()
    assert retries("connection", "GET /users/me") - before == 2


async def test_a_500_then_success_is_retried_and_a_400_is_not(fake: FakeMattermost) -> None:
    channel = fake.add_channel("c", [fake.bot_user_id])
    rest = MattermostRest(fast(**fake.settings_kwargs()))
    fake.add_fault("GET", rf"/api/v4/channels/{channel}", 500, count=2)
    await rest.start()
    try:
        assert (await rest.get_channel(channel))["id"] == channel
        with pytest.raises(MattermostAPIError) as caught:
            await rest.create_post("no-such-channel", "x", pending_post_id="p1")
    finally:
        await rest.close()
    assert [c.status for c in fake.calls_to("GET", rf"/api/v4/channels/{channel}")] == [500, 500, 200]
    assert caught.value.status == 400 and len(fake.calls_to("POST", "/api/v4/posts")) == 1


async def test_post_to_channel_starts_a_thread_and_replies_in_it(fake: FakeMattermost, store: Store) -> None:
    channel = fake.add_channel("alerts", [fake.bot_user_id])
    adapter = MattermostAdapter(fast(**fake.settings_kwargs()), store)

    async def handler(message: object) -> None:
        return None

    await adapter.start(handler)
    try:
        root = await adapter.post_to_channel(channel, "**FIRING** KubePodCrashLooping")
        again = await adapter.post_to_channel(channel, "still firing", thread_id=root)
    finally:
        await adapter.stop()
        await adapter.close()
    assert again == root
    assert [p["root_id"] for p in fake.thread(root)] == ["", root]


async def test_429s_beyond_max_retries_are_still_waited_out_honouring_retry_after(
    fake: FakeMattermost,
) -> None:
    # A 429 is a wait, not a failure: eight throttles with max_retries=2 still end in the post.
    channel = fake.add_channel("c", [fake.bot_user_id])
    rest = MattermostRest(fast(**fake.settings_kwargs(), retry={"max_retries": 2, "patience_s": 30}))
    fake.add_fault("POST", "/api/v4/posts", 429, count=8, retry_after=0.1)
    before = retries("429", "POST /posts")
    await rest.start()
    try:
        post = await rest.create_post(channel, "still here", pending_post_id="p-429")
    finally:
        await rest.close()
    assert post["message"] == "still here"
    calls = fake.calls_to("POST", "/api/v4/posts")
    assert [c.status for c in calls] == [429] * 8 + [201]
    gaps = [b.started - a.started for a, b in zip(calls, calls[1:], strict=False)]
    assert min(gaps) >= 0.1  # never earlier than the server's Retry-After
    assert retries("429", "POST /posts") - before == 8


async def test_throttling_past_the_patience_is_reported_as_throttled(fake: FakeMattermost) -> None:
    from bot.errors import PlatformThrottled

    channel = fake.add_channel("c", [fake.bot_user_id])
    rest = MattermostRest(fast(**fake.settings_kwargs(), retry={"patience_s": 0.5}))
    fake.add_fault("POST", "/api/v4/posts", 429, retry_after=0.2)
    await rest.start()
    try:
        with pytest.raises(PlatformThrottled, match="still rate limited"):
            await rest.create_post(channel, "x", pending_post_id="p-slow")
    finally:
        await rest.close()
