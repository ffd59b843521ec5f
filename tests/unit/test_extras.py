"""Optional extras: without matplotlib (the ``report`` extra) everything but the plots
works, and the plots fail with one line naming what to install."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from tradeoff.cli import main
from tradeoff.errors import MissingDependency, TradeoffError
from tradeoff.report import plots
from tradeoff.results import load_result, write_json

from .result_factory import bench_result, sweep_result

MESSAGE = "the HTML report needs matplotlib: pip install 'tradeoff[report]'"


@pytest.fixture
def no_matplotlib(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """matplotlib made unimportable: a None entry in sys.modules makes ``import
    matplotlib`` raise ImportError, as on an install without the report extra."""
    for name in [n for n in sys.modules if n == "matplotlib" or n.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    plots._pyplot.cache_clear()
    yield
    plots._pyplot.cache_clear()


def _sweep_file(tmp_path: Path) -> Path:
    path = tmp_path / "sweep.json"
    write_json(sweep_result([bench_result(load=1, throughput=500.0),
                             bench_result(load=2, throughput=900.0)]), path)
    return path


def test_plots_without_matplotlib_name_the_extra(no_matplotlib: None) -> None:
    with pytest.raises(MissingDependency) as caught:
        plots.require()
    assert isinstance(caught.value, TradeoffError)
    assert str(caught.value) == MESSAGE
    assert caught.value.extra == "report"


def test_writing_a_report_without_matplotlib_raises_the_one_line_error(
        no_matplotlib: None, tmp_path: Path) -> None:
    from tradeoff.report.html import write_report

    document = load_result(_sweep_file(tmp_path))
    with pytest.raises(MissingDependency, match=r"^the HTML report needs matplotlib: "):
        write_report([document], tmp_path / "report.html")
    assert not (tmp_path / "report.html").exists()


def test_the_report_modules_import_without_matplotlib() -> None:
    # A fresh interpreter: here the modules are already imported, with matplotlib.
    code = ("import sys; sys.modules['matplotlib'] = None; "
            "import tradeoff.report.html, tradeoff.report.plots, tradeoff.cli; "
            "assert 'matplotlib.pyplot' not in sys.modules")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr


def test_report_command_without_matplotlib_is_one_line(no_matplotlib: None,
                                                       tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["report", str(_sweep_file(tmp_path)),
                                       "-o", str(tmp_path / "report.html")])
    assert result.exit_code == 1
    assert result.output == f"Error: {MESSAGE}\n"


def test_plots_draw_again_once_matplotlib_is_back(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    plots._pyplot.cache_clear()
    plots.require()
    assert "<svg" in plots.to_svg(plots._figure()[0])


def test_demo_without_matplotlib_stops_before_any_work(no_matplotlib: None,
                                                       tmp_path: Path) -> None:
    output = tmp_path / "demo"
    result = CliRunner().invoke(main, ["demo", "--output", str(output),
                                       "--report", str(tmp_path / "demo.html")])
    assert result.exit_code == 1
    assert result.output == f"Error: {MESSAGE}\n"
    assert not output.exists()  # no model built, no server started, nothing measured
