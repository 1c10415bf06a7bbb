"""The bot side's errors, a small drawn tree (the engine's own tree is in ``inference.engine``)::

    OpsbotError
    ├── ConfigError              bot.config: one line naming the key and the fix
    ├── StoreError               bot.store.db: the database cannot be used (URL masked)
    ├── AnswerStalled            bot.progress: an answer made no progress for ``answer.stall_s``
    ├── RetriesExhausted         bot.retry: the policy gives up (the transports map it to a branch below)
    ├── BudgetTimeout            bot.adapters.ratelimit: no slot in time (BudgetStalled: none can come)
    ├── PrometheusError          bot.context.prometheus: a query failed (the footer names it)
    ├── RunbookError             bot.context.runbooks: a runbook could not be read
    ├── PayloadError             bot.context.alertmanager: an Alertmanager body is not one (400)
    ├── InputError               bot.analyze.readers: an input for ``opsbot analyze`` cannot be read
    ├── CaseError                bot.eval.cases: an eval case is malformed
    ├── DefaultModelUnavailable  bot.default_model: the default model cannot be fetched
    ├── EventLoopUnavailable     bot.event_loop: ``event_loop = "uvloop"`` without uvloop
    ├── StartupError             bot.app: ``opsbot run`` cannot start (a port taken, a platform
    │                            token refused), found before the model loads: the key and the fix
    ├── ActionError              bot.actions.catalog: a proposal outside the catalog or its schema
    ├── ApplyError               bot.actions.kube_apply: a dry run or apply failed (the API's status text)
    └── PlatformError            a chat platform call failed for good (a reply, an edit, a read)
        ├── PlatformRejected         the platform refused the call itself (4xx or ``ok: false``:
        │                            not_in_channel, channel_not_found, invalid_auth, ...): retrying
        │                            cannot help
        ├── PlatformThrottled        still rate limited after the retry policy's ``patience_s``
        └── PlatformUnavailable      5xx, timeouts or connection errors after ``max_retries``

Each adapter maps its platform's failures into this tree in one place (``bot.adapters.slack_api``:
``SlackCallError``; ``bot.adapters.mattermost_rest``: ``MattermostAPIError``; their subclasses
also derive from the branch they belong to). The pipeline maps a branch to a request status
(:attr:`PlatformError.request_status`) and never handles a platform's own exception types.
Errors that were ``ValueError`` / ``RuntimeError`` before joining the tree still are (a second base).
"""

from __future__ import annotations


class OpsbotError(Exception):
    """Base of every error opsbot raises on purpose."""


class AnswerStalled(OpsbotError):
    """The answer watchdog (:mod:`bot.progress`) stopped an answer that made no progress."""

    request_status = "stalled"
    """The request status the pipeline records."""


class StartupError(OpsbotError):
    """``opsbot run`` cannot start for a reason found before the model loads (the HTTP port is
    taken, a chat platform refuses its token); one line naming the key and the fix."""


class PlatformError(OpsbotError):
    """A call to the chat platform failed for good (after the retry policy, where it applies)."""

    request_status = "undelivered"
    """The request status the pipeline records when an answer fails this way."""


class PlatformRejected(PlatformError):
    """The platform refused the call (a 4xx or an ``ok: false`` error code); retrying cannot help."""


class PlatformThrottled(PlatformError):
    """Still rate limited after ``retry.patience_s``."""

    request_status = "throttled"


class PlatformUnavailable(PlatformError):
    """The platform kept failing (5xx, timeouts, connection errors) for ``retry.max_retries`` retries."""


def platform_branch(*, http_status: int | None, exhausted: str | None = None) -> type[PlatformError]:
    """The branch of a failed platform call: ``exhausted`` is the retry policy's reason when it gave up
    (``rate_limited`` / ``failures``); otherwise a 4xx (or an ``ok: false`` answer) is a rejection."""
    if exhausted == "rate_limited":
        return PlatformThrottled
    if exhausted == "failures" or http_status is None or http_status >= 500:
        return PlatformUnavailable
    return PlatformRejected
