"""`tradeoff plan` on the example models: predicted against replayed, plan against start.

For each model, three plans: a traffic that repeats inputs (Zipf 1.0 over 1,000 distinct
ones) under a tight SLA, one that does not under a looser SLA, and two classes (20% of
requests at the tight SLA, 80% at ten times the loose one) with two cores, where a pool
per class is weighed against one pool for all. Each plan runs the real command (its own
pinning: the servers on the first core, the load on the rest; unpinned with two cores),
which serves the chosen deployment and the starting one side by side and replays the
traffic. For ``smollm2-135m``, two plans of its engine (TTFT and TPOT SLAs): prompts
without a common start under a tight SLA (INT8 weighed: up to 10% higher perplexity), and
prompts whose first 96 of 128 words are shared under a loose one, starting from a
deployment without prefix caching; and a plan for two classes (30% chat with a tight TTFT
SLA, 70% batch with a loose one) at a rate that keeps its engine busy, where priority by
class is weighed against first come, first served. ``synthetic`` is a model whose batch
costs 32 ms + 4 ms per row spent sleeping (as a host waits on an accelerator), so four
instances fit on this machine: the classes plan where one pool costs more than a pool per
class.

The tables: what was chosen, p99 predicted and replayed for both, whether each met the
SLA, the cost per 1M requests at 0.05 per core-hour, the cache and batch predicted
against measured; with classes, each class's p99 against its own SLA.

    .venv/bin/python benchmarks/plan.py --models mlp,minilm,resnet50,synthetic,smollm2-135m \
        --replay 10s
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tradeoff.models import build_repository

# model: (rate req/s, tight SLA ms, loose SLA ms), sized for one core of this machine
SCENARIOS = {"mlp": (1000.0, 3.0, 20.0), "minilm": (40.0, 60.0, 200.0),
             "resnet50": (4.0, 600.0, 2000.0)}
# an LLM: (rate req/s, prompt words, answer tokens, (TTFT ms, TPOT ms) tight and loose)
LLM_SCENARIOS = {"smollm2-135m": (1.0, 128, 32, (800.0, 80.0), (1500.0, 150.0))}
# an LLM's two classes: 30% chat with a tight TTFT, 70% batch with a loose one, at a rate
# that keeps one core's engine about two-thirds busy
LLM_CLASSES = {"smollm2-135m": {"rate": 5.0, "words": 64, "tokens": 32,
                                "sla": (5000.0, 80.0), "chat_ttft_ms": 600.0,
                                "chat_share": 0.3}}
SHARED_PREFIX_WORDS = 96
# the sleeping model: classes only (its cost is set, so precision and cache have no role)
SYNTHETIC = {"rate": 22.5, "tight": 44.0, "loose": 120.0, "cores": 4}
LATENCY_SHARE = 0.2


def write_synthetic(repo: Path) -> None:
    """``repo/synthetic``: backends/synthetic.py's model, 32 ms + 4 ms per row."""
    (repo / "synthetic" / "1").mkdir(parents=True)
    (repo / "synthetic" / "1" / "model.json").write_text(json.dumps({
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4],
                     "copy_of": "INPUT0"}],
        "cost": {"fixed_ms": 32.0, "per_row_ms": 4.0}}))
    (repo / "synthetic" / "config.pbtxt").write_text(
        'name: "synthetic"\nbackend: "synthetic"\nmax_batch_size: 16\n')


def plan(repo: Path, model: str, rate: float, sla: float, repeats: bool, replay: str,
         out: Path, classes: tuple[float, ...] | None = None, cores: int | None = None
         ) -> dict:
    """One `tradeoff plan` run; ``classes``: two classes, the latency class's SLA given
    (the bulk class has ``sla``)."""
    args = [sys.executable, "-m", "tradeoff", "plan", str(repo / model), "--sla-p99-ms",
            f"{sla:g}", "--rate", f"{rate:g}",
            "--precision", "none" if model == "synthetic" else "int8", "--max-drop", "0.02",
            "--price-per-core-hour", "0.05", "--replay", replay, "--seconds", "2s",
            "--budget", "15m", "-o", str(out / "deploy"), "--json", str(out / "plan.json")]
    if repeats:
        args += ["--distinct-inputs", "1000", "--zipf", "1.0"]
    if classes is not None:
        args += ["--class-sla", f"latency={classes[0]:g}",
                 "--class-share", f"latency={LATENCY_SHARE}",
                 "--class-share", f"bulk={1 - LATENCY_SHARE}"]
    if cores is not None:
        args += ["--cores", str(cores)]
    return run_plan(args, out)


def run_plan(args: list[str], out: Path) -> dict:
    """Run the command; its JSON document, with how long it took."""
    started = time.monotonic()
    run = subprocess.run(args, capture_output=True, text=True, timeout=2400, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"plan failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
    document = json.loads((out / "plan.json").read_text())
    document["wall_s"] = time.monotonic() - started
    return document


def row(model: str, scenario: str, doc: dict) -> dict:
    proof = doc["proof"]
    baseline, chosen = (proof[-2], proof[-1]) if proof else (None, None)
    return {"model": model, "scenario": scenario, "sla_p99_ms": doc["goal"]["sla_p99_ms"],
            "rate_rps": doc["traffic"]["rate_rps"], "chosen": doc["chosen"],
            "plan_p99_predicted": chosen and chosen["predicted"]["p99_ms"],
            "plan_p99_replayed": chosen and chosen["p99_ms"],
            "plan_met": chosen and chosen["meets_sla"],
            "start_p99_predicted": baseline and baseline["predicted"]["p99_ms"],
            "start_p99_replayed": baseline and baseline["p99_ms"],
            "start_met": baseline and baseline["meets_sla"],
            "plan_cost": chosen and chosen["cost_per_million"],
            "start_cost": baseline and baseline["cost_per_million"],
            "hit_predicted": chosen and chosen["predicted"]["hit_ratio"],
            "hit_replayed": chosen and chosen["hit_ratio"],
            "batch_predicted": chosen and chosen["predicted"]["mean_batch"],
            "batch_replayed": chosen and chosen["mean_batch"],
            "stop_reason": doc["stop_reason"], "wall_s": doc["wall_s"]}


def plan_llm(repo: Path, model: str, rate: float, words: int, tokens: int, sla: tuple,
             shared: int, replay: str, out: Path) -> dict:
    """One `tradeoff plan` of an LLM: INT8 weighed (perplexity up to 10% higher)."""
    args = [sys.executable, "-m", "tradeoff", "plan", str(repo / model),
            "--sla-ttft-ms", f"{sla[0]:g}", "--sla-tpot-ms", f"{sla[1]:g}",
            "--rate", f"{rate:g}", "--prompt-words", str(words), "--output-tokens",
            str(tokens), "--shared-prefix-words", str(shared), "--precision", "int8",
            "--max-drop", "0.10", "--price-per-core-hour", "0.05", "--replay", replay,
            "--seconds", "4s", "--budget", "20m", "-o", str(out / "deploy"),
            "--json", str(out / "plan.json")]
    return run_plan(args, out)


def plan_llm_classes(repo: Path, model: str, replay: str, out: Path) -> dict:
    """One `tradeoff plan` of an LLM with two classes, one server core."""
    c = LLM_CLASSES[model]
    args = [sys.executable, "-m", "tradeoff", "plan", str(repo / model),
            "--sla-ttft-ms", f"{c['sla'][0]:g}", "--sla-tpot-ms", f"{c['sla'][1]:g}",
            "--class-sla", f"chat={c['chat_ttft_ms']:g}", "--rate", f"{c['rate']:g}",
            "--class-share", f"chat={c['chat_share']:g}",
            "--class-share", f"batch={1 - c['chat_share']:g}",
            "--prompt-words", str(c["words"]), "--output-tokens", str(c["tokens"]),
            "--precision", "int8", "--max-drop", "0.10", "--price-per-core-hour", "0.05",
            "--replay", replay, "--seconds", "4s", "--budget", "20m",
            "-o", str(out / "deploy"), "--json", str(out / "plan.json")]
    return run_plan(args, out)


def llm_class_row(model: str, doc: dict) -> dict:
    proof = doc["proof"]
    baseline, chosen = (proof[-2], proof[-1]) if proof else ({}, {})
    start = {c["request_class"]: c for c in baseline.get("classes", [])}
    levers = {lever["lever"]: lever for lever in doc["levers"]}
    return {"model": model, "rate_rps": doc["traffic"]["rate_rps"],
            "prompt_tokens": doc["traffic"]["prompt_tokens"],
            "output_tokens": doc["traffic"]["output_tokens"],
            "chosen": doc["chosen"], "start": doc["baseline"]["name"],
            "classes": [{"class": c["request_class"], "sla_ttft_ms": c["sla_p99_ms"],
                         "sla_tpot_ms": c.get("sla_tpot_ms"),
                         "ttft": (c["predicted"]["p99_ms"], c["p99_ms"]),
                         "tpot": (c["predicted"].get("tpot_p99_ms"), c.get("tpot_p99_ms")),
                         "met": c["meets_sla"],
                         "start_predicted": (start.get(c["request_class"], {})
                                             .get("predicted", {}).get("p99_ms")),
                         "start_ttft": start.get(c["request_class"], {}).get("p99_ms"),
                         "start_tpot": start.get(c["request_class"], {}).get("tpot_p99_ms"),
                         "start_met": start.get(c["request_class"], {}).get("meets_sla")}
                        for c in chosen.get("classes", [])],
            "met": (chosen.get("meets_sla"), baseline.get("meets_sla")),
            "goodput_rps": (chosen.get("goodput_rps"), baseline.get("goodput_rps")),
            "scheduling_lever": levers.get("scheduling", {}).get("why"),
            "classes_lever": levers.get("classes", {}).get("why"),
            "calibration": doc["calibration"],
            "stop_reason": doc["stop_reason"], "wall_s": doc["wall_s"]}


def llm_row(model: str, scenario: str, doc: dict) -> dict:
    proof = doc["proof"]
    baseline, chosen = (proof[-2], proof[-1]) if proof else ({}, {})
    versions = {v["version"]: v for v in doc["versions"]}
    return {"model": model, "scenario": scenario, "rate_rps": doc["traffic"]["rate_rps"],
            "prompt_tokens": doc["traffic"]["prompt_tokens"],
            "output_tokens": doc["traffic"]["output_tokens"],
            "sla_ttft_ms": doc["goal"]["sla_p99_ms"], "sla_tpot_ms": doc["goal"]["sla_tpot_ms"],
            "chosen": doc["chosen"], "start": doc["baseline"]["name"],
            "int8_perplexity_rise": next((v["drop"] for v in versions.values()
                                          if v["precision"] == "int8"), None),
            "plan_ttft": (chosen.get("predicted", {}).get("p99_ms"), chosen.get("p99_ms")),
            "plan_tpot": (chosen.get("predicted", {}).get("tpot_p99_ms"),
                          chosen.get("tpot_p99_ms")),
            "start_ttft": (baseline.get("predicted", {}).get("p99_ms"), baseline.get("p99_ms")),
            "start_tpot": (baseline.get("predicted", {}).get("tpot_p99_ms"),
                           baseline.get("tpot_p99_ms")),
            "met": (chosen.get("meets_sla"), baseline.get("meets_sla")),
            "tokens_per_s": (chosen.get("output_tokens_per_s"),
                             baseline.get("output_tokens_per_s")),
            "cost": (chosen.get("cost_per_million"), baseline.get("cost_per_million")),
            "prefix_hits": (chosen.get("predicted", {}).get("hit_ratio"),
                            chosen.get("hit_ratio")),
            "goodput_rps": (chosen.get("goodput_rps"), baseline.get("goodput_rps")),
            "stop_reason": doc["stop_reason"], "wall_s": doc["wall_s"]}


def class_row(model: str, doc: dict) -> dict:
    proof = doc["proof"]
    baseline, chosen = (proof[-2], proof[-1]) if proof else ({}, {})
    start = {c["request_class"]: c for c in baseline.get("classes", [])}
    candidate = next((c for c in doc["candidates"] if c["name"] == doc["chosen"]), {})
    levers = {lever["lever"]: lever for lever in doc["levers"]}
    return {"model": model, "rate_rps": doc["traffic"]["rate_rps"],
            "cores": doc["goal"]["cores"], "chosen": doc["chosen"],
            "pools": bool(candidate.get("pools")), "plan_cores": candidate.get("cores"),
            "start_cores": doc["baseline"]["cores"],
            "classes": [{"class": c["request_class"], "sla_p99_ms": c["sla_p99_ms"],
                         "plan_predicted": c["predicted"]["p99_ms"], "plan_replayed": c["p99_ms"],
                         "plan_met": c["meets_sla"],
                         "start_replayed": start.get(c["request_class"], {}).get("p99_ms"),
                         "start_met": start.get(c["request_class"], {}).get("meets_sla")}
                        for c in chosen.get("classes", [])],
            "plan_cost": chosen.get("cost_per_million"),
            "start_cost": baseline.get("cost_per_million"),
            "classes_lever": levers.get("classes", {}).get("why"),
            "stop_reason": doc["stop_reason"], "wall_s": doc["wall_s"]}


def _f(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join([*SCENARIOS, "synthetic",
                                                      *LLM_SCENARIOS]))
    parser.add_argument("--replay", default="10s")
    parser.add_argument("--scenarios", default="single,classes",
                        help="single: each model's one-class plans; classes: its two-class "
                             "plan")
    parser.add_argument("--json", type=Path, default=Path("benchmarks/results/plan.json"))
    args = parser.parse_args()
    rows, class_rows, llm_rows, llm_class_rows = [], [], [], []
    scenarios = set(args.scenarios.split(","))
    with tempfile.TemporaryDirectory() as tmp:
        repo = Path(tmp) / "models"
        models = args.models.split(",")
        build_repository(repo, tuple(m for m in models if m != "synthetic"))
        if "synthetic" in models:
            write_synthetic(repo)
        for number, model in enumerate(models):
            out = Path(tmp) / f"{model}-{number}"
            if model in LLM_SCENARIOS:
                rate, words, tokens, tight, loose = LLM_SCENARIOS[model]
                for scenario, sla, shared in (
                        ("no shared prefix, tight SLA", tight, 0),
                        (f"{SHARED_PREFIX_WORDS} of {words} words shared, loose SLA, the "
                         "start without prefix caching", loose, SHARED_PREFIX_WORDS)) \
                        if "single" in scenarios else ():
                    print(f"{model}: {scenario} at {rate:g}/s", flush=True)
                    settings = repo / model / "generate.yaml"
                    text = settings.read_text().replace("prefix_caching: false\n", "")
                    settings.write_text(text + ("prefix_caching: false\n" if shared else ""))
                    llm_rows.append(llm_row(model, scenario, plan_llm(
                        repo, model, rate, words, tokens, sla, shared, args.replay,
                        Path(tmp) / f"{model}-{len(llm_rows)}")))
                    print(f"  {llm_rows[-1]}", flush=True)
                if "classes" in scenarios and model in LLM_CLASSES:
                    print(f"{model}: two classes at {LLM_CLASSES[model]['rate']:g}/s",
                          flush=True)
                    (repo / model / "generate.yaml").write_text(
                        (repo / model / "generate.yaml").read_text()
                        .replace("prefix_caching: false\n", ""))
                    llm_class_rows.append(llm_class_row(model, plan_llm_classes(
                        repo, model, args.replay, Path(tmp) / f"{model}-classes")))
                    print(f"  {llm_class_rows[-1]}", flush=True)
                continue
            if model == "synthetic" and "classes" in scenarios:
                s = SYNTHETIC
                print(f"{model}: two classes at {s['rate']:g}/s", flush=True)
                class_rows.append(class_row(model, plan(
                    repo, model, s["rate"], s["loose"], False, args.replay, out,
                    (s["tight"], s["loose"]), int(s["cores"]))))
                print(f"  {class_rows[-1]}", flush=True)
                continue
            if model not in SCENARIOS:
                continue
            rate, tight, loose = SCENARIOS[model]
            for scenario, sla, repeats in (("Zipf 1.0 over 1,000 inputs", tight, True),
                                           ("no repetition", loose, False)) \
                    if "single" in scenarios else ():
                out = Path(tmp) / f"{model}-{number}-{len(rows)}"
                print(f"{model}: {scenario}, p99 <= {sla:g} ms at {rate:g}/s", flush=True)
                rows.append(row(model, scenario, plan(repo, model, rate, sla, repeats,
                                                      args.replay, out)))
                print(f"  {rows[-1]}", flush=True)
            if "classes" not in scenarios:
                continue
            print(f"{model}: two classes at {rate:g}/s", flush=True)
            class_rows.append(class_row(model, plan(
                repo, model, rate, 10 * loose, False, args.replay, Path(tmp) / f"{model}-c",
                (tight, 10 * loose), 2)))
            print(f"  {class_rows[-1]}", flush=True)
    print()
    print("| model | traffic | SLA p99 ms | chosen | p99 plan: predicted / replayed | "
          "p99 start: predicted / replayed | SLA met plan / start | $/1M plan / start | "
          "cache hits predicted / replayed | batch predicted / replayed |")
    print("|---|---|---:|---|---:|---:|---|---:|---:|---:|")
    for r in rows:
        met = f"{'yes' if r['plan_met'] else 'no'} / {'yes' if r['start_met'] else 'no'}"
        print(f"| {r['model']} | {r['scenario']} at {r['rate_rps']:g}/s | "
              f"{r['sla_p99_ms']:g} | {r['chosen']} | {_f(r['plan_p99_predicted'])} / "
              f"{_f(r['plan_p99_replayed'])} | {_f(r['start_p99_predicted'])} / "
              f"{_f(r['start_p99_replayed'])} | {met} | {_f(r['plan_cost'], 4)} / "
              f"{_f(r['start_cost'], 4)} | {_f(r['hit_predicted'])} / "
              f"{_f(r['hit_replayed'])} | {_f(r['batch_predicted'], 1)} / "
              f"{_f(r['batch_replayed'], 1)} |")
    print()
    print("| model | rate, cores | chosen | cores plan / start | class: SLA, p99 plan "
          "predicted / replayed, start replayed | $/1M plan / start |")
    print("|---|---|---|---:|---|---:|")
    for r in class_rows:
        each = "<br>".join(
            f"{c['class']} <= {c['sla_p99_ms']:g}: {_f(c['plan_predicted'])} / "
            f"{_f(c['plan_replayed'])}{'' if c['plan_met'] else ' (missed)'}, "
            f"{_f(c['start_replayed'])}{'' if c['start_met'] else ' (missed)'}"
            for c in r["classes"])
        print(f"| {r['model']} | {r['rate_rps']:g}/s, {r['cores']} | {r['chosen']} | "
              f"{r['plan_cores']} / {r['start_cores']} | {each} | {_f(r['plan_cost'], 4)} / "
              f"{_f(r['start_cost'], 4)} |")
    print()
    print("| model | traffic | SLA TTFT / TPOT ms | chosen (start) | TTFT p99 plan: "
          "predicted / replayed | TPOT p99 plan: predicted / replayed | TTFT / TPOT p99 "
          "start: replayed | met plan / start | prefix hits predicted / replayed | "
          "goodput req/s plan / start |")
    print("|---|---|---|---|---:|---:|---:|---|---:|---:|")
    for r in llm_rows:
        met = " / ".join("yes" if m else "no" for m in r["met"])
        print(f"| {r['model']} | {r['scenario']}: {r['rate_rps']:g}/s, "
              f"{r['prompt_tokens']} + {r['output_tokens']} tokens | {r['sla_ttft_ms']:g} / "
              f"{r['sla_tpot_ms']:g} | {r['chosen']} ({r['start']}) | "
              f"{_f(r['plan_ttft'][0])} / {_f(r['plan_ttft'][1])} | {_f(r['plan_tpot'][0])} "
              f"/ {_f(r['plan_tpot'][1])} | {_f(r['start_ttft'][1])} / "
              f"{_f(r['start_tpot'][1])} | {met} | {_f(r['prefix_hits'][0])} / "
              f"{_f(r['prefix_hits'][1])} | {_f(r['goodput_rps'][0])} / "
              f"{_f(r['goodput_rps'][1])} |")
    print()
    print("| model | traffic | chosen (start) | class: SLA TTFT / TPOT ms | TTFT p99 plan: "
          "predicted / replayed | TPOT p99 plan: predicted / replayed | TTFT p99 start: "
          "predicted / replayed | met plan / start | goodput req/s plan / start |")
    print("|---|---|---|---|---:|---:|---:|---|---:|")
    for r in llm_class_rows:
        for number, c in enumerate(r["classes"]):
            met = f"{'yes' if c['met'] else 'no'} / {'yes' if c['start_met'] else 'no'}"
            lead = (f"| {r['model']} | {r['rate_rps']:g}/s, {r['prompt_tokens']} + "
                    f"{r['output_tokens']} tokens | {r['chosen']} ({r['start']}) |"
                    if number == 0 else "| | | |")
            goodput = (f"{_f(r['goodput_rps'][0])} / {_f(r['goodput_rps'][1])}"
                       if number == 0 else "")
            print(f"{lead} {c['class']}: {c['sla_ttft_ms']:g} / {_f(c['sla_tpot_ms'], 0)} | "
                  f"{_f(c['ttft'][0])} / {_f(c['ttft'][1])} | {_f(c['tpot'][0])} / "
                  f"{_f(c['tpot'][1])} | {_f(c['start_predicted'])} / {_f(c['start_ttft'])} "
                  f"| {met} | {goodput} |")
    rows = rows + class_rows + llm_rows + llm_class_rows
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"schema": "tradeoff.bench.plan/1",
                                     "command": " ".join(sys.argv), "rows": rows}, indent=2))
    print(f"results in {args.json}")


if __name__ == "__main__":
    main()
