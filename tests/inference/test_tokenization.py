"""HFChatTokenizer.render keeps the system prompt's ids and encodes only the rest, exactly.

Every result is compared with the tokenizer's own ``apply_chat_template(tokenize=True)``; a
tokenizer on which the shortcut would be wrong (an added token that strips the whitespace before
it) must be caught by the one-time check and always get the full encoding.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest

from inference.engine import ChatMessage
from inference.tokenization import SYSTEM_PREFIX_CACHE_SIZE, HFChatTokenizer, _checked_backend

SYSTEM = "You are opsbot, the on-call assistant. Answer from the fenced cluster data only.\n" * 40
PIECES = (
    " ",
    "\n",
    "\n\n",
    "a",
    "é",
    "  x",
    "pod-7f9c",
    "<|eot_id|>",
    "<|start_header_id|>",
    "\t",
    "日本",
    "CPU 93%",
)


def _direct(tok: HFChatTokenizer, messages: list[ChatMessage]) -> list[int]:
    ids: Any = tok.hf.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in messages], add_generation_prompt=True, tokenize=True
    )
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def _conversations(count: int, seed: int = 7) -> list[list[ChatMessage]]:
    rng = random.Random(seed)
    out = []
    for i in range(count):
        user = "".join(rng.choice(PIECES) for _ in range(rng.randint(0, 30)))
        turns = [ChatMessage("system", SYSTEM)]
        if i % 3 == 0:
            turns += [ChatMessage("user", "earlier question"), ChatMessage("assistant", " earlier answer ")]
        out.append([*turns, ChatMessage("user", user)])
    return out


def test_render_equals_the_full_encoding_for_any_user_text(tiny_model: Path) -> None:
    tok = HFChatTokenizer(str(tiny_model))
    for messages in _conversations(120):
        assert tok.render(messages) == _direct(tok, messages)


def test_after_the_first_render_only_the_rest_of_the_prompt_is_encoded(
    tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tok = HFChatTokenizer(str(tiny_model))
    first, second = _conversations(2, seed=3)
    tok.render(first)  # renders and checks the boundary once
    encoded: list[str] = []
    backend = tok._backend
    assert backend is not None, "a fast tokenizer encodes through its backend"

    class Spy:
        def encode(self, text: str, **kwargs: Any) -> Any:
            encoded.append(text)
            return backend.encode(text, **kwargs)

    monkeypatch.setattr(tok, "_backend", Spy())
    assert tok.render(second) == _direct(tok, second)
    assert len(encoded) == 1 and SYSTEM not in encoded[0], "the system prompt was encoded again"


def test_the_backend_encodes_as_transformers_does_or_is_not_used(tiny_model: Path) -> None:
    tok = HFChatTokenizer(str(tiny_model))
    texts = [SYSTEM, "  lead space", "tab\tand\nnewline", "émoji ✓ 🔥", "<|im_start|>user x", ""]
    for text in texts:
        assert tok.count(text) == len(tok.hf.encode(text, add_special_tokens=False))
        assert tok._encode(text) == [int(i) for i in tok.hf.encode(text, add_special_tokens=False)]

    class Wrapped:  # a wrapper that changes the text before its backend sees it
        is_fast = True
        backend_tokenizer = tok.hf.backend_tokenizer

        def encode(self, text: str, **kwargs: Any) -> list[int]:
            return [int(i) for i in tok.hf.encode(text.lower(), **kwargs)]

    assert _checked_backend(Wrapped()) is None
    assert _checked_backend(object()) is None  # a slow tokenizer: no backend


def test_many_system_prompts_stay_exact_and_bounded(tiny_model: Path) -> None:
    tok = HFChatTokenizer(str(tiny_model))
    for round_ in range(2):
        for i in range(SYSTEM_PREFIX_CACHE_SIZE + 4):
            messages = [ChatMessage("system", f"preset {i}: " + SYSTEM), ChatMessage("user", f"q{round_}")]
            assert tok.render(messages) == _direct(tok, messages)
    assert len(tok._prefixes) <= SYSTEM_PREFIX_CACHE_SIZE


def test_a_conversation_without_a_system_turn_or_only_one_is_encoded_whole(tiny_model: Path) -> None:
    tok = HFChatTokenizer(str(tiny_model))
    for messages in ([ChatMessage("user", "hi")], [ChatMessage("system", SYSTEM)]):
        assert tok.render(messages) == _direct(tok, messages)


def test_a_tokenizer_where_the_shortcut_is_wrong_always_gets_the_full_encoding(
    tiny_model: Path, tmp_path: Path
) -> None:
    # Each turn ends with a newline and the next starts with <|start_header_id|>, which strips the
    # whitespace on its left (lstrip): encoded whole, the newline disappears; encoded in two parts
    # it would stay. The check at the first render must see that and never take the shortcut.
    folder = tmp_path / "lstrip"
    shutil.copytree(tiny_model, folder)
    tokenizer = json.loads((folder / "tokenizer.json").read_text())
    for token in tokenizer["added_tokens"]:
        if token["content"] == "<|start_header_id|>":
            token["lstrip"] = True
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer))
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config["chat_template"] = (
        "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] }}\n"
        "{% endfor %}{% if add_generation_prompt %}"
        "<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    tok = HFChatTokenizer(str(folder))
    messages = [ChatMessage("system", SYSTEM), ChatMessage("user", "why is checkout failing?")]
    prefix_ids = tok.hf.encode(
        tok.hf.apply_chat_template([{"role": "system", "content": SYSTEM}], tokenize=False),
        add_special_tokens=False,
    )
    assert _direct(tok, messages)[: len(prefix_ids)] != prefix_ids, "the fixture no longer exercises lstrip"
    for _ in range(3):  # the first render checks; the later ones must not trust the shortcut
        assert tok.render(messages) == _direct(tok, messages)
