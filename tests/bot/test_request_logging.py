"""Every log line of one request carries its id, from where the event enters to the store."""

from __future__ import annotations

import io
import json
import logging
from typing import Any

import pytest

from bot.logs import JsonFormatter, RequestIdFilter, TextFormatter, setup_logging


class Collect(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []
        self.addFilter(RequestIdFilter())

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def collected() -> Any:
    handler = Collect()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        yield handler
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)


async def test_every_opsbot_line_written_while_answering_carries_the_request_id(
    parts: Any, collected: Any
) -> None:
    message = parts.adapter.to_message("why is api-gateway crashlooping?")
    await parts.adapter._submit(message)
    ours = [
        r
        for r in collected.records
        # the store's writer task serves every request at once; its lines are about batches
        if r.name.startswith(("bot.", "inference.")) and r.name != "bot.store.buffer"
    ]
    assert ours, "the answer wrote no log line at DEBUG"
    assert {r.name for r in ours} >= {"bot.pipeline", "inference.cpu_engine"}
    missing = [f"{r.name}: {r.getMessage()}" for r in ours if r.request_id != message.request_id]  # type: ignore[attr-defined]
    assert missing == []


async def test_the_id_is_on_the_text_and_json_lines_and_absent_outside_a_request(parts: Any) -> None:
    for formatter in (TextFormatter(), JsonFormatter()):
        stream = io.StringIO()
        setup_logging("DEBUG", stream=stream)
        logging.getLogger().handlers[0].setFormatter(formatter)
        try:
            message = parts.adapter.to_message("is the database up?")
            await parts.adapter._submit(message)
            logging.getLogger("bot.test").info("outside any request")
        finally:
            logging.getLogger().handlers.clear()
        lines = [line for line in stream.getvalue().splitlines() if line.strip()]
        pipeline_lines = [line for line in lines if "bot.pipeline" in line]
        outside = [line for line in lines if "outside any request" in line]
        assert pipeline_lines and outside
        if isinstance(formatter, JsonFormatter):
            assert all(json.loads(line)["request_id"] == message.request_id for line in pipeline_lines)
            assert "request_id" not in json.loads(outside[0])
        else:
            assert all(f"[request_id={message.request_id}]" in line for line in pipeline_lines)
            assert "request_id=" not in outside[0]
