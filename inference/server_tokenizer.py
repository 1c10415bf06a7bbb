"""The model's tokenizer as the model server itself serves it (``/tokenize``, ``/detokenize``).

Used by the ``openai`` backend when no local tokenizer is configured. :class:`ChatTokenizer` is a
synchronous interface (the prompt builder counts and renders inline), so every call here is one
blocking HTTP round trip on the calling thread: milliseconds per prompt to a server on the same
host (the server tokenizes too), more across a network. Counts are cached (history turns and
context sections repeat across follow-ups), renders are not. Set ``engine.tokenizer`` to the
model's tokenizer folder or id to avoid the round trips; the engine then renders locally and
sends token ids.

Routes per server kind:

- vLLM: ``POST /tokenize`` ``{"model", "prompt", "add_special_tokens": false}`` and
  ``{"model", "messages", "add_generation_prompt"}`` (the server's own chat template) ->
  ``{"count", "max_model_len", "tokens"}``; ``POST /detokenize`` ``{"model", "tokens"}`` ->
  ``{"prompt"}``.
- llama.cpp: ``POST /apply-template`` ``{"messages"}`` -> ``{"prompt"}``, then ``POST /tokenize``
  ``{"content", "add_special": false, "parse_special": true}`` -> ``{"tokens"}``;
  ``POST /detokenize`` ``{"tokens"}`` -> ``{"content"}``.

Unlike :class:`~inference.tokenization.HFChatTokenizer`, :meth:`decode` keeps special tokens: both
servers' ``/detokenize`` do.
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import json
import threading
from collections.abc import Sequence
from typing import Any, Literal
from urllib.parse import urlsplit

from inference.engine import ChatMessage, ChatTokenizer, EngineDeadError, EngineGenerateError

ServerKind = Literal["vllm", "llamacpp"]


class ServerTokenizer(ChatTokenizer):
    """:class:`ChatTokenizer` over a vLLM or llama.cpp server's tokenizer routes (see the module doc)."""

    def __init__(
        self,
        base_url: str,
        *,
        kind: ServerKind,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.kind = kind
        self.model = model
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._timeout_s = timeout_s
        self._headers = {"Content-Type": "application/json"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._local = threading.local()  # one keep-alive connection per calling thread
        self._all: list[http.client.HTTPConnection] = []
        self._all_lock = threading.Lock()
        self._count = functools.lru_cache(maxsize=4096)(self._count_uncached)

    def count(self, text: str) -> int:
        return self._count(text)

    def _count_uncached(self, text: str) -> int:
        if self.kind == "vllm":
            reply = self._post(
                "/tokenize", {"model": self.model, "prompt": text, "add_special_tokens": False}
            )
        else:
            reply = self._post("/tokenize", {"content": text, "add_special": False, "parse_special": False})
        return len(_ids(reply, "/tokenize"))

    def render(self, messages: Sequence[ChatMessage], add_generation_prompt: bool = True) -> list[int]:
        conversation = [{"role": m.role, "content": m.content} for m in messages]
        if self.kind == "vllm":
            body = {
                "model": self.model,
                "messages": conversation,
                "add_generation_prompt": add_generation_prompt,
                "add_special_tokens": False,
            }
            return _ids(self._post("/tokenize", body), "/tokenize")
        # The template's own text (special tokens written out) is tokenized as it stands.
        rendered = self._post(
            "/apply-template", {"messages": conversation, "add_generation_prompt": add_generation_prompt}
        )
        prompt = rendered.get("prompt") if isinstance(rendered, dict) else None
        if not isinstance(prompt, str):
            raise EngineGenerateError(
                f"{self.base_url}/apply-template answered without a prompt: {rendered!r:.200}"
            )
        body = {"content": prompt, "add_special": False, "parse_special": True}
        return _ids(self._post("/tokenize", body), "/tokenize")

    def decode(self, token_ids: Sequence[int]) -> str:
        tokens = [int(t) for t in token_ids]
        if self.kind == "vllm":
            reply = self._post("/detokenize", {"model": self.model, "tokens": tokens})
            text = reply.get("prompt") if isinstance(reply, dict) else None
        else:
            reply = self._post("/detokenize", {"tokens": tokens})
            text = reply.get("content") if isinstance(reply, dict) else None
        if not isinstance(text, str):
            raise EngineGenerateError(f"{self.base_url}/detokenize answered without text: {reply!r:.200}")
        return text

    def close(self) -> None:
        """Close every thread's connection (at engine shutdown)."""
        with self._all_lock:
            connections, self._all = self._all, []
        for conn in connections:
            conn.close()

    # --- HTTP ------------------------------------------------------------------------------------

    def _connection(self) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
            conn = cls(self._host, self._port, timeout=self._timeout_s)
            self._local.conn = conn
            with self._all_lock:
                self._all.append(conn)
        return conn

    def _post(self, path: str, body: dict[str, Any]) -> Any:
        payload = json.dumps(body).encode("utf-8")
        url = self.base_url + path
        for attempt in (1, 2):
            conn = self._connection()
            reused = conn.sock is not None
            try:
                conn.request("POST", self._prefix + path, body=payload, headers=self._headers)
                response = conn.getresponse()
                raw = response.read()
            except (http.client.HTTPException, OSError) as exc:
                conn.close()
                self._local.conn = None
                with self._all_lock, contextlib.suppress(ValueError):
                    self._all.remove(conn)
                # A keep-alive connection the server closed meanwhile: one fresh try.
                if attempt == 1 and reused:
                    continue
                raise EngineDeadError(f"the model server's tokenizer at {url} is unreachable: {exc}") from exc
            break
        if response.status != 200:
            raise EngineGenerateError(
                f"the model server's tokenizer at {url} answered {response.status}: {_message(raw)}"
            )
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise EngineGenerateError(f"{url} answered with invalid JSON: {raw[:200]!r}") from exc


def _ids(reply: Any, route: str) -> list[int]:
    tokens = reply.get("tokens") if isinstance(reply, dict) else None
    if not isinstance(tokens, list):
        raise EngineGenerateError(f"{route} answered without a token list: {reply!r:.200}")
    # llama.cpp returns {"id", "piece"} objects when asked for pieces; ids otherwise.
    return [int(t["id"]) if isinstance(t, dict) else int(t) for t in tokens]


def _message(raw: bytes) -> str:
    """The error message of an OpenAI-style error body, else the body's start."""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw[:300].decode("utf-8", "replace")
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and "message" in error:
        return str(error["message"])
    if isinstance(error, str):
        return error
    return str(body)[:300]


__all__ = ["ServerKind", "ServerTokenizer"]
