"""Kubernetes objects (API JSON) read and described: health, severity, owners, references, one line each.

Pure functions over the dicts :mod:`bot.context.kube_read` returns, in the API's own field names;
no I/O. The provider (:mod:`bot.context.kubernetes`) picks which objects to describe, the hop
planner (:mod:`bot.context.hops`) which to follow.

Env values of secret-like names are replaced here already (the rest of the redaction happens in the
gatherer); Secret references show the Secret's name and key, never a value (none is ever read).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from bot.redact import REDACTED, is_secret_name

Obj = dict[str, Any]

BAD_WAITING = frozenset(
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
"""Waiting reasons that mean a container cannot run (``ContainerCreating`` only means not yet)."""

_SKIPPED_ANNOTATIONS = ("kubectl.kubernetes.io/last-applied-configuration",)
_MAX_MESSAGE = 300


_EMPTY: Mapping[str, Any] = {}


def meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """``metadata`` (empty when missing)."""
    value: Mapping[str, Any] = obj.get("metadata") or _EMPTY
    return value


# name / namespace / key run for every object of every list, thousands of times a question: lean.
def name(obj: Mapping[str, Any]) -> str:
    """``metadata.name``."""
    return (obj.get("metadata") or _EMPTY).get("name") or ""


def namespace(obj: Mapping[str, Any]) -> str:
    """``metadata.namespace`` ("" for cluster-scoped objects)."""
    return (obj.get("metadata") or _EMPTY).get("namespace") or ""


def key(obj: Mapping[str, Any]) -> tuple[str, str]:
    """(namespace, name)."""
    m = obj.get("metadata") or _EMPTY
    return m.get("namespace") or "", m.get("name") or ""


def labels(obj: Mapping[str, Any]) -> Mapping[str, str]:
    """``metadata.labels``."""
    return meta(obj).get("labels") or {}


def annotations_of(obj: Mapping[str, Any]) -> Mapping[str, str]:
    """``metadata.annotations``."""
    return meta(obj).get("annotations") or {}


def owners(obj: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(kind, name) of each owner reference, the controller first."""
    refs = meta(obj).get("ownerReferences") or []
    if len(refs) > 1:
        refs = sorted(refs, key=lambda r: not r.get("controller"))
    return [(str(r.get("kind") or ""), str(r.get("name") or "")) for r in refs]


def spec(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """``spec`` (empty when missing)."""
    return obj.get("spec") or {}


def status(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    """``status`` (empty when missing)."""
    return obj.get("status") or {}


def parse_time(value: object) -> datetime | None:
    """An RFC 3339 time of the API, or ``None``."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def ts(value: object) -> str:
    """A time as ``2026-11-29T19:58:00Z`` (``?`` when unknown)."""
    parsed = parse_time(value)
    return parsed.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ") if parsed else "?"


def short(text: object, limit: int = _MAX_MESSAGE) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    flat = " ".join(str(text or "").split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


# -- quantities ------------------------------------------------------------------------------------

_SUFFIXES = {
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "k": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
    "m": 0.001,
}


def quantity(value: object) -> float | None:
    """A resource quantity as a number (``250m`` -> 0.25, ``512Mi`` -> 536870912), ``None`` if odd."""
    match = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(value or "").strip())
    if not match:
        return None
    number, suffix = match.groups()
    try:
        return float(number) * _SUFFIXES.get(suffix, 1.0 if not suffix else float("nan"))
    except ValueError:
        return None


# -- pods ------------------------------------------------------------------------------------------


def container_statuses(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Init container statuses, then the containers' (sidecars included)."""
    st = status(pod)
    return [*(st.get("initContainerStatuses") or []), *(st.get("containerStatuses") or [])]


def restarts(pod: Mapping[str, Any]) -> int:
    """Restarts of all the pod's containers."""
    return sum(int(s.get("restartCount") or 0) for s in container_statuses(pod))


def _state(cs: Mapping[str, Any], which: str) -> Mapping[str, Any]:
    return (cs.get(which) or {}) if which == "state" else (cs.get("lastState") or {})


def pod_problems(pod: Mapping[str, Any]) -> list[str]:
    """Why ``pod`` is not healthy (empty: healthy or finished)."""
    st = status(pod)
    if not st:
        return ["no status"]
    phase = st.get("phase") or "Unknown"
    if phase == "Succeeded":
        return []
    problems: list[str] = []
    if phase in ("Pending", "Failed", "Unknown"):
        reason = str(st.get("reason") or "")
        for condition in st.get("conditions") or []:
            if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                reason = f"{condition.get('reason')}: {condition.get('message')}"
        message = str(st.get("message") or "")
        if message and reason and message not in reason:
            reason = f"{reason}: {short(message)}"
        problems.append(f"{phase}{' (' + reason + ')' if reason else ''}")
    for cs in container_statuses(pod):
        state, last = _state(cs, "state"), _state(cs, "last")
        waiting, term = state.get("waiting") or {}, state.get("terminated") or {}
        cname = cs.get("name")
        if waiting.get("reason") and waiting.get("reason") not in ("ContainerCreating", "PodInitializing"):
            problems.append(f"{cname} {waiting['reason']}")
        if term.get("exitCode"):
            problems.append(f"{cname} terminated {term.get('reason')} exit {term.get('exitCode')}")
        if (last.get("terminated") or {}).get("reason") == "OOMKilled":
            problems.append(f"{cname} OOMKilled")
        if int(cs.get("restartCount") or 0) >= 3 and not any(p.startswith(f"{cname} ") for p in problems):
            problems.append(f"{cname} restarting")
    init = st.get("initContainerStatuses") or []
    if phase == "Pending" and any((s.get("state") or {}).get("running") for s in init):
        running = [str(s.get("name")) for s in init if (s.get("state") or {}).get("running")]
        problems.append(f"stuck in init container {', '.join(running)}")
    if phase == "Running":
        for condition in st.get("conditions") or []:
            if condition.get("type") == "Ready" and condition.get("status") != "True":
                problems.append("not Ready")
    return list(dict.fromkeys(problems))


def severity(pod: Mapping[str, Any]) -> int:
    """How broken ``pod`` is, 0 (healthy) to 100: crash loop and OOM highest, then failing to start,
    pending, not ready, recent restarts."""
    score = 0
    st = status(pod)
    phase = st.get("phase")
    for cs in container_statuses(pod):
        waiting = (_state(cs, "state").get("waiting") or {}).get("reason")
        last = (_state(cs, "last").get("terminated") or {}).get("reason")
        if waiting == "CrashLoopBackOff":
            score = max(score, 90)
        elif waiting in BAD_WAITING:
            score = max(score, 80)
        if last == "OOMKilled":
            score = max(score, 85)
        if (_state(cs, "state").get("terminated") or {}).get("exitCode"):
            score = max(score, 60)
        score = max(score, min(50, 10 * int(cs.get("restartCount") or 0)))
    if phase == "Failed":
        score = max(score, 45 if st.get("reason") == "Evicted" else 55)
    elif phase == "Pending":
        score = max(score, 70)
    elif phase == "Unknown":
        score = max(score, 65)
    if phase == "Running" and "not Ready" in pod_problems(pod):
        score = max(score, 60)
    return score


def pod_line(pod: Mapping[str, Any]) -> str:
    """One line for ``pod``: phase, readiness, restarts, node, problems, last termination."""
    st = status(pod)
    statuses = st.get("containerStatuses") or []
    ready = sum(1 for s in statuses if s.get("ready"))
    parts = [
        f"{namespace(pod)}/{name(pod)}",
        st.get("phase") or "Unknown",
        f"ready {ready}/{len(statuses) or len(spec(pod).get('containers') or [])}",
        f"restarts {restarts(pod)}",
    ]
    if spec(pod).get("nodeName"):
        parts.append(f"node {spec(pod)['nodeName']}")
    problems = pod_problems(pod)
    if problems:
        parts.append("problems: " + "; ".join(problems))
    for cs in container_statuses(pod):
        done = _state(cs, "state").get("terminated") or {}
        if done:
            parts.append(
                f"{cs.get('name')} terminated {done.get('reason') or '?'} exit code {done.get('exitCode')} "
                f"at {ts(done.get('finishedAt'))}"
            )
        last = _state(cs, "last").get("terminated") or {}
        if last:
            parts.append(
                f"{cs.get('name')} last terminated {last.get('reason') or '?'} exit code "
                f"{last.get('exitCode')} at {ts(last.get('finishedAt'))}"
            )
        waiting = _state(cs, "state").get("waiting") or {}
        if waiting.get("message"):
            parts.append(f"{cs.get('name')} waiting: {short(waiting['message'])}")
    return " | ".join(parts)


def _env_value(env: Mapping[str, Any]) -> str:
    ref = env.get("valueFrom")
    if ref:
        if ref.get("secretKeyRef"):
            return f"<from secret {ref['secretKeyRef'].get('name')} key {ref['secretKeyRef'].get('key')}>"
        if ref.get("configMapKeyRef"):
            r = ref["configMapKeyRef"]
            return f"<from configmap {r.get('name')} key {r.get('key')}>"
        if ref.get("fieldRef"):
            return f"<from field {ref['fieldRef'].get('fieldPath')}>"
        return "<from resource>"
    if is_secret_name(str(env.get("name") or "")):
        return REDACTED
    return str(env.get("value") or "")


def env_pairs(container: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(name, shown value) of a container's env (secret-named values replaced, references named)."""
    return [(str(e.get("name")), _env_value(e)) for e in container.get("env") or []]


def _probe(probe: Mapping[str, Any] | None) -> str:
    if not probe:
        return ""
    if probe.get("httpGet"):
        target = f"http GET {probe['httpGet'].get('path', '/')}:{probe['httpGet'].get('port')}"
    elif probe.get("tcpSocket"):
        target = f"tcp :{probe['tcpSocket'].get('port')}"
    elif probe.get("exec"):
        target = "exec " + " ".join(str(c) for c in probe["exec"].get("command") or [])
    elif probe.get("grpc"):
        target = f"grpc :{probe['grpc'].get('port')}"
    else:
        target = "?"
    timing = ", ".join(
        f"{k} {probe[k]}"
        for k in ("initialDelaySeconds", "periodSeconds", "timeoutSeconds", "failureThreshold")
        if probe.get(k) is not None
    )
    return target + (f" ({timing})" if timing else "")


def resources_text(container: Mapping[str, Any]) -> str:
    """``requests {...}; limits {...}`` of a container."""
    res = container.get("resources") or {}
    req, lim = dict(res.get("requests") or {}), dict(res.get("limits") or {})
    return f"requests {req or '-'}; limits {lim or '-'}"


def pod_spec_lines(pod_spec: Mapping[str, Any], indent: str = "  ") -> list[str]:
    """Containers (image, resources, probes, ports, mounts, env) and volumes of a pod spec."""
    lines: list[str] = []
    for kind, containers in (
        ("init container", pod_spec.get("initContainers")),
        ("container", pod_spec.get("containers")),
    ):
        for c in containers or []:
            lines.append(f"{indent}{kind} {c.get('name')}: image {c.get('image')}; {resources_text(c)}")
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                if c.get(probe):
                    lines.append(f"{indent}  {probe.removesuffix('Probe')} probe: {_probe(c[probe])}")
            for mount in c.get("volumeMounts") or []:
                lines.append(f"{indent}  mounts volume {mount.get('name')} at {mount.get('mountPath')}")
            for source in c.get("envFrom") or []:
                ref = source.get("configMapRef") or source.get("secretRef") or {}
                what = "configmap" if source.get("configMapRef") else "secret"
                lines.append(f"{indent}  env from {what} {ref.get('name')}")
            for env_name, value in env_pairs(c):
                lines.append(f"{indent}  env {env_name}={value}")
    for volume in pod_spec.get("volumes") or []:
        lines.append(f"{indent}volume {volume_line(volume)}")
    return lines


def volume_line(volume: Mapping[str, Any]) -> str:
    """``data: persistentVolumeClaim data-db-0``, ``rules: configMap pricing-rules`` ..."""
    vname = volume.get("name")
    for field, label, inner in (
        ("persistentVolumeClaim", "persistentVolumeClaim", "claimName"),
        ("configMap", "configMap", "name"),
        ("secret", "secret", "secretName"),
        ("hostPath", "hostPath", "path"),
    ):
        if volume.get(field):
            return f"{vname}: {label} {volume[field].get(inner)}"
    if "emptyDir" in volume:
        limit = (volume.get("emptyDir") or {}).get("sizeLimit")
        return f"{vname}: emptyDir" + (f" sizeLimit {limit}" if limit else " (no sizeLimit)")
    if volume.get("projected"):
        return f"{vname}: projected"
    return f"{vname}: {next((k for k in volume if k != 'name'), '?')}"


def pod_details(pod: Mapping[str, Any]) -> list[str]:
    """Containers (images, resources, probes, mounts, env with secret-named values replaced), volumes
    and annotations of ``pod`` (its owners: :func:`bot.context.hops.owner_chain`)."""
    lines = [f"{namespace(pod)}/{name(pod)}:"]
    lines += pod_spec_lines(spec(pod))
    for akey, value in sorted(annotations_of(pod).items()):
        if akey in _SKIPPED_ANNOTATIONS:
            continue
        shown = REDACTED if is_secret_name(akey.rsplit("/", 1)[-1]) else short(value, 500)
        lines.append(f"  annotation {akey}: {shown}")
    return lines


def config_references(pod_spec: Mapping[str, Any]) -> dict[tuple[str, str], set[str]]:
    """(``configmap`` / ``secret``, name) -> keys a pod spec references (empty set: the whole object,
    through a volume or ``envFrom``)."""
    refs: dict[tuple[str, str], set[str]] = {}
    containers = [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]
    for c in containers:
        for env in c.get("env") or []:
            source = env.get("valueFrom") or {}
            for field, kind in (("configMapKeyRef", "configmap"), ("secretKeyRef", "secret")):
                if source.get(field):
                    refs.setdefault((kind, str(source[field].get("name"))), set()).add(
                        str(source[field].get("key"))
                    )
        for source in c.get("envFrom") or []:
            for field, kind in (("configMapRef", "configmap"), ("secretRef", "secret")):
                if source.get(field):
                    refs.setdefault((kind, str(source[field].get("name"))), set())
    for volume in pod_spec.get("volumes") or []:
        if volume.get("configMap"):
            items = {str(i.get("key")) for i in volume["configMap"].get("items") or []}
            refs.setdefault(("configmap", str(volume["configMap"].get("name"))), set()).update(items)
        if volume.get("secret"):
            items = {str(i.get("key")) for i in volume["secret"].get("items") or []}
            refs.setdefault(("secret", str(volume["secret"].get("secretName"))), set()).update(items)
        for source in (volume.get("projected") or {}).get("sources") or []:
            for field, kind in (("configMap", "configmap"), ("secret", "secret")):
                if source.get(field):
                    refs.setdefault((kind, str(source[field].get("name"))), set())
    return refs


def claims(pod: Mapping[str, Any]) -> list[str]:
    """Names of the PVCs a pod mounts."""
    return [
        str(v["persistentVolumeClaim"].get("claimName"))
        for v in spec(pod).get("volumes") or []
        if v.get("persistentVolumeClaim")
    ]


# -- workloads -------------------------------------------------------------------------------------


def revision(obj: Mapping[str, Any]) -> int:
    """``deployment.kubernetes.io/revision`` of a Deployment or ReplicaSet (0 when missing)."""
    try:
        return int(annotations_of(obj).get("deployment.kubernetes.io/revision", "0"))
    except ValueError:
        return 0


def images(template: Mapping[str, Any] | None) -> str:
    """``app=registry/app:1.2`` for each container of a pod template."""
    containers = (template or {}).get("spec", {}).get("containers") or []
    return ", ".join(f"{c.get('name')}={c.get('image')}" for c in containers)


def deployment_healthy(deployment: Mapping[str, Any]) -> bool:
    """All replicas updated, ready and available."""
    want = spec(deployment).get("replicas", 1)
    st = status(deployment)
    return bool(
        st
        and int(st.get("readyReplicas") or 0) >= want
        and int(st.get("updatedReplicas") or 0) >= want
        and int(st.get("availableReplicas") or 0) >= want
        and not st.get("unavailableReplicas")
    )


def deployment_line(deployment: Mapping[str, Any]) -> str:
    """Rollout status of a Deployment, with its failing conditions and images."""
    st = status(deployment)
    want = spec(deployment).get("replicas", 1)
    parts = [
        f"deployment {namespace(deployment)}/{name(deployment)}",
        f"revision {annotations_of(deployment).get('deployment.kubernetes.io/revision', '?')}",
        f"replicas {want} desired, {st.get('updatedReplicas') or 0} updated, "
        f"{st.get('readyReplicas') or 0} ready, {st.get('availableReplicas') or 0} available",
        "rollout complete" if deployment_healthy(deployment) else "rollout NOT complete",
    ]
    for condition in st.get("conditions") or []:
        if condition.get("status") != "True" or condition.get("reason") == "ProgressDeadlineExceeded":
            parts.append(
                f"{condition.get('type')}={condition.get('status')} {condition.get('reason')}: "
                f"{condition.get('message')}"
            )
    parts.append(f"images {images(spec(deployment).get('template'))}")
    return " | ".join(parts)


def replicaset_line(rs: Mapping[str, Any]) -> str:
    """One revision of a Deployment (its ReplicaSet): when, what image, how many pods, why."""
    st = status(rs)
    cause = annotations_of(rs).get("kubernetes.io/change-cause")
    return (
        f"revision {revision(rs)} created {ts(meta(rs).get('creationTimestamp'))} replicaset {name(rs)}: "
        f"{st.get('readyReplicas') or 0}/{st.get('replicas') or 0} ready, "
        f"images {images(spec(rs).get('template'))}" + (f", change-cause: {cause}" if cause else "")
    )


def statefulset_healthy(sts: Mapping[str, Any]) -> bool:
    """All replicas ready and on the update revision."""
    want = spec(sts).get("replicas", 1)
    st = status(sts)
    return bool(
        st
        and int(st.get("readyReplicas") or 0) >= want
        and (not st.get("updateRevision") or st.get("currentRevision") == st.get("updateRevision"))
    )


def statefulset_line(sts: Mapping[str, Any]) -> str:
    """Rollout status of a StatefulSet (current vs update revision)."""
    st = status(sts)
    want = spec(sts).get("replicas", 1)
    return " | ".join(
        [
            f"statefulset {namespace(sts)}/{name(sts)}",
            f"replicas {want} desired, {st.get('readyReplicas') or 0} ready, "
            f"{st.get('currentReplicas') or 0} current, {st.get('updatedReplicas') or 0} updated",
            f"current revision {st.get('currentRevision')}, update revision {st.get('updateRevision')}",
            "rollout complete" if statefulset_healthy(sts) else "rollout NOT complete",
            f"images {images(spec(sts).get('template'))}",
        ]
    )


def daemonset_healthy(ds: Mapping[str, Any]) -> bool:
    """Every scheduled pod ready and updated."""
    st = status(ds)
    want = int(st.get("desiredNumberScheduled") or 0)
    return int(st.get("numberReady") or 0) >= want and int(st.get("updatedNumberScheduled") or 0) >= want


def daemonset_line(ds: Mapping[str, Any]) -> str:
    """Rollout status of a DaemonSet."""
    st = status(ds)
    return " | ".join(
        [
            f"daemonset {namespace(ds)}/{name(ds)}",
            f"{st.get('desiredNumberScheduled') or 0} desired, {st.get('numberReady') or 0} ready, "
            f"{st.get('updatedNumberScheduled') or 0} updated, "
            f"{st.get('numberUnavailable') or 0} unavailable",
            "healthy" if daemonset_healthy(ds) else "NOT all ready",
            f"images {images(spec(ds).get('template'))}",
        ]
    )


def hpa_line(hpa: Mapping[str, Any]) -> str:
    """An autoscaler: target, bounds, current and desired replicas, metrics and limiting conditions."""
    sp, st = spec(hpa), status(hpa)
    target = sp.get("scaleTargetRef") or {}
    parts = [
        f"hpa {namespace(hpa)}/{name(hpa)} for {str(target.get('kind', '')).lower()}/{target.get('name')}",
        f"replicas {st.get('currentReplicas')} current, {st.get('desiredReplicas')} desired, "
        f"min {sp.get('minReplicas', 1)}, max {sp.get('maxReplicas')}",
    ]
    wanted = {
        (m.get("resource") or {}).get("name"): ((m.get("resource") or {}).get("target") or {})
        for m in sp.get("metrics") or []
    }
    for metric in st.get("currentMetrics") or []:
        res = metric.get("resource") or {}
        current = (res.get("current") or {}).get("averageUtilization")
        goal = (wanted.get(res.get("name")) or {}).get("averageUtilization")
        if current is not None:
            parts.append(f"{res.get('name')} {current}% of request (target {goal}%)")
    if st.get("currentReplicas") is not None and st.get("currentReplicas") == sp.get("maxReplicas"):
        parts.append("AT maxReplicas")
    for condition in st.get("conditions") or []:
        if (condition.get("type") == "ScalingLimited") == (condition.get("status") == "True"):
            parts.append(_condition(condition))
    return " | ".join(parts)


def job_line(job: Mapping[str, Any]) -> str:
    """A Job: owner, counts, conditions."""
    st = status(job)
    parts = [f"job {namespace(job)}/{name(job)}"]
    parts += [f"of {k.lower()}/{n}" for k, n in owners(job)]
    parts.append(
        f"started {ts(st.get('startTime'))}, {st.get('succeeded') or 0} succeeded, "
        f"{st.get('failed') or 0} failed, {st.get('active') or 0} active, "
        f"backoffLimit {spec(job).get('backoffLimit')}"
    )
    for condition in st.get("conditions") or []:
        if condition.get("status") == "True":
            parts.append(_condition(condition))
    return " | ".join(parts)


def _condition(condition: Mapping[str, Any]) -> str:
    """``Type=Status Reason: message`` of a status condition (empty parts left out)."""
    reason = f" {condition.get('reason')}" if condition.get("reason") else ""
    message = f": {condition.get('message')}" if condition.get("message") else ""
    return f"{condition.get('type')}={condition.get('status')}{reason}{message}"


def job_failed(job: Mapping[str, Any]) -> bool:
    """The Job ended with a ``Failed`` condition, or has failed pods and none succeeded."""
    st = status(job)
    failed = any(c.get("type") == "Failed" and c.get("status") == "True" for c in st.get("conditions") or [])
    return failed or (bool(st.get("failed")) and not st.get("succeeded") and not st.get("active"))


def cronjob_line(cj: Mapping[str, Any]) -> str:
    """A CronJob: schedule, last schedule and last success."""
    st = status(cj)
    return " | ".join(
        [
            f"cronjob {namespace(cj)}/{name(cj)}",
            f"schedule {spec(cj).get('schedule')}" + (" SUSPENDED" if spec(cj).get("suspend") else ""),
            f"last scheduled {ts(st.get('lastScheduleTime'))}",
            f"last successful {ts(st.get('lastSuccessfulTime'))}",
            f"{len(st.get('active') or [])} active",
        ]
    )


# -- storage, services, nodes -----------------------------------------------------------------------


def pvc_line(pvc: Mapping[str, Any]) -> str:
    """A PVC: phase, class, size, volume."""
    sp, st = spec(pvc), status(pvc)
    size = (sp.get("resources") or {}).get("requests", {}).get("storage")
    return (
        f"pvc {namespace(pvc)}/{name(pvc)} {st.get('phase')} | storageClass {sp.get('storageClassName')} | "
        f"requests {size} | volume {sp.get('volumeName') or '-'} | "
        f"access {','.join(sp.get('accessModes') or [])}"
    )


def pv_line(pv: Mapping[str, Any]) -> str:
    """A PV: phase, class, capacity, driver, zone affinity."""
    sp, st = spec(pv), status(pv)
    zones = [
        v
        for term in ((sp.get("nodeAffinity") or {}).get("required") or {}).get("nodeSelectorTerms") or []
        for expr in term.get("matchExpressions") or []
        for v in expr.get("values") or []
    ]
    return (
        f"pv {name(pv)} {st.get('phase')} | storageClass {sp.get('storageClassName')} | "
        f"capacity {(sp.get('capacity') or {}).get('storage')} | "
        f"driver {(sp.get('csi') or {}).get('driver', '-')}"
        + (f" | node affinity {','.join(zones)}" if zones else "")
    )


def storageclass_line(sc: Mapping[str, Any]) -> str:
    """A StorageClass: provisioner, parameters, binding mode."""
    params = ", ".join(f"{k}={v}" for k, v in sorted((sc.get("parameters") or {}).items()))
    return (
        f"storageclass {name(sc)} | provisioner {sc.get('provisioner')} | parameters {params or '-'} | "
        f"volumeBindingMode {sc.get('volumeBindingMode')}"
    )


def selects(selector: Mapping[str, str] | None, pod: Mapping[str, Any]) -> bool:
    """Whether a Service's (equality) ``selector`` selects ``pod``."""
    if not selector:
        return False
    pod_labels = labels(pod)
    return all(pod_labels.get(k) == v for k, v in selector.items())


def node_problems(node: Mapping[str, Any]) -> list[str]:
    """``NotReady`` and pressure conditions of ``node``, and whether it is cordoned."""
    problems = []
    for condition in status(node).get("conditions") or []:
        ctype, cstatus = condition.get("type"), condition.get("status")
        if ctype == "Ready" and cstatus != "True":
            problems.append(f"NotReady ({condition.get('reason')}: {condition.get('message')})")
        elif ctype != "Ready" and cstatus == "True":
            problems.append(f"{ctype} ({condition.get('reason')}: {condition.get('message')})")
    if spec(node).get("unschedulable"):
        problems.append("cordoned (unschedulable)")
    return problems


def node_line(node: Mapping[str, Any]) -> str:
    """One line for ``node``: its problems, allocatable resources and taints."""
    allocatable = status(node).get("allocatable") or {}
    taints = ", ".join(
        f"{t.get('key')}={t.get('value') or ''}:{t.get('effect')}" for t in spec(node).get("taints") or []
    )
    problems = node_problems(node)
    return " | ".join(
        [
            f"node {name(node)}",
            "; ".join(problems) if problems else "Ready, no pressure",
            f"allocatable cpu {allocatable.get('cpu', '?')} memory {allocatable.get('memory', '?')}"
            + (
                f" ephemeral-storage {allocatable['ephemeral-storage']}"
                if allocatable.get("ephemeral-storage")
                else ""
            ),
            *([f"taints {taints}"] if taints else []),
        ]
    )


def requests_of(pod: Mapping[str, Any], resource: str) -> float:
    """Sum of the containers' requests of ``resource`` (cores or bytes)."""
    total = 0.0
    for c in spec(pod).get("containers") or []:
        value = quantity(((c.get("resources") or {}).get("requests") or {}).get(resource))
        total += value or 0.0
    return total


def limits_of(pod: Mapping[str, Any], resource: str) -> float | None:
    """Sum of the containers' limits of ``resource``; ``None`` when a container has none."""
    total = 0.0
    for c in spec(pod).get("containers") or []:
        value = quantity(((c.get("resources") or {}).get("limits") or {}).get(resource))
        if value is None:
            return None
        total += value
    return total


def event_time(event: Mapping[str, Any]) -> datetime:
    """When an event last happened."""
    for field in ("lastTimestamp", "eventTime", "firstTimestamp"):
        parsed = parse_time(event.get(field))
        if parsed:
            return parsed
    return parse_time(meta(event).get("creationTimestamp")) or datetime.min.replace(tzinfo=UTC)


def event_line(event: Mapping[str, Any]) -> str:
    """``<time> <ns> pod/x Reason xN: message``."""
    obj = event.get("involvedObject") or {}
    what = f"{str(obj.get('kind') or '').lower()}/{obj.get('name')}"
    count = event.get("count") or (event.get("series") or {}).get("count")
    times = f" x{count}" if count and int(count) > 1 else ""
    when = ts(event_time(event).isoformat())
    return (
        f"{when} {namespace(event)} {what} {event.get('reason')}{times}: {short(event.get('message'), 400)}"
    )


def unique(objs: Iterable[Obj]) -> list[Obj]:
    """Objects without repeats (by namespace and name), first kept."""
    seen: dict[tuple[str, str, str], Obj] = {}
    for obj in objs:
        seen.setdefault((str(obj.get("kind") or ""), *key(obj)), obj)
    return list(seen.values())


def template_diff(current: Mapping[str, Any] | None, previous: Mapping[str, Any] | None) -> list[str]:
    """What changed between two pod templates, per container: image, resources, env (names, and
    values where shown), probes, mounts, volumes and config references (``memory limit 2Gi ->
    512Mi``)."""
    cur = _template_facts(current)
    old = _template_facts(previous)
    changes = []
    for fact in sorted(cur.keys() | old.keys()):
        before, after = old.get(fact), cur.get(fact)
        if before == after:
            continue
        if before is None:
            changes.append(f"{fact}: added {after}")
        elif after is None:
            changes.append(f"{fact}: removed (was {before})")
        else:
            changes.append(f"{fact}: {before} -> {after}")
    return changes


def _template_facts(template: Mapping[str, Any] | None) -> dict[str, str]:
    pod_spec = (template or {}).get("spec") or {}
    facts: dict[str, str] = {}
    for c in [*(pod_spec.get("initContainers") or []), *(pod_spec.get("containers") or [])]:
        cname = c.get("name")
        facts[f"{cname} image"] = str(c.get("image"))
        res = c.get("resources") or {}
        for kind in ("requests", "limits"):
            for resource, value in (res.get(kind) or {}).items():
                facts[f"{cname} {resource} {kind.rstrip('s')}"] = str(value)
        for env_name, value in env_pairs(c):
            facts[f"{cname} env {env_name}"] = value
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if c.get(probe):
                facts[f"{cname} {probe.removesuffix('Probe')} probe"] = _probe(c[probe])
        for mount in c.get("volumeMounts") or []:
            facts[f"{cname} mount {mount.get('mountPath')}"] = str(mount.get("name"))
        if c.get("args"):
            facts[f"{cname} args"] = " ".join(str(a) for a in c["args"])
        if c.get("command"):
            facts[f"{cname} command"] = " ".join(str(a) for a in c["command"])
    for volume in pod_spec.get("volumes") or []:
        facts[f"volume {volume.get('name')}"] = volume_line(volume).split(": ", 1)[-1]
    return facts


def names_in(objs: Sequence[Mapping[str, Any]]) -> set[str]:
    """The names of ``objs``."""
    return {name(o) for o in objs}
