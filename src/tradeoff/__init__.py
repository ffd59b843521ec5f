"""tradeoff: serve, benchmark and tune AI inference for the latency/throughput trade-off."""

from tradeoff.errors import (
    ConfigError,
    Forbidden,
    InferenceFailed,
    InstanceDied,
    InvalidInput,
    ModelLoadError,
    NotFound,
    Overloaded,
    PayloadTooLarge,
    RequestError,
    RequestTimeout,
    TradeoffError,
    Unauthorized,
    Unavailable,
)

__version__ = "0.1.0"

__all__ = [
    "ConfigError",
    "Forbidden",
    "InferenceFailed",
    "InstanceDied",
    "InvalidInput",
    "ModelLoadError",
    "NotFound",
    "Overloaded",
    "PayloadTooLarge",
    "RequestError",
    "RequestTimeout",
    "TradeoffError",
    "Unauthorized",
    "Unavailable",
    "__version__",
]
