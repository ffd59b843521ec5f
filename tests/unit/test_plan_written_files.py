"""The files `tradeoff plan` writes carry user text (class names, folder names) only
quoted: `serve.sh` runs the one command it names, its comments stay comments."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tradeoff.plan.deployment import (
    MISSES_SLA,
    serve_script,
    write_router,
    write_serve_script,
    written_by,
)
from tradeoff.repository.safe_yaml import read_yaml
from tradeoff.results import PlanCandidate, Prediction, Replayed

HOSTILE_NAME = "bulk\n%x ;touch PWNED\n---\n#"


def _candidate(name: str, cache_bytes: int = 0) -> PlanCandidate:
    return PlanCandidate(name=name, version=1, precision="fp32", drop=0.0,
                         knobs={"max_batch_size": 8}, cache_bytes=cache_bytes, cores=1,
                         predicted=Prediction(1.0, 2.0, 1.0, 0.0, 0.5),
                         cost_per_million=None, meets_sla=True, changes=0)


@pytest.mark.parametrize("folder", ["My Models", "m$(touch PWNED)-plan-mlp", "it's `id`"])
def test_serve_sh_runs_one_command_with_its_arguments_whole(tmp_path: Path,
                                                            folder: str) -> None:
    """serve.sh, executable, run as a user would: the plan's interpreter (here one that
    prints its arguments) runs tradeoff, whatever is on PATH."""
    fake = tmp_path / "bin dir" / "python"
    fake.parent.mkdir()
    fake.write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    repository = tmp_path / folder
    repository.mkdir()
    candidate = _candidate(HOSTILE_NAME, cache_bytes=3 << 20)
    script = write_serve_script(tmp_path, repository, candidate)
    assert script == tmp_path / "serve.sh" and script.stat().st_mode & 0o777 == 0o755
    script.write_text(serve_script(repository, candidate, python=str(fake)))
    run = subprocess.run([str(script), "--port", "9000"], check=False, cwd=tmp_path,
                         capture_output=True, text=True, timeout=30,
                         env={**os.environ, "PATH": "/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == (
        '["-m", "tradeoff", "serve", "--model-repository", ' +
        json.dumps(str(repository.resolve())) +
        ', "--cache", "local,size=3MiB,tenant_size=3MiB", "--port", "9000"]')
    assert not list(tmp_path.rglob("PWNED"))
    assert script.read_text().count("\n") == 3  # shebang, one comment, the command
    assert shlex.quote(sys.executable) in serve_script(repository, candidate)


def test_a_written_comment_is_one_line_whatever_the_name_holds() -> None:
    for separator in ("\n", "\r", "\x0b", "\x0c", "\x1c", "\x85", "\u2028", "\u2029", "\x00"):
        line = written_by(f"a{separator}b")
        assert line.endswith("\n") and len(line.splitlines()) == 1 and "\x00" not in line


def test_router_yaml_keeps_its_comment_a_comment(tmp_path: Path) -> None:
    write_router(tmp_path, "mlp", HOSTILE_NAME, [{"to": "mlp_bulk"}])
    text = (tmp_path / "mlp" / "router.yaml").read_text()
    assert text.splitlines()[0].startswith("# written by tradeoff plan: bulk?%x ;touch")
    assert read_yaml(tmp_path / "mlp" / "router.yaml") == {"routes": [{"to": "mlp_bulk"}],
                                                           "hide_targets": True}



def test_a_deployment_that_missed_its_sla_says_so_in_serve_sh(tmp_path: Path) -> None:
    candidate = _candidate("mlp")
    assert "did NOT meet the SLA" not in serve_script(tmp_path, candidate)
    missed = write_serve_script(tmp_path, tmp_path, candidate, met=False).read_text()
    assert missed.splitlines()[2] == MISSES_SLA.strip() and missed.count("\n") == 4


def test_the_verdict_names_the_classes_that_met_and_those_that_missed() -> None:
    from tradeoff.plan.planner import verdict
    from tradeoff.results import ClassReplayed, Replayed
    from tradeoff.tune.goal import Goal

    predicted = Prediction(1.0, 2.0, 1.0, 0.0, 0.5)

    def replayed(role: str, met: dict[str, bool]) -> Replayed:
        classes = [ClassReplayed(name, 10.0, 5.0 if ok else 50.0, predicted, 0.0, ok)
                   for name, ok in met.items()]
        return Replayed(role, role, 1.0, 5.0, 100.0, 0.0, None, None, predicted,
                        all(met.values()), None, classes)

    goal = Goal(sla_p99_ms=10.0, max_drop=0.0, class_sla_ms={"chat": 10.0})
    start = replayed("baseline", {"chat": False, "bulk": False})
    some = verdict([start, replayed("plan", {"chat": True, "bulk": False})], goal)
    assert some.startswith("the plan meets the SLA of chat and misses those of bulk")
    every = verdict([start, replayed("plan", {"chat": True, "bulk": True})], goal)
    assert every.startswith("the plan meets the SLA of every class")
    none = verdict([start, replayed("plan", {"chat": False, "bulk": False})], goal)
    assert none.startswith("the plan misses the SLA of every class")


def _replay(name: str, role: str, p99: float, rounds: list[float], met: bool = True
            ) -> Replayed:
    predicted = Prediction(1.0, 2.0, 1.0, 0.0, 0.5)
    return Replayed(name, role, p99 / 2, p99, 100.0, 0.0, None, None, predicted, met, None,
                    p99_rounds_ms=list(rounds))


def test_the_noise_is_the_widest_spread_of_one_deployment_between_rounds() -> None:
    from tradeoff.plan.planner import noise_ms

    start = _replay("start", "baseline", 2.6, [2.4, 2.9])
    plan = _replay("plan", "plan", 2.3, [2.2, 2.35])
    assert noise_ms(start, plan) == pytest.approx(0.5)
    assert noise_ms(_replay("one", "plan", 2.0, [2.0])) is None  # one round: no noise known


def test_a_change_must_beat_a_start_that_meets_the_sla_by_more_than_the_noise() -> None:
    from tradeoff.plan.planner import no_gain, verdict
    from tradeoff.tune.goal import Goal

    goal = Goal(sla_p99_ms=5.0, max_drop=0.0)
    start, change = _candidate("start"), _candidate("b4")
    # the docs' example: 2.61 against 2.33 ms, rounds 0.5 ms apart: the start stays
    replays = [_replay("start", "baseline", 2.61, [2.4, 2.9]),
               _replay("b4", "plan", 2.33, [2.2, 2.4])]
    assert no_gain(*replays, change, start) == pytest.approx(0.5)
    said = verdict(replays, goal, start, start, stays=True)
    assert said.startswith("no change: the starting deployment meets the SLA of p99 <= 5 ms")
    assert "(rounds 2.40-2.90 ms)" in said and "noise (0.50 ms between rounds)" in said
    # faster by more than the noise: worth it
    clear = [replays[0], _replay("b4", "plan", 1.2, [1.1, 1.3])]
    assert no_gain(*clear, change, start) is None
    # the start missed the SLA, or the change costs less: no noise bar
    missed = [_replay("start", "baseline", 9.0, [8.0, 9.5], met=False), replays[1]]
    assert no_gain(*missed, change, start) is None
    cheaper = dataclasses.replace(change, cores=change.cores / 2)
    assert no_gain(*replays, cheaper, start) is None


def test_the_verdict_says_no_change_and_not_decided() -> None:
    from tradeoff.plan.planner import verdict
    from tradeoff.tune.goal import Goal

    goal = Goal(sla_p99_ms=50.0, max_drop=0.0)
    start = _candidate("start")
    # the plan is the start
    same = [_replay("start", "baseline", 20.0, [18.0, 40.0]),
            _replay("start", "plan", 30.0, [25.0, 31.0])]
    assert verdict(same, goal, start, start).startswith(
        "no change: the plan is the starting deployment; the plan meets the SLA")
    # a change whose difference from the start is within the rounds' spread
    close = [_replay("start", "baseline", 40.0, [30.0, 48.0], met=False),
             _replay("b8", "plan", 35.0, [34.0, 36.0])]
    said = verdict(close, goal, _candidate("b8"), start)
    assert said.startswith("not decided: the machine's noise between replay rounds "
                           "(18.00 ms) is larger than the difference between the plan and "
                           "the start (5.00 ms)"), said
    assert "p99 35.00 ms (rounds 34.00-36.00 ms)" in said
    decided = [close[0], _replay("b8", "plan", 10.0, [9.0, 11.0])]
    assert verdict(decided, goal, _candidate("b8"), start).startswith("the plan meets")


def test_with_classes_the_start_is_not_kept_on_one_p99() -> None:
    from tradeoff.plan.planner import no_gain
    from tradeoff.results import ClassReplayed

    predicted = Prediction(1.0, 2.0, 1.0, 0.0, 0.5)
    plan = dataclasses.replace(_replay("prio", "plan", 2.6, [2.5, 2.7]), classes=[
        ClassReplayed("chat", 3.0, 1.0, predicted, 0.0, True)])
    start = _replay("start", "baseline", 2.6, [2.4, 2.9])
    assert no_gain(start, plan, _candidate("prio"), _candidate("start")) is None
