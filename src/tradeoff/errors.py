"""The one error tree of tradeoff.

    TradeoffError
    ├── ConfigError              a model configuration is invalid (names file and field)
    ├── ModelLoadError           a model could not be loaded
    ├── MissingDependency        an optional extra is not installed (names the pip command)
    ├── OptimizeError            tradeoff optimize cannot make or measure a version
    ├── TuneError                tradeoff tune cannot search or measure
    ├── ResultFormatError        a file is not a result this version reads; also a ValueError
    ├── BenchSetupError          a measurement cannot be carried out (bad arguments, an
    │                            endpoint unreachable or refusing); has .status
    ├── DatasetError             a dataset option or file that cannot be used; a ValueError
    ├── InvalidValue             a flag, spec or field tradeoff cannot use; a ValueError
    ├── RunStopped               a load run stopped by a signal (bench.runner.stop_runs)
    ├── LocalResourceError       a file, folder, port or certificate the user named that
    │                            this machine will not let tradeoff use (local_resource)
    ├── ServerStartError         a server started as a child process did not come up
    │                            (with its log's tail); also a RuntimeError
    └── RequestError             something a client caused or must be told; has .status
        ├── InvalidInput         400: malformed body, wrong dtype/shape, missing input
        ├── Unauthorized         401: a protected call without a valid API key
        ├── Forbidden            403: a valid key that may not make this call
        ├── NotFound             404: unknown model, version or route
        ├── PayloadTooLarge      413: body over the configured limit
        ├── Unavailable          503: model not ready, queue full, shutting down
        │   ├── Overloaded       503: the server-wide limit of requests in flight
        │   └── RequestTimeout   503: timed out in the queue (Triton's UNAVAILABLE)
        └── InferenceFailed      500: the backend raised while running a batch
            ├── BadGateway       502: a gateway's replica failed it, or answered nonsense
            └── InstanceDied     500: ... and the instance cannot run again

Transports (HTTP, gRPC) map these to status codes; nothing here imports a web framework.
A message is cut at ``MESSAGE_LIMIT`` characters, so an error that echoes what a file or a
client gave stays one readable line (a model's load-failure reason, a log line, an answer).
"""

from __future__ import annotations

import reprlib
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = [
    "MESSAGE_LIMIT",
    "BadGateway",
    "BenchSetupError",
    "ConfigError",
    "DatasetError",
    "Forbidden",
    "InferenceFailed",
    "InstanceDied",
    "InvalidInput",
    "InvalidValue",
    "LocalResourceError",
    "MissingDependency",
    "ModelLoadError",
    "NotFound",
    "OptimizeError",
    "Overloaded",
    "PayloadTooLarge",
    "RequestError",
    "RequestTimeout",
    "ResultFormatError",
    "RunStopped",
    "ServerStartError",
    "TradeoffError",
    "TuneError",
    "Unauthorized",
    "Unavailable",
    "capped",
    "failure_text",
    "local_resource",
    "shown",
]

MESSAGE_LIMIT = 2000  # characters

_SHOWN = reprlib.Repr()
_SHOWN.maxlevel, _SHOWN.maxlist, _SHOWN.maxdict, _SHOWN.maxstring = 2, 4, 4, 40


def capped(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """``text`` cut to ``limit`` characters, saying how many were cut."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... ({len(text) - limit} more characters)"


def failure_text(exc: BaseException) -> str:
    """An exception as one line, its type too: ``TimeoutError`` says nothing else."""
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def shown(value: object) -> str:
    """A short ``repr`` of a value for an error message: long strings, lists and mappings
    are cut (``[1, 2, 3, 4, ...]``), so the message names the value without echoing it."""
    return _SHOWN.repr(value)


class TradeoffError(Exception):
    """Base of every error tradeoff raises on purpose; its message is ``capped``."""

    def __init__(self, *args: object) -> None:
        super().__init__(*(capped(a) if isinstance(a, str) else a for a in args))


class ConfigError(TradeoffError):
    """A model configuration is invalid.

    The message names the file, the field and what is wrong, e.g.
    ``models/mlp/config.pbtxt: max_batch_size: must be >= 0, got -1``.
    """

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source = source
        self.field = field
        self.problem = capped(problem)
        where = f"{source}: {field}: " if field else f"{source}: "
        super().__init__(where + problem)


class ModelLoadError(TradeoffError):
    """A model could not be loaded (missing file, runtime refused the model, ...)."""


class OptimizeError(TradeoffError):
    """``tradeoff optimize`` cannot make or measure a version: a sample file that is missing
    or has the wrong inputs, a model with nothing to quantize, ..."""


class TuneError(TradeoffError):
    """``tradeoff tune`` cannot run its search (what to fix is in the message)."""


class MissingDependency(TradeoffError):
    """A feature needs a package of an optional extra that is not installed.

    The message is one line naming what to install, e.g.
    ``the HTML report needs matplotlib: pip install 'tradeoff[report]'``.
    """

    def __init__(self, feature: str, package: str, extra: str) -> None:
        self.feature = feature
        self.package = package
        self.extra = extra
        super().__init__(f"{feature} needs {package}: pip install 'tradeoff[{extra}]'")


class ResultFormatError(TradeoffError, ValueError):
    """A document that is not a tradeoff result this version can read.

    The message names the file (or the given name) and the field, e.g.
    ``sweep.json.points[1].summary: field 'requests' is missing``. It is also a
    ``ValueError``, so handlers of bad values catch it too.
    """



class BenchSetupError(TradeoffError):
    """A measurement cannot be carried out (bad arguments, endpoint unreachable, ...);
    ``status`` is the HTTP status when the endpoint refused a setup request."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class DatasetError(TradeoffError, ValueError):
    """A dataset option or file that cannot be used; the message says what to fix."""


class InvalidValue(TradeoffError, ValueError):
    """A value given to tradeoff (a flag, a spec, a field of a file) that it cannot use;
    the message says what it takes instead. Also a ``ValueError``, so handlers of bad
    values catch it too."""


class RunStopped(TradeoffError):
    """A load run ended early, or refused to start, after ``bench.runner.stop_runs``
    (a signal, as a rule)."""

class LocalResourceError(TradeoffError):
    """A file, folder, port or certificate the user named that this machine will not let
    tradeoff use: missing, unreadable, a folder where a file was meant, a full disk, a
    port already taken. The message names it and the system's reason."""


class ServerStartError(TradeoffError, RuntimeError):
    """A server tradeoff started as a child process (``tradeoff serve``, a Ray node) did
    not come up; the message ends with the tail of its log."""


@contextmanager
def local_resource(what: str) -> Iterator[None]:
    """Raise an ``OSError`` met inside the block as a :class:`LocalResourceError` that
    starts with ``what`` (``"cannot write out/sweep.json"``); use it only where a user's
    path or address is touched, so that any other ``OSError`` stays a bug with its
    traceback.

        with local_resource(f"cannot read --input-data {path}"):
            text = path.read_text()
    """
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or str(exc) or type(exc).__name__
        raise LocalResourceError(f"{what}: {reason}") from exc


class RequestError(TradeoffError):
    """An error answered to a client; ``status`` is the HTTP status code."""

    status = 500


class InvalidInput(RequestError):
    status = 400


class Unauthorized(RequestError):
    status = 401


class Forbidden(RequestError):
    status = 403


class NotFound(RequestError):
    status = 404


class PayloadTooLarge(RequestError):
    status = 413


class Unavailable(RequestError):
    status = 503


class Overloaded(Unavailable):
    """Refused at once: the server already holds its limit of requests in flight."""


class RequestTimeout(Unavailable):
    """Timed out in the queue; 503 like Triton's UNAVAILABLE, with its own message."""


class InferenceFailed(RequestError):
    status = 500


class BadGateway(InferenceFailed):
    """A replica behind a gateway failed the request or answered what cannot be read."""

    status = 502


class InstanceDied(InferenceFailed):
    """A model instance can no longer run (crashed session, lost device): its batch
    fails, and the model is not ready until it is loaded again."""
