"""`tradeoff tune serve`: coordinate descent against the full grid, on the same space.

Builds the models with `tradeoff models build` into a temporary repository, starts one
`tradeoff serve` on core 0, and for each model runs `tradeoff tune serve --max-throughput`
on core 1 twice, with `--strategy coordinate` and then `--strategy grid`, over the same
space and SLA. Reads both `--json` results (schema tradeoff.tune/1) and reports, per
model: the configurations each strategy tried, the time each took, the coordinate
winner's throughput against the server's default config (the baseline trial) and
against the best grid point, and coordinate's time as a fraction of the grid's. A search
picks its winner from one short measurement per config, and on a noisy machine that
favours the lucky; so the server's config, the coordinate winner and the grid winner
are then measured again, interleaved, with longer points, and those medians give the
ratios. Prints the tables and writes benchmarks/results/tune.json.

    .venv/bin/python benchmarks/tune.py
    .venv/bin/python benchmarks/tune.py --models mlp --duration 2s --max-batch-sizes 1,16,64
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from harness import command_line, server_and_client_cores, write_results

from tradeoff.server.process import ServerProcess

ROOT = Path(__file__).resolve().parent.parent
CLI = str(Path(sys.executable).with_name("tradeoff"))
STRATEGIES = ("coordinate", "grid")


def build(repo: Path, models: list[str]) -> list[str]:
    """Build the models one at a time; the ones that could not be built are left out."""
    built = []
    for model in models:
        done = subprocess.run([CLI, "models", "build", str(repo), "--model", model],
                              capture_output=True, text=True, check=False)
        if done.returncode == 0 and (repo / model / "config.pbtxt").exists():
            built.append(model)
        else:
            print(f"could not build {model}: {(done.stderr or done.stdout).strip()[-300:]}",
                  flush=True)
    return built


def tune(url: str, model: str, strategy: str, space: dict[str, str],
         args: argparse.Namespace, scratch: Path, client_cpu: int) -> dict[str, Any]:
    out = scratch / f"tune-{model}-{strategy}.json"
    command = ["taskset", "-c", str(client_cpu), CLI, "tune", "serve", url,
               "--model", model, "--sla-p99-ms", str(args.sla_p99_ms), "--max-throughput",
               "--strategy", strategy,
               "--max-batch-sizes", space["max_batch_sizes"], "--delays-us", space["delays_us"],
               "--instances", space["instances"], "--threads", space["threads"],
               "--duration", args.duration, "--warmup", args.warmup, "--budget", args.budget,
               "--output", str(scratch / f"winner-{model}-{strategy}"), "--json", str(out)]
    start = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    wall = time.monotonic() - start
    if done.returncode != 0:
        raise SystemExit(f"tune {model} {strategy} failed ({done.returncode}):\n"
                         f"{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    result = json.loads(out.read_text())
    result["_wall_s"] = wall
    result["_command"] = " ".join(command[3:])
    return result


def confirm(url: str, model: str, knobs: dict[str, Any], args: argparse.Namespace,
            scratch: Path, client_cpu: int, tag: str) -> float | None:
    """One configuration measured again on its own (a one-point grid, longer points):
    its throughput within the SLA, or None when it missed it."""
    out = scratch / f"confirm-{model}-{tag}.json"
    command = ["taskset", "-c", str(client_cpu), CLI, "tune", "serve", url,
               "--model", model, "--sla-p99-ms", str(args.sla_p99_ms), "--max-throughput",
               "--strategy", "grid", "--max-batch-sizes", str(knobs["max_batch_size"]),
               "--delays-us", str(knobs["max_queue_delay_us"]),
               "--instances", str(knobs["instances"]), "--threads", str(knobs["threads"]),
               "--preferred", "max" if knobs["preferred"] else "off",
               "--duration", args.confirm_duration, "--warmup", args.warmup,
               "--output", str(scratch / "confirm"), "--json", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"confirm {model} {tag} failed:\n{done.stdout[-2000:]}")
    measured = json.loads(out.read_text())["trials"][0]
    return measured["throughput_rps"] if measured["meets_sla"] else None


def confirm_side_by_side(url: str, model: str, runs: dict[str, dict[str, Any]],
                         args: argparse.Namespace, scratch: Path,
                         client_cpu: int) -> dict[str, Any]:
    """The server's config, the coordinate winner and the grid winner measured again,
    interleaved, ``--confirm-repeats`` times: medians and their ratios."""
    coord, grid = runs["coordinate"], runs["grid"]
    chosen = {"baseline": trial(coord, coord["baseline"]),
              "coordinate winner": trial(coord, coord["winner"]),
              "grid winner": trial(grid, grid["winner"])}
    figures: dict[str, list[float]] = {name: [] for name in chosen}
    for repeat in range(args.confirm_repeats):
        for name, picked in chosen.items():
            if picked is None:
                continue
            value = confirm(url, model, picked["knobs"], args, scratch, client_cpu,
                            f"{name.replace(' ', '-')}-{repeat}")
            figures[name].append(value or 0.0)
            print(f"  confirm {model} {name} [{repeat + 1}]: {value or 0:,.0f} req/s",
                  flush=True)
    medians = {name: (statistics.median(v) if v else None) for name, v in figures.items()}
    base, c_win, g_win = (medians["baseline"], medians["coordinate winner"],
                          medians["grid winner"])
    return {"configs": {n: (t["name"] if t else None) for n, t in chosen.items()},
            "runs": figures, "medians": medians,
            "coordinate_over_baseline": c_win / base if c_win and base else None,
            "coordinate_over_grid_winner": c_win / g_win if c_win and g_win else None}


def trial(result: dict[str, Any], name: str | None) -> dict[str, Any] | None:
    return next((t for t in result["trials"] if t["name"] == name), None)


def summarise(model: str, runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    coord, grid = runs["coordinate"], runs["grid"]
    base = trial(coord, coord["baseline"]) or trial(grid, grid["baseline"])
    c_win, g_win = trial(coord, coord["winner"]), trial(grid, grid["winner"])

    def tput(t: dict[str, Any] | None) -> float | None:
        return t["throughput_rps"] if t and t.get("meets_sla") else None

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a and b else None

    def measured(result: dict[str, Any]) -> int:
        return sum(1 for t in result["trials"] if t.get("status") == "measured")

    return {
        "model": model, "grid_size": grid["grid_size"],
        "baseline": coord["baseline"],
        "baseline_rps": tput(base), "baseline_p99_ms": base["p99_ms"] if base else None,
        "coordinate": {"tried": len(coord["trials"]), "measured": measured(coord),
                       "elapsed_s": coord["elapsed_s"], "winner": coord["winner"],
                       "winner_rps": tput(c_win),
                       "winner_p99_ms": c_win["p99_ms"] if c_win else None,
                       "stop_reason": coord.get("stop_reason")},
        "grid": {"tried": len(grid["trials"]), "measured": measured(grid),
                 "elapsed_s": grid["elapsed_s"], "winner": grid["winner"],
                 "winner_rps": tput(g_win),
                 "winner_p99_ms": g_win["p99_ms"] if g_win else None,
                 "stop_reason": grid.get("stop_reason")},
        "coordinate_over_baseline": ratio(tput(c_win), tput(base)),
        "coordinate_over_grid_best": ratio(tput(c_win), tput(g_win)),
        "time_fraction": coord["elapsed_s"] / grid["elapsed_s"],
        # the coordinate winner's knobs as measured in the grid run (same config, other run)
        "coordinate_winner_in_grid_rps": tput(trial(grid, coord["winner"])),
    }


def fmt(x: float | None, spec: str = ",.0f") -> str:
    return "-" if x is None else format(x, spec)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="mlp,minilm")
    parser.add_argument("--sla-p99-ms", type=float, default=20.0)
    parser.add_argument("--duration", default="1s", help="per measurement (a tune flag)")
    parser.add_argument("--warmup", default="0.3s")
    parser.add_argument("--budget", default="10m", help="per search; large enough for the grid")
    parser.add_argument("--max-batch-sizes", default="1,8,32")
    parser.add_argument("--delays-us", default="0,2000")
    parser.add_argument("--instances", default="1,2")
    parser.add_argument("--threads", default="1")
    parser.add_argument("--minilm-max-batch-sizes", default="1,8",
                        help="minilm is slow: its smaller max_batch_size list")
    parser.add_argument("--confirm-duration", default="3s",
                        help="per point when the three configs are measured again")
    parser.add_argument("--confirm-repeats", type=int, default=3)
    parser.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/tune.json")
    args = parser.parse_args()
    server_cpu, client_cpu = server_and_client_cores("tune client")

    rows, raw, spaces = [], {}, {}
    with tempfile.TemporaryDirectory(prefix="tradeoff-tune-") as tmp:
        scratch = Path(tmp)
        repo = scratch / "models"
        models = build(repo, args.models.split(","))
        if not models:
            sys.exit("no model could be built")
        with ServerProcess(repo, cpus=str(server_cpu)) as server:
            for model in models:
                space = {"max_batch_sizes": args.minilm_max_batch_sizes if model == "minilm"
                         else args.max_batch_sizes, "delays_us": args.delays_us,
                         "instances": args.instances, "threads": args.threads}
                spaces[model] = space
                runs = {}
                for strategy in STRATEGIES:
                    runs[strategy] = tune(server.url, model, strategy, space, args, scratch,
                                          client_cpu)
                    r = runs[strategy]
                    print(f"{model:7s} {strategy:10s} {len(r['trials'])} configs in "
                          f"{r['elapsed_s']:.0f} s, winner {r['winner']}", flush=True)
                raw[model] = runs
                row = summarise(model, runs)
                row["confirmed"] = confirm_side_by_side(server.url, model, runs, args,
                                                        scratch, client_cpu)
                rows.append(row)
            exit_code = server.stop()

    print()
    print("| model | grid size | coordinate: configs / s | grid: configs / s | "
          "time coord/grid | baseline req/s | coordinate winner req/s | grid best req/s | "
          "coord/baseline | coord/grid best |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        c, g = r["coordinate"], r["grid"]
        print(f"| {r['model']} | {r['grid_size']} | {c['tried']} / {c['elapsed_s']:.0f} | "
              f"{g['tried']} / {g['elapsed_s']:.0f} | {r['time_fraction']:.2f} | "
              f"{fmt(r['baseline_rps'])} | {fmt(c['winner_rps'])} | {fmt(g['winner_rps'])} | "
              f"{fmt(r['coordinate_over_baseline'], '.2f')}x | "
              f"{fmt(r['coordinate_over_grid_best'], '.2f')}x |")
    print()
    print("measured again side by side (medians of the interleaved repeats, req/s within "
          "the SLA):")
    print("| model | server's config | coordinate winner | grid winner | coord/server's | "
          "coord/grid winner |")
    print("|---|---:|---:|---:|---:|---:|")
    for r in rows:
        m = r["confirmed"]["medians"]
        print(f"| {r['model']} | {fmt(m['baseline'])} | {fmt(m['coordinate winner'])} | "
              f"{fmt(m['grid winner'])} | "
              f"{fmt(r['confirmed']['coordinate_over_baseline'], '.2f')}x | "
              f"{fmt(r['confirmed']['coordinate_over_grid_winner'], '.2f')}x |")
    for r in rows:
        print(f"{r['model']}: baseline = {r['baseline']}; coordinate winner = "
              f"{r['coordinate']['winner']}; grid winner = {r['grid']['winner']}")
    print(f"server exit code after SIGTERM: {exit_code}")
    write_results(args.json, {
        "schema": "tradeoff.bench.tune/1",
        "command": command_line(),
        "sla_p99_ms": args.sla_p99_ms, "duration": args.duration, "warmup": args.warmup,
        "spaces": spaces, "rows": rows,
        "trials": {m: {s: {"trials": runs[s]["trials"], "command": runs[s]["_command"]}
                       for s in runs} for m, runs in raw.items()}})


if __name__ == "__main__":
    main()
