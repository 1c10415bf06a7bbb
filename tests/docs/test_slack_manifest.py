"""docs/slack-app-manifest.yaml against the code: what opsbot calls and listens to, the manifest grants.

The Web API methods are read out of the bot's source (every string that names one, plus the
rate budgets' method names), the events and the slash command out of its bolt registrations. Each
method is mapped to its bot scopes from Slack's method reference. A method the code starts to call
that is not in :data:`METHOD_SCOPES` fails here until someone looks up its scopes; a scope the
manifest asks for that nothing needs fails too (least privilege: workspace admins read this list).
"""

from __future__ import annotations

import ast
import copy
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from bot.config import SLACK_RATE_LIMITS, SlackSettings

ROOT = Path(__file__).resolve().parents[2]
MANIFEST = ROOT / "docs" / "slack-app-manifest.yaml"
HTTP_MANIFEST = ROOT / "docs" / "slack-app-manifest-http.yaml"
SOURCES = sorted((ROOT / "bot").rglob("*.py"))
"""Every module of the bot: a Slack call made outside the adapter (a start-up check, say) counts too."""

_CONVERSATION_KINDS = ("channels", "groups", "im", "mpim")
"""Public channels, private channels, direct messages, group direct messages: opsbot works in all."""

METHOD_SCOPES: dict[str, frozenset[str]] = {
    # docs.slack.dev/reference/methods/<method>, "Bot token" scopes. Methods that accept any of
    # several scopes list the one this manifest grants.
    "auth.test": frozenset(),
    # apps.connections.open takes the app-level token (connections:write), which is no bot scope:
    # it is made on the app's Basic Information page, not granted by oauth_config.
    "apps.connections.open": frozenset(),
    "chat.postMessage": frozenset({"chat:write"}),
    "chat.postEphemeral": frozenset({"chat:write"}),
    "chat.update": frozenset({"chat:write"}),
    "chat.startStream": frozenset({"chat:write"}),
    "chat.appendStream": frozenset({"chat:write"}),
    "chat.stopStream": frozenset({"chat:write"}),
    # accepts chat:write or assistant:write (Slack's 2026-03 scope update)
    "assistant.threads.setStatus": frozenset({"chat:write"}),
    "reactions.add": frozenset({"reactions:write"}),
    "reactions.remove": frozenset({"reactions:write"}),
    "conversations.replies": frozenset(f"{kind}:history" for kind in _CONVERSATION_KINDS),
    "conversations.history": frozenset(f"{kind}:history" for kind in _CONVERSATION_KINDS),
    "conversations.info": frozenset(f"{kind}:read" for kind in _CONVERSATION_KINDS),
    "users.info": frozenset({"users:read"}),
    "files.getUploadURLExternal": frozenset({"files:write"}),
    "files.completeUploadExternal": frozenset({"files:write"}),
}

EVENT_SUBSCRIPTIONS: dict[str, dict[str, frozenset[str]]] = {
    # bolt's event name -> the manifest's bot_events for it -> the scope each needs
    # (docs.slack.dev/reference/events/<event>).
    "app_mention": {"app_mention": frozenset({"app_mentions:read"})},
    "message": {f"message.{kind}": frozenset({f"{kind}:history"}) for kind in _CONVERSATION_KINDS},
    # needs no scope of its own, but only reaches apps with the assistant view (assistant:write)
    "assistant_thread_started": {"assistant_thread_started": frozenset({"assistant:write"})},
}

_METHOD = re.compile(
    r"^(auth|apps|assistant|bookmarks|bots|canvases|chat|conversations|dnd|emoji|files|pins|reactions|"
    r"reminders|search|stars|team|usergroups|users|views)\.[a-zA-Z]+(\.[a-zA-Z]+)?$"
)
# chat.googleapis.com is a host name and chat.log a file name, not methods
_HOST = re.compile(r"\.(com|net|org|io|dev|log|txt|json|jsonl|md|png|db|yaml|toml)$")


@pytest.fixture(scope="module")
def manifest() -> dict:
    return yaml.safe_load(MANIFEST.read_text())


@pytest.fixture(scope="module")
def trees() -> list[ast.Module]:
    assert (ROOT / "bot" / "adapters" / "slack.py") in SOURCES, "bot/adapters/slack.py moved?"
    return [ast.parse(path.read_text(), str(path)) for path in SOURCES]


def methods_called(trees: list[ast.Module]) -> set[str]:
    """Every Slack Web API method named in the bot's source, and every rate-budgeted one."""
    named = {
        node.value
        for tree in trees
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _METHOD.match(node.value)
        and not _HOST.search(node.value)
    }
    return named | set(SLACK_RATE_LIMITS)


def _imports_bolt(tree: ast.Module) -> bool:
    return any(
        isinstance(node, ast.ImportFrom) and (node.module or "").startswith("slack_bolt")
        for node in tree.body
    )


def bolt_registrations(trees: list[ast.Module]) -> dict[str, list[ast.Call]]:
    """``app.event(...)``, ``app.command(...)``, ``app.action(...)`` ... by listener kind, in the
    modules that build a bolt app (elsewhere ``app`` is aiohttp's)."""
    found: dict[str, list[ast.Call]] = {}
    for tree in filter(_imports_bolt, trees):
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "app"
            ):
                found.setdefault(node.func.attr, []).append(node)
    return found


def events_listened(trees: list[ast.Module]) -> set[str]:
    events = set()
    for call in bolt_registrations(trees).get("event", []):
        (arg,) = call.args
        assert isinstance(arg, ast.Constant), f"app.event with a computed name at line {call.lineno}"
        events.add(arg.value)
    return events


def granted(manifest: dict) -> set[str]:
    return set(manifest["oauth_config"]["scopes"]["bot"])


def test_the_scan_finds_the_methods_opsbot_is_known_to_call(trees: list[ast.Module]) -> None:
    # Guards the scan itself: if these vanish, the scan is broken (not the code suddenly quieter).
    assert {"chat.postMessage", "reactions.add", "conversations.replies", "users.info"} <= methods_called(
        trees
    )
    assert {"app_mention", "message"} <= events_listened(trees)


def test_every_method_the_code_calls_has_known_scopes(trees: list[ast.Module]) -> None:
    unknown = sorted(methods_called(trees) - set(METHOD_SCOPES))
    assert not unknown, (
        f"opsbot now calls {unknown}: look up each method's bot scopes at "
        "docs.slack.dev/reference/methods, add them to METHOD_SCOPES here and to the manifest"
    )


def test_the_manifest_grants_every_scope_the_methods_need(trees: list[ast.Module], manifest: dict) -> None:
    missing = {
        method: sorted(METHOD_SCOPES[method] - granted(manifest))
        for method in methods_called(trees) & set(METHOD_SCOPES)
        if METHOD_SCOPES[method] - granted(manifest)
    }
    assert not missing, f"docs/slack-app-manifest.yaml lacks scopes for {missing}"


def test_the_manifest_subscribes_to_every_event_the_code_listens_to(
    trees: list[ast.Module], manifest: dict
) -> None:
    events = events_listened(trees)
    unknown = sorted(events - set(EVENT_SUBSCRIPTIONS))
    assert not unknown, f"opsbot now listens to {unknown}: add them to EVENT_SUBSCRIPTIONS and the manifest"
    subscribed = set(manifest["settings"]["event_subscriptions"]["bot_events"])
    for event in events:
        for bot_event, scopes in EVENT_SUBSCRIPTIONS[event].items():
            assert bot_event in subscribed, f"manifest bot_events lacks {bot_event} (opsbot handles {event})"
            assert scopes <= granted(manifest), f"{bot_event} needs {sorted(scopes - granted(manifest))}"
    extra = subscribed - {name for event in events for name in EVENT_SUBSCRIPTIONS[event]}
    assert not extra, f"manifest subscribes to {sorted(extra)}, which opsbot does not handle"


def test_no_scope_is_granted_that_nothing_needs(trees: list[ast.Module], manifest: dict) -> None:
    needed = {scope for method in methods_called(trees) for scope in METHOD_SCOPES.get(method, ())}
    needed |= {
        s for e in events_listened(trees) for scopes in EVENT_SUBSCRIPTIONS[e].values() for s in scopes
    }
    if bolt_registrations(trees).get("command"):
        needed.add("commands")
    assert granted(manifest) - needed == set(), "unused scopes in the manifest"


def test_the_slash_command_is_the_one_opsbot_answers(trees: list[ast.Module], manifest: dict) -> None:
    assert bolt_registrations(trees).get("command"), "the adapter no longer registers a slash command"
    commands = [c["command"] for c in manifest["features"]["slash_commands"]]
    assert commands == [SlackSettings().command]
    assert "commands" in granted(manifest)


def test_interactivity_is_on_because_the_feedback_buttons_need_it(
    trees: list[ast.Module], manifest: dict
) -> None:
    listeners = bolt_registrations(trees)
    unknown = sorted(set(listeners) - {"event", "command", "action"})
    assert not unknown, f"the adapter registers app.{unknown}: say in the manifest what they need"
    assert bool(listeners.get("action")) == manifest["settings"]["interactivity"]["is_enabled"]


def test_socket_mode_is_on_as_in_the_default_configuration(manifest: dict) -> None:
    # slack.mode defaults to "socket": the manifest must make an app that mode can connect to, with
    # a bot user to post as and the Messages tab open for direct messages.
    assert SlackSettings.model_fields["mode"].default == "socket"
    assert manifest["settings"]["socket_mode_enabled"] is True
    assert "request_url" not in manifest["settings"]["event_subscriptions"]
    assert manifest["features"]["bot_user"]["display_name"]
    assert manifest["features"]["app_home"]["messages_tab_enabled"] is True
    assert manifest["features"]["app_home"]["messages_tab_read_only_enabled"] is False


def test_the_guide_names_the_manifest_and_every_setting_it_tells_people_to_set() -> None:
    guide = (ROOT / "docs" / "slack.md").read_text()
    assert "slack-app-manifest.yaml" in guide and "connections:write" in guide
    assert "slack-app-manifest-http.yaml" in guide
    for variable in re.findall(r"OPSBOT_SLACK__[A-Z_]+", guide):
        field = variable.removeprefix("OPSBOT_SLACK__").lower()
        assert field in SlackSettings.model_fields, (
            f"docs/slack.md names {variable}, which opsbot does not read"
        )


def test_the_http_mode_manifest_is_the_same_app_posting_to_the_path_opsbot_serves(manifest: dict) -> None:
    http = yaml.safe_load(HTTP_MANIFEST.read_text())
    settings, (command,) = http["settings"], http["features"]["slash_commands"]
    urls = [
        settings["event_subscriptions"]["request_url"],
        settings["interactivity"]["request_url"],
        command["url"],
    ]
    for url in urls:
        # one Request URL for events, commands and buttons: slack.events_path on opsbot's server
        assert urlsplit(url).scheme == "https" and urlsplit(url).path == SlackSettings().events_path
    assert settings["socket_mode_enabled"] is False
    same = copy.deepcopy(http)
    del (
        same["settings"]["event_subscriptions"]["request_url"],
        same["settings"]["interactivity"]["request_url"],
    )
    del same["features"]["slash_commands"][0]["url"]
    same["settings"]["socket_mode_enabled"] = True
    assert same == manifest, "the two manifests differ in more than the HTTP mode's URLs"
