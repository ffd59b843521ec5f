"""The deployment a plan writes: a repository beside the original, never over it.

    write_deployment(target, candidates, candidate, config)   # MODEL, or a router over pools
    write_engine_deployment(target, source, candidate, priorities)   # a generative model
    serve_script(target, candidate)                           # its `tradeoff serve` line

One model: the candidate's version alone and its ``config.pbtxt`` (the knobs, the response
cache on or off), or a generative model's files with a ``generate.yaml`` of the engine's
settings and precision. A pool per class: each pool as ``MODEL_CLASS`` and a router named
MODEL (``router.yaml``) that sends each class to its pool, so clients keep the model's
name; an engine scheduled by the classes' priority sits behind such a router as
``MODEL_engine``.
"""

from __future__ import annotations

import math
import re
import shlex
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tradeoff.errors import local_resource
from tradeoff.plan.engine_search import ENGINE_KNOBS
from tradeoff.repository.config import ModelConfig
from tradeoff.repository.edit import PBTXT, YAML_FILES, config_text
from tradeoff.repository.repository import GENERATIVE_FILE, ROUTER_FILE
from tradeoff.repository.safe_yaml import read_yaml
from tradeoff.results import PlanCandidate
from tradeoff.tune.knobs import Knobs

__all__ = ["MISSES_SLA", "WRITTEN_BY", "engine_name", "pool_name", "pool_routes", "serve_flags",
           "serve_script", "write_deployment", "write_engine_deployment", "write_router",
           "write_serve_script",
           "written_by"]

WRITTEN_BY = "# written by tradeoff plan"


def write_deployment(target: Path, candidates: Path, candidate: PlanCandidate,
                     config: ModelConfig) -> Path:
    """A repository at ``target`` serving the candidate under the model's name: the model
    with only the candidate's version and its config (knobs, cache on or off); or, for a
    pool per class, each pool as ``MODEL_CLASS`` and a router named MODEL that sends each
    class to its pool (requests of no known class to the largest class's)."""
    with local_resource(f"cannot write the deployment into {target}"):
        if not candidate.pools:
            _write_model(target, candidates, candidate, config, config.name)
            return target
        routes = pool_routes(config.name, candidate, lambda name, pool: _write_model(
            target, candidates, pool, config, name))
        write_router(target, config.name, candidate.name, routes)
    return target


def write_engine_deployment(target: Path, source: Path, candidate: PlanCandidate,
                            priorities: dict[str, int] | None = None) -> Path:
    """A repository at ``target`` with the model (its files copied from ``source``, the
    original model directory) and a ``generate.yaml`` of the candidate's settings and
    precision. Scheduled by priority (``priorities``: each class's), the engine is
    ``MODEL_engine`` behind a router named MODEL whose routes give each class its
    priority (a request of no known class gets the last's), so clients keep the name.
    With a pool per class, each class's engine is ``MODEL_CLASS`` behind that router."""
    routes: list[dict[str, Any]] = []
    with local_resource(f"cannot write the deployment into {target}"):
        if candidate.pools:  # an engine per class
            routes = pool_routes(source.name, candidate, lambda name, pool: _write_engine(
                target / name, source, pool, candidate.name))
        elif candidate.knobs["scheduling"] == "priority" and priorities:
            name = engine_name(source.name)
            _write_engine(target / name, source, candidate, candidate.name)
            order = sorted(priorities, key=priorities.__getitem__)
            routes = [{"when": {"class": c}, "to": name, "priority": priorities[c]}
                      for c in order]
            routes.append({"to": name, "priority": priorities[order[-1]]})
        else:
            _write_engine(target / source.name, source, candidate, candidate.name)
        if routes:
            write_router(target, source.name, candidate.name, routes)
    return target


def _write_engine(model_dir: Path, source: Path, candidate: PlanCandidate, plan: str) -> None:
    """The model's files and a ``generate.yaml`` of the candidate's settings, precision
    and threads (an engine among several: its share of the cores)."""
    doc = read_yaml(source / GENERATIVE_FILE) or {}
    doc.update({k: candidate.knobs[k] for k in ENGINE_KNOBS}, precision=candidate.precision)
    if candidate.knobs.get("threads"):
        doc["threads"] = candidate.knobs["threads"]
    shutil.copytree(source, model_dir, ignore=shutil.ignore_patterns(GENERATIVE_FILE))
    (model_dir / GENERATIVE_FILE).write_text(written_by(plan)
                                             + yaml.safe_dump(doc, sort_keys=False))


def engine_name(model: str) -> str:
    """The engine's model name behind a router that sets each class's priority."""
    return f"{model}_engine"


def pool_routes(model: str, candidate: PlanCandidate,
                write: Callable[[str, PlanCandidate], None]) -> list[dict[str, Any]]:
    """Each pool of the candidate written as ``MODEL_CLASS`` by ``write(name, pool)``, and
    the router's routes to them by class: the largest class's pool, last, takes what
    names no class."""
    routes: list[dict[str, Any]] = []
    for pool in sorted(candidate.pools, key=lambda p: p.share):
        name = pool_name(model, pool.request_class)
        write(name, pool.candidate)
        routes.append({"when": {"class": pool.request_class}, "to": name})
    del routes[-1]["when"]
    return routes


def write_router(target: Path, model: str, plan: str, routes: list[dict[str, Any]]) -> None:
    """``target/MODEL/router.yaml`` with these routes, marked as the plan's; its targets
    answer only through it (a client calling a pool or an engine by its own name would
    skip the priority and the pool its class is given)."""
    router = target / model
    router.mkdir(parents=True)
    (router / ROUTER_FILE).write_text(written_by(plan) + yaml.safe_dump(
        {"routes": routes, "hide_targets": True}, sort_keys=False))


def pool_name(model: str, request_class: str) -> str:
    """The model name of one class's pool: ``mlp_latency``."""
    return f"{model}_{re.sub(r'[^A-Za-z0-9_.-]', '_', request_class)}"


def _write_model(target: Path, candidates: Path, candidate: PlanCandidate,
                 config: ModelConfig, name: str) -> None:
    model_dir = target / name
    knobs = Knobs(**candidate.knobs, preferred=False)
    document = knobs.config(config.to_dict())
    document["name"] = name
    document["version_policy"] = {"specific": {"versions": [candidate.version]}}
    document["response_cache"] = {"enable": candidate.cache_bytes > 0}
    model_dir.mkdir(parents=True)
    shutil.copytree(candidates / str(candidate.version), model_dir / str(candidate.version))
    for extra in candidates.iterdir():
        if not extra.name.isdigit() and extra.name not in (PBTXT, *YAML_FILES):
            copy = shutil.copytree if extra.is_dir() else shutil.copy2
            copy(extra, model_dir / extra.name)
    (model_dir / PBTXT).write_text(written_by(candidate.name) + config_text(document))


def serve_flags(candidate: PlanCandidate) -> list[str]:
    """The ``tradeoff serve`` flags the deployment needs beyond its repository: a response
    cache the size of every pool's."""
    if not candidate.cache_bytes:
        return []
    size = f"{math.ceil(candidate.cache_bytes / 2**20)}MiB"
    return ["--cache", f"local,size={size},tenant_size={size}"]


MISSES_SLA = "# it did NOT meet the SLA on replay: the best deployment the plan reached\n"


def serve_script(repository: Path, candidate: PlanCandidate, python: str = sys.executable,
                 met: bool = True) -> str:
    """``serve.sh``: the `tradeoff serve` line that starts the deployment, every word
    quoted for the shell. It runs tradeoff with ``python``, the interpreter that made the
    plan (a `tradeoff` on PATH is not there after a venv install); a deployment that did
    not meet the SLA on replay (``met`` False) says so in a comment."""
    words = [python, "-m", "tradeoff", "serve", "--model-repository",
             str(repository.resolve()), *serve_flags(candidate)]
    return (f"#!/bin/sh\n{written_by(candidate.name)}{'' if met else MISSES_SLA}"
            f"exec {' '.join(shlex.quote(word) for word in words)} \"$@\"\n")


def write_serve_script(output: Path, repository: Path, candidate: PlanCandidate,
                       met: bool = True) -> Path:
    """``output/serve.sh``, executable."""
    path = output / "serve.sh"
    path.write_text(serve_script(repository, candidate, met=met))
    path.chmod(0o755)
    return path


def written_by(plan: str) -> str:
    """The comment line that marks a file as the plan's: one line whatever the plan's
    name holds (a character that could end a line or a comment is shown as '?')."""
    shown_name = "".join(c if c.isprintable() else "?" for c in plan)
    return f"{WRITTEN_BY}: {shown_name}\n"
