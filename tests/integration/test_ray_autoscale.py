"""`tradeoff serve --ray --autoscale`: Ray Serve adds a replica under load and takes it
away after, and no request goes unanswered meanwhile."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

import pytest

from tradeoff.server.process import LocalRayCluster, ServerProcess

from .helpers import background_load, wait_for
from .test_ray import answer_tiny, live_replicas

if importlib.util.find_spec("ray") is None:
    pytest.skip("ray[serve] is not installed: pip install 'tradeoff[ray]' (make test does)",
                allow_module_level=True)

pytestmark = pytest.mark.integration


def test_autoscaling_follows_the_requests_in_flight(tmp_path: Path) -> None:
    from tradeoff.models import build_repository

    build_repository(tmp_path, ["tiny"])
    with LocalRayCluster(nodes=2) as cluster, ServerProcess(tmp_path, extra_args=(
            "--ray", cluster.address, "--autoscale", "1:2", "--target-ongoing-requests", "1",
            "--upscale-delay", "1s", "--downscale-delay", "3s"),
            env={"RAY_USAGE_STATS_ENABLED": "0"}) as server:
        wait_for(lambda: len(live_replicas(server)) == 1, "one replica at the start", 60)
        with background_load(lambda: answer_tiny(server.url), threads=6) as statuses:
            wait_for(lambda: len(live_replicas(server)) == 2, "a second replica under load",
                     90)
        wait_for(lambda: len(live_replicas(server)) == 1, "back to one replica when idle",
                 120)
        assert set(statuses) == {200}, Counter(statuses)
