"""Kubernetes provider (kubernetes-asyncio): what is unhealthy and why, read-only.

For the objects a question names (or, with none named, the whole scope as an overview) it reads:
pods that are not healthy (CrashLoopBackOff, OOMKilled, Pending, ImagePullBackOff, not Ready) with
restart counts and last termination reason / exit code; Warning events; the log tail of failing
containers, previous container too; Deployments / StatefulSets with rollout status and recent
revisions; node conditions. Scope: ``kubernetes.namespaces`` (narrowed by the channel's scope,
``ContextRequest.namespaces``) and ``kubernetes.label_selector``.

Only get / list calls are made (see ``deploy/rbac.yaml``); Secrets are never read. Env values of
secret-like names are replaced here already, the rest of the redaction happens in the gatherer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, TypeVar

from kubernetes_asyncio import client, config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException

from bot.config import KubernetesSettings
from bot.context.base import ContextProvider, ContextRequest, ContextSection, ProviderResult, ProviderStatus
from bot.context.entities import Entities
from bot.redact import REDACTED, is_secret_name

logger = logging.getLogger(__name__)

SOURCE = "Kubernetes"
CHANGE_REVIEW = "change_review"

_BAD_WAITING = frozenset(
    {
        "CrashLoopBackOff",
        "ImagePullBackOff",
        "ErrImagePull",
        "CreateContainerConfigError",
        "CreateContainerError",
        "InvalidImageName",
        "RunContainerError",
        "PostStartHookError",
        "ContainerCannotRun",
    }
)
_MAX_LOG_PODS = 3
_MAX_LOG_STREAMS = 6
_MAX_EVENTS = 200
_MAX_REVISIONS = 5
_SKIPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)

T = TypeVar("T")


@dataclass(slots=True)
class _Partial:
    """Calls that failed while others succeeded (e.g. nodes forbidden to a namespaced Role)."""

    errors: list[str] = field(default_factory=list)
    queries: list[str] = field(default_factory=list)


def _ts(value: datetime | None) -> str:
    if value is None:
        return "?"
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _api_error(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        body = exc.body[:300] if isinstance(exc.body, str) else ""
        return f"HTTP {exc.status} {exc.reason}: {body}".strip()
    return f"{type(exc).__name__}: {exc}"


class KubernetesProvider(ContextProvider):
    """Reads one cluster through a kubeconfig file and context, or in-cluster."""

    name = SOURCE

    def __init__(self, settings: KubernetesSettings) -> None:
        self.settings = settings
        self._api: client.ApiClient | None = None
        self._lock = asyncio.Lock()
        self._target = f"kubeconfig {settings.kubeconfig}" if settings.kubeconfig else "in-cluster"

    @property
    def target(self) -> str:
        """The API server URL once connected (before: the kubeconfig it will read)."""
        return self._target

    @property
    def timeout_s(self) -> float:
        """``kubernetes.timeout_s``."""
        return self.settings.timeout_s

    async def _client(self) -> client.ApiClient:
        async with self._lock:
            if self._api is None:
                configuration = client.Configuration()
                if self.settings.kubeconfig is not None:
                    await config.load_kube_config(
                        config_file=str(self.settings.kubeconfig),
                        context=self.settings.context,
                        client_configuration=configuration,
                        persist_config=False,
                    )
                else:
                    try:
                        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
                    except ConfigException:
                        await config.load_kube_config(
                            context=self.settings.context,
                            client_configuration=configuration,
                            persist_config=False,
                        )
                # Required-field checks of the generated models would turn one odd object from the
                # server (a node without nodeInfo.architecture) into a failed answer.
                configuration.client_side_validation = False
                self._api = client.ApiClient(configuration=configuration)
                self._target = str(configuration.host)
            return self._api

    async def close(self) -> None:
        """Close the API client's connection pool."""
        if self._api is not None:
            await self._api.close()
            self._api = None

    async def fetch(self, request: ContextRequest) -> ProviderResult:
        """Pods, events, logs, workloads and nodes relevant to ``request``."""
        try:
            api = await self._client()
        except (ConfigException, OSError, ValueError) as exc:
            return ProviderResult.failed(
                SOURCE, self.target, "load kubeconfig", f"cannot configure client: {exc}"
            )
        reader = _Reader(api, self.settings, request)
        try:
            sections = await reader.read()
        except ApiException as exc:
            return ProviderResult.failed(
                SOURCE, self.target, "; ".join(reader.partial.queries), _api_error(exc)
            )
        except Exception as exc:  # aiohttp connection errors and the like
            if isinstance(exc, asyncio.CancelledError):
                raise
            return ProviderResult.failed(
                SOURCE, self.target, "; ".join(reader.partial.queries), _api_error(exc)
            )
        return ProviderResult(
            source=SOURCE,
            status=ProviderStatus.OK if sections else ProviderStatus.EMPTY,
            sections=sections,
            query="; ".join(reader.partial.queries),
            error="; ".join(reader.partial.errors) or None,
            target=self.target,
        )


class _Reader:
    """One gathering pass: the API calls and the sections built from their answers."""

    def __init__(self, api: client.ApiClient, settings: KubernetesSettings, request: ContextRequest) -> None:
        self.core = client.CoreV1Api(api)
        self.apps = client.AppsV1Api(api)
        self.settings = settings
        self.request = request
        self.entities: Entities = request.entities
        self.partial = _Partial()
        self.call_timeout = settings.timeout_s
        self.namespaces = self._scope()

    def _scope(self) -> list[str] | None:
        """Namespaces to read (``None``: all namespaces the service account may list)."""
        # The channel's scope (already inside the configured namespaces) narrows the configuration.
        allowed = (
            list(self.request.namespaces) if self.request.namespaces is not None else self.settings.namespaces
        )
        named = self.entities.namespaces
        if named and allowed:
            inside = [n for n in named if n in allowed]
            outside = [n for n in named if n not in allowed]
            if outside:
                self.partial.errors.append(
                    f"namespace(s) {', '.join(outside)} outside opsbot's configured scope"
                )
            return inside or list(allowed)
        if named:
            return list(named)
        return list(allowed) or None

    # -- API calls --------------------------------------------------------------------------------

    async def _list(
        self,
        what: str,
        namespaced: Callable[..., Awaitable[Any]],
        everywhere: Callable[..., Awaitable[Any]],
        **kwargs: Any,
    ) -> list[Any]:
        """Items of a list call over the scope (per namespace concurrently, or all namespaces)."""
        kwargs["_request_timeout"] = self.call_timeout
        # One page per call: a huge cluster must not blow the deadline; a cut is noted.
        kwargs.setdefault("limit", self.settings.list_limit)
        if self.namespaces is None:
            self.partial.queries.append(f"list {what} (all namespaces)")
            answers = [await everywhere(**kwargs)]
        else:
            self.partial.queries.append(f"list {what} in {','.join(self.namespaces)}")
            answers = await asyncio.gather(*(namespaced(ns, **kwargs) for ns in self.namespaces))
        if any(a.metadata is not None and a.metadata._continue for a in answers):
            self.partial.errors.append(
                f"{what}: only the first {self.settings.list_limit} per namespace were read"
            )
        return [item for answer in answers for item in answer.items]

    async def _optional(self, what: str, call: Awaitable[T], default: T) -> T:
        """A call whose failure (403 to a namespaced Role, 404) leaves a note instead of failing all."""
        try:
            return await call
        except ApiException as exc:
            self.partial.errors.append(f"{what}: {_api_error(exc)}")
            return default

    def _selector(self) -> dict[str, Any]:
        return {"label_selector": self.settings.label_selector} if self.settings.label_selector else {}

    async def read(self) -> list[ContextSection]:
        change_review = self.request.scenario == CHANGE_REVIEW
        want_workloads = change_review or bool(self.entities.workload_names()) or self.entities.is_empty()
        pods_call = self._list(
            "pods", self.core.list_namespaced_pod, self.core.list_pod_for_all_namespaces, **self._selector()
        )
        events_call = self._optional(
            "events",
            self._list(
                "events",
                self.core.list_namespaced_event,
                self.core.list_event_for_all_namespaces,
                field_selector="type=Warning",
            ),
            [],
        )
        nodes_call = self._optional("nodes", self._nodes(), [])
        workload_calls = (
            [
                self._optional(kind, self._workloads(kind), [])
                for kind in ("deployments", "statefulsets", "replicasets")
            ]
            if want_workloads
            else [_none(), _none(), _none()]
        )
        pods, events, nodes, deployments, statefulsets, replicasets = await asyncio.gather(
            pods_call, events_call, nodes_call, *workload_calls
        )
        focus = self._focus_pods(pods)
        unhealthy = [p for p in pods if pod_problems(p)]
        sections: list[ContextSection] = []
        # Nothing named, or names that match no pod: the overview gives the model its bearings.
        if not self.entities.has_objects() or (not focus and not self.entities.nodes):
            sections.append(self._overview(pods, unhealthy))
        shown = _unique_pods([*[p for p in focus if pod_problems(p)], *unhealthy])
        if focus and not shown:
            shown = focus
        if shown:
            sections.append(
                ContextSection(
                    source=SOURCE,
                    title="Pods that are not healthy"
                    if not focus
                    else "Pods in question first, then other pods that are not healthy",
                    body="\n".join(pod_line(p) for p in _unique_pods([*focus, *shown])[:60]),
                    priority=10,
                    unit="more pods",
                    drop_from="end",
                )
            )
        details = list(focus)[:_MAX_LOG_PODS] or unhealthy[:1]
        if details:
            sections.append(
                ContextSection(
                    source=SOURCE,
                    title="Pod details (images, resources, env, annotations)",
                    body="\n".join(line for p in details for line in pod_details(p)),
                    priority=25,
                    unit="pod detail lines",
                    drop_from="end",
                )
            )
        # Logs of the failing pods asked about; with none asked about, of the first failing pods.
        failing_focus = [p for p in focus if pod_problems(p) or restarts(p)]
        sections.extend(await self._logs(failing_focus if focus else unhealthy))
        event_section = self._events(events, focus)
        if event_section is not None:
            sections.append(event_section)
        if want_workloads:
            section = self._workload_section(deployments, statefulsets, replicasets, change_review)
            if section is not None:
                sections.append(section)
        node_section = self._node_section(nodes)
        if node_section is not None:
            sections.append(node_section)
        return sections

    async def _nodes(self) -> list[Any]:
        self.partial.queries.append("list nodes")
        answer = await self.core.list_node(_request_timeout=self.call_timeout)
        return list(answer.items)

    async def _workloads(self, kind: str) -> list[Any]:
        calls: dict[str, tuple[Callable[..., Awaitable[Any]], Callable[..., Awaitable[Any]]]] = {
            "deployments": (
                self.apps.list_namespaced_deployment,
                self.apps.list_deployment_for_all_namespaces,
            ),
            "statefulsets": (
                self.apps.list_namespaced_stateful_set,
                self.apps.list_stateful_set_for_all_namespaces,
            ),
            "replicasets": (
                self.apps.list_namespaced_replica_set,
                self.apps.list_replica_set_for_all_namespaces,
            ),
        }
        namespaced, everywhere = calls[kind]
        selector = self._selector() if kind != "replicasets" else {}
        return await self._list(kind, namespaced, everywhere, **selector)

    # -- choosing ---------------------------------------------------------------------------------

    def _focus_pods(self, pods: Sequence[Any]) -> list[Any]:
        """Pods the question names directly or through their workload, service or node."""
        names = set(self.entities.pods)
        prefixes = tuple(f"{w}-" for w in self.entities.workload_names())
        nodes = set(self.entities.nodes)
        chosen = []
        for pod in pods:
            meta = pod.metadata
            labels = meta.labels or {}
            app = labels.get("app.kubernetes.io/name") or labels.get("app")
            owners = {o.name for o in meta.owner_references or []}
            if (
                meta.name in names
                or (prefixes and meta.name.startswith(prefixes))
                or (app and app in self.entities.workload_names())
                or owners & set(self.entities.workload_names())
                or (pod.spec and pod.spec.node_name in nodes)
            ):
                chosen.append(pod)
        return sorted(chosen, key=lambda p: (0 if pod_problems(p) else 1, -restarts(p)))

    # -- sections ---------------------------------------------------------------------------------

    def _overview(self, pods: Sequence[Any], unhealthy: Sequence[Any]) -> ContextSection:
        by_namespace: dict[str, dict[str, int]] = {}
        for pod in pods:
            phases = by_namespace.setdefault(pod.metadata.namespace, {})
            phase = (pod.status.phase if pod.status else None) or "Unknown"
            phases[phase] = phases.get(phase, 0) + 1
        bad: dict[str, int] = {}
        for pod in unhealthy:
            bad[pod.metadata.namespace] = bad.get(pod.metadata.namespace, 0) + 1
        lines = [
            f"{ns}: {sum(phases.values())} pods ("
            + ", ".join(f"{n} {phase}" for phase, n in sorted(phases.items()))
            + f"), {bad.get(ns, 0)} not healthy"
            for ns, phases in sorted(by_namespace.items(), key=lambda item: (-bad.get(item[0], 0), item[0]))
        ]
        scope = ", ".join(self.namespaces) if self.namespaces else "all namespaces"
        return ContextSection(
            source=SOURCE,
            title=f"Cluster overview ({scope}): {len(pods)} pods, {len(unhealthy)} not healthy",
            body="\n".join(lines) or "no pods",
            priority=8,
            unit="more namespaces",
            drop_from="end",
        )

    async def _logs(self, pods: Sequence[Any]) -> list[ContextSection]:
        wanted: list[tuple[Any, str, bool]] = []
        for pod in pods[:_MAX_LOG_PODS]:
            for status in _container_statuses(pod):
                failing = status.restart_count or (
                    status.state and status.state.waiting and status.state.waiting.reason in _BAD_WAITING
                )
                terminated = status.state and status.state.terminated
                if not failing and not (terminated and terminated.exit_code):
                    continue
                if not (
                    status.state
                    and status.state.waiting
                    and status.state.waiting.reason != "CrashLoopBackOff"
                ):
                    wanted.append((pod, status.name, False))
                if status.last_state and status.last_state.terminated:
                    wanted.append((pod, status.name, True))
        wanted = wanted[:_MAX_LOG_STREAMS]
        tails = await asyncio.gather(
            *(self._log(pod, container, previous) for pod, container, previous in wanted)
        )
        sections = []
        for (pod, container, previous), text in zip(wanted, tails, strict=True):
            if not text:
                continue
            which = "previous container" if previous else "current container"
            where = f"{pod.metadata.namespace}/{pod.metadata.name}/{container}"
            sections.append(
                ContextSection(
                    source=SOURCE,
                    title=f"Log tail of {where} ({which}, newest last)",
                    body=text.rstrip("\n"),
                    priority=30 if previous else 32,
                    unit=f"older log lines of {where}",
                    drop_from="start",
                )
            )
        return sections

    async def _log(self, pod: Any, container: str, previous: bool) -> str:
        ns, name = pod.metadata.namespace, pod.metadata.name
        self.partial.queries.append(
            f"log {ns}/{name}/{container}{' previous' if previous else ''} "
            f"tail {self.settings.log_tail_lines}"
        )
        if self.settings.log_tail_lines == 0:
            return ""
        try:
            text = await self.core.read_namespaced_pod_log(
                name,
                ns,
                container=container,
                previous=previous,
                tail_lines=self.settings.log_tail_lines,
                _request_timeout=self.call_timeout,
            )
        except ApiException as exc:
            # A container that never started has no log: that is a fact, not a failure.
            if exc.status not in (400, 404):
                self.partial.errors.append(f"log {ns}/{name}/{container}: {_api_error(exc)}")
            return ""
        return str(text or "")

    def _events(self, events: Sequence[Any], focus: Sequence[Any]) -> ContextSection | None:
        if not events:
            return None
        related = (
            {p.metadata.name for p in focus} | set(self.entities.workload_names()) | set(self.entities.nodes)
        )
        prefixes = tuple(f"{w}-" for w in self.entities.workload_names())

        def is_related(event: Any) -> bool:
            obj = event.involved_object
            return bool(obj and (obj.name in related or (prefixes and (obj.name or "").startswith(prefixes))))

        chosen = [e for e in events if is_related(e)] if self.entities.has_objects() else list(events)
        if not chosen:
            chosen = list(events)
        chosen.sort(key=_event_time)
        chosen = chosen[-_MAX_EVENTS:]
        lines = []
        for event in chosen:
            obj = event.involved_object
            what = f"{(obj.kind or '').lower()}/{obj.name}" if obj else "?"
            count = f" x{event.count}" if event.count and event.count > 1 else ""
            ns = event.metadata.namespace if event.metadata else ""
            lines.append(
                f"{_ts(_event_time(event))} {ns} {what} {event.reason}{count}: {event.message or ''}".strip()
            )
        scope = ", ".join(self.namespaces) if self.namespaces else "all namespaces"
        return ContextSection(
            source=SOURCE,
            title=f"Warning events in {scope} (oldest first)",
            body="\n".join(lines),
            priority=20,
            unit="older events",
            drop_from="start",
        )

    def _workload_section(
        self,
        deployments: Sequence[Any],
        statefulsets: Sequence[Any],
        replicasets: Sequence[Any],
        change: bool,
    ) -> ContextSection | None:
        names = set(self.entities.workload_names())
        lines: list[str] = []
        for deployment in deployments:
            meta = deployment.metadata
            if names and meta.name not in names:
                continue
            if not names and not change and deployment_healthy(deployment):
                continue
            lines.append(deployment_line(deployment))
            owned = [
                r for r in replicasets if any(o.name == meta.name for o in r.metadata.owner_references or [])
            ]
            owned.sort(key=_revision, reverse=True)
            for rs in owned[:_MAX_REVISIONS]:
                lines.append("  " + replicaset_line(rs))
        for sts in statefulsets:
            meta = sts.metadata
            if names and meta.name not in names:
                continue
            if not names and not change and statefulset_healthy(sts):
                continue
            lines.append(statefulset_line(sts))
        if not lines:
            return None
        return ContextSection(
            source=SOURCE,
            title="Deployments and StatefulSets: rollout status and recent revisions (newest first)",
            body="\n".join(lines),
            priority=5 if change else 35,
            unit="more workload lines",
            drop_from="end",
        )

    def _node_section(self, nodes: Sequence[Any]) -> ContextSection | None:
        if not nodes:
            return None
        named = set(self.entities.nodes)
        problems = [n for n in nodes if node_problems(n) or n.metadata.name in named]
        ready = sum(1 for n in nodes if not any(p.startswith("NotReady") for p in node_problems(n)))
        lines = [node_line(n) for n in problems]
        with_problems = sum(1 for n in nodes if node_problems(n))
        return ContextSection(
            source=SOURCE,
            title=f"Nodes: {len(nodes)} total, {ready} Ready, {with_problems} with problems",
            body="\n".join(lines) or "all nodes Ready, no pressure",
            priority=12 if named else 40,
            unit="more nodes",
            drop_from="end",
        )


async def _none() -> list[Any]:
    return []


def _unique_pods(pods: Iterable[Any]) -> list[Any]:
    seen: dict[tuple[str, str], Any] = {}
    for pod in pods:
        seen.setdefault((pod.metadata.namespace, pod.metadata.name), pod)
    return list(seen.values())


def _container_statuses(pod: Any) -> list[Any]:
    status = pod.status
    if status is None:
        return []
    return [*(status.init_container_statuses or []), *(status.container_statuses or [])]


def restarts(pod: Any) -> int:
    """Restarts of all the pod's containers."""
    return sum(s.restart_count or 0 for s in _container_statuses(pod))


def pod_problems(pod: Any) -> list[str]:
    """Why ``pod`` is not healthy (empty: healthy or finished)."""
    status = pod.status
    if status is None:
        return ["no status"]
    phase = status.phase or "Unknown"
    if phase == "Succeeded":
        return []
    problems: list[str] = []
    if phase in ("Pending", "Failed", "Unknown"):
        reason = status.reason or ""
        for condition in status.conditions or []:
            if condition.type == "PodScheduled" and condition.status == "False":
                reason = f"{condition.reason}: {condition.message}"
        problems.append(f"{phase}{' (' + reason + ')' if reason else ''}")
    for cs in _container_statuses(pod):
        state = cs.state
        if state and state.waiting and state.waiting.reason and state.waiting.reason != "ContainerCreating":
            problems.append(f"{cs.name} {state.waiting.reason}")
        if state and state.terminated and state.terminated.exit_code:
            problems.append(
                f"{cs.name} terminated {state.terminated.reason} exit {state.terminated.exit_code}"
            )
        last = cs.last_state.terminated if cs.last_state else None
        if last and last.reason == "OOMKilled":
            problems.append(f"{cs.name} OOMKilled")
        if (cs.restart_count or 0) >= 3 and not any(p.startswith(cs.name) for p in problems):
            problems.append(f"{cs.name} restarting")
    if phase == "Running":
        for condition in status.conditions or []:
            if condition.type == "Ready" and condition.status != "True":
                problems.append("not Ready")
    return list(dict.fromkeys(problems))


def pod_line(pod: Any) -> str:
    """One line for ``pod``: phase, readiness, restarts, per-container state and last termination."""
    meta, status = pod.metadata, pod.status
    statuses = (status.container_statuses or []) if status else []
    ready = sum(1 for s in statuses if s.ready)
    parts = [
        f"{meta.namespace}/{meta.name}",
        (status.phase if status else None) or "Unknown",
        f"ready {ready}/{len(statuses) or len(pod.spec.containers if pod.spec else [])}",
        f"restarts {restarts(pod)}",
    ]
    if pod.spec and pod.spec.node_name:
        parts.append(f"node {pod.spec.node_name}")
    problems = pod_problems(pod)
    if problems:
        parts.append("problems: " + "; ".join(problems))
    for cs in _container_statuses(pod):
        last = cs.last_state.terminated if cs.last_state else None
        if last:
            parts.append(
                f"{cs.name} last terminated {last.reason or '?'} exit code {last.exit_code} "
                f"at {_ts(last.finished_at)}"
            )
        if cs.state and cs.state.waiting and cs.state.waiting.message:
            parts.append(f"{cs.name} waiting: {cs.state.waiting.message[:300]}")
    return " | ".join(parts)


def _env_value(env: Any) -> str:
    if env.value_from is not None:
        ref = env.value_from
        if ref.secret_key_ref is not None:
            return f"<from secret {ref.secret_key_ref.name} key {ref.secret_key_ref.key}>"
        if ref.config_map_key_ref is not None:
            return f"<from configmap {ref.config_map_key_ref.name} key {ref.config_map_key_ref.key}>"
        if ref.field_ref is not None:
            return f"<from field {ref.field_ref.field_path}>"
        return "<from resource>"
    if is_secret_name(env.name):
        return REDACTED
    return str(env.value or "")


def pod_details(pod: Any) -> list[str]:
    """Images, resources, env (secret-named values replaced) and annotations of ``pod``."""
    meta = pod.metadata
    lines = [f"{meta.namespace}/{meta.name}:"]
    owners = ", ".join(f"{o.kind}/{o.name}" for o in meta.owner_references or [])
    if owners:
        lines.append(f"  owner: {owners}")
    for container in pod.spec.containers if pod.spec else []:
        resources = container.resources
        req = dict(resources.requests or {}) if resources else {}
        lim = dict(resources.limits or {}) if resources else {}
        lines.append(
            f"  container {container.name}: image {container.image}; "
            f"requests {req or '-'}; limits {lim or '-'}"
        )
        for env in container.env or []:
            lines.append(f"    env {env.name}={_env_value(env)}")
    for key, value in sorted((meta.annotations or {}).items()):
        if key in _SKIPPED_ANNOTATIONS:
            continue
        shown = REDACTED if is_secret_name(key.rsplit("/", 1)[-1]) else str(value)[:500]
        lines.append(f"  annotation {key}: {shown}")
    return lines


def _event_time(event: Any) -> datetime:
    stamp = (
        getattr(event, "last_timestamp", None)
        or getattr(event, "event_time", None)
        or getattr(event, "first_timestamp", None)
        or (event.metadata.creation_timestamp if event.metadata else None)
    )
    if isinstance(stamp, datetime):
        return stamp if stamp.tzinfo else stamp.replace(tzinfo=UTC)
    return datetime.min.replace(tzinfo=UTC)


def _revision(rs: Any) -> int:
    try:
        return int((rs.metadata.annotations or {}).get("deployment.kubernetes.io/revision", "0"))
    except ValueError:
        return 0


def _images(template: Any) -> str:
    containers = template.spec.containers if template and template.spec else []
    return ", ".join(f"{c.name}={c.image}" for c in containers)


def deployment_healthy(deployment: Any) -> bool:
    """All replicas updated, ready and available."""
    want = deployment.spec.replicas if deployment.spec and deployment.spec.replicas is not None else 1
    status = deployment.status
    return bool(
        status
        and (status.ready_replicas or 0) >= want
        and (status.updated_replicas or 0) >= want
        and (status.available_replicas or 0) >= want
        and not status.unavailable_replicas
    )


def deployment_line(deployment: Any) -> str:
    """Rollout status of a Deployment, with its failing conditions and images."""
    meta, spec, status = deployment.metadata, deployment.spec, deployment.status
    want = spec.replicas if spec and spec.replicas is not None else 1
    parts = [
        f"deployment {meta.namespace}/{meta.name}",
        f"revision {(meta.annotations or {}).get('deployment.kubernetes.io/revision', '?')}",
        f"replicas {want} desired, {status.updated_replicas or 0} updated, "
        f"{status.ready_replicas or 0} ready, {status.available_replicas or 0} available",
        "rollout complete" if deployment_healthy(deployment) else "rollout NOT complete",
    ]
    for condition in status.conditions or []:
        if condition.status != "True" or condition.reason == "ProgressDeadlineExceeded":
            parts.append(f"{condition.type}={condition.status} {condition.reason}: {condition.message}")
    parts.append(f"images {_images(spec.template if spec else None)}")
    return " | ".join(parts)


def replicaset_line(rs: Any) -> str:
    """One revision of a Deployment (its ReplicaSet): when, what image, how many pods, why."""
    meta, status = rs.metadata, rs.status
    cause = (meta.annotations or {}).get("kubernetes.io/change-cause")
    return (
        f"revision {_revision(rs)} created {_ts(meta.creation_timestamp)} replicaset {meta.name}: "
        f"{status.ready_replicas or 0}/{status.replicas or 0} ready, "
        f"images {_images(rs.spec.template if rs.spec else None)}"
        + (f", change-cause: {cause}" if cause else "")
    )


def statefulset_healthy(sts: Any) -> bool:
    """All replicas ready and on the update revision."""
    want = sts.spec.replicas if sts.spec and sts.spec.replicas is not None else 1
    status = sts.status
    return bool(
        status
        and (status.ready_replicas or 0) >= want
        and (not status.update_revision or status.current_revision == status.update_revision)
    )


def statefulset_line(sts: Any) -> str:
    """Rollout status of a StatefulSet (current vs update revision)."""
    meta, spec, status = sts.metadata, sts.spec, sts.status
    want = spec.replicas if spec and spec.replicas is not None else 1
    return " | ".join(
        [
            f"statefulset {meta.namespace}/{meta.name}",
            f"replicas {want} desired, {status.ready_replicas or 0} ready, "
            f"{status.current_replicas or 0} current, {status.updated_replicas or 0} updated",
            f"current revision {status.current_revision}, update revision {status.update_revision}",
            "rollout complete" if statefulset_healthy(sts) else "rollout NOT complete",
            f"images {_images(spec.template if spec else None)}",
        ]
    )


def node_problems(node: Any) -> list[str]:
    """``NotReady`` and pressure conditions of ``node``, and whether it is cordoned."""
    problems = []
    for condition in node.status.conditions or [] if node.status else []:
        if condition.type == "Ready" and condition.status != "True":
            problems.append(f"NotReady ({condition.reason}: {condition.message})")
        elif condition.type != "Ready" and condition.status == "True":
            problems.append(f"{condition.type} ({condition.reason}: {condition.message})")
    if node.spec and node.spec.unschedulable:
        problems.append("cordoned (unschedulable)")
    return problems


def node_line(node: Any) -> str:
    """One line for ``node``: its problems, capacity and taints."""
    allocatable = dict(node.status.allocatable or {}) if node.status else {}
    taints = ", ".join(
        f"{t.key}={t.value or ''}:{t.effect}" for t in (node.spec.taints or [] if node.spec else [])
    )
    problems = node_problems(node)
    return " | ".join(
        [
            f"node {node.metadata.name}",
            "; ".join(problems) if problems else "Ready, no pressure",
            f"allocatable cpu {allocatable.get('cpu', '?')} memory {allocatable.get('memory', '?')}",
            *([f"taints {taints}"] if taints else []),
        ]
    )
