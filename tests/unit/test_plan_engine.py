"""`tradeoff plan` for generative models, the parts that need no server: the engine's own
scheduler run over modelled step costs, against what is known by hand."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

from tradeoff.plan.continuous import EngineSettings, Lengths, StepCost, simulate_engine
from tradeoff.plan.traffic import Traffic

# a decode step: 10 ms alone, 14 ms for 16 sequences; a prompt: 2 ms + 0.05 ms a token
COST = StepCost((1, 2, 4, 8, 16), (10.0, 10.5, 11.0, 12.0, 14.0), 2.0, 0.05)


def _settings(seqs: int = 16, tokens: int = 512, **changes: object) -> EngineSettings:
    return EngineSettings(seqs, tokens, num_blocks=512, block_size=16, **changes)  # type: ignore[arg-type]


def test_one_request_alone_takes_a_prefill_step_then_a_decode_step_a_token() -> None:
    run = simulate_engine(np.array([0.0]), Lengths(128, 32), _settings(), COST)
    assert run.ttft_ms[0] == pytest.approx(2.0 + 0.05 * 128)
    assert run.tpot_ms[0] == pytest.approx(10.0)
    assert run.e2e_ms[0] == pytest.approx(8.4 + 31 * 10.0)
    assert run.rejected == 0 and run.mean_running == 1


def test_a_long_prompt_is_prefilled_in_chunks_of_the_token_budget() -> None:
    run = simulate_engine(np.array([0.0]), Lengths(1000, 2), _settings(tokens=256), COST)
    # four chunks (256, 256, 256, 232), each a step with its fixed cost
    assert run.ttft_ms[0] == pytest.approx(4 * 2.0 + 0.05 * 1000)


def test_decoding_together_shares_the_steps() -> None:
    # two requests at once: the second's prompt waits for nothing (the budget holds both),
    # then both decode in steps of two
    run = simulate_engine(np.array([0.0, 0.0]), Lengths(100, 11), _settings(), COST)
    assert run.ttft_ms == pytest.approx([2.0 + 0.05 * 200] * 2)
    assert run.tpot_ms == pytest.approx([10.5, 10.5])
    alone = simulate_engine(np.array([0.0, 0.0]), Lengths(100, 11), _settings(seqs=1), COST)
    # one sequence at a time: the second starts when the first ends
    assert alone.ttft_ms[1] == pytest.approx(alone.e2e_ms[0] + 2.0 + 0.05 * 100)


def test_more_sequences_a_step_keep_up_where_one_falls_behind() -> None:
    arrivals = Traffic.law(10).arrivals(600)
    # 10 requests/s x 64 tokens: one sequence at a time serves 1 / (64 x 10 ms) = 1.6/s
    one = simulate_engine(arrivals, Lengths(128, 64), _settings(seqs=1), COST)
    many = simulate_engine(arrivals, Lengths(128, 64), _settings(seqs=32), COST)
    assert one.rejected > 0 and one.percentile(one.ttft_ms, 99) == float("inf")
    assert many.rejected == 0
    assert many.percentile(many.ttft_ms, 99) < 200
    assert many.percentile(many.tpot_ms, 99) < 20
    assert many.mean_running > 4


def test_prefix_caching_skips_the_shared_prompt() -> None:
    arrivals = Traffic.law(5).arrivals(200)
    lengths = Lengths(256, 8, shared_prefix=192)
    cached = simulate_engine(arrivals, lengths, _settings(), COST)
    plain = simulate_engine(arrivals, lengths, _settings(prefix_caching=False), COST)
    assert cached.prefix_hit_ratio == pytest.approx(192 / 255, abs=0.02)
    assert plain.prefix_hit_ratio == 0
    assert np.median(cached.ttft_ms) < np.median(plain.ttft_ms)


def test_a_kv_cache_too_small_for_every_sequence_preempts() -> None:
    arrivals = np.zeros(8)
    small = EngineSettings(8, 2048, num_blocks=40, block_size=16)  # 640 tokens for 8 x 160
    run = simulate_engine(arrivals, Lengths(96, 64), small, COST)
    assert run.preemptions > 0 and not np.isnan(run.e2e_ms).any()


def test_the_step_cost_interpolates_and_extrapolates() -> None:
    cost = StepCost.of({1: 100.0, 4: 200.0}, 1.0, 0.1)
    assert cost.decode(1) == pytest.approx(10.0)
    assert cost.decode(4) == pytest.approx(20.0)
    assert cost.decode(8) == pytest.approx(20.0 + 4 * 10.0 / 3)
    assert cost.step_ms(2, 0) == pytest.approx(cost.decode(2))
    assert cost.step_ms(0, 10) == pytest.approx(2.0)


def _searcher(rate: float, lengths: Lengths, tpot_ms: float = 25.0):
    from tradeoff.plan.engine_search import EngineSearcher, GenerationCalibration
    from tradeoff.tune.goal import Goal

    goal = Goal(sla_p99_ms=500.0, max_drop=0.05, sla_tpot_ms=tpot_ms,
                    price_per_core_hour=0.1)
    calibration = GenerationCalibration(lengths.prompt, lengths.shared_prefix, 1.0, 1.0, 40)
    return EngineSearcher(Traffic.law(rate), lengths, goal, calibration,
                          (1, _settings(seqs=1, prefix_caching=False)))


def _version(version: int = 1, drop: float = 0.0, kept: bool = True):
    from tradeoff.results import PlanVersion

    return PlanVersion(version, "fp32", "test", drop, kept, "test",
                       dict(zip(COST.sizes, COST.decode_ms, strict=True)))


def test_the_search_batches_sequences_when_one_at_a_time_falls_behind() -> None:
    searcher = _searcher(10, Lengths(128, 64))
    version = _version()
    start = searcher.predict(version, COST, searcher.start[1])
    assert not start.meets_sla and start.predicted.utilisation > 1
    ranked = searcher.search([version], {1: COST})
    best = ranked[0]
    assert best.meets_sla and best.knobs["max_num_seqs"] >= 16
    assert best.predicted.tpot_p99_ms is not None and best.predicted.tpot_p99_ms <= 25
    assert best.cost_per_million is not None  # per 1M output tokens
    # a TPOT SLA under one decode step (10 ms) cannot be met
    impossible = _searcher(10, Lengths(128, 64), tpot_ms=5.0).search([version], {1: COST})
    assert not any(c.meets_sla for c in impossible)


@pytest.mark.parametrize("searcher", [
    pytest.param(lambda: _searcher(5, Lengths(128, 64, shared_prefix=64)), id="one class"),
    pytest.param(lambda: _class_searcher(9.5, {"chat": 0.2, "batch": 0.8}, {"chat": 300.0}),
                 id="two classes")])
def test_the_search_reuses_a_run_only_where_it_repeats_step_for_step(searcher) -> None:
    """Settings of a larger max_num_seqs take the run of a smaller one whose cap never
    held a request back: every candidate is what predicting it alone gives."""
    searcher = searcher()
    version = _version()
    alone = {c.name: c for c in (searcher.predict(version, COST, s)
                                 for s in searcher.grid(COST))}
    searched = searcher.search([version], {1: COST})
    assert [c.name for c in searched] == sorted(alone, key=[c.name for c in searched].index)
    assert searched == [alone[c.name] for c in searched] and len(searched) == len(alone)
    runs: dict = {}
    for settings in sorted(searcher.grid(COST), key=lambda s: s.max_num_seqs):
        searcher.predict(version, COST, settings, runs)
    reused = len(runs) - len({id(run) for run in runs.values()})
    assert reused > 0  # the caps above the busiest step repeat a run
    assert any(run.seqs_bound for run in runs.values())  # and some cap did bind


def test_prefix_caching_is_weighed_only_where_prompts_share_a_block() -> None:
    plain = _searcher(2, Lengths(128, 16)).grid(COST)
    assert {s.prefix_caching for s in plain} == {False}
    shared = _searcher(2, Lengths(128, 16, shared_prefix=96)).grid(COST)
    assert {s.prefix_caching for s in shared} == {False, True}
    assert max(s.max_num_seqs for s in shared) == 32  # twice the largest batch measured


def test_a_version_over_the_perplexity_budget_is_never_a_candidate() -> None:
    searcher = _searcher(2, Lengths(64, 16))
    ranked = searcher.search([_version(), _version(2, drop=0.2, kept=False)], {1: COST, 2: COST})
    assert {c.version for c in ranked} == {1}


def test_a_trace_gives_the_lengths_of_prompts_and_answers(tmp_path) -> None:
    from tradeoff.errors import InvalidValue

    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(f'{{"timestamp": {i * 0.5}, "prompt_tokens": {100 + i % 3}, '
                              f'"output_tokens": 40}}' for i in range(30)))
    traffic = Traffic.read(path)
    assert traffic.prompt_tokens == pytest.approx(101, abs=0.1)
    assert traffic.output_tokens == 40 and traffic.rate_rps == pytest.approx(2)
    assert traffic.describe()["trace_output_tokens"] == 40
    path.write_text('{"timestamp": 0, "output_tokens": 0}\n{"timestamp": 1, "output_tokens": 3}')
    with pytest.raises(InvalidValue, match="whole number"):
        Traffic.read(path)


def test_the_calibration_scales_the_step_costs() -> None:
    from tradeoff.plan.engine_search import GenerationCalibration

    served = GenerationCalibration(128, 0, prefill_scale=0.5, decode_scale=2.0,
                                   requests=20).cost(COST)
    assert served.decode(1) == pytest.approx(20.0)
    assert served.step_ms(0, 100) == pytest.approx(0.5 * (2.0 + 0.05 * 100))
    alone = simulate_engine(np.zeros(1), Lengths(128, 32), _settings(), served)
    assert alone.tpot_ms[0] == pytest.approx(20.0)


def test_the_load_scale_grows_with_the_rate_the_server_takes_its_share_at() -> None:
    from tradeoff.plan.engine_search import GenerationCalibration

    alone = GenerationCalibration(128, 0, prefill_scale=1.0, decode_scale=1.0, requests=8)
    assert alone.at_rate(10.0) == alone  # not measured under load: nothing to carry
    # 1.25x at 2 requests/s: the server's work took a fifth of the core
    loaded = replace(alone, load_scale=1.25, load_rate_rps=2.0)
    assert loaded.at_rate(2.0).load_scale == pytest.approx(1.25)
    assert loaded.at_rate(4.0).load_scale == pytest.approx(1 / (1 - 0.4))
    assert loaded.at_rate(1.0).load_scale == pytest.approx(1 / (1 - 0.1))
    assert loaded.at_rate(100.0).load_scale == 5.0  # bounded
    cost = loaded.cost(COST)
    assert cost.decode(1) == pytest.approx(12.5) and cost.prefill_fixed_ms == 2.5


def test_a_step_with_prompts_is_one_pass_on_the_cpu_and_two_launches_on_a_gpu() -> None:
    from dataclasses import replace

    # 4 decodes and 100 prompt tokens: one forward of 104 tokens, at least the decode step
    assert COST.step_ms(4, 100) == pytest.approx(max(11.0, 2.0 + 0.05 * 104))
    assert COST.step_ms(16, 8) == pytest.approx(14.0)  # a few tokens ride the decode step
    gpu = replace(COST, one_pass=False)
    assert gpu.step_ms(4, 100) == pytest.approx(11.0 + 2.0 + 0.05 * 100)
    assert gpu.step_ms(0, 100) == COST.step_ms(0, 100) == pytest.approx(7.0)


def test_the_command_bounds_the_lengths(tmp_path) -> None:
    from click.testing import CliRunner

    from tradeoff.cli import main

    model = tmp_path / "repo" / "m"
    model.mkdir(parents=True)
    for flag in ("--prompt-words", "--output-tokens", "--shared-prefix-words"):
        for value in ("100000", "-1", "nan", ""):
            run = CliRunner().invoke(main, ["plan", str(model), "--sla-ttft-ms", "5",
                                            "--sla-tpot-ms", "5", "--rate", "1", flag, value])
            assert run.exit_code == 2, (flag, value, run.output)
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"timestamp": 0, "prompt_tokens": 900000}\n'
                     '{"timestamp": 1, "prompt_tokens": 900000}')
    run = CliRunner().invoke(main, ["plan", str(model), "--sla-ttft-ms", "5",
                                    "--sla-tpot-ms", "5", "--trace", str(trace)])
    assert run.exit_code == 2 and "give --prompt-words" in run.output


def test_priority_scheduling_serves_the_urgent_class_first_when_the_engine_is_full() -> None:
    # 4 sequences at once, 40 requests/s of 32 tokens: about what 4 decoding together
    # serve (4 / (32 x 11 ms) = 11/s is less), so a queue forms and its order decides TTFT
    arrivals = Traffic.law(12).arrivals(400)
    urgent = np.arange(arrivals.size) % 5 == 0
    priorities = np.where(urgent, 0, 1)
    lengths = Lengths(64, 32)
    fcfs = simulate_engine(arrivals, lengths, _settings(seqs=4), COST, priorities)
    ordered = simulate_engine(arrivals, lengths, _settings(seqs=4, scheduling="priority"),
                              COST, priorities)
    p99 = lambda run, mine: run.percentile(run.ttft_ms[mine], 99)  # noqa: E731
    # first come first served ignores the priorities: both classes wait alike
    assert p99(fcfs, urgent) == pytest.approx(p99(fcfs, ~urgent), rel=0.5)
    assert p99(ordered, urgent) < 0.5 * p99(fcfs, urgent)
    assert p99(ordered, ~urgent) >= p99(fcfs, ~urgent) * 0.9  # the others pay for it


def _class_searcher(rate: float, classes: dict[str, float], class_sla: dict[str, float],
                    sla_ms: float = 100_000.0):
    from tradeoff.plan.engine_search import EngineSearcher, GenerationCalibration
    from tradeoff.tune.goal import Goal

    goal = Goal(sla_p99_ms=sla_ms, max_drop=0.05, sla_tpot_ms=1000.0,
                    class_sla_ms=class_sla)
    lengths = Lengths(64, 32)
    calibration = GenerationCalibration(64, 0, 1.0, 1.0, 40)
    return EngineSearcher(Traffic.law(rate, classes=classes), lengths, goal, calibration,
                          (1, _settings(seqs=4, prefix_caching=False)))


def test_with_classes_the_search_weighs_priority_and_each_class_meets_its_own_sla() -> None:
    from tradeoff.plan.engine_search import class_priorities

    # 9.5 requests/s on 4 sequences: the engine is 89% busy and a queue forms
    searcher = _class_searcher(9.5, {"chat": 0.2, "batch": 0.8}, {"chat": 300.0})
    assert searcher.priority == {"chat": 0, "batch": 1}
    assert class_priorities(searcher.goal, {"a": 0.5, "b": 0.5}) == {"a": 0, "b": 1}
    assert {s.scheduling for s in searcher.grid(COST)} == {"fcfs", "priority"}
    version = _version()
    start = searcher.start[1]
    fcfs = searcher.predict(version, COST, start)
    ordered = searcher.predict(version, COST, replace(start, scheduling="priority"))
    assert set(fcfs.class_predicted) == {"chat", "batch"}
    chat_fcfs, chat_ordered = (c.class_predicted["chat"].p99_ms for c in (fcfs, ordered))
    assert chat_ordered < chat_fcfs
    # meeting the SLA is each class against its own: chat's 300 ms only by priority
    assert chat_ordered <= 300.0 < chat_fcfs
    assert ordered.meets_sla and not fcfs.meets_sla
    assert ordered.class_predicted["batch"].p99_ms > fcfs.class_predicted["batch"].p99_ms
    best = searcher.search([version], {1: COST})[0]
    assert best.meets_sla and best.changes >= 1
    assert "prio" in ordered.name and ordered.knobs["scheduling"] == "priority"
    # one class: no priority to weigh
    plain = _searcher(2, Lengths(64, 16)).grid(COST)
    assert {s.scheduling for s in plain} == {"fcfs"}


def test_a_trace_gives_each_request_its_class_in_send_order(tmp_path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("\n".join(json.dumps({"timestamp": t * 0.1, "class": c})
                               for t, c in enumerate("aabab")))
    traffic = Traffic.read(trace)
    assert list(traffic.classes_of(7)) == list("aababaa")
    law = Traffic.law(10, classes={"x": 0.25, "y": 0.75})
    drawn = law.classes_of(4000, seed=1)
    assert abs((drawn == "x").mean() - 0.25) < 0.03
    assert list(drawn) == list(law.classes_of(4000, seed=1))


def test_with_classes_the_rank_reads_the_class_closest_to_its_own_sla() -> None:
    from tradeoff.plan.search import rank_key
    from tradeoff.results import Prediction

    searcher = _class_searcher(9.5, {"chat": 0.2, "batch": 0.8}, {"chat": 300.0},
                               sla_ms=5000.0)
    base = searcher.predict(_version(), COST, searcher.start[1])

    def with_classes(chat_ms: float, batch_ms: float, overall_ms: float):
        return replace(base, meets_sla=True, predicted=replace(base.predicted,
                                                              p99_ms=overall_ms),
                       class_predicted={"chat": Prediction(0, chat_ms, 1, 0, 0.5),
                                        "batch": Prediction(0, batch_ms, 1, 0, 0.5)})

    # first come first served: every class near 280 ms, chat at 93% of its SLA; by
    # priority chat at 50% and batch later, within its 5 s
    fcfs = with_classes(280.0, 280.0, 280.0)
    ordered = with_classes(150.0, 900.0, 800.0)
    goal = searcher.goal
    assert rank_key(ordered, 300.0, goal) < rank_key(fcfs, 300.0, goal)
    assert rank_key(fcfs, 300.0) < rank_key(ordered, 300.0)  # the overall p99 alone


def test_a_replay_round_is_long_enough_for_whole_answers() -> None:
    """A round shorter than one answer completes none (0 requests/s): the plan lengthens
    it to three answers alone, and says so."""
    from tradeoff.plan.engine_search import GenerationCalibration
    from tradeoff.plan.planner import _replay_long_enough
    from tradeoff.tune.goal import Goal

    lengths = Lengths(128, 64)
    calibration = GenerationCalibration(128, 0, 1.0, 1.0, 40)
    answer = calibration.alone_answer_s(COST, lengths, _settings(seqs=4))
    alone = simulate_engine(np.zeros(1), lengths, _settings(seqs=4), COST)
    assert answer == pytest.approx(float(alone.e2e_ms[0]) / 1e3)
    said: list[str] = []
    goal = Goal(sla_p99_ms=500.0, max_drop=0.05, sla_tpot_ms=25.0, replay_s=1.0)
    longer = _replay_long_enough(goal, 2.4, said.append)
    assert longer.replay_s == 8.0 and "from 1 s to 8 s" in said[0]
    assert _replay_long_enough(replace(goal, replay_s=15.0), 2.4, said.append).replay_s == 15
    assert _replay_long_enough(goal, float("inf"), said.append) is goal and len(said) == 1
