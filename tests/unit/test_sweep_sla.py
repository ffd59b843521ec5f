"""The SLA search of a sweep: its answer and the figures its stop message quotes."""

from __future__ import annotations

from tradeoff.bench.load import LoadSpec
from tradeoff.bench.sweep import Sweep, SweepPlan
from tradeoff.results import BenchResult

from .result_factory import bench_result


class Measured(Sweep):
    """A sweep whose levels are not run: each rate's p99 is ``p99_of(rate)``."""

    def __init__(self, p99_of, plan: SweepPlan) -> None:
        base = LoadSpec.from_flags(rate=1)
        super().__init__(adapter=None, base=base, plan=plan)  # type: ignore[arg-type]
        self.p99_of = p99_of

    def measure(self, load: float) -> BenchResult:
        result = bench_result(load=load, mode="open", p99=self.p99_of(load))
        self.points.append(result)
        return result


def test_the_stop_message_quotes_the_failed_levels_own_p99() -> None:
    """'4250 failed (p99 1123.48 ms ...)' used to quote the p99 of the ramp's first failed
    level (8000), not of 4250."""
    def p99_of(rate: float) -> float:  # meets 20 ms up to 4,000 req/s
        return 10.0 if rate <= 4000 else rate / 10

    plan = SweepPlan("rate", [250, 500, 1000, 2000, 4000, 8000], sla_p99_ms=20,
                     bisect_steps=4)
    result = Measured(p99_of, plan).run()
    assert result.sla is not None and result.sla.best_load == 4000
    failed = float(result.stop_reason.split(" failed")[0].rsplit(", ", 1)[1])
    assert f"p99 {p99_of(failed):.2f} ms > 20 ms at rate {failed:g}" in result.stop_reason
