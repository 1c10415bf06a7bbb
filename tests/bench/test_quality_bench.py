"""bench/quality_bench.py's math on known distributions (KL on the top-k partition, top-1 agreement,
NLL, greedy prefixes), its prompts, and the GGUF chunking a device run's carry needs."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "quality_bench.py"


def load():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("quality_bench_under_test", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


qb = load()


def logs(probs: dict[int, float]) -> dict[int, float]:
    return {t: math.log(p) for t, p in probs.items()}


def full_kl(p: list[float], q: list[float]) -> float:
    return sum(pi * math.log(pi / qi) for pi, qi in zip(p, q, strict=True) if pi > 0)


def test_kl_of_a_distribution_with_itself_is_zero_and_agreement_is_total() -> None:
    p = logs({0: 0.7, 1: 0.2, 2: 0.1})
    kl, missing = qb.partition_kl(p, p)
    assert kl == pytest.approx(0.0, abs=1e-12) and missing == 0
    assert qb.top1(p) == 0


def test_kl_over_the_whole_vocabulary_is_the_textbook_value() -> None:
    # KL([.5, .5] || [.9, .1]) = .5 ln(.5/.9) + .5 ln(.5/.1) = 0.5108 nats
    kl, _ = qb.partition_kl(logs({0: 0.5, 1: 0.5}), logs({0: 0.9, 1: 0.1}))
    assert kl == pytest.approx(0.5 * math.log(0.5 / 0.9) + 0.5 * math.log(5.0), rel=1e-12)
    assert kl == pytest.approx(0.5108256, rel=1e-6)


def test_a_truncated_reference_gives_the_partition_kl_a_lower_bound_of_the_full_kl() -> None:
    p = [0.5, 0.3, 0.15, 0.05]
    q = [0.4, 0.2, 0.1, 0.3]
    # top-2 of p, the rest lumped: .5 ln(.5/.4) + .3 ln(.3/.2) + .2 ln(.2/.4)
    expected = 0.5 * math.log(0.5 / 0.4) + 0.3 * math.log(0.3 / 0.2) + 0.2 * math.log(0.2 / 0.4)
    kl, missing = qb.partition_kl(logs({0: 0.5, 1: 0.3}), logs(dict(enumerate(q))))
    assert kl == pytest.approx(expected, rel=1e-12) and missing == 0
    assert kl <= full_kl(p, q)


def test_on_random_distributions_the_partition_kl_never_exceeds_the_full_kl() -> None:
    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(3, 40)
        p = [rng.random() ** 3 for _ in range(n)]
        q = [rng.random() ** 3 + 1e-6 for _ in range(n)]
        p = [x / sum(p) for x in p]
        q = [x / sum(q) for x in q]
        k = rng.randint(1, n)
        top = dict(sorted(enumerate(p), key=lambda kv: -kv[1])[:k])
        kl, _ = qb.partition_kl(logs(top), logs(dict(enumerate(q))))
        assert kl <= full_kl(p, q) + 1e-12
        if k == n:
            assert kl == pytest.approx(full_kl(p, q), rel=1e-9)


def test_a_reference_token_missing_from_the_candidates_top_k_gets_its_smallest_probability() -> None:
    ref = logs({0: 0.6, 5: 0.3})
    cand = logs({0: 0.5, 1: 0.3, 2: 0.1})  # token 5 is below the candidate's top 3
    kl, missing = qb.partition_kl(ref, cand)
    expected = 0.6 * math.log(0.6 / 0.5) + 0.3 * math.log(0.3 / 0.1) + 0.1 * math.log(0.1 / 0.4)
    assert missing == 1 and kl == pytest.approx(expected, rel=1e-12)


def test_compare_counts_agreement_nll_and_greedy_prefixes_over_every_position() -> None:
    ref = qb.Scored(
        tops=[[logs({1: 0.8, 2: 0.2}), logs({3: 0.6, 4: 0.4})], [logs({5: 0.9, 6: 0.1})]],
        chosen=[[math.log(0.8), math.log(0.6)], [math.log(0.9)]],
        greedy=[[1, 3], [5]],
    )
    cand = qb.Scored(
        # the second position's favourite flips to 4; the others agree
        tops=[[logs({1: 0.7, 2: 0.3}), logs({4: 0.5, 3: 0.5 - 1e-9})], [logs({5: 0.9, 6: 0.1})]],
        chosen=[[math.log(0.7), math.log(0.5 - 1e-9)], [math.log(0.9)]],
        greedy=[[1, 4], [5]],
    )
    out = qb.compare(ref, cand, ref.greedy, ref_top=2)
    assert out["positions"] == 3
    assert out["top1_agreement"] == pytest.approx(2 / 3, abs=1e-5)
    assert out["nll_mean_nats"] == pytest.approx(
        -(math.log(0.7) + math.log(0.5) + math.log(0.9)) / 3, abs=1e-5
    )
    assert out["perplexity"] == pytest.approx(math.exp(out["nll_mean_nats"]), rel=1e-3)
    assert out["greedy_identical_share"] == 0.5 and out["greedy_common_prefix_mean_tokens"] == 1.0
    expected_first = 0.8 * math.log(0.8 / 0.7) + 0.2 * math.log(0.2 / 0.3)
    assert out["kl_max_nats"] >= expected_first - 1e-6 and out["missing_share"] == 0
    self_out = qb.compare(ref, ref, ref.greedy, ref_top=2)
    assert self_out["top1_agreement"] == 1.0 and self_out["kl_mean_nats"] == 0.0
    assert self_out["greedy_identical_share"] == 1.0


def test_compare_refuses_runs_that_scored_different_prompts() -> None:
    one = qb.Scored(tops=[[logs({1: 1.0})]], chosen=[[0.0]])
    two = qb.Scored(tops=[[logs({1: 1.0})], [logs({1: 1.0})]], chosen=[[0.0], [0.0]])
    with pytest.raises(ValueError, match="1 reference prompts but 2 candidate prompts"):
        qb.compare(one, two, [], ref_top=1)


def test_fifty_ops_prompts_are_distinct_and_cover_every_kind_of_question() -> None:
    prompts = qb.ops_prompts(50)
    assert len(prompts) == len(set(prompts)) == 50
    services = qb._SERVICES
    assert prompts[:9] == [ask.format(s=services[k % len(services)]) for k, ask in enumerate(qb._ASKS)]


def test_the_gguf_splits_into_chunks_that_fit_a_carry_and_joins_back_verified(tmp_path: Path) -> None:
    src = tmp_path / qb.GGUF_NAME
    src.write_bytes(random.Random(1).randbytes(5 * (1 << 20) + 123))
    manifest = qb.split_file(src, tmp_path / "parts", chunk_mib=2)
    assert manifest["parts"] == [f"{qb.GGUF_NAME}.{k:02d}" for k in range(3)]
    assert all((tmp_path / "parts" / p).stat().st_size <= 2 << 20 for p in manifest["parts"])
    joined = qb.join_parts(tmp_path / "parts", tmp_path / "joined.gguf")
    assert joined.read_bytes() == src.read_bytes()
    # a chunk lost between two device runs, or a corrupted one, is a clear error and no output
    (tmp_path / "parts" / manifest["parts"][1]).write_bytes(b"x")
    with pytest.raises(SystemExit, match="does not match the manifest"):
        qb.join_parts(tmp_path / "parts", tmp_path / "bad.gguf")
    assert not (tmp_path / "bad.gguf").exists()
    (tmp_path / "parts" / manifest["parts"][2]).unlink()
    with pytest.raises(SystemExit, match=r"chunks missing .*\.02"):
        qb.join_parts(tmp_path / "parts", tmp_path / "bad.gguf")
    assert json.loads((tmp_path / "parts" / qb.MANIFEST).read_text())["size"] == 5 * (1 << 20) + 123


def test_each_configuration_maps_to_vllm_arguments_and_gguf_loads_the_file(tmp_path: Path) -> None:
    args = qb.parse(["run", "--model", str(tmp_path / "bf16"), "--gguf", str(tmp_path / "m.gguf")])
    fp8 = qb.llm_kwargs("fp8+kvfp8", tmp_path / "bf16", tmp_path / "m.gguf", args)
    assert fp8["quantization"] == "fp8" and fp8["kv_cache_dtype"] == "fp8"
    assert fp8["max_logprobs"] == 100 and fp8["enable_prefix_caching"] is False
    gguf = qb.llm_kwargs("gguf", tmp_path / "bf16", tmp_path / "m.gguf", args)
    assert gguf["model"] == str(tmp_path / "m.gguf") and gguf["tokenizer"] == str(tmp_path / "bf16")
    assert "quantization" not in gguf
    with pytest.raises(SystemExit, match="unknown configuration 'int3'"):
        qb.llm_kwargs("int3", tmp_path / "bf16", None, args)


def test_bnb4_says_bitsandbytes_is_missing_instead_of_starting_an_engine_that_cannot_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # As on the H200 (2026-12-01): vLLM importable, bitsandbytes not in the bundle.
    present = {"vllm"}
    monkeypatch.setattr(qb.importlib.util, "find_spec", lambda name: object() if name in present else None)
    assert "bitsandbytes is not installed" in (qb.unsupported_reason("bnb4") or "")
    assert qb.unsupported_reason("fp8") is None
    present.add("bitsandbytes")
    assert qb.unsupported_reason("bnb4") is None
