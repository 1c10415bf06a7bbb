"""Finding the GGUF file a configuration names: a ``.gguf`` path, or a folder that holds one.

Both CPU engines read GGUF (``inference.llamacpp_engine`` through llama.cpp, ``inference.cpu_engine``
through transformers' ``gguf_file=`` loading), so the rule for which file a setting means lives here
once. Nothing heavy is imported.
"""

from __future__ import annotations

from pathlib import Path

from inference.engine import EngineStartupError

GGUF_SUFFIX = ".gguf"


def is_gguf_ref(model: str, gguf_file: str | None = None) -> bool:
    """Whether ``model`` (with ``engine.gguf_file``) names a GGUF model rather than a transformers one:
    a ``.gguf`` file, or a folder with ``gguf_file`` set or with ``*.gguf`` and no ``config.json``."""
    path = Path(model).expanduser()
    if path.suffix.lower() == GGUF_SUFFIX:
        return True
    if not path.is_dir():
        return False
    if gguf_file:
        return True
    return not (path / "config.json").is_file() and any(path.glob(f"*{GGUF_SUFFIX}"))


def find_gguf(model: str, gguf_file: str | None = None) -> Path:
    """The GGUF file ``model`` names: the file itself, ``gguf_file`` inside the folder ``model``, or
    the folder's only ``*.gguf``; :class:`EngineStartupError` naming the fix otherwise.

    Split files (``name-00001-of-00003.gguf``) are named by their first part, as llama.cpp loads them.
    """
    path = Path(model).expanduser()
    if path.is_file():
        if path.suffix.lower() != GGUF_SUFFIX:
            raise EngineStartupError(
                f"engine.model {model!r} is a file but not a GGUF file (*.gguf). Fix: point engine.model "
                "at a .gguf file or at the folder that holds one"
            )
        return path.resolve()
    if path.suffix.lower() == GGUF_SUFFIX or not path.is_dir():
        raise EngineStartupError(
            f"engine.model {model!r} does not exist. Fix: set engine.model to a .gguf file or a folder "
            "holding one (unset: opsbot fetches SmolLM2-135M-Instruct into data_dir)"
        )
    if gguf_file:
        chosen = path / gguf_file
        if not chosen.is_file():
            present = ", ".join(sorted(p.name for p in path.glob(f"*{GGUF_SUFFIX}"))) or "none"
            raise EngineStartupError(
                f"engine.gguf_file {gguf_file!r} is not in {path} (GGUF files there: {present}). Fix: set "
                "engine.gguf_file to one of them"
            )
        return chosen.resolve()
    # Only first parts of split models count; a folder of several quantizations needs a choice.
    candidates = sorted(
        p
        for p in path.glob(f"*{GGUF_SUFFIX}")
        if "-of-" not in p.stem or p.stem.split("-of-")[0].endswith("1")
    )
    if not candidates:
        raise EngineStartupError(
            f"{path} holds no .gguf file. Fix: point engine.model at a GGUF file or a folder holding one"
        )
    if len(candidates) > 1:
        names = ", ".join(p.name for p in candidates)
        raise EngineStartupError(
            f"{path} holds several GGUF files ({names}). Fix: set engine.gguf_file to the one to load"
        )
    return candidates[0].resolve()


__all__ = ["GGUF_SUFFIX", "find_gguf", "is_gguf_ref"]
