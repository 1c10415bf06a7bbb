"""Batch analysis inside a running bot: ``POST /analyze`` on opsbot's HTTP server.

``POST /analyze?scenario=alert_summary&since=...&until=...&post=slack:C123&format=auto&name=...``
takes the input as the request body (the same formats as ``opsbot analyze``: Alertmanager JSON,
JSONL of alerts or Kubernetes events, log text), answers ``202`` at once with the job id, the
records read and the bad lines (line numbers), and runs the analysis as work in flight of the
pipeline (shutdown stops it and keeps what is done). Its items go through the bot's own engine in
the **background lane**: admission holds them while urgent work waits or prefills, so ``/rca``
answers and alert summaries are never delayed by a batch.

``GET /analyze/{job}`` answers the job's state (``running`` with items done / total, ``done``
with the report, ``failed``, ``interrupted``); ``GET /analyze/{job}/report.md`` (``report.json``,
``counts.png``) serves the report files. The job id is a hash of the body and the parameters:
posting the same input again while it runs answers the running job, and after a restart resumes
from the results already in its folder (``analyze.out_dir``, one sub-folder per job).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from aiohttp import web

from bot.analyze.job import SCENARIOS, JobSpec, Prepared, finish, prepare
from bot.analyze.post import ChannelPoster, parse_target, post_summary
from bot.analyze.progress import LogProgress
from bot.analyze.readers import FORMATS, InputError, describe_bad_lines, parse_when, read_bytes
from bot.analyze.records import ReadResult
from bot.analyze.report import COUNTS_PNG, REPORT_JSON, REPORT_MD
from bot.analyze.results import ResultLog, run_id
from bot.analyze.runner import BatchRunner, EngineExecutor
from bot.config import Settings
from bot.pipeline import Pipeline
from bot.prompts import PromptBuilder
from bot.store import Store

logger = logging.getLogger(__name__)

_FILES = {REPORT_MD: "text/markdown", REPORT_JSON: "application/json", COUNTS_PNG: "image/png"}


@dataclass(slots=True)
class AnalyzeJob:
    """One in-bot analysis and its state."""

    id: str
    spec: JobSpec
    read: ReadResult
    post: tuple[str, str] | None
    status: str = "queued"
    """``queued``, ``running``, ``done``, ``failed`` or ``interrupted``."""
    error: str | None = None
    progress: LogProgress = field(default_factory=LogProgress)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    report: dict[str, Any] | None = None
    thread: str | None = None

    def state(self) -> dict[str, Any]:
        """What ``GET /analyze/{job}`` answers."""
        out: dict[str, Any] = {
            "job": self.id,
            "status": self.status,
            "scenario": self.spec.scenario,
            "items_done": self.progress.done,
            "items": self.progress.total,
            "records": len(self.read.records),
            "bad_lines": len(self.read.bad_lines),
            "out_dir": str(self.spec.out_dir),
        }
        if self.error:
            out["error"] = self.error
        if self.thread:
            out["posted_thread"] = self.thread
        if self.report is not None:
            out["report"] = self.report
            out["files"] = {name: f"/analyze/{self.id}/{name}" for name in _FILES}
        return out


class AnalyzeService:
    """``POST /analyze`` and ``GET /analyze/...`` (see the module doc)."""

    def __init__(
        self,
        settings: Settings,
        pipeline: Pipeline,
        store: Store,
        adapters_by_platform: Mapping[str, ChannelPoster],
        *,
        model: str,
    ) -> None:
        self.settings = settings
        self.pipeline = pipeline
        self.store = store
        self.adapters = dict(adapters_by_platform)
        self.model = model
        self.base = settings.analyze.out_dir or settings.data_dir / "analyze"
        self.jobs: dict[str, AnalyzeJob] = {}
        self.accepting = True
        self._tokenizer: Any = None

    def http_routes(self) -> list[web.RouteDef]:
        """The routes, for the HTTP app."""
        return [
            web.post("/analyze", self.handle_post),
            web.get("/analyze/{job}", self.handle_status),
            web.get("/analyze/{job}/{name}", self.handle_file),
        ]

    def stop(self) -> None:
        """Shutdown: take no new jobs; running ones stop at once (finished items are kept)."""
        self.accepting = False
        for job in self.jobs.values():
            job.stop.set()

    def _refused(self, request: web.Request) -> web.Response | None:
        token = self.settings.analyze.bearer_token
        if token is None:
            return None
        given = request.headers.get("Authorization", "")
        if hmac.compare_digest(given.encode(), f"Bearer {token.get_secret_value()}".encode()):
            return None
        return web.json_response({"error": "missing or wrong bearer token"}, status=401)

    async def handle_post(self, request: web.Request) -> web.Response:
        """Validate, read the body, answer 202 with the job, run it in the background lane."""
        if (refusal := self._refused(request)) is not None:
            return refusal
        if not self.accepting:
            return web.json_response({"error": "opsbot is shutting down; retry"}, status=503)
        query = request.query
        try:
            scenario = query.get("scenario", SCENARIOS[0])
            since = parse_when(query["since"]) if query.get("since") else None
            until = parse_when(query["until"]) if query.get("until") else None
            fmt = query.get("format", "auto")
            if fmt not in FORMATS:
                raise ValueError(f"format must be one of {', '.join(FORMATS)}")
            target = parse_target(query["post"]) if query.get("post") else None
            if target is not None and target[0] not in self.adapters:
                raise ValueError(f"post={query['post']}: no {target[0]} adapter is running in this bot")
            body = await request.read()
            if not body.strip():
                raise ValueError(
                    "the request body is empty: send the alerts, events or log lines as the body"
                )
            name = Path(query.get("name") or "upload").name
            job_id = _job_id(body, scenario, since, until, fmt)
            running = self.jobs.get(job_id)
            if running is not None and running.status in ("queued", "running"):
                return web.json_response(running.state(), status=202)
            read = await asyncio.to_thread(read_bytes, body, name, fmt)
            cfg = self.settings.analyze
            spec = JobSpec(
                input_name=name,
                scenario=scenario,
                out_dir=self.base / job_id,
                since=since,
                until=until,
                max_tokens=int(query["max_tokens"]) if query.get("max_tokens") else cfg.max_tokens,
                max_groups=cfg.max_groups,
                max_group_lines=cfg.max_group_lines,
                instance_labels=cfg.instance_labels,
            )
        except (ValueError, InputError) as exc:
            return web.json_response({"error": str(exc)}, status=400)
        if not read.records:
            return web.json_response(
                {"error": "no records could be read", "bad_lines": describe_bad_lines(read.bad_lines)},
                status=400,
            )
        job = AnalyzeJob(job_id, spec, read, target)
        self.jobs[job_id] = job
        self.pipeline.track(self._run(job, body), f"analyze-{job_id}")
        answer = job.state() | {
            "status_url": f"/analyze/{job_id}",
            "bad_line_list": describe_bad_lines(read.bad_lines),
        }
        return web.json_response(answer, status=202)

    async def handle_status(self, request: web.Request) -> web.Response:
        """The job's state; a job from before a restart is answered from its report file."""
        if (refusal := self._refused(request)) is not None:
            return refusal
        job_id = request.match_info["job"]
        job = self.jobs.get(job_id)
        if job is not None:
            return web.json_response(job.state())
        report = self.base / _safe(job_id) / REPORT_JSON
        if report.is_file():
            return web.Response(body=report.read_bytes(), content_type="application/json")
        return web.json_response({"error": f"no analysis {job_id}"}, status=404)

    async def handle_file(self, request: web.Request) -> web.StreamResponse:
        """``report.md``, ``report.json`` or ``counts.png`` of a job."""
        if (refusal := self._refused(request)) is not None:
            return refusal
        name = request.match_info["name"]
        path = self.base / _safe(request.match_info["job"]) / name
        if name not in _FILES or not path.is_file():
            return web.json_response({"error": f"no {name} for this analysis"}, status=404)
        return web.FileResponse(path, headers={"Content-Type": _FILES[name]})

    async def _run(self, job: AnalyzeJob, body: bytes) -> None:
        job.status = "running"
        try:
            job.spec.out_dir.mkdir(parents=True, exist_ok=True)
            (job.spec.out_dir / f"input-{job.spec.input_name}").write_bytes(body)
            prepared = await asyncio.to_thread(self._prepare, job)
            runner = BatchRunner(
                results=ResultLog(job.spec.out_dir),
                store=self.store,
                run_id=run_id(job.spec.out_dir, {"job": job.id, "scenario": job.spec.scenario}),
                model=self.model,
                progress=job.progress,
                channel=job.post[1] if job.post else None,
            )
            executor = EngineExecutor(
                self.pipeline.engine, self.settings.analyze.max_in_flight, runner.request_id
            )
            summary = await runner.run(prepared.plan.items, executor, prepared.sampling, job.stop)
            report, files = await asyncio.to_thread(finish, prepared, runner, summary, self.model)
            job.report = report
            if summary.interrupted:
                job.status = "interrupted"
                return
            if job.post is not None:
                platform, channel = job.post
                job.thread = await post_summary(
                    self.adapters[platform], channel, report, report_path=f"/analyze/{job.id}/{REPORT_MD}"
                )
            job.status = "done" if not summary.failed else "failed"
            if summary.failed:
                job.error = f"{summary.failed} items failed; post the same input again to retry them"
            logger.info("analysis %s: %s (%s)", job.id, job.status, files.markdown)
        except asyncio.CancelledError:
            job.status = "interrupted"
            raise
        except Exception as exc:
            logger.exception("analysis %s failed", job.id)
            job.status, job.error = "failed", f"{type(exc).__name__}: {exc}"

    def _prepare(self, job: AnalyzeJob) -> Prepared:
        """Plan in a worker thread with a tokenizer of its own: the engine's is used on the event loop
        at the same time, and a fast tokenizer must not be used from two threads at once."""
        from inference.tokenization import HFChatTokenizer

        if self._tokenizer is None:
            engine_cfg = self.settings.engine
            if engine_cfg.backend == "openai" and not engine_cfg.tokenizer:
                # The model server tokenizes (one HTTP connection per thread: safe from here).
                self._tokenizer = self.pipeline.prompts.tokenizer
            else:
                self._tokenizer = HFChatTokenizer(
                    engine_cfg.tokenizer or self.model, trust_remote_code=engine_cfg.trust_remote_code
                )
        prompts = self.pipeline.prompts
        builder = PromptBuilder(
            self._tokenizer,
            system_prompt=prompts.system_prompt,
            max_model_len=prompts.max_model_len,
            context_share=self.settings.prompt.context_share,
            history_share=self.settings.prompt.history_share,
        )
        return prepare(job.spec, job.read, builder, self.pipeline.scenarios)


def _job_id(body: bytes, scenario: str, since: datetime | None, until: datetime | None, fmt: str) -> str:
    digest = hashlib.sha256(body)
    digest.update(f"|{scenario}|{since}|{until}|{fmt}".encode())
    return digest.hexdigest()[:16]


def _safe(job_id: str) -> str:
    """A job id as a folder name (ids are hex; anything else never names a folder here)."""
    return job_id if job_id.isalnum() else "-"
