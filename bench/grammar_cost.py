"""What the llama.cpp grammar costs per token: the same model and prompt decoded greedily, free text
against a tool decision under the investigation's schema (every built-in tool offered), twice each.

    python bench/grammar_cost.py [MODEL.gguf]     # default: the shipped SmolLM2 GGUF

Prints ms per generated token for each run and the text it wrote (the first token's time, the
prompt's prefill, is left out). A check of one number, not a benchmark with episodes: see
``bench/investigate_bench.py`` for the loop as a whole.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bot.config import KubernetesSettings, PrometheusSettings, Settings  # noqa: E402
from bot.context.gatherer import ContextGatherer  # noqa: E402
from bot.default_model import ensure_default_gguf  # noqa: E402
from bot.tools.base import ClusterTools, ToolScope  # noqa: E402
from bot.tools.registry import ToolRegistry  # noqa: E402
from inference.engine import ToolSpec  # noqa: E402
from inference.tool_calls import decision_schema, final_answer_spec  # noqa: E402


def main() -> None:
    from llama_cpp import Llama, LlamaGrammar

    model = (
        sys.argv[1]
        if len(sys.argv) > 1
        else str(ensure_default_gguf(ROOT / ".pytest_cache" / "opsbot-models"))
    )
    settings = Settings(
        kubernetes=KubernetesSettings(enabled=True),
        prometheus=PrometheusSettings(enabled=True, url="http://x"),
    )
    scope = ToolScope(clusters=[ClusterTools(name="c", namespaces=("shop",))])
    tools = ToolRegistry(ContextGatherer.from_settings(settings)).tools
    specs = [ToolSpec(t.name, t.description, t.parameters(scope)) for t in tools]
    grammar = LlamaGrammar.from_json_schema(
        json.dumps(decision_schema([*specs, final_answer_spec()])), verbose=False
    )
    llm = Llama(model_path=model, n_ctx=4096, n_threads=2, verbose=False)
    prompt = llm.tokenize(
        b"<|im_start|>user\nWhy is api-1 in shop restarting? Call a tool as JSON.<|im_end|>\n"
        b"<|im_start|>assistant\n",
        special=True,
    )
    for label, constraint in (("free", None), ("grammar", grammar), ("free", None), ("grammar", grammar)):
        llm.reset()
        out: list[int] = []
        first = 0.0
        for token in llm.generate(
            prompt, top_k=0, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, grammar=constraint
        ):
            if not out:
                first = time.perf_counter()
            out.append(token)
            if token == llm.token_eos() or len(out) >= 60:
                break
        per_token = (time.perf_counter() - first) / max(1, len(out) - 1) * 1000
        print(f"{label:8} {len(out):3} tokens {per_token:6.1f} ms/token  {llm.detokenize(out)[:80]!r}")


if __name__ == "__main__":
    main()
