"""`tradeoff serve --ray --autoscale`: Ray Serve adds a replica under load and takes it
away after, and no request goes unanswered meanwhile."""

from __future__ import annotations

import importlib.util
import threading
from collections import Counter
from pathlib import Path

import pytest

from tradeoff.server.process import LocalRayCluster, ServerProcess

from .helpers import wait_for
from .test_ray import infer_tiny, live_replicas

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
        answers: Counter[object] = Counter()
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                try:
                    answers[infer_tiny(server.url)] += 1
                except Exception as exc:
                    answers[type(exc).__name__] += 1

        threads = [threading.Thread(target=load) for _ in range(6)]
        for thread in threads:
            thread.start()
        try:
            wait_for(lambda: len(live_replicas(server)) == 2, "a second replica under load",
                     90)
        finally:
            stop.set()
            for thread in threads:
                thread.join(60)
        wait_for(lambda: len(live_replicas(server)) == 1, "back to one replica when idle",
                 120)
        assert set(answers) == {200}, answers
