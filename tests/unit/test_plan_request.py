"""A plan request refuses values no plan can be made of when it is made (InvalidValue), and
``tradeoff plan`` shows each as a usage error: one line, exit code 2."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tradeoff.cli import main
from tradeoff.errors import InvalidValue
from tradeoff.plan.continuous import MAX_LENGTH, Lengths
from tradeoff.plan.planner import PlanRequest
from tradeoff.plan.traffic import Traffic
from tradeoff.stats.cost import Price
from tradeoff.tune.goal import Goal

TRAFFIC = Traffic.law(10, classes={"chat": 0.5, "batch": 0.5})
PRICES = "give one of --price-per-hour, --price-per-core-hour and --price-per-gpu-hour"


@pytest.mark.parametrize(("goal", "lengths", "says"), [
    (Goal(5, price=Price(per_hour=1), price_per_core_hour=0.1), None, PRICES),
    (Goal(5, price_per_core_hour=0.1, price_per_gpu_hour=2), None, PRICES),
    (Goal(5), Lengths(8, 4, 8), "--shared-prefix-words must be fewer than the prompt's 8 "
                                "words"),
    (Goal(5), Lengths(MAX_LENGTH + 1, 4), "the trace's mean prompt_tokens or output_tokens "
                                          "is over 65,536: give --prompt-words"),
    (Goal(5, class_tpot_ms={"chat": 50}), None, "--class-sla-tpot is for generative models"),
    (Goal(5, class_sla_ms={"bulk": 2}), None, "--class-sla bulk: the traffic has no such "
                                              "class (its classes: chat, batch)"),
    (Goal(5, sla_tpot_ms=50, class_tpot_ms={"bulk": 20}), None,
     "--class-sla-tpot bulk: the traffic has no such class"),
])
def test_a_request_refuses_what_no_plan_can_be_made_of(goal: Goal, lengths: Lengths | None,
                                                        says: str) -> None:
    with pytest.raises(InvalidValue, match=says.replace("(", r"\(").replace(")", r"\)")):
        PlanRequest(Path("repo/m"), TRAFFIC, goal, lengths=lengths)


def test_a_request_of_sound_values_is_made() -> None:
    goal = Goal(5, sla_tpot_ms=50, class_sla_ms={"chat": 2}, class_tpot_ms={"chat": 20},
                price_per_gpu_hour=2)
    request = PlanRequest(Path("repo/m"), TRAFFIC, goal, lengths=Lengths(128, 64, 96))
    assert request.goal.on_gpus(2).price == Price(per_hour=4)


@pytest.mark.parametrize(("flags", "says"), [
    (["--sla-p99-ms", "5", "--rate", "10", "--price-per-hour", "1", "--price-per-core-hour",
      "1"], PRICES),
    (["--sla-ttft-ms", "5", "--sla-tpot-ms", "5", "--rate", "1", "--prompt-words", "8",
      "--shared-prefix-words", "8"], "--shared-prefix-words must be fewer than the "
                                     "prompt's 8 words"),
    (["--sla-p99-ms", "5", "--rate", "10", "--class-share", "a=1", "--class-share", "b=1",
      "--class-sla-tpot", "a=5"], "--class-sla-tpot is for generative models: give "
                                  "--sla-ttft-ms and --sla-tpot-ms"),
    (["--sla-p99-ms", "5", "--rate", "10", "--class-share", "a=1", "--class-share", "b=1",
      "--class-sla", "c=5"], "--class-sla c: the traffic has no such class (its classes: "
                             "a, b)"),
])
def test_the_command_shows_a_refused_request_as_a_usage_error(
        flags: list[str], says: str, tmp_path: Path) -> None:
    model = tmp_path / "repo" / "m"
    model.mkdir(parents=True)
    run = CliRunner().invoke(main, ["plan", str(model), *flags])
    assert run.exit_code == 2, run.output
    assert run.output.strip().splitlines()[-1] == f"Error: {says}"
    assert not (tmp_path / "repo-plan-m").exists()
