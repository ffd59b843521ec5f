"""deploy/: the Prometheus alert rules pass promtool, and the Grafana dashboard and the
rules only name metrics a live server exports."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tradeoff.models.examples import build_repository
from tradeoff.server.process import ServerProcess

from .helpers import get_text, running_server

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
RULES = DEPLOY / "prometheus" / "tradeoff-alerts.yml"
RULE_TESTS = DEPLOY / "prometheus" / "tradeoff-alerts.test.yml"
DASHBOARD = DEPLOY / "grafana" / "tradeoff-dashboard.json"
NAME = re.compile(r"\btradeoff_[a-z0-9_]+")


def promtool() -> str:
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool is not installed (make test installs it: apt-get install "
                    "prometheus)")
    return tool


def test_the_alert_rules_are_valid() -> None:
    done = subprocess.run([promtool(), "check", "rules", str(RULES)], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 4 rules found" in done.stdout


def test_the_alerts_fire_on_the_series_they_are_for() -> None:
    """promtool's own rule tests: p99 above target, a growing queue, an error ratio, a
    nearly full KV cache, each on synthetic series, with the annotations rendered."""
    done = subprocess.run([promtool(), "test", "rules", RULE_TESTS.name], capture_output=True,
                          text=True, check=False, cwd=RULE_TESTS.parent)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server with a tensor model (with the adaptive batcher) and a generative one."""
    pytest.importorskip("torch")
    from tradeoff.models.generative import write_generative

    root = tmp_path_factory.mktemp("deploy-models")
    build_repository(root, ("mlp",))
    write_generative(root, "tinyllama", max_num_seqs=2, max_num_batched_tokens=64,
                     num_blocks=32, block_size=8)
    config = root / "mlp" / "config.pbtxt"
    config.write_text(config.read_text() + '\nparameters { key: "target_p99_ms" value: '
                      '{ string_value: "20" } }\n')
    yield from running_server(root)


@pytest.fixture(scope="module")
def exported(server: ServerProcess) -> set[str]:
    """Every sample name of the server's /metrics."""
    return {s.name for family in text_string_to_metric_families(get_text(server.metrics_url))
            for s in family.samples}


def names_in(expressions: list[str]) -> set[str]:
    return {name for e in expressions for name in NAME.findall(e)}


def test_the_dashboard_names_only_exported_metrics(exported: set[str]) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for panel in dashboard["panels"] for t in panel.get("targets", [])]
    exprs += [v["query"]["query"] for v in dashboard["templating"]["list"]
              if isinstance(v.get("query"), dict)]
    used = names_in(exprs)
    assert len(used) >= 15  # every panel reads the server
    assert used <= exported, f"not exported: {sorted(used - exported)}"


def test_the_alert_rules_name_only_exported_metrics(exported: set[str]) -> None:
    used = names_in([RULES.read_text()])
    assert len(used) == 5
    assert used <= exported, f"not exported: {sorted(used - exported)}"
