"""``opsbot config show``: the effective configuration as valid TOML, each value with where it came
from (``# default``, ``# file opsbot.toml``, ``# env OPSBOT_...``), and the model that will load.

The output can be saved as an ``opsbot.toml`` and read back (secrets are masked, unset values are
comments: TOML has no null). Provenance is decided per key: an environment variable that names it
(or a section above it, as JSON) wins, as it does when settings load; then the file; else default.
"""

from __future__ import annotations

import json
import math
import os
import re
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bot.config import CONFIG_FILE_ENV, DEFAULT_CONFIG_FILE, Settings, env_name

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def config_path() -> Path:
    """The configuration file settings are read from (it may not exist)."""
    return Path(os.environ.get(CONFIG_FILE_ENV) or DEFAULT_CONFIG_FILE)


def _file_data(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return {}


class Provenance:
    """Where each key's value came from (see the module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.file = _file_data(path)
        self.env = {key.upper(): key for key in os.environ}

    def of(self, parts: Sequence[str]) -> str:
        """``env OPSBOT_X``, ``file opsbot.toml`` or ``default`` for the key at ``parts``."""
        for depth in range(len(parts), 0, -1):
            name = env_name(parts[:depth])
            if name in self.env:
                return f"env {self.env[name]}"
        node: Any = self.file
        for part in parts:
            if not isinstance(node, Mapping) or part not in node:
                return "default"
            node = node[part]
        return f"file {self.path}"


def _key(name: str) -> str:
    return name if _BARE_KEY.match(name) else json.dumps(name)


def _value(value: Any) -> str | None:
    """``value`` as a TOML value, or ``None`` when TOML cannot write it (null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return "nan" if math.isnan(value) else repr(value)
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, Mapping):
        pairs = [(str(k), _value(v)) for k, v in value.items()]
        return "{" + ", ".join(f"{_key(k)} = {v}" for k, v in pairs if v is not None) + "}"
    if isinstance(value, list | tuple):
        shown = [_value(v) for v in value]
        return "[" + ", ".join(v for v in shown if v is not None) + "]"
    return json.dumps(str(value))


def _is_table(value: Any) -> bool:
    return isinstance(value, Mapping) and bool(value)


def render_toml(data: Mapping[str, Any], provenance: Provenance) -> str:
    """``data`` (the masked settings) as TOML: plain keys first, then one ``[table]`` per section
    (nested sections as ``[a.b]``), each line with its provenance comment."""
    lines: list[str] = []

    def table(node: Mapping[str, Any], parts: tuple[str, ...]) -> None:
        if parts:
            lines.append("")
            lines.append("[" + ".".join(_key(p) for p in parts) + "]")
        subtables = []
        for name, value in node.items():
            here = (*parts, str(name))
            if _is_table(value):
                subtables.append((here, value))
                continue
            shown = _value(value)
            origin = provenance.of(here)
            if shown is None:
                lines.append(f"# {_key(str(name))} is unset  # {origin}")
            else:
                lines.append(f"{_key(str(name))} = {shown}  # {origin}")
        for here, value in subtables:
            table(value, here)

    table(data, ())
    return "\n".join(lines).strip("\n") + "\n"


def model_to_load(settings: Settings) -> str:
    """Which model ``opsbot chat`` / ``run`` will load, without loading or fetching anything."""
    from bot.default_model import default_gguf_path
    from bot.engine_factory import default_model_dir

    engine = settings.engine
    if engine.model:
        return f"{engine.model} (engine.model, backend {engine.backend})"
    if engine.backend == "openai":
        return f"{engine.served_model_name or 'the server’s model'} on {engine.base_url} (backend openai)"
    gguf = default_gguf_path(settings.data_dir)
    fetched = "kept" if gguf.is_file() else "fetched from the package index on first start"
    quantization = gguf.name.split(".")[-2]  # SmolLM2-135M-Instruct.Q8_0.gguf -> Q8_0
    return (
        f"SmolLM2-135M-Instruct, a 135M-parameter toy ({quantization} GGUF at {gguf}, {fetched}; on vLLM, or "
        f"when it cannot be had, the random-weights test model in {default_model_dir(settings)}). "
        "Set engine.model for real answers"
    )


def show_toml(settings: Settings) -> str:
    """The whole ``config show`` text (see the module doc)."""
    path = config_path()
    where = f"{path} (found)" if path.is_file() else f"{path} (not found: defaults and environment only)"
    header = [
        "# opsbot effective configuration; secrets are masked",
        f"# configuration file: {where}",
        f"# model that will load: {model_to_load(settings)}",
        "# after each value: where it came from (default, file, env)",
        "",
    ]
    return "\n".join(header) + render_toml(settings.masked(), Provenance(path))
