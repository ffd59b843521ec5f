"""tradeoff: serve, benchmark and tune AI inference for the latency/throughput trade-off."""

from tradeoff.errors import (
    ConfigError,
    Forbidden,
    InferenceFailed,
    InstanceDied,
    InvalidInput,
    MissingDependency,
    ModelLoadError,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    RequestError,
    RequestTimeout,
    ResultFormatError,
    TradeoffError,
    Unauthorized,
    Unavailable,
)
from tradeoff.results import (
    BenchResult,
    CompareResult,
    SoakResult,
    SweepResult,
    load_result,
    write_json,
)

__version__ = "0.1.0"

__all__ = [
    "BenchResult",
    "CompareResult",
    "ConfigError",
    "Forbidden",
    "InferenceFailed",
    "InstanceDied",
    "InvalidInput",
    "MissingDependency",
    "ModelLoadError",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "RequestError",
    "RequestTimeout",
    "ResultFormatError",
    "SoakResult",
    "SweepResult",
    "TradeoffError",
    "Unauthorized",
    "Unavailable",
    "__version__",
    "load_result",
    "write_json",
]
