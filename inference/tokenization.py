"""The model's tokenizer behind :class:`inference.engine.ChatTokenizer` (Hugging Face ``tokenizers``).

Both engines render prompts here, so the bot counts tokens for its budget with exactly the
ids the engine receives, and the shared system prompt renders to the same prefix every time.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from inference.engine import ChatMessage, ChatTokenizer, EngineStartupError


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
        return len(self._tok.encode(text, add_special_tokens=False))

    def render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> list[int]:
        conversation = [{"role": m.role, "content": m.content} for m in messages]
        ids = self._tok.apply_chat_template(
            conversation, add_generation_prompt=add_generation_prompt, tokenize=True
        )
        # transformers 5 returns a BatchEncoding-like mapping for tokenize=True on some paths.
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return [int(i) for i in ids]

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(token_ids), skip_special_tokens=True))
