"""What a server's ``/metrics`` says now, and what changed between two readings.

    before = scrape("http://127.0.0.1:8002/metrics")
    time.sleep(1)
    after = scrape("http://127.0.0.1:8002/metrics")
    models, generations = live_rows(before, after)

Counters become rates over the interval; latency percentiles come from the histogram
buckets that filled in the interval, interpolated inside a bucket as Prometheus's
``histogram_quantile`` does (so they are as fine as the buckets, no finer); gauges are
read as they are at the second reading.

:func:`prometheus_rows` gives the same rows from a Prometheus server that scrapes one or
more servers (replicas summed), with PromQL over a window.

A reading is bounded: ``SCRAPE_TIMEOUT_S`` for all of it (not per read: an endpoint that
drips its answer cannot stretch it), ``MAX_SCRAPE_BYTES`` and ``MAX_SERIES``. A reading
past a bound raises :class:`ScrapeError`, whose message says which, before the text is
parsed.
"""

from __future__ import annotations

import math
import time
import urllib.parse
from dataclasses import dataclass

import orjson
from prometheus_client.parser import text_string_to_metric_families

from tradeoff.errors import BenchSetupError
from tradeoff.protocol.http_client import ResponseTooLarge, get

__all__ = [
    "MAX_SCRAPE_BYTES",
    "MAX_SERIES",
    "SCRAPE_TIMEOUT_S",
    "GenerationRow",
    "Labels",
    "ModelRow",
    "ReplicaRow",
    "ScrapeError",
    "Snapshot",
    "live_rows",
    "metrics_url",
    "parse",
    "prometheus_replica_rows",
    "prometheus_rows",
    "quantile",
    "replica_rows",
    "scrape",
]

SCRAPE_TIMEOUT_S = 5.0
MAX_SCRAPE_BYTES = 32 << 20
MAX_SERIES = 100_000  # samples of one reading; a server with 100 models has a few thousand


class ScrapeError(BenchSetupError):
    """One reading failed a bound, or was not Prometheus text; the next may not."""

Labels = frozenset[tuple[str, str]]


@dataclass(frozen=True)
class Snapshot:
    """Every sample of one reading of ``/metrics``."""

    at: float  # time.monotonic() of the reading
    samples: dict[tuple[str, Labels], float]

    def value(self, name: str, labels: dict[str, str]) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))

    def label_sets(self, name: str) -> list[dict[str, str]]:
        """The label sets ``name`` has samples for."""
        return [dict(labels) for sample, labels in self.samples if sample == name]

    def buckets(self, name: str, labels: dict[str, str]) -> dict[float, float]:
        """Cumulative counts of histogram ``name`` by upper bound (``inf`` last)."""
        out = {}
        for (sample, sample_labels), value in self.samples.items():
            if sample != f"{name}_bucket":
                continue
            rest = dict(sample_labels)
            bound = rest.pop("le", None)
            if bound is not None and rest == labels:
                out[float(bound)] = value
        return dict(sorted(out.items()))


def parse(text: str, at: float | None = None) -> Snapshot:
    """A Snapshot of Prometheus text exposition."""
    samples = {(s.name, frozenset(s.labels.items())): float(s.value)
               for family in text_string_to_metric_families(text) for s in family.samples}
    return Snapshot(time.monotonic() if at is None else at, samples)


def metrics_url(url: str) -> str:
    """``url`` as a ``/metrics`` address (a bare ``host:port`` or base URL gets the path)."""
    if "://" not in url:
        url = f"http://{url}"
    return url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"


def scrape(url: str, timeout_s: float = SCRAPE_TIMEOUT_S, max_bytes: int = MAX_SCRAPE_BYTES,
           max_series: int = MAX_SERIES) -> Snapshot:
    """Read ``url`` (a server's ``/metrics``): ScrapeError when the reading passes a bound
    or is not Prometheus text, BenchSetupError when there is no reading at all."""
    body = _read(url, timeout_s, max_bytes)
    lines = body.count(b"\n") + (not body.endswith(b"\n"))
    series = lines - body.count(b"\n#") - body.startswith(b"#") - body.count(b"\n\n")
    if series > max_series:
        raise ScrapeError(f"{url}: more than {max_series:,} series in one reading "
                          f"({series:,}); not read")
    try:
        return parse(body.decode())
    except (ValueError, TypeError) as exc:  # UnicodeDecodeError is a ValueError
        raise ScrapeError(f"{url}: not Prometheus text ({str(exc)[:120]})") from None


def _read(url: str, timeout_s: float, max_bytes: int) -> bytes:
    """The body of ``GET url`` within the bounds of a reading."""
    try:
        response = get(url, timeout_s=timeout_s, max_bytes=max_bytes)
    except ResponseTooLarge:
        raise ScrapeError(f"{url}: a reading over {max_bytes:,} bytes; not read") from None
    except TimeoutError:
        raise ScrapeError(f"{url}: no whole reading within {timeout_s:g} s") from None
    except OSError as exc:
        raise BenchSetupError(f"cannot read {url}: {exc}") from None
    if response.status != 200:
        detail = response.body[:300].decode(errors="replace")
        raise BenchSetupError(f"cannot read {url}: HTTP {response.status} {detail}",
                              response.status)
    return response.body


def quantile(q: float, before: dict[float, float], after: dict[float, float]) -> float | None:
    """The ``q`` quantile of the observations that landed between two readings of a
    histogram's cumulative buckets (None when none did)."""
    counts = [(bound, after[bound] - before.get(bound, 0.0)) for bound in after]
    if not counts or counts[-1][1] <= 0:
        return None
    rank = q * counts[-1][1]
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in counts:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound  # past the last finite bound: the bound is all we know
            share = (rank - lower_count) / (count - lower_count) if count > lower_count \
                else 1.0
            return lower_bound + (bound - lower_bound) * share
        lower_bound, lower_count = bound, count
    return lower_bound


@dataclass(frozen=True)
class ModelRow:
    """One tensor model version over one interval."""

    model: str
    version: str
    requests_per_s: float
    failures_per_s: float
    inferences_per_s: float
    executions_per_s: float
    p50_ms: float | None
    p99_ms: float | None
    queue_depth: float
    in_flight: float

    @property
    def mean_batch(self) -> float | None:
        return self.inferences_per_s / self.executions_per_s if self.executions_per_s else None


@dataclass(frozen=True)
class GenerationRow:
    """One generative model over one interval."""

    model: str
    output_tokens_per_s: float
    requests_per_s: float
    running: float
    waiting: float
    kv_usage: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None


@dataclass(frozen=True)
class ReplicaRow:
    """One replica of a gateway's pool over one interval."""

    router: str
    pool: str
    replica: str
    requests_per_s: float
    errors_per_s: float
    in_flight: float
    ready: bool
    latency_ms: float | None        # mean answer time over the interval
    prefix_matched: float | None    # share of the prompt blocks it was known to hold
    queued: float | None = None     # waiting in its own queue, by its last report


_REPLICA = "tradeoff_gateway_replica_"


def replica_rows(before: Snapshot, after: Snapshot) -> list[ReplicaRow]:
    """Each gateway replica's rates and state between two readings."""
    seconds = after.at - before.at
    rows = []
    for labels in sorted(after.label_sets(f"{_REPLICA}ready"),
                         key=lambda d: (d["router"], d["pool"], d["replica"])):
        def delta(name: str, labels: dict[str, str] = labels) -> float:
            return max((after.value(name, labels) or 0.0) - (before.value(name, labels) or 0.0),
                       0.0)

        answered = delta(f"{_REPLICA}latency_seconds_count")
        sent = delta(f"{_REPLICA}prefix_blocks_total", {**labels, "kind": "sent"})
        rows.append(ReplicaRow(
            labels["router"], labels["pool"], labels["replica"],
            _rate(f"{_REPLICA}requests_total", labels, before, after, seconds),
            _rate(f"{_REPLICA}errors_total", labels, before, after, seconds),
            after.value(f"{_REPLICA}in_flight", labels) or 0.0,
            (after.value(f"{_REPLICA}ready", labels) or 0.0) > 0,
            delta(f"{_REPLICA}latency_seconds_sum") / answered * 1e3 if answered else None,
            delta(f"{_REPLICA}prefix_blocks_total", {**labels, "kind": "matched"}) / sent
            if sent else None,
            after.value(f"{_REPLICA}reported_queue", labels)))
    return rows


def _rate(name: str, labels: dict[str, str], before: Snapshot, after: Snapshot,
          seconds: float) -> float:
    now, then = after.value(name, labels), before.value(name, labels)
    if now is None or seconds <= 0:
        return 0.0
    return max(now - (then or 0.0), 0.0) / seconds  # a restart resets counters: not < 0


def live_rows(before: Snapshot, after: Snapshot) -> tuple[list[ModelRow], list[GenerationRow]]:
    """Rates, percentiles and gauges of every model between two readings."""
    seconds = after.at - before.at
    models = []
    for labels in sorted(after.label_sets("tradeoff_model_ready"),
                         key=lambda d: (d["model"], d["version"])):
        failed = "tradeoff_inference_request_failure_total"  # one series per reason
        failures = sum(_rate(failed, reasons, before, after, seconds)
                       for reasons in after.label_sets(failed)
                       if (reasons.get("model"), reasons.get("version"))
                       == (labels["model"], labels["version"]))
        latency = "tradeoff_inference_request_duration_seconds"
        then, now = before.buckets(latency, labels), after.buckets(latency, labels)
        p50, p99 = quantile(0.5, then, now), quantile(0.99, then, now)
        models.append(ModelRow(
            labels["model"], labels["version"],
            _rate("tradeoff_inference_request_success_total", labels, before, after, seconds),
            failures,
            _rate("tradeoff_inference_count_total", labels, before, after, seconds),
            _rate("tradeoff_inference_exec_count_total", labels, before, after, seconds),
            None if p50 is None else p50 * 1e3, None if p99 is None else p99 * 1e3,
            after.value("tradeoff_inference_queue_depth", labels) or 0.0,
            after.value("tradeoff_inference_in_flight", labels) or 0.0))
    generations = []
    for labels in sorted(after.label_sets("tradeoff_generation_requests_running"),
                         key=lambda d: d["model"]):
        ttft = "tradeoff_generation_time_to_first_token_seconds"
        then, now = before.buckets(ttft, labels), after.buckets(ttft, labels)
        p50, p99 = quantile(0.5, then, now), quantile(0.99, then, now)
        generations.append(GenerationRow(
            labels["model"],
            _rate("tradeoff_generation_generation_tokens_total", labels, before, after,
                  seconds),
            _rate("tradeoff_generation_requests_finished_total", labels, before, after,
                  seconds),
            after.value("tradeoff_generation_requests_running", labels) or 0.0,
            after.value("tradeoff_generation_requests_waiting", labels) or 0.0,
            after.value("tradeoff_generation_kv_cache_usage_ratio", labels) or 0.0,
            None if p50 is None else p50 * 1e3, None if p99 is None else p99 * 1e3))
    return models, generations


# ------------------------------------------------------------------ from Prometheus

def _query(base: str, expr: str, deadline: float, timeout_s: float
           ) -> list[tuple[dict[str, str], float]]:
    """One instant query of Prometheus's HTTP API, done by ``deadline`` (monotonic, the
    end of ``timeout_s`` for the whole reading): (labels, value) per series."""
    url = f"{base.rstrip('/')}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    left = deadline - time.monotonic()
    if left <= 0:
        raise ScrapeError(f"Prometheus at {base}: no whole reading within "
                          f"{timeout_s:g} s")
    try:
        response = get(url, timeout_s=left, max_bytes=MAX_SCRAPE_BYTES)
    except ResponseTooLarge:
        raise ScrapeError(f"Prometheus at {base}: an answer over {MAX_SCRAPE_BYTES:,} "
                          "bytes; not read") from None
    except TimeoutError:
        raise ScrapeError(f"Prometheus at {base}: no whole reading within "
                          f"{timeout_s:g} s") from None
    except OSError as exc:
        raise BenchSetupError(f"cannot query Prometheus at {base}: {exc}") from None
    if response.status != 200:
        detail = response.body[:300].decode(errors="replace")
        raise BenchSetupError(f"Prometheus at {base} refused {expr!r}: HTTP "
                              f"{response.status} {detail}")
    try:
        answer = orjson.loads(response.body)
        if answer.get("status") != "success":
            raise BenchSetupError(f"Prometheus at {base}: {answer.get('error', answer)}")
        out = []
        for series in answer["data"]["result"]:
            value, metric = float(series["value"][1]), series["metric"]
            if not isinstance(metric, dict):
                raise TypeError("a series' metric is not an object")
            out.append((metric, value if math.isfinite(value) else math.nan))
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        raise ScrapeError(f"Prometheus at {base}: not a query answer "
                          f"({type(exc).__name__}: {str(exc)[:120]})") from None
    return out


def prometheus_rows(base: str, window: str = "1m", timeout_s: float = SCRAPE_TIMEOUT_S
                    ) -> tuple[list[ModelRow], list[GenerationRow]]:
    """The rows of :func:`live_rows`, from a Prometheus server that scrapes the servers:
    rates and percentiles over ``window``, summed over every server (replica) it
    scrapes. Its queries have ``timeout_s`` in all."""
    by = "model, version"
    deadline = time.monotonic() + timeout_s

    def per_model(expr: str, keys: str = by) -> dict[tuple[str, ...], float]:
        names = [k.strip() for k in keys.split(",")]
        return {tuple(m.get(n, "") for n in names): v
                for m, v in _query(base, expr, deadline, timeout_s)}

    def rate(name: str, keys: str = by) -> str:
        return f"sum by ({keys}) (rate({name}[{window}]))"

    def quantile(q: float, name: str, keys: str = by) -> str:
        return (f"histogram_quantile({q}, sum by ({keys}, le) "
                f"(rate({name}_bucket[{window}])))")

    def ms(value: float | None) -> float | None:
        return None if value is None or math.isnan(value) else value * 1e3

    latency = "tradeoff_inference_request_duration_seconds"
    ready = per_model(f"sum by ({by}) (tradeoff_model_ready)")
    success = per_model(rate("tradeoff_inference_request_success_total"))
    failure = per_model(rate("tradeoff_inference_request_failure_total"))
    inferences = per_model(rate("tradeoff_inference_count_total"))
    executions = per_model(rate("tradeoff_inference_exec_count_total"))
    p50, p99 = per_model(quantile(0.5, latency)), per_model(quantile(0.99, latency))
    queue = per_model(f"sum by ({by}) (tradeoff_inference_queue_depth)")
    in_flight = per_model(f"sum by ({by}) (tradeoff_inference_in_flight)")
    models = [ModelRow(key[0], key[1], success.get(key, 0.0), failure.get(key, 0.0),
                       inferences.get(key, 0.0), executions.get(key, 0.0),
                       ms(p50.get(key)), ms(p99.get(key)), queue.get(key, 0.0),
                       in_flight.get(key, 0.0))
              for key in sorted(ready)]
    ttft = "tradeoff_generation_time_to_first_token_seconds"
    running = per_model("sum by (model) (tradeoff_generation_requests_running)", "model")
    waiting = per_model("sum by (model) (tradeoff_generation_requests_waiting)", "model")
    kv = per_model("max by (model) (tradeoff_generation_kv_cache_usage_ratio)", "model")
    tokens = per_model(rate("tradeoff_generation_generation_tokens_total", "model"), "model")
    finished = per_model(rate("tradeoff_generation_requests_finished_total", "model"), "model")
    t50 = per_model(quantile(0.5, ttft, "model"), "model")
    t99 = per_model(quantile(0.99, ttft, "model"), "model")
    generations = [GenerationRow(key[0], tokens.get(key, 0.0), finished.get(key, 0.0),
                                 running.get(key, 0.0), waiting.get(key, 0.0),
                                 kv.get(key, 0.0), ms(t50.get(key)), ms(t99.get(key)))
                   for key in sorted(running)]
    return models, generations


def prometheus_replica_rows(base: str, window: str = "1m",
                            timeout_s: float = SCRAPE_TIMEOUT_S) -> list[ReplicaRow]:
    """The rows of :func:`replica_rows` from Prometheus over ``window``, summed over the
    gateways it scrapes (each front end of one gateway, or several gateways)."""
    deadline = time.monotonic() + timeout_s
    keys = "router, pool, replica"

    def per_replica(expr: str) -> dict[tuple[str, str, str], float]:
        return {(m.get("router", ""), m.get("pool", ""), m.get("replica", "")): v
                for m, v in _query(base, expr, deadline, timeout_s)}

    def rate(name: str, extra: str = "") -> dict[tuple[str, str, str], float]:
        return per_replica(f"sum by ({keys}) (rate({_REPLICA}{name}{extra}[{window}]))")

    ready = per_replica(f"max by ({keys}) ({_REPLICA}ready)")
    in_flight = per_replica(f"sum by ({keys}) ({_REPLICA}in_flight)")
    requests, errors = rate("requests_total"), rate("errors_total")
    seconds, answered = rate("latency_seconds_sum"), rate("latency_seconds_count")
    sent = rate("prefix_blocks_total", '{kind="sent"}')
    matched = rate("prefix_blocks_total", '{kind="matched"}')
    queued = per_replica(f"max by ({keys}) ({_REPLICA}reported_queue)")
    return [ReplicaRow(*key, requests.get(key, 0.0), errors.get(key, 0.0),
                       in_flight.get(key, 0.0), ready.get(key, 0.0) > 0,
                       seconds[key] / answered[key] * 1e3 if answered.get(key) else None,
                       matched.get(key, 0.0) / sent[key] if sent.get(key) else None,
                       queued.get(key))
            for key in sorted(ready)]
