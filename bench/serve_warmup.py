"""The in-process engine's incident-shaped warm-up, sent to ``vllm serve`` over HTTP (issue 40).

opsbot's vLLM engine runs :func:`inference.vllm_engine.warm_incident_shapes` at start (a full batch
decoding while prompts prefill beside it, then short urgent ones), and the bench warms raw AsyncLLM
with the same function. Before issue 40 the remote-server design got no such warm-up, so its first
burst paid the one-off kernel and allocator costs the other two had already paid. This runs that
very function against the server: its ``llm.generate`` calls become streamed ``/v1/completions``
requests with the same prompt ids (the bot's system prompt rendered by the model's tokenizer, then
random ids), lengths, sampling and priorities.

    python bench/serve_warmup.py --base-url http://127.0.0.1:18931 --model-name opsbot-8b \
        --model .pytest_cache/opsbot-models/8b-v2 --engine-arg max_num_seqs=64 ...
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from e2e_bench import parse_value  # noqa: E402

from bot.config import Settings  # noqa: E402
from bot.prompts import load_system_prompt  # noqa: E402
from inference.config import EngineConfig  # noqa: E402
from inference.engine import ChatMessage  # noqa: E402
from inference.tokenization import HFChatTokenizer  # noqa: E402
from inference.vllm_engine import warm_incident_shapes  # noqa: E402


class HttpLLM:
    """The one ``AsyncLLM.generate`` call :func:`warm_incident_shapes` makes, over the OpenAI API."""

    def __init__(self, session: Any, base_url: str, model: str) -> None:
        self.session = session
        self.url = base_url.rstrip("/") + "/v1/completions"
        self.model = model
        self.requests = 0

    async def generate(
        self, prompt: Any, params: Any, request_id: str, priority: int = 0
    ) -> AsyncIterator[str]:
        body = {
            "model": self.model,
            "prompt": list(prompt["prompt_token_ids"]),
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "repetition_penalty": params.repetition_penalty,
            "ignore_eos": True,
            "priority": priority,
            "stream": True,
        }
        self.requests += 1
        async with self.session.post(self.url, json=body) as resp:
            if resp.status != 200:
                raise RuntimeError(f"{self.url} answered {resp.status}: {(await resp.text())[:300]}")
            async for line in resp.content:
                if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                    yield line.decode()


async def main_async(args: argparse.Namespace) -> int:
    import aiohttp

    engine = {k: parse_value(v) for k, v in (a.split("=", 1) for a in args.engine_arg)}
    config = EngineConfig(model=args.model, max_model_len=args.max_model_len, **engine)
    settings = Settings()
    system = load_system_prompt(settings.prompt.system_prompt, settings.prompt.system_prompt_file)
    tokenizer = HFChatTokenizer(args.model)
    ids = tokenizer.render([ChatMessage("system", system)], add_generation_prompt=False)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        llm = HttpLLM(session, args.base_url, args.model_name)
        seconds = await warm_incident_shapes(llm, ids, config, vocab_size=len(tokenizer.hf))  # type: ignore[arg-type]
    print(f"incident-shaped warm-up of {args.base_url}: {llm.requests} requests, {len(ids)}-token system "
          f"prompt, {seconds:.1f} s", flush=True)  # fmt: skip
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--base-url", required=True)
    p.add_argument("--model-name", required=True, help="the served model name")
    p.add_argument("--model", required=True, help="the model folder (its tokenizer renders the prompt)")
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--engine-arg", action="append", default=[], metavar="KEY=VALUE",
                   help="the [engine] settings of the in-process runs (max_num_seqs, ...)")  # fmt: skip
    return asyncio.run(main_async(p.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
