"""`tradeoff serve --ray --autoscale`: Ray Serve adds a replica under load and takes it
away after, and no request goes unanswered meanwhile."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from collections import Counter
from pathlib import Path

import pytest

from tradeoff.server.process import LocalRayCluster, ServerProcess

from .helpers import background_load, wait_for
from .test_ray import answer_tiny, live_replicas, stale_home

if importlib.util.find_spec("ray") is None:
    pytest.skip("ray[serve] is not installed: pip install 'tradeoff[ray]' (make test does)",
                allow_module_level=True)

pytestmark = pytest.mark.integration


@pytest.mark.slow
def test_autoscaling_follows_the_requests_in_flight(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    from tradeoff.models import build_repository

    build_repository(tmp_path / "models", ["tiny"])
    monkeypatch.setenv("HOME", str(stale_home(tmp_path / "home")))
    # another Ray's process on this machine (by name, as `ray stop` finds them): stopping
    # this cluster must leave it running
    other = tmp_path / "raylet"
    shutil.copy("/bin/sleep", other)
    bystander = subprocess.Popen([str(other), "600"])
    try:
        with LocalRayCluster(nodes=2) as cluster, ServerProcess(
                tmp_path / "models", env=cluster.env, extra_args=(
                    "--ray", cluster.address, "--autoscale", "1:2",
                    "--target-ongoing-requests", "1", "--upscale-delay", "1s",
                    "--downscale-delay", "3s")) as server:
            wait_for(lambda: len(live_replicas(server)) == 1, "one replica at the start", 60)
            with background_load(lambda: answer_tiny(server.url), threads=6) as statuses:
                wait_for(lambda: len(live_replicas(server)) == 2,
                         "a second replica under load", 90)
            wait_for(lambda: len(live_replicas(server)) == 1,
                     "back to one replica when idle", 120)
            assert set(statuses) == {200}, Counter(statuses)
        assert cluster.pids() == set()  # every process of the cluster is gone
        assert bystander.poll() is None  # and only those
    finally:
        bystander.kill()
        bystander.wait()
