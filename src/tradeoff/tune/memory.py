"""How much memory this process holds at its peak: RSS on the CPU, the device on CUDA.

    meter = memory_meter("cpu")
    meter.reset()            # the peak starts again from what is held now
    ...                      # run a batch
    meter.peak()             # bytes: the most held since reset

On Linux the CPU peak is the kernel's own high-water mark of the resident set
(``VmHWM`` in ``/proc/self/status``), which writing ``5`` to ``/proc/self/clear_refs``
resets; nothing is sampled, so no short peak is missed. The C heap is trimmed before each
reset, so memory an earlier batch freed is not counted again. On CUDA it is what
``nvidia-smi`` reports the GPU holding: ONNX Runtime's CUDA arena keeps what it took,
so the figure after a batch is its peak.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

from tradeoff.errors import TuneError

__all__ = ["CudaMeter", "MemoryMeter", "RssMeter", "TorchCudaMeter", "memory_meter"]

_STATUS = Path("/proc/self/status")
_CLEAR_REFS = Path("/proc/self/clear_refs")


def _status_kib(field: str) -> int:
    for line in _STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise TuneError(f"/proc/self/status has no {field}: cannot measure memory here")


def _trim_heap() -> None:
    """Give the C heap's free memory back to the system, so what an earlier batch freed
    does not count as held by the next one (glibc keeps it resident otherwise)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the peak then includes freed heap
        pass


class RssMeter:
    """Peak resident memory of this process (Linux)."""

    source = "peak RSS of the process (VmHWM, reset before each batch size)"

    def __init__(self) -> None:
        if not _STATUS.is_file():
            raise TuneError("measuring memory needs Linux's /proc/self/status")

    def now(self) -> int:
        """Resident memory now, freed heap given back first."""
        _trim_heap()
        return _status_kib("VmRSS") * 1024

    def reset(self) -> None:
        _trim_heap()
        try:
            _CLEAR_REFS.write_text("5")
        except OSError as exc:
            raise TuneError(f"cannot reset the peak RSS ({exc}); the kernel refuses "
                            "/proc/self/clear_refs here") from None

    def peak(self) -> int:
        return _status_kib("VmHWM") * 1024


class CudaMeter:
    """Memory one GPU holds, from ``nvidia-smi``."""

    source = "memory the GPU holds (nvidia-smi, after each batch size)"

    def __init__(self, device_id: int = 0) -> None:
        self.tool = shutil.which("nvidia-smi")
        if self.tool is None:
            raise TuneError("--device cuda needs nvidia-smi to measure device memory")
        self.device_id = device_id

    def _query(self, *fields: str) -> list[list[str]]:
        out = subprocess.run([self.tool or "nvidia-smi", f"--id={self.device_id}", *fields,
                              "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=False)
        if out.returncode:
            raise TuneError(f"nvidia-smi failed: {out.stderr.strip() or out.returncode}")
        return [[part.strip() for part in line.split(",")] for line in out.stdout.splitlines()
                if line.strip()]

    def now(self) -> int:
        """What the device holds now. The whole device, not this process: before the
        model loads this process has no CUDA context to list, and a container's own PID
        namespace hides it from nvidia-smi. The difference from before the model loaded is
        what counts, so keep other work off the GPU while tuning."""
        return sum(int(row[0]) for row in self._query("--query-gpu=memory.used")) * 1024 * 1024

    def reset(self) -> None:
        """The arena does not give memory back, so there is nothing to reset."""

    def peak(self) -> int:
        return self.now()


class TorchCudaMeter:
    """Memory PyTorch's caching allocator holds for tensors on one GPU: its own peak
    counter, reset before each batch size, so the figure is this process's alone."""

    source = "torch.cuda.max_memory_allocated (reset before each batch size)"

    def __init__(self, device_id: int = 0) -> None:
        import torch

        if not torch.cuda.is_available():
            raise TuneError(f"--device cuda: this PyTorch ({torch.__version__}) sees no CUDA "
                            "device (a CUDA build of torch, on a machine with a GPU)")
        self.torch = torch
        self.device = torch.device("cuda", device_id)

    def now(self) -> int:
        self.torch.cuda.synchronize(self.device)
        return int(self.torch.cuda.memory_allocated(self.device))

    def reset(self) -> None:
        self.torch.cuda.synchronize(self.device)
        self.torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int:
        self.torch.cuda.synchronize(self.device)
        return int(self.torch.cuda.max_memory_allocated(self.device))


MemoryMeter = RssMeter | CudaMeter | TorchCudaMeter


def memory_meter(device: str, backend: str = "") -> MemoryMeter:
    """The meter for ``cpu`` or ``cuda`` (PyTorch's own counters for its backend)."""
    if device != "cuda":
        return RssMeter()
    return TorchCudaMeter() if backend == "pytorch" else CudaMeter()
