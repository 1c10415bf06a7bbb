"""Approval-gated actions under attack and under load, through the real wire protocols.

For each platform (Slack in HTTP mode: signed ``block_actions``; Mattermost: the fake server
forwarding clicks to ``/mattermost/actions``), against the fake Kubernetes API with a write
ServiceAccount and a SQLite store:

The fakes' platform rate limits are off (the bench measures opsbot's path, not Slack's posting
limit).

1. ``--attempts`` fuzzed clicks (``tests/fakes/click_fuzz.py``: forged users, tampered values,
   malformed values, another channel, replays of an applied proposal, an expired proposal,
   unsigned / badly signed / stale requests): each must be refused; the number that changed
   anything on the API is counted (target 0).
2. ``--approvals`` proposals (a scale each), each approved by an approver: the time from sending
   the click to the API server receiving the real (not dry-run) write, on one clock
   (``time.perf_counter`` in this process, which hosts the fakes and opsbot alike). Target P99
   <= 1 s.

    python bench/actions_bench.py --attempts 150 --approvals 200 --out bench/results/actions_bench-DATE
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for _p in (ROOT, ROOT / "tests", ROOT / "bench"):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from aiohttp import web  # noqa: E402
from fakes.actions_world import NS, actions_settings, applied, cluster  # noqa: E402
from fakes.click_fuzz import Attempt, attempts  # noqa: E402
from fakes.mattermost_server import FakeMattermost  # noqa: E402
from fakes.slack_server import FakeSlack  # noqa: E402
from run_meta import package_versions, run_meta  # noqa: E402

from bot.actions.catalog import ActionSpec  # noqa: E402
from bot.actions.service import ActionService, ThreadRef  # noqa: E402
from bot.adapters.mattermost import MattermostAdapter  # noqa: E402
from bot.adapters.slack import SlackAdapter  # noqa: E402
from bot.config import MattermostSettings, SlackSettings, StoreSettings  # noqa: E402
from bot.eval.kube_api import KubernetesSnapshotServer  # noqa: E402
from bot.store import Store  # noqa: E402

APPROVER_SLACK = "U0APPROVER"


async def _serve(routes: list[web.RouteDef]) -> tuple[web.AppRunner, str]:
    app = web.Application()
    app.add_routes(routes)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


async def _write_after(
    kube: KubernetesSnapshotServer, before: int, sent: float, timeout_s: float = 10.0
) -> float:
    """Seconds from ``sent`` to the first real write after the first ``before`` ones."""
    deadline = time.perf_counter() + timeout_s
    while True:
        real = [w for w in kube.writes if not w.dry_run and w.status == 200]
        if len(real) > before:
            return real[before].at - sent
        if time.perf_counter() > deadline:
            raise AssertionError("no write arrived")
        await asyncio.sleep(0.001)


async def slack_run(tmp: Path, n_attempts: int, n_approvals: int) -> dict[str, Any]:
    kube = cluster()
    await kube.start()
    store = await Store.open(f"sqlite+aiosqlite:///{tmp / 'slack.db'}", StoreSettings())
    # the fakes' platform rate limits are off: this measures opsbot's decision path, not Slack's
    # per-channel posting limit (the cards of 200 proposals in one channel would take minutes)
    async with FakeSlack(tiers={}, channel_post=None) as fake:
        settings = SlackSettings(
            enabled=True,
            mode="http",
            bot_token=fake.bot_token,
            signing_secret=fake.signing_secret,
            api_base_url=fake.api_url,
            rate_budgets=False,
            retry={"initial_s": 0.05},
        )
        adapter = SlackAdapter(settings, store)
        runner, url = await _serve(adapter.http_routes())
        await adapter.start(lambda message: None)  # type: ignore[arg-type,return-value]
        policy = {"match": ["C1"], "approvers": [APPROVER_SLACK]}
        svc = ActionService(actions_settings(kube, tmp, policies=[policy], verify_s=0.2), store)
        svc.attach({"slack": adapter})
        adapter.actions = svc
        events_url = url + settings.events_path

        async def click(
            card_id: str, user: str, value: str, channel: str = "C1", transport: str = "signed"
        ) -> int:
            card = fake.find("C1", card_id)
            assert card is not None
            payload = fake.block_action(card, user, "opsbot_action_approve", value)
            payload["channel"]["id"] = payload["container"]["channel_id"] = channel
            kwargs: dict[str, Any] = {}
            if transport == "bad_secret":
                kwargs["secret"] = "not-the-secret"
            elif transport in ("stale", "no_headers"):
                kwargs["timestamp"] = 1_700_000_000
            post = await fake.post_to_app(events_url, "interactive", payload, **kwargs)
            return post.status

        def value_of(card_id: str, which: str = "opsbot_action_approve") -> str:
            card = fake.find("C1", card_id)
            assert card is not None
            block = next(b for b in card.blocks or [] if b["type"] == "actions")
            return next(e["value"] for e in block["elements"] if e["action_id"] == which)

        result = await _run(
            "slack",
            svc,
            kube,
            click,
            value_of,
            APPROVER_SLACK,
            "C1",
            "C2",
            ("bad_secret", "stale"),
            n_attempts,
            n_approvals,
        )
        await svc.drain(5)
        await svc.close()
        await adapter.stop()
        await adapter.close()
        await runner.cleanup()
    await store.close()
    await kube.stop()
    return result


async def mattermost_run(tmp: Path, n_attempts: int, n_approvals: int) -> dict[str, Any]:
    import socket

    kube = cluster()
    await kube.start()
    store = await Store.open(f"sqlite+aiosqlite:///{tmp / 'mm.db'}", StoreSettings())
    async with FakeMattermost(rate_limit=None) as fake:
        approver = fake.add_user("approver")
        channel = fake.add_channel("incidents", [approver, fake.bot_user_id])
        other = fake.add_channel("elsewhere", [approver, fake.bot_user_id])
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        sock.close()
        settings = MattermostSettings(
            enabled=True,
            **fake.settings_kwargs(),
            public_url=url,
            action_secret="x",
            rate_budgets=False,
            channel_post_interval_s=0.0,
        )
        adapter = MattermostAdapter(settings, store)
        app = web.Application()
        app.add_routes(adapter.http_routes())
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", int(url.rsplit(":", 1)[1])).start()
        await adapter.start(lambda message: None)  # type: ignore[arg-type,return-value]
        policy = {"match": [channel], "approvers": [approver]}
        svc = ActionService(actions_settings(kube, tmp, policies=[policy], verify_s=0.2), store)
        svc.attach({"mattermost": adapter})
        adapter.actions = svc

        async def click(
            card_id: str, user: str, value: str, where: str = channel, transport: str = "signed"
        ) -> int:
            if (
                transport == "signed"
                and user == approver
                and where == channel
                and value == _buttons(card_id).get("Approve")
            ):
                # a genuine click: the (fake) Mattermost server forwards it; every other attempt is a
                # forger POSTing to /mattermost/actions itself, the stronger attacker
                status, _ = await fake.click_button(card_id, "Approve", user)
                return status
            context: dict[str, Any] = {"action": "opsbot_action", "value": value}
            if transport == "no_signature":
                context["value"] = value.rsplit(":", 1)[0]
            body = {
                "user_id": user,
                "user_name": "x",
                "channel_id": where,
                "team_id": fake.team_id,
                "post_id": card_id,
                "trigger_id": "t",
                "type": "",
                "data_source": "",
                "context": context,
            }
            import aiohttp

            async with (
                aiohttp.ClientSession() as session,
                session.post(url + "/mattermost/actions", json=body) as resp,
            ):
                await resp.read()
                return resp.status

        def _buttons(card_id: str) -> dict[str, str]:
            actions = fake.posts[card_id]["props"]["attachments"][0].get("actions", [])
            return {a["name"]: a["integration"]["context"]["value"] for a in actions}

        def value_of(card_id: str, which: str = "Approve") -> str:
            return _buttons(card_id)[which]

        result = await _run(
            "mattermost",
            svc,
            kube,
            click,
            value_of,
            approver,
            channel,
            other,
            ("no_signature",),
            n_attempts,
            n_approvals,
        )
        await svc.drain(5)
        await svc.close()
        await adapter.stop()
        await adapter.close()
        await runner.cleanup()
    await store.close()
    await kube.stop()
    return result


async def _run(
    platform: str,
    svc: ActionService,
    kube: KubernetesSnapshotServer,
    click: Any,
    value_of: Any,
    approver: str,
    channel: str,
    other_channel: str,
    unsigned: tuple[str, ...],
    n_attempts: int,
    n_approvals: int,
) -> dict[str, Any]:
    where = ThreadRef(platform, channel, None, "U0ASKER")
    reject_word = "opsbot_action_reject" if platform == "slack" else "Reject"

    def scale(n: int) -> ActionSpec:
        return ActionSpec("scale", {"kind": "deployment", "namespace": NS, "name": "api", "replicas": n})

    # 1. fuzz: a live proposal, an applied one, another one, an expired one
    live = await svc.propose(ActionSpec("cordon", {"kind": "node", "name": "worker-1"}), ["disk"], where)
    done = await svc.propose(scale(4), ["load"], where)
    other = await svc.propose(scale(5), ["load"], where)
    short = ActionService(svc.settings.model_copy(update={"expiry_s": 0.05}), svc.audit.store)
    short.attach(svc.adapters)
    late = await short.propose(ActionSpec("uncordon", {"kind": "node", "name": "worker-1"}), ["x"], where)
    await short.close()
    assert live.card_id and done.card_id and other.record and late.card_id, (live, done, other, late)
    done_value = value_of(done.card_id)  # before approving: a decided card has no buttons
    assert await click(done.card_id, approver, done_value) == 200
    await _write_after(kube, 0, 0.0)
    await asyncio.sleep(0.1)
    tried: list[Attempt] = attempts(
        live_approve=value_of(live.card_id),
        live_reject=value_of(live.card_id, reject_word),
        other_id=other.record.id,
        applied_approve=done_value,
        expired_approve=value_of(late.card_id),
        approver=approver,
        channel=channel,
        other_channel=other_channel,
        unsigned_transports=unsigned,
        count=n_attempts,
    )
    writes_before = len(applied(kube))
    statuses: dict[int, int] = {}
    by_kind: dict[str, int] = {}
    for attempt in tried:
        status = await click(
            live.card_id, attempt.user or "U0", attempt.value, attempt.channel, attempt.transport
        )
        statuses[status] = statuses.get(status, 0) + 1
        by_kind[attempt.kind] = by_kind.get(attempt.kind, 0) + 1
    await asyncio.sleep(0.5)  # Slack decides after the ack: let the last ones finish
    changed = len(applied(kube)) - writes_before
    refused_audited = sum(1 for e in await svc.audit.events() if e.event == "refused")

    # 2. approve -> applied latency
    latencies: list[float] = []
    for i in range(n_approvals):
        proposal = await svc.propose(scale(1 + i % 9), [f"load step {i}"], where)
        assert proposal.card_id
        value = value_of(proposal.card_id)
        before = len(applied(kube))
        sent = time.perf_counter()
        assert await click(proposal.card_id, approver, value) == 200
        latencies.append(await _write_after(kube, before, sent))
    return {
        "platform": platform,
        "attempts": len(tried),
        "attempts_by_kind": by_kind,
        "http_statuses": statuses,
        "applied_by_attempts": changed,
        "refusals_in_audit": refused_audited,
        "approvals": n_approvals,
        "approve_to_applied_ms": {
            "p50": round(statistics.median(latencies) * 1000, 1),
            "p99": round(_percentile(latencies, 99) * 1000, 1),
            "max": round(max(latencies) * 1000, 1),
            "mean": round(statistics.fmean(latencies) * 1000, 1),
        },
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        slack = await slack_run(Path(tmp), args.attempts, args.approvals)
        mm = await mattermost_run(Path(tmp), args.attempts, args.approvals)
    return {"slack": slack, "mattermost": mm}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attempts", type=int, default=150, help="fuzzed clicks per platform")
    parser.add_argument("--approvals", type=int, default=200, help="approved proposals per platform")
    parser.add_argument("--out", type=Path, help="write OUT.json and OUT.md")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    results = asyncio.run(main_async(args))
    meta = run_meta(sys.argv if argv is None else ["bench/actions_bench.py", *argv])
    meta.update(package_versions("aiohttp", "slack_bolt", "sqlalchemy"))
    try:
        import subprocess

        meta["commit"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
        ).stdout.strip()
    except OSError:
        pass
    data = {"meta": meta, "results": results}
    total = sum(r["attempts"] for r in results.values())
    changed = sum(r["applied_by_attempts"] for r in results.values())
    lines = [
        f"# actions_bench {meta['date']}",
        "",
        f"`{meta['command']}` at commit `{meta.get('commit', '?')}`",
        f"on {meta['gpu']}, Python {meta['python']}",
        "",
        f"Fuzzed clicks: {total} across both platforms, {changed} applied (target 0).",
        "",
        "| platform | attempts | by kind | HTTP statuses | applied | refusals audited | approvals "
        "| approve -> applied P50 / P99 / max ms |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in results.values():
        ms = r["approve_to_applied_ms"]
        kinds = ", ".join(f"{k} {v}" for k, v in sorted(r["attempts_by_kind"].items()))
        lines.append(
            f"| {r['platform']} | {r['attempts']} | {kinds} | {r['http_statuses']} "
            f"| {r['applied_by_attempts']} | "
            f"{r['refusals_in_audit']} | {r['approvals']} | {ms['p50']} / {ms['p99']} / {ms['max']} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)  # noqa: T201
    if args.out:
        args.out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
        args.out.with_suffix(".md").write_text(text)
    return 0 if changed == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
