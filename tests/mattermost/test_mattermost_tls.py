"""TLS: certificates are verified unless ``verify_tls`` is false (REST and the websocket)."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from fakes.mattermost_server import FakeMattermost
from mm_helpers import BotFactory

from bot.adapters.mattermost import MattermostAdapter
from bot.adapters.mattermost_rest import MattermostAPIError
from bot.config import MattermostSettings
from bot.store import Store


@pytest.fixture
async def fake(tmp_path: Path) -> AsyncIterator[FakeMattermost]:
    """The fake Mattermost on HTTPS / WSS with a self-signed certificate."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl CLI not installed")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True,
    )  # fmt: skip
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    async with FakeMattermost(ssl_context=context) as mm:
        yield mm


async def test_a_self_signed_certificate_is_refused_when_tls_verification_is_on(
    fake: FakeMattermost, store: Store
) -> None:
    settings = MattermostSettings(enabled=True, retry={"max_retries": 0}, **fake.settings_kwargs())
    assert settings.verify_tls and settings.scheme == "https"
    adapter = MattermostAdapter(settings, store)

    async def handler(message: object) -> None:
        raise AssertionError("nothing may be delivered")

    with pytest.raises(MattermostAPIError, match="[Cc]ertificate"):
        await adapter.start(handler)  # and it closes what it opened (no unclosed-session warning)
    assert not fake.calls  # the TLS handshake failed before any request reached the server


async def test_with_verification_off_rest_and_websocket_work_over_tls(
    fake: FakeMattermost, start_bot: BotFactory
) -> None:
    alice = fake.add_user("alice")
    channel = fake.add_channel("incidents", [alice, fake.bot_user_id])
    bot = await start_bot(verify_tls=False)
    assert bot.adapter.websocket_url.startswith("wss://")
    post = await fake.user_posts(alice, channel, "@opsbot over tls?")
    await fake.wait_for(
        lambda: any(p["root_id"] == post["id"] and "request `" in p["message"] for p in fake.bot_posts())
    )
