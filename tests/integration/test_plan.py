"""`tradeoff plan` end to end: real `tradeoff serve` processes on 127.0.0.1, a synthetic
model whose batch cost is known (so the right plan is known by hand), and the example MLP
for the accuracy budget. Replays are short; they check behaviour, not speed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from tradeoff.cli import main
from tradeoff.models import build_repository
from tradeoff.plan.planner import PlanRequest, make_plan
from tradeoff.plan.traffic import Traffic
from tradeoff.repository.repository import ModelRepository
from tradeoff.results import PlanResult, load_as
from tradeoff.server.process import ServerProcess
from tradeoff.tune.goal import Goal

from ..synthetic_model import write_synthetic_model

pytestmark = pytest.mark.timeout(300)


def _cores() -> str | None:
    cores = sorted(os.sched_getaffinity(0))
    return str(cores[0]) if len(cores) > 1 else None


def _plan(model_dir: Path, traffic: Traffic, sla_ms: float, **goal: float) -> PlanResult:
    return make_plan(PlanRequest(model_dir, traffic,
                                 Goal(sla_p99_ms=sla_ms, max_drop=0.01, replay_s=2.0,
                                          **goal),
                                 variants=(), seconds_per_version=0.5,
                                 server_cpus=_cores()))


@pytest.mark.timing  # the replayed p99 of a plan calibrated minutes before moves with the load
@pytest.mark.slow
def test_the_plan_batches_a_model_that_cannot_keep_up_alone(tmp_path: Path) -> None:
    # 2 ms per request alone: at 400/s it runs at 82% load and its p99 is far over
    # 15 ms; batches of 8 cost 2.4 ms for 8 requests
    model = write_synthetic_model(tmp_path / "repo", fixed_ms=2.0, per_row_ms=0.05,
                                  max_batch_size=16)
    result = _plan(model, Traffic.law(400), 15.0, budget_s=120)
    assert result.baseline.knobs["max_batch_size"] == 1
    assert not result.baseline.meets_sla
    chosen = result.candidate(result.chosen)
    assert chosen is not None and chosen.knobs["max_batch_size"] > 1
    baseline, plan = result.proof[-2:]
    assert plan.meets_sla and plan.mean_batch is not None and plan.mean_batch > 1
    assert baseline.p99_ms is not None and plan.p99_ms is not None
    assert plan.p99_ms < baseline.p99_ms
    assert "meets the SLA" in result.verdict
    assert {lever.lever: lever.taken for lever in result.levers}["batching"]

    # written beside the repository, never in it; the original is unchanged
    output = Path(result.output or "")
    assert output.parent == tmp_path and not (model / "2").exists()
    assert "dynamic_batching" not in (model / "config.pbtxt").read_text()
    config = ModelRepository(output / "repository").read("synthetic").config
    assert config.dynamic_batching is not None and config.max_batch_size > 1
    assert "--model-repository" in (output / "serve.sh").read_text()
    assert not (output / ".work").exists()
    with ServerProcess(output / "repository") as server:  # the written repository serves
        from tradeoff.bench.adapters import V2Adapter

        adapter = V2Adapter(server.url, "synthetic")
        assert adapter.prepare()
    document = json.loads(json.dumps(result.to_dict()))
    assert load_as(PlanResult, document) == result


@pytest.mark.timing  # what each round measures moves with the load, beside the pace set
@pytest.mark.slow
def test_a_difference_inside_the_noise_between_rounds_decides_nothing(tmp_path: Path) -> None:
    """The model's speed is varied between the replay's rounds, as a noisy host does:
    the start's first round and the plan's second run at full speed, the others at a
    fifth of it. The start holds requests up to 5 ms for a batch, which the plan drops:
    a few milliseconds better, while each deployment's two rounds differ by more. The
    verdict keeps the start ("no change") or says "not decided", naming the noise, and
    each round's p99 is kept."""
    pace = tmp_path / "pace"
    model = write_synthetic_model(
        tmp_path / "repo", fixed_ms=2.0, per_row_ms=0.05, max_batch_size=16, pace_file=pace,
        extra="dynamic_batching { max_queue_delay_microseconds: 5000 }")
    slow = {("1", "plan"), ("2", "baseline")}
    rounds: list[str] = []

    def say(line: str) -> None:
        if line.startswith("replay round "):
            number, role = line.removeprefix("replay round ").split(" of 2: ")
            rounds.append(line)
            pace.write_text("5" if (number, role) in slow else "1")

    result = make_plan(PlanRequest(model, Traffic.law(100),
                                   Goal(sla_p99_ms=50.0, max_drop=0.01, replay_s=2.0,
                                        budget_s=120),
                                   variants=(), seconds_per_version=0.5,
                                   server_cpus=_cores()), say)
    assert rounds[:4] == ["replay round 1 of 2: baseline", "replay round 1 of 2: plan",
                          "replay round 2 of 2: baseline", "replay round 2 of 2: plan"]
    baseline, plan = result.proof[:2]
    for replayed, slowed in ((baseline, 1), (plan, 0)):
        fast_p99, slow_p99 = (replayed.p99_rounds_ms[i] for i in (1 - slowed, slowed))
        assert fast_p99 is not None and slow_p99 is not None
        assert slow_p99 > fast_p99, (replayed.p99_rounds_ms, result.verdict)
    assert result.verdict.startswith(("no change", "not decided")), result.verdict
    assert "noise" in result.verdict and "rounds" in result.verdict


@pytest.mark.slow
def test_an_impossible_sla_is_reported_with_the_best_p99(tmp_path: Path) -> None:
    """No deployment meets 1 ms: the best one reached is replayed and written, its
    serve.sh says it missed, and the command exits 3 (a verdict, as soak's)."""
    model = write_synthetic_model(tmp_path / "repo", fixed_ms=2.0, per_row_ms=0.05,
                                  max_batch_size=16)
    run = CliRunner().invoke(main, [
        "plan", str(model), "--sla-p99-ms", "1", "--rate", "100", "--precision", "none",
        "--replay", "2s", "--seconds", "0.5s", "--budget", "2m",
        "--json", str(tmp_path / "plan.json")])
    assert run.exit_code == 3, run.output
    assert "no deployment met the SLA on replay" in run.output
    result = load_as(PlanResult, tmp_path / "plan.json")
    assert not any(c.meets_sla for c in result.candidates)
    assert "no deployment is predicted to meet p99 <= 1 ms" in result.stop_reason
    assert result.proof and not result.proof[-1].meets_sla
    assert "misses the SLA" in result.verdict
    assert "did NOT meet the SLA" in (Path(result.output or "") / "serve.sh").read_text()


@pytest.mark.slow
def test_the_budget_stops_the_search(tmp_path: Path) -> None:
    model = write_synthetic_model(tmp_path / "repo", fixed_ms=1.0, max_batch_size=8)
    result = _plan(model, Traffic.law(100), 50.0, budget_s=1)
    assert "budget" in result.stop_reason and not result.proof
    assert result.chosen is None and not (Path(result.output or "") / "repository").exists()


@pytest.mark.slow
def test_a_repeating_trace_turns_the_cache_on_and_the_replay_hits(tmp_path: Path) -> None:
    model = write_synthetic_model(tmp_path / "repo", fixed_ms=3.0, per_row_ms=0.5,
                                  max_batch_size=4)
    rng = np.random.default_rng(7)
    times = np.cumsum(rng.exponential(1 / 250, 2000))
    inputs = np.minimum(rng.zipf(1.8, times.size), 40)
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps({"timestamp": float(t), "input": int(i)})
                               for t, i in zip(times, inputs, strict=True)))
    result = _plan(model, Traffic.read(trace), 20.0, budget_s=150)
    chosen = result.candidate(result.chosen)
    assert chosen is not None and chosen.cache_bytes > 0
    assert {lever.lever: lever.taken for lever in result.levers}["cache"]
    plan = result.proof[-1]
    assert plan.hit_ratio is not None and plan.hit_ratio > 0.3
    # the trace's own inputs, in its order: the hits Che's approximation predicted
    assert plan.hit_ratio == pytest.approx(plan.predicted.hit_ratio, abs=0.1)
    assert "--cache local" in (Path(result.output or "") / "serve.sh").read_text()


@pytest.mark.slow
def test_a_trace_without_repetition_leaves_the_cache_off(tmp_path: Path) -> None:
    model = write_synthetic_model(tmp_path / "repo", fixed_ms=1.0, max_batch_size=8)
    rows = ["scheduled_ms,request"] + [f"{i * 10.0},{i}" for i in range(300)]
    trace = tmp_path / "records.csv"
    trace.write_text("\n".join(rows))
    result = _plan(model, Traffic.read(trace), 20.0, budget_s=120)
    assert all(c.cache_bytes == 0 for c in result.candidates)
    assert not {lever.lever: lever.taken for lever in result.levers}["cache"]


@pytest.mark.slow
def test_the_accuracy_budget_leaves_a_version_out(tmp_path: Path) -> None:
    build_repository(tmp_path / "models", ("mlp",))
    cores = os.sched_getaffinity(0)
    run = CliRunner().invoke(main, [
        "plan", str(tmp_path / "models" / "mlp"), "--sla-p99-ms", "50", "--rate", "200",
        "--precision", "int8", "--max-drop", "0.000001", "--replay", "2s", "--seconds",
        "0.5s", "--budget", "3m", "--json", str(tmp_path / "plan.json")])
    assert run.exit_code in (0, 3), run.output  # 3: its replay missed 50 ms (the load)
    assert os.sched_getaffinity(0) == cores  # the command pins itself only while it runs
    result = load_as(PlanResult, tmp_path / "plan.json")
    int8 = next(v for v in result.versions if v.precision == "int8")
    assert not int8.kept and "over the budget" in int8.why
    assert {c.version for c in result.candidates} == {1}
    assert "left out" in run.output and "deployment:" in run.output


def test_the_command_refuses_an_output_inside_the_repository(tmp_path: Path) -> None:
    model = write_synthetic_model(tmp_path / "repo")
    run = CliRunner().invoke(main, ["plan", str(model), "--sla-p99-ms", "5", "--rate", "10",
                                    "-o", str(tmp_path / "repo" / "plan")])
    assert run.exit_code == 1
    assert "inside the model's repository" in run.output
    run = CliRunner().invoke(main, ["plan", str(model), "--sla-p99-ms", "5"])
    assert run.exit_code == 2 and "--rate (with --arrival) or --trace" in run.output
    run = CliRunner().invoke(main, ["plan", str(tmp_path / "repo"), "--sla-p99-ms", "5",
                                    "--rate", "10"])
    assert run.exit_code == 2 and "is a model repository, not a model" in run.output
    assert str(model) in " ".join(run.output.split()).replace(" ", "") or \
        model.name in run.output
    trace = tmp_path / "t.csv"
    trace.write_text("scheduled_ms,sent_ms,request,outcome\n0,0,0,ok\n10,10,1,ok\n")
    run = CliRunner().invoke(main, ["plan", str(model), "--sla-p99-ms", "5", "--rate", "10",
                                    "--trace", str(trace)])
    assert run.exit_code == 2 and "not both" in run.output
    many = len(os.sched_getaffinity(0)) + 1
    run = CliRunner().invoke(main, ["plan", str(model), "--sla-p99-ms", "5", "--rate", "10",
                                    "--cores", str(many)])
    assert run.exit_code == 2 and "--another-host" in run.output, run.output


@pytest.mark.timing  # the cores the pools take follow step costs measured on the real clock
@pytest.mark.slow
def test_two_classes_get_a_pool_each_behind_a_router(tmp_path: Path) -> None:
    # 32 ms + 4 ms per row at 22.5/s. One pool for both classes must meet the latency
    # class's 44 ms: four instances of batch 1. Alone, the 20% latency class needs two
    # instances and the bulk class one with batches: 3 cores against 4.
    model = write_synthetic_model(tmp_path / "repo", fixed_ms=32.0, per_row_ms=4.0,
                                  max_batch_size=16)
    run = CliRunner().invoke(main, [
        "plan", str(model), "--sla-p99-ms", "1200", "--class-sla", "latency=44",
        "--rate", "22.5", "--class-share", "latency=0.2", "--class-share", "bulk=0.8",
        "--cores", "4", "--another-host", "--price-per-core-hour", "0.1",
        "--precision", "none",
        "--replay", "3s", "--seconds", "0.5s", "--budget", "4m",
        "--json", str(tmp_path / "plan.json")])
    assert run.exit_code == 0, run.output
    if len(os.sched_getaffinity(0)) < 4:  # planned for a bigger host than this one
        assert "cannot prove it" in " ".join(run.output.split())
    result = load_as(PlanResult, tmp_path / "plan.json")
    chosen = result.candidate(result.chosen)
    assert chosen is not None and chosen.pools and chosen.cores == 3, result.chosen
    assert {lever.lever: lever.taken for lever in result.levers}["classes"]
    baseline, plan = result.proof[-2:]
    assert {c.request_class for c in plan.classes} == {"latency", "bulk"}
    assert {c.request_class: c.sla_p99_ms for c in plan.classes} == \
        {"latency": 44, "bulk": 1200}
    assert plan.mean_batch is not None  # counted over the pools
    latency = {c.request_class: c for c in plan.classes}["latency"]
    start = {c.request_class: c for c in baseline.classes}["latency"]
    assert latency.p99_ms is not None and start.p99_ms is not None
    assert latency.p99_ms < start.p99_ms
    assert "every class" in result.verdict
    deployment = Path(result.output or "") / "repository"
    assert ModelRepository(deployment).kind("synthetic") == "router"
    with ServerProcess(deployment) as server:  # the router answers under the model's name
        from tradeoff.bench.adapters import V2Adapter

        assert V2Adapter(server.url, "synthetic").prepare()


@pytest.mark.timing  # the replayed TPOT and SLA verdict move with the load
@pytest.mark.slow
def test_a_generative_model_gets_the_engine_batch_its_rate_needs(tmp_path: Path) -> None:
    # a step costs 20 ms + 0.1 ms a token (sleeping, as a host waits on a GPU). One
    # sequence at a time serves a 16-token answer in about 0.35 s: under 3 requests/s,
    # so the start falls behind; decoding several together costs little more per step.
    from tradeoff.models.generative import write_synthetic_llm
    from tradeoff.repository.safe_yaml import read_yaml

    model = write_synthetic_llm(tmp_path / "repo", model={"step_ms": 20.0,
                                                          "per_token_ms": 0.1},
                                max_num_seqs=1)
    run = CliRunner().invoke(main, [
        "plan", str(model), "--sla-ttft-ms", "400", "--sla-tpot-ms", "60", "--rate", "3",
        "--prompt-words", "24", "--output-tokens", "16", "--shared-prefix-words", "12",
        "--precision", "none",
        "--replay", "2s", "--seconds", "0.5s", "--budget", "4m",
        "--json", str(tmp_path / "plan.json")])
    assert run.exit_code == 0, run.output
    result = load_as(PlanResult, tmp_path / "plan.json")
    assert result.baseline.knobs["max_num_seqs"] == 1 and not result.baseline.meets_sla
    chosen = result.candidate(result.chosen)
    assert chosen is not None and chosen.knobs["max_num_seqs"] > 1
    assert chosen.predicted.tpot_p99_ms is not None and chosen.predicted.tpot_p99_ms < 60
    # the prompt in the server's tokens (one a character here), not words
    assert result.traffic["prompt_tokens"] > 24
    baseline, plan = result.proof[-2:]
    assert plan.meets_sla, result.verdict
    assert plan.tpot_p99_ms is not None and plan.output_tokens_per_s
    assert plan.goodput_rps is not None and plan.goodput_rps > 0
    # half of each prompt is shared: the engine's prefix cache, read from /metrics
    assert plan.hit_ratio is not None and plan.hit_ratio > 0.2
    assert chosen.predicted.hit_ratio > 0.2
    assert baseline.p99_ms is None or (plan.p99_ms is not None and plan.p99_ms < baseline.p99_ms)
    assert {lever.lever: lever.taken for lever in result.levers}["engine batch"]
    written = read_yaml(Path(result.output or "") / "repository" / "synthetic-llm" /
                        "generate.yaml")
    assert written["max_num_seqs"] == chosen.knobs["max_num_seqs"]
    assert read_yaml(model / "generate.yaml")["max_num_seqs"] == 1  # the original is kept
    assert "TTFT p99" in run.output and "TPOT" in run.output


@pytest.mark.timing  # chat's replayed TTFT p99 against batch's moves with the load
@pytest.mark.slow
def test_two_classes_of_generations_get_their_priority_in_one_engine(tmp_path: Path) -> None:
    # a step costs 20 ms + 2 ms a token (sleeping): four sequences keep TPOT under 55 ms,
    # and at 5 requests/s they run full, so the waiting queue's order decides who waits.
    # First come first served, chat's TTFT p99 is predicted over its 300 ms; put first,
    # under it (the others wait longer, within their 2 s).
    from tradeoff.models.generative import write_synthetic_llm
    from tradeoff.repository.safe_yaml import read_yaml

    model = write_synthetic_llm(tmp_path / "repo", model={"step_ms": 20.0,
                                                          "per_token_ms": 2.0},
                                max_num_seqs=4)
    run = CliRunner().invoke(main, [
        "plan", str(model), "--sla-ttft-ms", "2000", "--sla-tpot-ms", "55",
        "--class-sla", "chat=300", "--rate", "5", "--class-share", "chat=0.3",
        "--class-share", "batch=0.7", "--prompt-words", "4", "--output-tokens", "8",
        "--precision", "none", "--replay", "5s", "--seconds", "0.5s", "--budget", "4m",
        "--json", str(tmp_path / "plan.json")])
    assert run.exit_code == 0, run.output
    result = load_as(PlanResult, tmp_path / "plan.json")
    assert not result.baseline.meets_sla
    assert result.baseline.class_predicted["chat"].p99_ms > 300
    chosen = result.candidate(result.chosen)
    assert chosen is not None and chosen.knobs["scheduling"] == "priority", result.chosen
    assert chosen.class_predicted["chat"].p99_ms <= 300
    assert {lever.lever: lever.taken for lever in result.levers}["scheduling"]
    deployment = Path(result.output or "") / "repository"
    router = read_yaml(deployment / "synthetic-llm" / "router.yaml")
    assert router["routes"][0] == {"when": {"class": "chat"}, "to": "synthetic-llm_engine",
                                   "priority": 0}
    assert read_yaml(deployment / "synthetic-llm_engine" / "generate.yaml")[
        "scheduling"] == "priority"
    baseline, plan = result.proof[-2:]
    assert [c.request_class for c in plan.classes] == ["chat", "batch"]
    chat, batch = plan.classes
    assert (chat.sla_p99_ms, chat.sla_tpot_ms, batch.sla_p99_ms) == (300, 55, 2000)
    assert chat.p99_ms is not None and chat.tpot_p99_ms is not None
    assert chat.error_percent == 0 and batch.error_percent == 0
    # put first, chat waits less than batch in the plan; alike in the start
    start = {c.request_class: c for c in baseline.classes}
    assert chat.predicted.p99_ms < batch.predicted.p99_ms
    assert chat.p99_ms < (batch.p99_ms or 0) or chat.p99_ms < (start["chat"].p99_ms or 0)
    assert "chat TTFT p99" in result.verdict


@pytest.mark.timing  # calibrated and replayed on the real clock: at load 4-6, one engine won
@pytest.mark.slow
def test_a_class_whose_tpot_one_engine_cannot_keep_gets_an_engine_of_its_own(
        tmp_path: Path) -> None:
    # the same sleeping steps (20 ms + 2 ms a token) at 6 requests/s on two cores: in one
    # engine, chat's 40 ms TPOT breaks under batch's prompts and larger batches whatever
    # the settings; an engine each (a thread each) meets both classes' SLAs
    from tradeoff.models.generative import write_synthetic_llm
    from tradeoff.repository.safe_yaml import read_yaml

    model = write_synthetic_llm(tmp_path / "repo", model={"step_ms": 20.0,
                                                          "per_token_ms": 2.0},
                                max_num_seqs=4)
    run = CliRunner().invoke(main, [
        "plan", str(model), "--sla-ttft-ms", "3000", "--sla-tpot-ms", "80",
        "--class-sla", "chat=300", "--class-sla-tpot", "chat=40", "--rate", "6",
        "--class-share", "chat=0.3", "--class-share", "batch=0.7", "--cores", "2",
        "--prompt-words", "4", "--output-tokens", "8", "--precision", "none",
        "--replay", "2s", "--seconds", "0.5s", "--budget", "4m",
        "--json", str(tmp_path / "plan.json")])
    assert run.exit_code in (0, 3), run.output  # 3: missed on replay (checked below)
    result = load_as(PlanResult, tmp_path / "plan.json")
    chosen = result.candidate(result.chosen)
    levers = {lever.lever: lever for lever in result.levers}
    assert chosen is not None
    if not chosen.pools:
        # the choice follows the step costs this host measured: on a host running at half
        # its usual speed (plan/predict's own benchmark 2.2x slower), the pools' engines
        # of one thread each were calibrated slower and one engine was chosen
        assert not levers["classes"].taken and levers["classes"].why, levers["classes"]
        pytest.skip(f"this host's calibration kept one engine: {levers['classes'].why}")
    assert [p.request_class for p in chosen.pools] == ["chat", "batch"], result.chosen
    assert chosen.cores == 2 and all(p.candidate.knobs["threads"] == 1
                                     for p in chosen.pools)
    assert not any(c.meets_sla and not c.pools for c in result.candidates)
    assert levers["classes"].taken and "engine per class ranked best" in levers["classes"].why
    deployment = Path(result.output or "") / "repository"
    routes = read_yaml(deployment / "synthetic-llm" / "router.yaml")["routes"]
    assert routes == [{"when": {"class": "chat"}, "to": "synthetic-llm_chat"},
                      {"to": "synthetic-llm_batch"}]
    for pool in ("chat", "batch"):
        assert read_yaml(deployment / f"synthetic-llm_{pool}" / "generate.yaml")[
            "threads"] == 1
    plan = result.proof[-1]
    chat, batch = plan.classes
    assert chat.request_class == "chat" and chat.sla_tpot_ms == 40
    assert chat.tpot_p99_ms is not None and batch.tpot_p99_ms is not None
    assert chat.predicted.tpot_p99_ms is not None and batch.predicted.tpot_p99_ms is not None
    assert chat.predicted.tpot_p99_ms < batch.predicted.tpot_p99_ms
    assert chat.tpot_p99_ms < batch.tpot_p99_ms  # the chat engine batches less
