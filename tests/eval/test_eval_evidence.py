"""Evidence recall: each decisive fact traced to the prompt block that carried it, or to where it was lost."""

from __future__ import annotations

from bot.eval.cases import Expectation
from bot.eval.evidence import CUT, IN_PROMPT, NOT_GATHERED, NOT_SERVED, QUESTION, miss, recalled, trace
from bot.eval.kube_api import KubernetesSnapshotServer, pod
from bot.eval.prom_api import PrometheusSnapshotServer, Series
from bot.eval.report import totals
from bot.eval.runner import CaseResult
from bot.prompts import fence


def _prompt(*blocks: tuple[str, str]) -> str:
    return "task text\n\n" + "\n\n".join(fence(label, body, "ab12cd34") for label, body in blocks)


def test_a_fact_in_a_data_block_is_credited_to_that_block_before_the_question():
    prompt = _prompt(
        ("Kubernetes: Log tail of shop/api-1/app", "Caused by: java.net.UnknownHostException: db"),
        ("chat message", "why is api-1 down? is it db?"),
    )
    facts = trace(Expectation(objects=[["db"]], numbers=[]), prompt, "", "")
    assert facts[0].status == IN_PROMPT
    assert facts[0].sources == ["Kubernetes: Log tail of shop/api-1/app", QUESTION]
    assert facts[0].source == "Kubernetes: Log tail of shop/api-1/app"
    assert recalled(facts) is True and miss(facts) is None


def test_a_fact_only_the_question_names_comes_from_the_question():
    prompt = _prompt(("chat message", "is kafka-2 ok?"))
    facts = trace(Expectation(objects=[["kafka-2"]]), prompt, "", "")
    assert facts[0].sources == [QUESTION]


def test_gathered_but_cut_served_but_not_gathered_and_served_nowhere_are_told_apart():
    expect = Expectation(objects=[["coredns-abc"]], numbers=[["512Mi"], ["137"], ["4242"]])
    prompt = _prompt(("Kubernetes: Pods", "shop/api-1 | Running | limits memory 512Mi"))
    gathered = "Log tail\nkilled with exit code 137"
    served = '{"pods": [{"name": "coredns-abc"}]} ... 137'
    facts = trace(expect, prompt, gathered, served)
    by_wanted = {f.wanted[0]: f.status for f in facts}
    assert by_wanted == {"coredns-abc": NOT_GATHERED, "512Mi": IN_PROMPT, "137": CUT, "4242": NOT_SERVED}
    assert recalled(facts) is False
    assert miss(facts) == NOT_SERVED  # the worst one: the case itself asks the impossible
    assert miss([f for f in facts if f.wanted != ["4242"]]) == NOT_GATHERED


def test_numbers_are_whole_numbers_and_objects_whole_words():
    prompt = _prompt(("Kubernetes: Pods", "restarts 1370, pod rapid-1"))
    facts = trace(Expectation(objects=[["api"]], numbers=[["137"]]), prompt, None, "")
    assert [f.status for f in facts] == [NOT_SERVED, NOT_SERVED]


def test_the_served_state_holds_objects_logs_and_series_in_the_forms_opsbot_writes():
    from bot.eval.evidence import served_text

    kube = KubernetesSnapshotServer(pods=[pod("pg-0", "data")])
    kube.logs[("data", "pg-0", "app", False)] = "FATAL: sorry, too many clients already"
    prom = PrometheusSnapshotServer(series=[Series("container_memory_working_set_bytes", {}, [536870912])])
    text = served_text(kube, prom)
    assert "pg-0" in text and "too many clients" in text and "512.0 MiB" in text


def test_the_totals_count_recall_and_each_kind_of_miss():
    prompt = _prompt(("Kubernetes: Pods", "shop/api-1 | OOMKilled exit 137"))

    def result(case_id: str, numbers: list[list[str]], gathered: str) -> CaseResult:
        evidence = trace(Expectation(numbers=numbers), prompt, gathered, "137 999 4242")
        return CaseResult(case_id, case_id, "f.yaml", None, "ok", evidence=evidence)

    t = totals(
        [
            result("hit", [["137"]], ""),
            result("cut", [["137"], ["999"]], "999"),
            result("lost", [["4242"]], ""),
            result("wrong", [["31337"]], ""),
        ]
    )
    assert t["evidence_recall"] == {"hits": 1, "of": 4}
    assert t["budget_misses"] == ["cut"]
    assert t["gathering_misses"] == ["lost"]
    assert t["invalid_cases"] == ["wrong"]
    assert t["fact_sources"] == {"Kubernetes": 2}


def test_every_built_in_cases_decisive_facts_reach_a_default_4096_token_prompt(
    eval_env, smollm2_gguf, capsys, tmp_path
):
    """The issue-36 target, as a new user runs it: the default model's tokenizer and window, every
    built-in case, ``--evidence-only`` (no answer is generated, so this is fast on any machine)."""
    import json

    from bot.cli import main
    from bot.eval.cases import BUILTIN_CASES, load_cases

    config = tmp_path / "engine.toml"
    config.write_text(f'[engine]\nbackend = "llamacpp"\nmodel = "{smollm2_gguf}"\nmax_model_len = 4096\n')
    out = tmp_path / "out"
    code = main(["eval", "--out", str(out), "--engine-config", str(config), "--evidence-only"])
    assert code == 0, capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    totals = report["totals"]
    missed = {c["id"]: c["evidence"] for c in report["cases"] if not c["evidence_recalled"]}
    assert missed == {}
    assert totals["evidence_recall"] == {"hits": len(load_cases([BUILTIN_CASES])), "of": len(report["cases"])}
    assert report["engine"]["evidence_only"] is True
    assert all(c["answer"] == "" and c["output_tokens"] == 0 for c in report["cases"])
    # The terminal says what was measured, not "FAILED (empty)" for answers nobody asked for, and
    # the per-request log lines go beside the report instead of between the progress lines.
    shown = capsys.readouterr()
    terminal = shown.out + shown.err
    assert "FAILED" not in terminal and " INFO " not in terminal
    assert f"evidence recall {len(report['cases'])}/{len(report['cases'])}" in terminal
    assert "evidence only" in terminal and "object named" not in terminal
    assert " INFO " in (out / "eval.log").read_text()


def test_every_held_out_cases_decisive_facts_reach_a_default_4096_token_prompt(
    eval_env, smollm2_gguf, capsys, tmp_path
):
    """The 24 held-out cases (``bot/eval/cases-heldout``, written without looking at the gathering
    code; ``bench/results/evidence_recall-heldout-2026-12-05.md``) stay at their measured recall,
    24 of 24, so a change that loses one of their classes fails here."""
    import json

    from bot.cli import main
    from bot.eval.cases import BUILTIN_CASES, load_cases

    heldout = BUILTIN_CASES.parent / "cases-heldout"
    config = tmp_path / "engine.toml"
    config.write_text(f'[engine]\nbackend = "llamacpp"\nmodel = "{smollm2_gguf}"\nmax_model_len = 4096\n')
    out = tmp_path / "out"
    code = main(["eval", str(heldout), "--out", str(out), "--engine-config", str(config), "--evidence-only"])
    assert code == 0, capsys.readouterr().err
    report = json.loads((out / "report.json").read_text())
    missed = {c["id"]: c["evidence"] for c in report["cases"] if not c["evidence_recalled"]}
    assert missed == {}
    assert (
        report["totals"]["evidence_recall"]
        == {"hits": 24, "of": 24}
        == {
            "hits": len(load_cases([heldout])),
            "of": len(report["cases"]),
        }
    )
