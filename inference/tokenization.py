"""The model's tokenizer behind :class:`inference.engine.ChatTokenizer` (Hugging Face ``tokenizers``).

Both engines render prompts here, so the bot counts tokens for its budget with exactly the
ids the engine receives, and the shared system prompt renders to the same prefix every time.

The system prompt (about 1,500 tokens) is most of every prompt and the prompt builder renders each
request up to three times while it fits context to the window, so its token ids are kept (a few
system prompts, one per scenario and engine) and only the rest of the prompt is encoded. That is
exact only where the rest starts at a special token (the tokenizer splits on those before anything
else), and each such boundary is checked once against a full encoding before it is trusted: a
tokenizer whose pre-tokenizer treats the first piece of a text differently never uses the shortcut.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inference.engine import ChatMessage, ChatTokenizer, EngineStartupError

# System prompts whose token ids are kept: one per scenario preset and engine is a handful.
SYSTEM_PREFIX_CACHE_SIZE = 16


class HFChatTokenizer(ChatTokenizer):
    """A ``transformers`` tokenizer with a chat template, loaded from a folder or hub id."""

    def __init__(self, model: str, *, trust_remote_code: bool = False, gguf_file: str | None = None) -> None:
        """``gguf_file``: the tokenizer is the one stored in that GGUF file inside the folder ``model``."""
        from transformers import AutoTokenizer  # heavy import, kept off the module path

        extra = {"gguf_file": gguf_file} if gguf_file else {}
        try:
            self._tok: Any = AutoTokenizer.from_pretrained(
                model, trust_remote_code=trust_remote_code, **extra
            )
        except OSError as exc:
            where = "folder" if Path(model).exists() else "Hugging Face id or folder"
            raise EngineStartupError(
                f"cannot load a tokenizer from {model!r} ({where}): {exc}. Fix: point engine.model at "
                "a folder with tokenizer.json / tokenizer_config.json, or run `opsbot make-test-model DIR`"
            ) from exc
        if not getattr(self._tok, "chat_template", None):
            raise EngineStartupError(
                f"the tokenizer of {model!r} has no chat template. Fix: use an instruction-tuned model, "
                "or add a 'chat_template' to its tokenizer_config.json"
            )
        # Longest first, so a special token that begins with another one is matched whole.
        # Added tokens are split out before anything else (Llama 3's header tokens are added ones
        # that all_special_tokens does not list).
        added = {
            str(getattr(t, "content", t)) for t in getattr(self._tok, "added_tokens_decoder", {}).values()
        }
        special = {str(t) for t in getattr(self._tok, "all_special_tokens", ())}
        self._special_tokens = tuple(sorted((added | special) - {""}, key=len, reverse=True))
        # system messages -> (their rendered text, its ids); (system messages, boundary token) -> verdict
        self._prefixes: OrderedDict[tuple[str, ...], tuple[str, list[int]]] = OrderedDict()
        self._boundary_ok: dict[tuple[tuple[str, ...], str], bool] = {}
        self._lock = threading.Lock()
        self._backend = _checked_backend(self._tok)

    def __getstate__(self) -> dict[str, Any]:
        """Picklable (``workers`` send it to each bot process): everything but the lock and the
        backend handle (the tokenizer's own, found again on arrival)."""
        state = dict(self.__dict__)
        del state["_lock"], state["_backend"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._backend = _checked_backend(self._tok)

    @property
    def eos_token_id(self) -> int | None:
        """The end-of-sequence id generation stops at."""
        value = self._tok.eos_token_id
        return int(value) if value is not None else None

    @property
    def hf(self) -> Any:
        """The underlying ``transformers`` tokenizer (for engines that need it)."""
        return self._tok

    def count(self, text: str) -> int:
        return len(self._encode(text))

    def render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> list[int]:
        text = self._template(messages, add_generation_prompt)
        system = tuple(m.content for m in _leading_system(messages))
        if not system or len(system) == len(messages):
            return self._encode(text)
        prefix = self._system_prefix(messages[: len(system)], system, text)
        if prefix is None:
            return self._encode(text)
        prefix_text, prefix_ids = prefix
        rest = text[len(prefix_text) :]
        boundary = next((t for t in self._special_tokens if rest.startswith(t)), None)
        if boundary is None:
            return self._encode(text)
        with self._lock:
            verdict = self._boundary_ok.get((system, boundary))
        if verdict is False:  # checked once and found wrong for this tokenizer: no half encoding
            return self._encode(text)
        ids = prefix_ids + self._encode(rest)
        if verdict is None:
            full = self._encode(text)
            with self._lock:
                self._boundary_ok[(system, boundary)] = full == ids
            return full
        return ids

    def _template(self, messages: Sequence[ChatMessage], add_generation_prompt: bool) -> str:
        conversation = [{"role": m.role, "content": m.content} for m in messages]
        return str(
            self._tok.apply_chat_template(
                conversation, add_generation_prompt=add_generation_prompt, tokenize=False
            )
        )

    def _encode(self, text: str) -> list[int]:
        # As apply_chat_template(tokenize=True) does: the template writes BOS and the like itself.
        if self._backend is not None:
            return list(self._backend.encode(text, add_special_tokens=False).ids)
        return [int(i) for i in self._tok.encode(text, add_special_tokens=False)]

    def _system_prefix(
        self, system_messages: Sequence[ChatMessage], key: tuple[str, ...], text: str
    ) -> tuple[str, list[int]] | None:
        """The rendered system messages and their ids where ``text`` starts with them, else None."""
        with self._lock:
            cached = self._prefixes.get(key)
            if cached is not None:
                self._prefixes.move_to_end(key)
        if cached is not None and text.startswith(cached[0]):
            return cached if cached[0] else None
        # Not seen, or the template renders it differently now (a date in it): render it again.
        # An empty text marks a template that never starts the conversation with the system turn
        # alone (one that folds it into the first user turn): no shortcut, and no render per call.
        fresh = self._template(system_messages, add_generation_prompt=False)
        entry = (fresh, self._encode(fresh)) if fresh and text.startswith(fresh) else ("", [])
        with self._lock:
            self._prefixes[key] = entry
            self._prefixes.move_to_end(key)
            while len(self._prefixes) > SYSTEM_PREFIX_CACHE_SIZE:
                dropped, _ = self._prefixes.popitem(last=False)
                for boundary_key in [k for k in self._boundary_ok if k[0] == dropped]:
                    del self._boundary_ok[boundary_key]
        return entry if entry[0] else None

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(token_ids), skip_special_tokens=True))


_BACKEND_PROBE = "pod checkout-api-7d9f4 OOMKilled 14x\n  café ✓ <|x|> [INST] 0.25s"
"""A text the fast backend must encode exactly as ``transformers`` does before it is used alone."""


def _checked_backend(tok: Any) -> Any | None:
    """The fast tokenizer's ``tokenizers.Tokenizer`` when encoding through it gives the very ids
    ``transformers``' ``encode`` gives (its Python layer around the same call was 6% of the event
    loop's time under a burst), else None (a slow tokenizer, or one whose wrapper changes the text)."""
    backend = getattr(tok, "backend_tokenizer", None) if getattr(tok, "is_fast", False) else None
    if backend is None:
        return None
    try:
        same = list(backend.encode(_BACKEND_PROBE, add_special_tokens=False).ids) == [
            int(i) for i in tok.encode(_BACKEND_PROBE, add_special_tokens=False)
        ]
    except Exception:  # an exotic backend: the wrapper it is
        return None
    return backend if same else None


def _leading_system(messages: Sequence[ChatMessage]) -> list[ChatMessage]:
    """The system messages a conversation starts with (the shared, cacheable part)."""
    leading: list[ChatMessage] = []
    for message in messages:
        if message.role != "system":
            break
        leading.append(message)
    return leading
