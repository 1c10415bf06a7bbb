"""Kubernetes provider: what is unhealthy and why, following the cluster's own links, read-only.

One gathering is three rounds of concurrent API calls, each bounded by ``kubernetes.timeout_s``:

1. **lists** of the scope (``kubernetes.namespaces`` narrowed by the channel's scope, else all
   namespaces, listed from the API): pods, Warning events, nodes, Deployments, StatefulSets,
   DaemonSets, Services, Jobs, CronJobs, HPAs, PVCs
   (:mod:`bot.context.kube_snapshot`). The question is matched against them
   (:mod:`bot.context.matching`): exact names, typos, short names, ``app`` labels, a namespace or a
   node alone; ties go to the more broken pod. With nothing matched, the most broken pods lead.
2. **logs** of the pods in question, current and previous, every container, whether or not they
   restarted, read whole up to ``kubernetes.log_tail_lines`` and condensed by signature
   (:mod:`bot.context.logsig`); the PersistentVolumes and StorageClasses behind their claims; the
   ReplicaSets (revisions) of their namespaces.
3. **hops** (:mod:`bot.context.hops`): the logs of what they depend on (env hosts, hosts and IPs in
   their error lines, names their logs mention) and those Services' EndpointSlices, of the cluster
   DNS pods after a DNS failure, and of the neighbours on their node that could starve it.

The sections (:mod:`bot.context.kube_sections`) rank every line, so the budget keeps the decisive
ones; :class:`~bot.context.base.Findings` tell Prometheus what to query next. Only get / list calls
are made (see ``deploy/base/rbac.yaml``); Secrets are never read, ConfigMaps only those the pods in
question reference, with ``kubernetes.read_configmaps`` (their values redacted).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

from kubernetes_asyncio import client, config
from kubernetes_asyncio.config.config_exception import ConfigException

from bot.config import KubernetesSettings
from bot.context import hops, kube_sections, matching
from bot.context import kube_objects as ko
from bot.context.base import (
    ContextProvider,
    ContextRequest,
    ContextSection,
    Findings,
    ProviderResult,
    ProviderStatus,
    WorkloadFacts,
)
from bot.context.kube_objects import Obj
from bot.context.kube_read import KubeReader, api_error
from bot.context.kube_sections import LogStream
from bot.context.kube_snapshot import Snapshot
from bot.context.logsig import CONTEXT, DECISIVE, ERROR, Line, condense

logger = logging.getLogger(__name__)

SOURCE = "Kubernetes"
CHANGE_REVIEW = "change_review"

_MAX_FOCUS_WORKLOADS = 2
_MAX_PODS_PER_WORKLOAD = 3
_MAX_FOCUS_PODS = 5
_MAX_HOP_LOG_PODS = 6
_MAX_CONFIGMAPS = 4
_MAX_QUIET_PODS = 4
_MAX_HEAD_READS = 2
_HEAD_BYTES = 64 * 1024
_SYSTEM_NAMESPACES = frozenset({"kube-system", "kube-public", "kube-node-lease"})
_LOG_LIMIT_BYTES = 512 * 1024


class KubernetesProvider(ContextProvider):
    """Reads one cluster through a kubeconfig file and context, or in-cluster."""

    name = SOURCE

    def __init__(self, settings: KubernetesSettings) -> None:
        self.settings = settings
        self._api: client.ApiClient | None = None
        self._lock = asyncio.Lock()
        self._target = f"kubeconfig {settings.kubeconfig}" if settings.kubeconfig else "in-cluster"
        self._denied: dict[str, bool] = {}
        """Opt-in resources the API refused with 403 (see ``kube_read.OPT_IN_RESOURCES``): not asked again."""

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
                self._api = client.ApiClient(configuration=configuration)
                self._target = str(configuration.host)
            return self._api

    async def reader(self) -> KubeReader:
        """A fresh reader (its own call log) over this provider's client: the investigation's tools
        read through the same connection pool and credentials as the gathering."""
        api = await self._client()
        return KubeReader(api, timeout_s=self.settings.timeout_s, list_limit=self.settings.list_limit)

    async def close(self) -> None:
        """Close the API client's connection pool."""
        if self._api is not None:
            await self._api.close()
            self._api = None

    async def check(self) -> str | None:
        """``GET /version`` from the API server (any HTTP answer, even a refusal, is an answer)."""
        try:
            api = await self._client()
        except (ConfigException, OSError, ValueError) as exc:
            return f"cannot configure client: {exc}"
        try:
            await asyncio.wait_for(client.VersionApi(api).get_code(), self.settings.timeout_s)
        except TimeoutError:
            return f"no answer from {self.target} within {self.settings.timeout_s:g} s"
        except client.ApiException as exc:
            if exc.status in (401, 403):
                return f"{self.target} refused the credentials (HTTP {exc.status})"
            return None
        except Exception as exc:  # aiohttp's connection errors and the like
            return api_error(exc)
        return None

    async def fetch(self, request: ContextRequest) -> ProviderResult:
        """Pods, events, logs, workloads, nodes and the hops from them relevant to ``request``."""
        try:
            api = await self._client()
        except (ConfigException, OSError, ValueError) as exc:
            return ProviderResult.failed(
                SOURCE, self.target, "load kubeconfig", f"cannot configure client: {exc}"
            )
        reader = KubeReader(api, timeout_s=self.settings.timeout_s, list_limit=self.settings.list_limit)
        gathering = _Gathering(reader, self.settings, request, self._denied)
        try:
            sections, findings = await gathering.run()
        except Exception as exc:  # ApiException, aiohttp connection errors and the like
            if isinstance(exc, asyncio.CancelledError):
                raise
            return ProviderResult.failed(SOURCE, self.target, "; ".join(reader.log.queries), api_error(exc))
        return ProviderResult(
            source=SOURCE,
            status=ProviderStatus.OK if sections else ProviderStatus.EMPTY,
            sections=sections,
            query=f"{reader.log.calls} API calls: " + "; ".join(reader.log.queries),
            error="; ".join(reader.log.errors) or None,
            target=self.target,
            findings=findings,
        )


class _Gathering:
    """One question's rounds of API calls, and the sections made of their answers."""

    def __init__(
        self,
        reader: KubeReader,
        settings: KubernetesSettings,
        request: ContextRequest,
        denied: dict[str, bool] | None = None,
    ) -> None:
        self.reader = reader
        self.denied = denied if denied is not None else {}
        self.settings = settings
        self.request = request
        self.entities = request.entities
        self.namespaces = self._scope()

    def _scope(self) -> list[str] | None:
        """Namespaces to read (``None``: all namespaces the service account may list). A namespace
        the question names is where it looks first, not all it reads: the hops cross namespaces."""
        allowed = (
            list(self.request.namespaces) if self.request.namespaces is not None else self.settings.namespaces
        )
        outside = [n for n in self.entities.namespaces if allowed and n not in allowed]
        if outside:
            self.reader.log.errors.append(
                f"namespace(s) {', '.join(outside)} outside opsbot's configured scope"
            )
        return list(allowed) or None

    async def _round_one(self) -> Snapshot:
        read, optional = self.reader.list_kind, self.reader.optional_kind
        spaces = self.namespaces
        selector = {"label_selector": self.settings.label_selector} if self.settings.label_selector else {}
        calls = {
            "pods": read("pods", spaces, **selector),
            "events": optional("events", spaces, field_selector="type=Warning"),
            "nodes": optional("nodes"),
            "deployments": optional("deployments", spaces, **selector),
            "statefulsets": optional("statefulsets", spaces, **selector),
            "daemonsets": optional("daemonsets", spaces, **selector),
            "services": optional("services", spaces),
            "jobs": optional("jobs", spaces),
            "cronjobs": optional("cronjobs", spaces),
            "hpas": optional("horizontalpodautoscalers", spaces),
            "pvcs": optional("persistentvolumeclaims", spaces),
        }
        if spaces is None:
            calls["namespaces"] = optional("namespaces")
        answers = dict(zip(calls, await asyncio.gather(*calls.values()), strict=True))
        listed = [ko.name(n) for n in answers.pop("namespaces", [])]
        snapshot = Snapshot()
        for name, items in answers.items():
            setattr(snapshot, name, items)
        snapshot.namespaces = listed or list(spaces or sorted({ko.namespace(p) for p in snapshot.pods}))
        return snapshot.index()

    async def run(self) -> tuple[list[ContextSection], Findings]:
        snapshot = await self._round_one()
        focus = matching.resolve(self.entities, snapshot)
        top = _top_pods(snapshot, focus)
        # A workload named but without pods (its new ReplicaSet cannot create them) is in question too.
        overview = not top and not focus.workloads
        if overview:
            # Nothing in question: the most broken pods lead, never the first in API order.
            top = _top_pods(snapshot, matching.Focus(pods=matching.by_severity(snapshot.pods)))[:3]
        # Revisions only where they are read: the namespaces of the pods and workloads in question.
        spaces = sorted({ko.namespace(p) for p in top} | {ref[1] for ref in focus.workloads[:2]})
        streams, storage, replicasets = await asyncio.gather(
            self._logs(top),
            self._storage(snapshot, top),
            self.reader.optional_kind("replicasets", spaces) if spaces else _nothing(),
        )
        snapshot.add_replicasets(replicasets)
        logs = _by_pod(streams)
        plan = hops.plan(snapshot, top, logs, question=self.request.question)
        # Nothing named and nothing unhealthy: the fault may only be in a running pod's log (an
        # expired certificate, an upstream refusing), so a few workloads' logs are read for errors.
        quiet = _quiet_sample(snapshot) if overview and not top else []
        hop_streams, slices, configmaps = await asyncio.gather(
            self._logs([*_hop_pods(plan, {ko.key(p) for p in top}), *quiet], errors_only=True),
            self._endpoint_slices(plan),
            self._configmaps(plan),
        )
        snapshot.endpointslices = slices
        sections = kube_sections.build(
            kube_sections.Gathered(
                snapshot=snapshot,
                focus=focus,
                top=top,
                overview=overview,
                streams=streams,
                hop_streams=hop_streams,
                plan=plan,
                storage=storage,
                scope=self.namespaces,
                change_review=self.request.scenario == CHANGE_REVIEW,
                entities=self.entities,
                configmaps=configmaps,
                configmap_values=(
                    "kubernetes.read_configmaps is off"
                    if not self.settings.read_configmaps
                    else "opsbot's Role grants no get on configmaps"
                    if self.denied.get("configmaps")
                    else ""
                ),
                quiet=quiet,
            )
        )
        return sections, _findings(snapshot, top, plan)

    async def _logs(self, pods: Sequence[Obj], *, errors_only: bool = False) -> list[LogStream]:
        """Every container's log of ``pods`` (current, and previous when it restarted)."""
        wanted: list[LogStream] = []
        for pod in pods:
            for cs in ko.container_statuses(pod):
                state, last = cs.get("state") or {}, cs.get("lastState") or {}
                waiting = (state.get("waiting") or {}).get("reason")
                # A container waiting to be created, or that never ran, has no log of its own yet.
                ran = not waiting or waiting == "CrashLoopBackOff" or bool(last.get("terminated"))
                ran = ran and waiting not in ("ContainerCreating", "PodInitializing")
                finished_ok = (state.get("terminated") or {}).get("exitCode") == 0 and not cs.get(
                    "restartCount"
                )
                if ran and not (errors_only and finished_ok):
                    wanted.append(LogStream(pod, str(cs.get("name")), False))
                if last.get("terminated") or int(cs.get("restartCount") or 0):
                    wanted.append(LogStream(pod, str(cs.get("name")), True, ending=_ending(last)))
        texts = await asyncio.gather(
            *(
                self.reader.log_text(
                    ko.namespace(s.pod),
                    ko.name(s.pod),
                    s.container,
                    previous=s.previous,
                    tail_lines=self.settings.log_tail_lines,
                    limit_bytes=_LOG_LIMIT_BYTES,
                )
                for s in wanted
            )
            if self.settings.log_tail_lines
            else []
        )
        for stream, text in zip(wanted, texts, strict=False):
            stream.read = len(text.splitlines())
            stream.lines = condense(text, stream.ending)
        await self._heads(wanted)
        return [s for s in wanted if s.lines]

    async def _heads(self, streams: Sequence[LogStream]) -> None:
        """A log cut by ``log_tail_lines`` whose tail shows no error: its start is read too (one call
        each, the first few), since what broke at startup (a missing file, a refused certificate) is
        logged once and then buried under a running container's routine lines. Only its error lines
        are kept, before the tail's."""
        tail = self.settings.log_tail_lines
        cut = [s for s in streams if tail and s.read >= tail and not any(ln.rank <= ERROR for ln in s.lines)][
            :_MAX_HEAD_READS
        ]
        texts = await asyncio.gather(
            *(
                self.reader.log_head(
                    ko.namespace(s.pod),
                    ko.name(s.pod),
                    s.container,
                    previous=s.previous,
                    limit_bytes=_HEAD_BYTES,
                )
                for s in cut
            )
        )
        for stream, text in zip(cut, texts, strict=True):
            head = [ln for ln in condense(text) if ln.rank <= ERROR]
            if head:
                stream.lines = [
                    *head,
                    Line(
                        f"... (errors from the start of the log above, its last {tail} lines below)", CONTEXT
                    ),
                    *stream.lines,
                ]

    async def _endpoint_slices(self, plan: hops.Plan) -> list[Obj]:
        """The EndpointSlices of the Services the pods in question depend on (one call each)."""
        services = [d.service for d in plan.dependencies if d.service is not None]
        calls = [
            self.reader.optional_kind(
                "endpointslices", [ko.namespace(s)], label_selector=f"kubernetes.io/service-name={ko.name(s)}"
            )
            for s in services
        ]
        return [item for found in await asyncio.gather(*calls) for item in found]

    async def _configmaps(self, plan: hops.Plan) -> list[Obj]:
        """The ConfigMaps the pods in question reference (``kubernetes.read_configmaps``; one get
        each, the first few): a value there (a host, a flag) is often what changed. Never Secrets."""
        if not self.settings.read_configmaps or self.denied.get("configmaps"):
            return []
        wanted = [
            (ns, name)
            for (kind, ns, name) in plan.configs
            if kind == "configmap" and not name.startswith("kube-root-ca.crt")
        ][:_MAX_CONFIGMAPS]
        found = await asyncio.gather(*(self.reader.get("configmaps", ns, name) for ns, name in wanted))
        if "configmaps" in self.reader.denied:
            # Not granted (deploy/base/rbac.yaml grants none): asked once per process, not per question.
            self.denied["configmaps"] = True
            logger.info("kubernetes.read_configmaps is on but opsbot's Role grants no get on configmaps")
        return [o for o in found if o is not None]

    async def _storage(self, snapshot: Snapshot, pods: Sequence[Obj]) -> list[Obj]:
        """The PersistentVolumes and StorageClasses behind the claims of ``pods``."""
        claims = [
            pvc
            for pod in pods
            for name in ko.claims(pod)
            if (pvc := snapshot.get("PersistentVolumeClaim", ko.namespace(pod), name)) is not None
        ]
        calls = []
        for pvc in ko.unique(claims):
            volume = ko.spec(pvc).get("volumeName")
            if volume:
                calls.append(self.reader.get("persistentvolumes", None, str(volume)))
            storage_class = ko.spec(pvc).get("storageClassName")
            if storage_class and ko.status(pvc).get("phase") != "Bound":
                calls.append(self.reader.get("storageclasses", None, str(storage_class)))
        found = await asyncio.gather(*calls)
        return [o for o in found if o is not None]


async def _nothing() -> list[Obj]:
    return []


def _ending(last_state: dict[str, object]) -> int:
    """How telling the end of a previous container's log is: what it did before an OOM kill is
    decisive, before another abnormal exit an error."""
    terminated = last_state.get("terminated")
    if not isinstance(terminated, dict):
        return CONTEXT
    if terminated.get("reason") == "OOMKilled":
        return DECISIVE
    return ERROR if terminated.get("exitCode") else CONTEXT


def _top_pods(snapshot: Snapshot, focus: matching.Focus) -> list[Obj]:
    """The pods whose logs and details are read: from the best workloads in question, a few replicas
    each (enough to tell identical replicas), the most broken first."""
    chosen: list[Obj] = []
    per_workload: dict[tuple[str, str, str], int] = {}
    best = max((focus.score(p) for p in focus.pods), default=0.0)
    for pod in focus.pods:
        if focus.scores and focus.score(pod) < best - 0.3:
            break
        ref = snapshot.workload_of(pod)
        if ref not in per_workload and len(per_workload) >= _MAX_FOCUS_WORKLOADS:
            continue
        if per_workload.get(ref, 0) >= _MAX_PODS_PER_WORKLOAD:
            continue
        per_workload[ref] = per_workload.get(ref, 0) + 1
        chosen.append(pod)
        if len(chosen) >= _MAX_FOCUS_PODS:
            break
    return chosen


def _quiet_sample(snapshot: Snapshot) -> list[Obj]:
    """With nothing unhealthy in the scope: one running pod of each of the first few workloads
    outside the system namespaces (by namespace and name, never API order), whose logs are read for
    errors. In a scoped channel these are the team's own workloads."""
    chosen: list[Obj] = []
    seen: set[tuple[str, str, str]] = set()
    for pod in sorted(snapshot.pods, key=ko.key):
        ref = snapshot.workload_of(pod)
        if ko.namespace(pod) in _SYSTEM_NAMESPACES or ref in seen:
            continue
        if ko.status(pod).get("phase") != "Running":
            continue
        seen.add(ref)
        chosen.append(pod)
        if len(chosen) >= _MAX_QUIET_PODS:
            break
    return chosen


def _hop_pods(plan: hops.Plan, exclude: set[tuple[str, str]]) -> list[Obj]:
    """Pods whose logs the hops need: broken dependencies, the DNS pods, flagged neighbours."""
    pods: list[Obj] = []
    for dependency in plan.dependencies:
        broken = dependency.broken()
        pods += broken[:2] if broken else dependency.pods[:1]
    pods += plan.dns[:2]
    for node, neighbours in plan.neighbours.items():
        # On a node under pressure the pods beside them are suspects whatever their limits say.
        pressed = node in plan.pressured
        pods += [p for p in neighbours[:3] if ko.pod_problems(p) or kube_sections.could_starve(p) or pressed][
            :2
        ]
    return [p for p in ko.unique(pods) if ko.key(p) not in exclude][:_MAX_HOP_LOG_PODS]


def _by_pod(streams: Sequence[LogStream]) -> dict[tuple[str, str], list[Line]]:
    out: dict[tuple[str, str], list[Line]] = {}
    for stream in streams:
        out.setdefault(ko.key(stream.pod), []).extend(stream.lines)
    return out


def _findings(snapshot: Snapshot, top: Sequence[Obj], plan: hops.Plan) -> Findings:
    """What Prometheus should follow: the workloads in question, their dependencies and neighbours,
    their nodes and the pods there."""
    workloads: list[WorkloadFacts] = []

    def add(pods: Sequence[Obj], role: str) -> None:
        for ref in hops.workload_refs(snapshot, pods):
            members = snapshot.pods_of(ref) or [p for p in pods if snapshot.workload_of(p) == ref]
            services = tuple(ko.name(s) for s in snapshot.services_of(members))
            facts = WorkloadFacts(
                ref[1], ref[0], ref[2], tuple(ko.name(p) for p in members[:50]), services, role
            )
            if all((w.namespace, w.name) != (facts.namespace, facts.name) for w in workloads):
                workloads.append(facts)

    add(top, "asked")
    for dependency in plan.dependencies:
        add(dependency.pods, "dependency")
    for neighbours in plan.neighbours.values():
        add(neighbours[:3], "neighbour")
    nodes = tuple(plan.neighbours)
    node_pods = tuple((n, ko.namespace(p), ko.name(p)) for n in nodes for p in snapshot.pods_on(n))
    pressure = tuple(
        (n, problem.split(" ", 1)[0])
        for n in nodes
        if (node := snapshot.get("Node", "", n)) is not None
        for problem in ko.node_problems(node)
    )
    return Findings(tuple(workloads), nodes, node_pods, pressure)
