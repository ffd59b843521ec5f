"""``tradeoff tune batch-size``: the largest batch worth running, found by doubling.

The practice, measured in process through the backend the server uses:

1. Start at batch 1 and double. Each batch size runs for ``seconds_per_batch`` on the
   model's samples: samples per second, the latency of one batch, and the memory the
   process held at its peak.
2. Stop when more batch stopped paying: the knee of the throughput curve (the rule of
   :mod:`tradeoff.stats.knee`: from it on, every doubling gains under ``min_gain``),
   confirmed by ``patience`` (2) doublings past it; or when a batch fails, passes
   ``--max-memory`` or ``--max-latency-ms``, or reaches ``--max-batch``.
3. Back off ``back_off`` (20%) from the knee: the headroom keeps the operating point
   off the cliff when inputs are longer or the machine busier than in the measurement.
   The back-off batch size is measured too, so its cost is shown, not guessed.

Memory: what the process holds once the model is loaded is the model's own
(``weights``); the slope of the peak over the batch size is the memory per sample; the
largest batch that fits is estimated as ``(max_memory - weights) / per_sample`` and
printed next to the largest doubling that actually stayed within ``--max-memory``.

    result = tune_batch_size(Path("models/mlp"), BatchSizePlan(max_memory_bytes=4 << 30))
    result.recommended

Times are read on a clock, the real one unless told: on a
:class:`~tradeoff.backends.clock.ModelledClock` a synthetic model's batches take exactly
their modelled cost, so a test of the search does not move with the machine's load.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from tradeoff.backends.base import Backend
from tradeoff.backends.clock import REAL_CLOCK, Clock
from tradeoff.backends.registry import InstanceSpec, TensorBackendType
from tradeoff.errors import ModelLoadError, OptimizeError, TradeoffError, TuneError
from tradeoff.optimize.samples import VALIDATION, Samples, builtin_samples, sample_count
from tradeoff.repository.config import ModelConfig
from tradeoff.repository.repository import ModelRepository
from tradeoff.results import BatchPoint, BatchSizeTune, MemoryEstimate, environment
from tradeoff.stats.distribution import distribution
from tradeoff.stats.knee import MIN_GAIN, find_knee
from tradeoff.tune.memory import MemoryMeter, memory_meter

__all__ = [
    "BatchSizePlan",
    "Progress",
    "back_off_from",
    "estimated_max_batch",
    "memory_per_sample",
    "tune_batch_size",
]

Progress = Callable[[str], None]


@dataclass(frozen=True)
class BatchSizePlan:
    """How far to search and what bounds the batch."""

    device: str = "cpu"
    max_memory_bytes: int | None = None
    max_latency_ms: float | None = None
    max_batch: int = 1024
    seconds_per_batch: float = 1.0
    min_gain: float = MIN_GAIN
    patience: int = 2  # doublings measured past the knee before stopping
    back_off: float = 0.2
    threads: int | None = None  # intra-op threads; default: the model's config

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda"):
            raise TuneError(f"--device {self.device!r}: use cpu or cuda")
        if not 0 <= self.back_off < 1:
            raise TuneError(f"back-off {self.back_off}: give a fraction in [0, 1)")
        if self.max_batch < 1:
            raise TuneError(f"--max-batch {self.max_batch}: give 1 or more")


def back_off_from(knee: int, back_off: float) -> int:
    """The batch size ``back_off`` below the knee (at least 1)."""
    return max(1, math.floor(knee * (1 - back_off)))


def memory_per_sample(points: list[BatchPoint]) -> float | None:
    """Slope of peak memory over batch size (least squares over the batches that ran);
    None when fewer than two ran or memory did not grow with the batch."""
    ran = [p for p in points if p.memory_bytes is not None and p.error is None]
    if len({p.batch_size for p in ran}) < 2:
        return None
    slope = float(np.polyfit([p.batch_size for p in ran],
                             [float(p.memory_bytes or 0) for p in ran], 1)[0])
    return slope if slope > 0 else None


def estimated_max_batch(max_memory: int | None, weights: int,
                        per_sample: float | None) -> int | None:
    """``(max_memory - weights) / per_sample``, or None when either is unknown."""
    if max_memory is None or not per_sample:
        return None
    return max(0, math.floor((max_memory - weights) / per_sample))


class _Measurer:
    """Runs one batch size on the backend and reads the clock and the memory meter."""

    def __init__(self, backend: Backend, config: ModelConfig, samples: Samples,
                 plan: BatchSizePlan, meter: MemoryMeter, baseline: int,
                 clock: Clock) -> None:
        self.backend = backend
        self.clock = clock
        self.config = config
        self.samples = samples
        self.plan = plan
        self.meter = meter
        self.baseline = baseline
        self.outputs = [t.name for t in config.outputs]

    def batch(self, size: int) -> Samples:
        index = np.arange(size) % sample_count(self.samples)
        return {name: array[index] for name, array in self.samples.items()}

    def measure(self, size: int, role: str, runs: int = 3) -> BatchPoint:
        """``size`` for ``seconds_per_batch`` (at least ``runs`` runs; with ``runs=1`` only
        one, for a probe of memory)."""
        inputs = self.batch(size)
        self.meter.reset()
        seconds = self.plan.seconds_per_batch if runs > 1 else 0.0
        try:
            self.backend.run(inputs, self.outputs)  # allocations, lazy kernels
            times: list[float] = []
            deadline = self.clock.now() + seconds
            while len(times) < runs or self.clock.now() < deadline:
                start = self.clock.now()
                self.backend.run(inputs, self.outputs)
                times.append(self.clock.now() - start)
        except TradeoffError as exc:
            return BatchPoint(size, role, None, None, None, False, str(exc))
        except Exception as exc:  # a runtime's own error: the batch cannot run
            return BatchPoint(size, role, None, None, None, False,
                              f"{type(exc).__name__}: {exc}")
        memory = max(self.meter.peak() - self.baseline, 0)
        fits = self.plan.max_memory_bytes is None or memory <= self.plan.max_memory_bytes
        taken = np.array(times)
        return BatchPoint(size, role, size * len(times) / float(taken.sum()),
                          distribution(taken * 1e3), memory, fits)


def _load(model_dir: Path, plan: BatchSizePlan, clock: Clock
          ) -> tuple[ModelConfig, InstanceSpec, Samples, str, TensorBackendType]:
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise TuneError(f"{model_dir}: not a model directory (give REPOSITORY/MODEL)")
    inner = ModelRepository(model_dir)
    own_files = ("config.pbtxt", "config.yaml", "generate.yaml", "router.yaml")
    if inner.names() and not any(p.name.isdigit() for p in model_dir.iterdir()) and \
            not any((model_dir / f).exists() for f in own_files):
        raise TuneError(f"{model_dir} is a model repository, not a model: give "
                        f"REPOSITORY/MODEL, e.g. {model_dir / inner.names()[0]}")
    repository = ModelRepository(model_dir.parent)
    name = model_dir.name
    if repository.kind(name) != "tensor":
        raise TuneError(f"{name} is a {repository.kind(name)} model; tune batch-size takes a "
                        "tensor model (a generative model batches by continuous batching)")
    source = repository.read(name)
    config = source.config
    if config.max_batch_size == 0:
        raise TuneError(f"{name} does not batch (max_batch_size 0): its inputs have no batch "
                        "dimension to search")
    threads = plan.threads or int(config.parameters.get("intra_op_thread_count", 1))
    parameters = {k: v for k, v in config.parameters.items() if k != "intra_op_thread_count"}
    if plan.device == "cuda":
        _check_cuda(config.backend)
    spec = config.instance_spec(source.versions[max(source.versions)],
                                parameters=parameters, intra_op_threads=threads,
                                kind="KIND_GPU" if plan.device == "cuda" else "KIND_CPU",
                                device_id=0)
    spec = replace(spec, clock=clock)
    try:
        samples, where = builtin_samples(model_dir, config, VALIDATION)
    except OptimizeError as exc:
        raise TuneError(str(exc)) from None
    backend_type = repository.backends.tensor(config.backend)
    return config, spec, samples, f"{where}; backend {backend_type.name}", backend_type


def _check_cuda(backend: str) -> None:
    if backend == "pytorch":
        return  # its meter (TorchCudaMeter) checks that PyTorch sees a CUDA device
    if backend not in ("onnxruntime", "onnxruntime_text"):
        raise TuneError(f"--device cuda runs ONNX Runtime's CUDA provider or PyTorch; the "
                        f"{backend} backend has neither")
    import onnxruntime as ort

    if "CUDAExecutionProvider" not in ort.get_available_providers():
        raise TuneError("--device cuda: this ONNX Runtime has no CUDA provider "
                        "(pip install onnxruntime-gpu, on a machine with a GPU)")


def tune_batch_size(model_dir: Path, plan: BatchSizePlan, progress: Progress | None = None,
                    *, clock: Clock = REAL_CLOCK) -> BatchSizeTune:
    """Run the doubling search on the model in ``model_dir`` (REPOSITORY/MODEL), timing
    its batches on ``clock``."""
    say = progress or (lambda _: None)
    config, spec, samples, samples_from, backend_type = _load(model_dir, plan, clock)
    meter = memory_meter(plan.device, config.backend)
    baseline = meter.now()
    say("loading the model")
    try:
        backend = backend_type.create(spec)
    except ModelLoadError as exc:
        raise TuneError(str(exc)) from None
    try:
        weights = max(meter.now() - baseline, 0)
        measurer = _Measurer(backend, config, samples, plan, meter, baseline, clock)
        points, stop_reason = _double(measurer, plan, say)
        good = [p for p in points if p.samples_per_s is not None and p.fits
                and _within_latency(p, plan)]
        if not good:
            raise TuneError(f"no batch size ran within the bounds: {stop_reason}")
        sizes = [p.batch_size for p in good]
        index = find_knee(sizes, [p.samples_per_s or 0.0 for p in good], plan.min_gain)
        if index is not None:
            knee: int | None = sizes[index]
            why_knee = (f"throughput stopped growing at batch {knee}: every further doubling "
                        f"gained under {plan.min_gain:.0%}")
        else:
            knee = None
            why_knee = f"throughput still grew at the largest batch measured ({sizes[-1]}); "\
                       f"{stop_reason}"
        top = knee if knee is not None else sizes[-1]
        recommended = back_off_from(top, plan.back_off)
        if all(p.batch_size != recommended for p in points):
            say(f"measuring the back-off batch {recommended}")
            points.append(measurer.measure(recommended, "back-off"))
        why = (f"{why_knee}; {plan.back_off:.0%} below batch {top} for headroom "
               f"(longer inputs, a busier machine)")
        if plan.max_memory_bytes is not None and all(p.fits for p in points):
            points += _probe_memory(measurer, plan, points, say)
    finally:
        backend.close()
    per_sample = memory_per_sample(points)
    fitted = [p.batch_size for p in points if p.fits and p.error is None
              and p.role in ("doubling", "memory")]
    memory = MemoryEstimate(
        meter.source, weights, per_sample, plan.max_memory_bytes,
        estimated_max_batch(plan.max_memory_bytes, weights, per_sample),
        max(fitted) if plan.max_memory_bytes is not None and fitted else None)
    return BatchSizeTune(
        model=config.name, repository=str(Path(model_dir).parent), device=plan.device,
        plan={**asdict(plan), "samples": samples_from, "intra_op_threads": spec.intra_op_threads},
        environment=environment(), points=sorted(points, key=lambda p: p.batch_size),
        knee=knee, recommended=recommended, why=why, stop_reason=stop_reason, memory=memory)


def _probe_memory(measurer: _Measurer, plan: BatchSizePlan, points: list[BatchPoint],
                  say: Progress) -> list[BatchPoint]:
    """Past the knee, keep doubling with one run per size until a batch passes
    ``--max-memory`` (or fails, or reaches ``--max-batch``): the largest batch that fits
    is measured, not only estimated."""
    probes: list[BatchPoint] = []
    size = max(p.batch_size for p in points if p.role == "doubling") * 2
    while size <= plan.max_batch:
        say(f"memory at batch {size}")
        probe = measurer.measure(size, "memory", runs=1)
        probes.append(probe)
        if probe.error is not None or not probe.fits:
            break
        size *= 2
    return probes


def _within_latency(point: BatchPoint, plan: BatchSizePlan) -> bool:
    p99 = (point.latency_ms or {}).get("p99")
    return plan.max_latency_ms is None or p99 is None or p99 <= plan.max_latency_ms


def _double(measurer: _Measurer, plan: BatchSizePlan,
            say: Progress) -> tuple[list[BatchPoint], str]:
    points: list[BatchPoint] = []
    size = 1
    while True:
        say(f"batch {size}")
        point = measurer.measure(size, "doubling")
        points.append(point)
        if point.error is not None:
            return points, f"batch {size} failed: {point.error}"
        if not point.fits:
            return points, (f"batch {size} held {(point.memory_bytes or 0) / 1e6:,.0f} MB, "
                            f"over --max-memory {(plan.max_memory_bytes or 0) / 1e6:,.0f} MB")
        if not _within_latency(point, plan):
            return points, (f"batch {size} took {(point.latency_ms or {})['p99']:.2f} ms at "
                            f"p99, over --max-latency-ms {plan.max_latency_ms:g}")
        ran = [p for p in points if p.samples_per_s is not None]
        index = find_knee([p.batch_size for p in ran], [p.samples_per_s or 0.0 for p in ran],
                          plan.min_gain)
        if index is not None and len(ran) - 1 - index >= plan.patience:
            return points, (f"{plan.patience} doubling(s) past batch {ran[index].batch_size} "
                            f"gained under {plan.min_gain:.0%} each")
        if size * 2 > plan.max_batch:
            return points, f"--max-batch {plan.max_batch} reached"
        size *= 2
