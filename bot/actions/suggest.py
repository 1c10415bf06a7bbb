"""Fixes an answer suggests: the ``kubectl`` commands in its text that are catalog actions.

An answer often ends with the command to type (``kubectl rollout undo deployment/api -n shop``).
Each such command becomes an :class:`~bot.actions.catalog.ActionSpec`, so the pipeline can offer it
as a card (dry run first, a person approves) instead of leaving it to be copied into a terminal.
The answer is model output, so a command is offered only when it is exactly one catalog form, its
target is named in the evidence the answer was written from (a name the model made up, or a
``<placeholder>``, is never offered) and its namespace is one the channel may read.

Forms read (``-n``/``--namespace`` anywhere, ``KIND/NAME`` or ``KIND NAME``)::

    kubectl rollout restart deployment|statefulset|daemonset NAME
    kubectl rollout undo deployment NAME [--to-revision=N]
    kubectl scale deployment|statefulset NAME --replicas=N
    kubectl delete pod NAME
    kubectl cordon NODE · kubectl uncordon NODE
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bot.actions.catalog import ActionError, ActionSpec, canonical_kind

_COMMAND = re.compile(r"\bkubectl\s+([^\n`|;&<>$]*)")
"""``kubectl`` and its words up to the end of the line, a code span's end or a shell operator."""
_VALUE_FLAGS = {"-n", "--namespace", "--context", "--cluster", "--kubeconfig", "--replicas", "--to-revision"}


@dataclass(frozen=True)
class Suggested:
    """One catalog action an answer suggests, and the command it was read from."""

    spec: ActionSpec
    command: str


def suggested_actions(
    answer: str,
    *,
    known: Callable[[str], bool],
    namespaces: Sequence[str],
    most: int,
) -> list[Suggested]:
    """The catalog actions ``answer``'s ``kubectl`` commands name, in order, at most ``most``, each
    once. ``known(name)``: the target is named in the evidence; ``namespaces``: those the channel
    may read (a command without ``-n`` takes the only one, and is skipped when there are several;
    empty: any namespace, and a command must say which; a node action only then)."""
    found: list[Suggested] = []
    seen: set[str] = set()
    for match in _COMMAND.finditer(answer):
        command = "kubectl " + match.group(1).strip()
        spec = _spec(match.group(1), namespaces)
        if spec is None or spec.digest() in seen or not known(str(spec.params["name"])):
            continue
        if namespaces and (spec.namespace is None or spec.namespace not in namespaces):
            continue  # outside the channel's namespaces, or a node where the channel has namespaces
        seen.add(spec.digest())
        found.append(Suggested(spec, command))
        if len(found) >= most:
            break
    return found


def named_in(texts: Sequence[str]) -> Callable[[str], bool]:
    """``known`` for :func:`suggested_actions`: whether a name occurs in ``texts`` as a whole name
    (``api`` is not named by ``api-gateway``)."""
    joined = "\n".join(texts)

    def known(name: str) -> bool:
        return re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-]|\.\w)", joined) is not None

    return known


def _spec(words_text: str, namespaces: Sequence[str]) -> ActionSpec | None:
    """The one catalog action ``kubectl <words_text>`` is, or ``None``."""
    try:
        words = shlex.split(words_text)
    except ValueError:
        return None
    flags, rest = _flags(words)
    if flags is None:
        return None
    verb = rest[:2] if rest[:1] == ["rollout"] else rest[:1]
    targets = rest[len(verb) :]
    action = {
        ("rollout", "restart"): "rollout_restart",
        ("rollout", "undo"): "rollback",
        ("scale",): "scale",
        ("delete",): "delete_pod",
        ("cordon",): "cordon",
        ("uncordon",): "uncordon",
    }.get(tuple(verb))
    if action is None:
        return None
    target = _target(targets, "node" if action in ("cordon", "uncordon") else None)
    if target is None:
        return None
    kind, name = target
    params: dict[str, Any] = {"kind": kind, "name": name}
    if kind != "node":
        namespace = flags.get("namespace") or (namespaces[0] if len(namespaces) == 1 else None)
        if namespace is None:
            return None
        params["namespace"] = namespace
    try:
        if action == "scale":
            params["replicas"] = int(flags["replicas"])
        if action == "rollback" and "to-revision" in flags:
            params["revision"] = int(flags["to-revision"])
        return ActionSpec(action, params)
    except (KeyError, ValueError, ActionError):
        return None  # not one catalog form: a wrong kind, a placeholder name, no replica count


def _flags(words: list[str]) -> tuple[dict[str, str] | None, list[str]]:
    """``(flags by name without dashes, the other words)``; ``None`` flags for an unknown flag (a
    command with options the catalog does not model is not the action it names)."""
    flags: dict[str, str] = {}
    rest: list[str] = []
    index = 0
    while index < len(words):
        word = words[index]
        if word.startswith("-"):
            key, sep, value = word.partition("=")
            if key not in _VALUE_FLAGS:
                return None, rest
            if not sep:
                index += 1
                if index >= len(words):
                    return None, rest
                value = words[index]
            flags[{"-n": "namespace"}.get(key, key.lstrip("-"))] = value
        else:
            rest.append(word)
        index += 1
    return flags, rest


def _target(words: list[str], kind: str | None) -> tuple[str, str] | None:
    """``(kind, name)`` of ``KIND/NAME``, ``KIND NAME`` or (a node) ``NAME``."""
    if len(words) == 1 and "/" in words[0]:
        raw_kind, _, name = words[0].partition("/")
    elif len(words) == 2:
        raw_kind, name = words
    elif len(words) == 1 and kind is not None:
        raw_kind, name = kind, words[0]
    else:
        return None
    return canonical_kind(raw_kind), name
