"""What a benchmark script does around its measurement: the two cores it splits between
the server and the client, the command line it records, and the results document it
writes at the end.

    server_cpu, client_cpu = server_and_client_cores()
    ...
    write_results(args.json, {"schema": "tradeoff.bench.x/1", "command": command_line(),
                              "rows": rows})
"""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from pathlib import Path
from typing import Any


def server_and_client_cores(client: str = "client") -> tuple[int, int]:
    """The first two cores this process may run on: the server's, then the ``client``'s;
    exits saying so where there is only one."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        sys.exit(f"needs two cores: one for the server, one for the {client}")
    return cores[0], cores[1]


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process, all its threads, and of its live children (a
    server's front ends, executor or engine processes), from /proc."""
    total = 0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if stat.parent.name == str(pid) or fields[1] == str(pid):
            total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def engine_steps(url: str, model: str) -> tuple[int, float]:
    """The steps the engine of ``model`` has run and the seconds they took (the
    statistics extension: its batch_stats count steps by their number of sequences)."""
    with urllib.request.urlopen(f"{url}/v2/models/{model}/stats", timeout=10) as answer:
        batches = [b["compute_infer"] for s in json.load(answer)["model_stats"]
                   for b in s["batch_stats"]]
    return sum(b["count"] for b in batches), sum(b["ns"] for b in batches) / 1e9


def command_line() -> str:
    """How this script was run, as from the repository's root: ``benchmarks/<script>``
    and its arguments."""
    return " ".join([f"benchmarks/{Path(sys.argv[0]).name}", *sys.argv[1:]])


def write_results(path: Path, doc: dict[str, Any], indent: int = 1) -> None:
    """``doc`` as JSON at ``path`` (its folder made if need be), and a line saying where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc, indent=indent))
    print(f"results in {path}")
