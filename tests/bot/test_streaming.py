"""Splitting, per-channel pacing and throttled edits shared by every chat adapter."""

from __future__ import annotations

import asyncio
import time

import pytest

from bot.adapters.ratelimit import RateBudget
from bot.adapters.streaming import StreamingReply, format_footer_line, split_text
from bot.types import FinalAnswer, SourceNote


def test_short_text_is_one_piece() -> None:
    assert split_text("hello", 100) == ["hello"]


def test_split_prefers_paragraph_boundaries_and_respects_the_limit() -> None:
    paragraphs = [f"paragraph {i} " + "x" * 50 for i in range(30)]
    pieces = split_text("\n\n".join(paragraphs), 200)
    assert all(len(p) <= 200 for p in pieces)
    assert "\n\n".join(pieces) == "\n\n".join(paragraphs)


def test_an_oversized_code_block_is_cut_between_lines_and_refenced() -> None:
    code = "```bash\n" + "\n".join(f"kubectl get pods -n ns{i}" for i in range(100)) + "\n```"
    pieces = split_text("Intro.\n\n" + code + "\n\nOutro.", 300)
    assert all(len(p) <= 300 for p in pieces)
    fenced = [p for p in pieces if "kubectl" in p]
    assert len(fenced) > 1
    for piece in fenced:  # every piece opens and closes its own fence, so each renders as code
        assert "```bash\n" in piece and piece.count("```") % 2 == 0
    joined = "\n".join(pieces)
    assert all(f"kubectl get pods -n ns{i}\n" in joined for i in range(100))


def test_an_overlong_line_is_cut_hard() -> None:
    pieces = split_text("y" * 1000, 300)
    assert [len(p) for p in pieces] == [300, 300, 300, 100]


async def test_a_channel_bucket_of_one_keeps_posts_to_one_channel_an_interval_apart() -> None:
    budget = RateBudget(channel_limits={"post": (0.05, 1)})
    starts: list[float] = []

    async def post() -> None:
        async with budget.slot("post", "C1"):
            starts.append(time.monotonic())

    await asyncio.gather(*(post() for _ in range(5)))
    gaps = [b - a for a, b in zip(starts, starts[1:], strict=False)]
    assert all(g >= 0.05 - 1e-3 for g in gaps)


class RecordingReply(StreamingReply):
    def __init__(self, **kw: object) -> None:
        super().__init__(channel="C1", thread_id="T1", **kw)  # type: ignore[arg-type]
        self.calls: list[tuple[str, float, str, str, bool]] = []
        self._n = 0

    async def _post(self, text: str, final: FinalAnswer | None) -> str:
        self._n += 1
        self.calls.append(("post", time.monotonic(), f"m{self._n}", text, final is not None))
        return f"m{self._n}"

    async def _edit(self, message_id: str, text: str, final: FinalAnswer | None) -> None:
        self.calls.append(("edit", time.monotonic(), message_id, text, final is not None))


async def test_edits_are_throttled_and_the_final_answer_is_split_with_footer_last() -> None:
    reply = RecordingReply(limit=100, edit_interval_s=0.05)
    await reply.start()
    text = ""
    for i in range(60):
        text += f"word{i} "
        await reply.update(text)
        await asyncio.sleep(0.005)
    final_text = "\n\n".join(f"para {i} " + "z" * 40 for i in range(6))
    await reply.finish(FinalAnswer(request_id="r1", text=final_text))
    edits = [c for c in reply.calls if c[0] == "edit"]
    # The first words replace the placeholder at once; the edits after them keep the interval.
    times = [c[1] for c in edits if c[2] == "m1"]
    assert all(b - a >= 0.05 - 1e-3 for a, b in zip(times, times[1:], strict=False))
    assert len(edits) < 60  # coalesced, not one edit per token
    posts = [c for c in reply.calls if c[0] == "post"]
    assert posts[0][3] == reply.placeholder
    finals = [c for c in reply.calls if c[4]]
    assert len(finals) == 1 and finals[0] is reply.calls[-1]
    assert len(reply.message_ids) > 1
    assert all(len(c[3]) <= 100 for c in reply.calls)


def test_footer_names_sources_failures_left_out_and_timings_with_units() -> None:
    answer = FinalAnswer(
        request_id="r",
        text="t",
        sources=[
            SourceNote("kubernetes", "ok"),
            SourceNote("prometheus", "timeout", "after 2 s at http://p"),
        ],
        left_out=["40 older events"],
        ttft_ms=120.0,
        total_ms=2500.0,
        output_tokens=42,
    )
    line = format_footer_line(answer)
    assert "kubernetes" in line and "prometheus (timeout: after 2 s at http://p)" in line
    assert "left out: 40 older events" in line
    assert "first token 0.12 s" in line and "total 2.50 s" in line and "42 tokens" in line


@pytest.mark.parametrize("limit", [10, 0])
def test_split_rejects_absurd_limits(limit: int) -> None:
    with pytest.raises(ValueError):
        split_text("abc" * 100, limit)


async def test_finishing_at_any_moment_never_edits_sooner_than_the_interval() -> None:
    # finish() may land while an edit is in flight, just done, or waiting: each time the final
    # edit must still come a full interval after the previous one completed.
    for attempt in range(40):
        reply = RecordingReply(limit=1000, edit_interval_s=0.02)
        await reply.start()
        for i in range(attempt % 7 + 1):
            await reply.update(f"partial {i}")
            await asyncio.sleep(0.003 * (attempt % 5))
        await reply.finish(FinalAnswer(request_id="r", text="done"))
        times = [c[1] for c in reply.calls if c[2] == "m1" and c[0] == "edit"]  # after the placeholder
        gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
        assert all(g >= 0.02 - 1e-3 for g in gaps), (attempt, gaps)


def test_a_failed_source_is_one_short_footer_line_with_its_reason_and_no_queries() -> None:
    queries = "; ".join(f'rate(container_cpu_usage_seconds_total{{pod="api-{i}"}}[5m])' for i in range(20))
    detail = (
        "Prometheus failed at http://prom:9090: cannot reach http://prom:9090/api/v1/query: refused "
        f"(query: {queries})"
    )
    answer = FinalAnswer(request_id="r", text="t", sources=[SourceNote("Prometheus", "failed", detail)])
    line = format_footer_line(answer)
    assert "\n" not in line and "rate(" not in line and len(line) < 250
    assert "failed: Prometheus (failed: Prometheus failed at http://prom:9090: cannot reach" in line
