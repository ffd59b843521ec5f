"""``tradeoff optimize``: make optimised versions of a repository model and measure them.

Each variant becomes a new version directory of the same model (the model file made from
the source version's, the other files of that version copied as they are), and the
model's config records how each was made and serves every version. Then every version
runs in process on the same validation samples, through the same backend the server
uses: latency at batch 1, throughput at each batch size up to ``max_batch_size``, and
each output graded against the source version (:mod:`tradeoff.optimize.accuracy`).

    plan = OptimizePlan(variants=(Variant("int8-dynamic", per_channel=True),))
    result = optimize_model(Path("models/minilm"), plan)
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from tradeoff.backends.base import Backend
from tradeoff.backends.registry import GENERATIVE, InstanceSpec
from tradeoff.backends.text_encoder import TextEncoderBackend
from tradeoff.errors import OptimizeError, local_resource
from tradeoff.optimize.accuracy import compare_output
from tradeoff.optimize.samples import (
    CALIBRATION,
    VALIDATION,
    Samples,
    builtin_samples,
    load_samples,
    sample_count,
    take,
)
from tradeoff.optimize.variants import (
    BF16,
    INT8_DYNAMIC,
    INT8_STATIC,
    Feed,
    Variant,
    make_variant,
)
from tradeoff.repository.config import ModelConfig
from tradeoff.repository.edit import add_versions, version_parameter
from tradeoff.repository.repository import ModelRepository, ModelSource
from tradeoff.results import OptimizeResult, VersionReport, environment
from tradeoff.stats.distribution import distribution
from tradeoff.stats.progress import progress_text

__all__ = ["DEFAULT_MAX_DROP", "OptimizePlan", "Progress", "optimize_model"]

DEFAULT_MAX_DROP = 0.01
# progress(description) is called before each step
Progress = Callable[[str], None]


@dataclass(frozen=True)
class OptimizePlan:
    """What to make and how to judge it."""

    variants: tuple[Variant, ...]
    validation: Path | None = None
    calibration: Path | None = None
    max_drop: float = DEFAULT_MAX_DROP
    seconds_per_version: float = 4.0  # speed measurement time of each version
    source_version: int | None = None  # default: the newest version not made by optimize
    max_sequences: int | None = None  # an LLM's largest decode batch timed (default: its
    # max_num_seqs, at most 16)


def optimize_model(model_dir: Path, plan: OptimizePlan,
                   progress: Progress | None = None) -> OptimizeResult:
    """Make the plan's versions of the model in ``model_dir`` and measure every one."""
    say = progress or (lambda _: None)
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise OptimizeError(f"{model_dir}: not a model directory (give REPOSITORY/MODEL)")
    repository = ModelRepository(model_dir.parent)
    name = model_dir.name
    if repository.kind(name) == GENERATIVE:
        return _optimize_generative(model_dir, plan, say)
    source = repository.read(name)
    config = source.config
    on_disk = sorted(int(p.name) for p in model_dir.iterdir()
                     if p.is_dir() and p.name.isascii() and p.name.isdigit() and int(p.name) > 0)
    source_version = plan.source_version or max(
        (v for v in on_disk if version_parameter(v, "method") not in config.parameters),
        default=max(on_disk))
    if source_version not in on_disk:
        raise OptimizeError(f"{name} has no version {source_version} (found {on_disk})")
    model_file = model_dir / str(source_version) / config.default_model_filename
    backend_type = repository.backends.tensor(config.backend)

    validation, validation_from = _samples(plan.validation, model_dir, config, VALIDATION)
    calibration_doc = None
    made: dict[int, Variant] = {}
    next_version = max(on_disk) + 1
    done, steps, started = 0, 2 * len(plan.variants) + 1, time.monotonic()

    def step(text: str) -> None:  # each version made, then each measured
        nonlocal done
        say(f"{text} ({progress_text(done, steps, time.monotonic() - started)})")
        done += 1

    for variant in plan.variants:
        version_dir = model_dir / str(next_version)
        step(f"making version {next_version}: {variant.kind}")
        feeds = None
        if variant.kind == INT8_STATIC:
            calibration, calibration_from = _samples(plan.calibration, model_dir, config,
                                                     CALIBRATION)
            calibration_doc = {"source": calibration_from,
                               "samples": sample_count(calibration)}
            feeds = _onnx_feeds(config, backend_type.create(_spec(name, model_file, config)),
                                calibration)
        try:
            with local_resource(f"cannot write version {next_version} into {model_dir}"):
                if config.backend == "pytorch":
                    from tradeoff.optimize.torch_variants import make_torch_variant

                    make_torch_variant(model_file, version_dir / config.default_model_filename,
                                       variant, [t.name for t in config.inputs], validation)
                else:
                    make_variant(model_file, version_dir / config.default_model_filename,
                                 variant, feeds)
                for extra in model_file.parent.iterdir():
                    if extra.name != config.default_model_filename:
                        copy = shutil.copytree if extra.is_dir() else shutil.copy2
                        copy(extra, version_dir / extra.name)
        except BaseException:
            shutil.rmtree(version_dir, ignore_errors=True)
            raise
        made[next_version] = variant
        next_version += 1
    if made:
        from tradeoff.optimize.torch_variants import describe_torch

        describe = describe_torch if config.backend == "pytorch" else Variant.describe
        with local_resource(f"cannot write {model_dir}'s config"):
            add_versions(model_dir, {v: {"precision": variant.precision,
                                         "method": f"{describe(variant)}; from version "
                                                   f"{source_version}"}
                                     for v, variant in made.items()})
    source = repository.read(name)  # the config as the server will read it now
    versions = [source_version, *made]
    reports = []
    reference: dict[str, np.ndarray] | None = None
    for version in versions:
        step(f"measuring version {version}")
        path = model_dir / str(version) / config.default_model_filename
        backend = backend_type.create(_spec(name, path, source.config))
        try:
            outputs = _outputs(backend, source.config, validation)
            latency, throughput = _speed(backend, source.config, validation,
                                         plan.seconds_per_version)
        finally:
            backend.close()
        if reference is None:
            reference = outputs
        accuracy = [] if version == source_version else \
            [compare_output(o, reference[o], outputs[o]) for o in reference]
        reports.append(VersionReport(
            version, _precision(source, version, made), _method(source, version, made),
            _size(path.parent), latency, throughput, accuracy, created=version in made))
    return OptimizeResult(
        model=name, repository=str(model_dir.parent), source_version=source_version,
        validation={"source": validation_from, "samples": sample_count(validation)},
        calibration=calibration_doc, max_drop=plan.max_drop,
        environment={**environment(), "onnxruntime": ort.__version__,
                     **({"torch": _torch_version()} if config.backend == "pytorch" else {}),
                     "intra_op_threads": _threads(source.config)},
        versions=reports)


def _optimize_generative(model_dir: Path, plan: OptimizePlan,
                         say: Progress) -> OptimizeResult:
    """An LLM: each precision as a sibling model (:mod:`tradeoff.optimize.generative`)."""
    from tradeoff.optimize.generative import optimize_generative, scored_text

    precisions = {INT8_DYNAMIC: "int8", BF16: "bf16"}
    refused = [v.kind for v in plan.variants if v.kind not in precisions]
    if refused or plan.validation or plan.calibration or plan.source_version:
        raise OptimizeError(
            f"{model_dir.name} is a generative model: it takes --int8 dynamic and --bf16 "
            "(its decoder's precision); --fp16, --graph-opt, --int8 static, --validation, "
            "--calibration and --from-version are for ONNX models")
    versions, original = optimize_generative(
        model_dir, tuple(precisions[v.kind] for v in plan.variants),
        plan.seconds_per_version, say, plan.max_sequences)
    text = scored_text()
    return OptimizeResult(
        model=model_dir.name, repository=str(model_dir.parent), source_version=1,
        validation={"source": f"tradeoff's sentences ({len(text)} characters), next "
                              "token at every position", "samples": _scored_tokens(versions)},
        calibration=None, max_drop=plan.max_drop,
        environment={**environment(), "torch": _torch_version(),
                     "intra_op_threads": _torch_threads(), "original_precision": original},
        versions=versions)


def _scored_tokens(versions: list[VersionReport]) -> int:
    return next((v.accuracy[0].samples for v in versions if v.accuracy), 0)


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def _samples(path: Path | None, model_dir: Path, config: ModelConfig,
             purpose: str) -> tuple[Samples, str]:
    if path is not None:
        return load_samples(path, config, flag=f"--{purpose}"), str(path)
    return builtin_samples(model_dir, config, purpose)


def _threads(config: ModelConfig) -> int:
    return int(config.parameters.get("intra_op_thread_count", 1))


def _spec(name: str, path: Path, config: ModelConfig) -> InstanceSpec:
    return config.instance_spec(path, intra_op_threads=_threads(config))


def _batches(config: ModelConfig, samples: Samples, size: int) -> Iterator[Samples]:
    """The samples in order, ``size`` at a time (one unbatched sample for a model that
    does not batch)."""
    count = sample_count(samples)
    if config.max_batch_size == 0:
        for i in range(count):
            yield {n: a[i] for n, a in samples.items()}
        return
    for start in range(0, count, size):
        yield take(samples, start, start + size)


def _onnx_feeds(config: ModelConfig, backend: Backend, samples: Samples) -> Iterator[Feed]:
    """What the ONNX file itself takes for each calibration batch: token ids for a text
    model, the samples for any other."""
    try:
        for batch in _batches(config, samples, 1):
            yield backend.tokenize(batch["text"]) if isinstance(backend, TextEncoderBackend) \
                else batch
    finally:
        backend.close()


def _outputs(backend: Backend, config: ModelConfig, samples: Samples) -> dict[str, np.ndarray]:
    """Every output over all samples, in sample order."""
    names = [t.name for t in config.outputs]
    size = max(config.max_batch_size, 1)
    parts: dict[str, list[np.ndarray]] = {n: [] for n in names}
    for batch in _batches(config, samples, size):
        for n, array in backend.run(batch, names).items():
            parts[n].append(array if config.max_batch_size else array[np.newaxis])
    return {n: np.concatenate(arrays) for n, arrays in parts.items()}


def _cycled(samples: Samples, size: int) -> Samples:
    """``size`` samples, going round the set as often as needed."""
    index = np.arange(size) % sample_count(samples)
    return {n: a[index] for n, a in samples.items()}


def _speed(backend: Backend, config: ModelConfig, samples: Samples,
           seconds: float) -> tuple[dict[str, float], dict[int, float]]:
    """Latency (ms) of single samples, and samples per second at each batch size
    (powers of two up to max_batch_size), each measured for a share of ``seconds``."""
    names = [t.name for t in config.outputs]
    sizes = [1]
    while config.max_batch_size and sizes[-1] * 2 <= config.max_batch_size:
        sizes.append(sizes[-1] * 2)
    singles = list(_batches(config, samples, 1))
    backend.run(singles[0], names)  # first run: allocations, lazy kernels
    latencies: list[float] = []
    deadline = time.perf_counter() + seconds / 2
    while len(latencies) < 5 or time.perf_counter() < deadline:
        batch = singles[len(latencies) % len(singles)]
        start = time.perf_counter()
        backend.run(batch, names)
        latencies.append((time.perf_counter() - start) * 1e3)
    throughput = {}
    share = seconds / 2 / len(sizes)
    for size in sizes:
        batch = singles[0] if size == 1 else _cycled(samples, size)
        backend.run(batch, names)
        runs, start = 0, time.perf_counter()
        while runs < 2 or time.perf_counter() - start < share:
            backend.run(batch, names)
            runs += 1
        throughput[size] = size * runs / (time.perf_counter() - start)
    latency = distribution(np.array(latencies))
    assert latency is not None  # at least five runs
    return latency, throughput


def _precision(source: ModelSource, version: int, made: dict[int, Variant]) -> str:
    if version in made:
        return made[version].precision
    return source.config.parameters.get(version_parameter(version, "precision"), "fp32")


def _method(source: ModelSource, version: int, made: dict[int, Variant]) -> str:
    return source.config.parameters.get(version_parameter(version, "method"), "original")


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
