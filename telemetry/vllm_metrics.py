"""The vLLM /metrics scraper: queue, KV-cache and latency state of one serving instance.

The Prometheus text is parsed with prometheus-client's parser. Series are summed over their
label sets (one vLLM server may report several engines or models).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families


class ScrapeError(Exception):
    """The instance did not answer /metrics in time, or answered something unreadable."""


@dataclass(frozen=True)
class Histogram:
    """A cumulative Prometheus histogram: ``buckets`` are (upper bound, cumulative count)."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    total: float

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count > 0 else None

    def since(self, earlier: Histogram | None) -> Histogram:
        """The observations made after ``earlier`` (a window between two scrapes)."""
        if earlier is None or earlier.count > self.count:  # first scrape, or a server restart
            return self
        before = dict(earlier.buckets)
        return Histogram(
            tuple((le, c - before.get(le, 0.0)) for le, c in self.buckets),
            self.count - earlier.count,
            self.total - earlier.total,
        )

    def quantile(self, q: float) -> float | None:
        """Linear interpolation inside the bucket, as PromQL's histogram_quantile does.

        >>> Histogram(((0.1, 50), (0.2, 100), (math.inf, 100)), 100, 12.0).quantile(0.75)
        0.15
        """
        if self.count <= 0 or not self.buckets:
            return None
        rank = q * self.count
        counts = [c for _, c in self.buckets]
        i = bisect.bisect_left(counts, rank)
        if i >= len(self.buckets):
            i = len(self.buckets) - 1
        upper, c_hi = self.buckets[i]
        if math.isinf(upper):
            return self.buckets[i - 1][0] if i > 0 else None
        lower, c_lo = (0.0, 0.0) if i == 0 else self.buckets[i - 1]
        if c_hi == c_lo:
            return upper
        return round(lower + (upper - lower) * (rank - c_lo) / (c_hi - c_lo), 12)


@dataclass(frozen=True)
class InstanceMetrics:
    running: float | None = None
    waiting: float | None = None
    kv_cache_usage: float | None = None  # 0..1
    preemptions_total: float | None = None
    prefix_cache_queries: float | None = None  # prompt tokens looked up in the prefix cache
    prefix_cache_hits: float | None = None  # of which found cached
    num_gpu_blocks: int | None = None
    block_size: int | None = None
    ttft: Histogram | None = None
    itl: Histogram | None = None
    e2e: Histogram | None = None
    queue_time: Histogram | None = None
    extra: dict[str, float] = field(default_factory=dict)


_GAUGES = {
    "vllm:num_requests_running": "running",
    "vllm:num_requests_waiting": "waiting",
    "vllm:kv_cache_usage_perc": "kv_cache_usage",
    "vllm:gpu_cache_usage_perc": "kv_cache_usage",  # the name before vLLM 0.10
    "vllm:num_preemptions": "preemptions_total",
    "vllm:prefix_cache_queries": "prefix_cache_queries",
    "vllm:prefix_cache_hits": "prefix_cache_hits",
}
_HISTOGRAMS = {
    "vllm:time_to_first_token_seconds": "ttft",
    "vllm:inter_token_latency_seconds": "itl",
    "vllm:time_per_output_token_seconds": "itl",  # older name
    "vllm:e2e_request_latency_seconds": "e2e",
    "vllm:request_queue_time_seconds": "queue_time",
}


@dataclass
class _Sums:
    buckets: dict[float, float] = field(default_factory=dict)
    count: float = 0.0
    total: float = 0.0

    def histogram(self) -> Histogram:
        return Histogram(tuple(sorted(self.buckets.items())), self.count, self.total)


def parse_metrics(text: str) -> InstanceMetrics:
    """Read the scheduling state out of a vLLM /metrics page.

    >>> m = parse_metrics('''# TYPE vllm:num_requests_running gauge
    ... vllm:num_requests_running{engine="0",model_name="tiny"} 3.0
    ... # TYPE vllm:kv_cache_usage_perc gauge
    ... vllm:kv_cache_usage_perc{engine="0",model_name="tiny"} 0.25
    ... ''')
    >>> m.running, m.kv_cache_usage
    (3.0, 0.25)
    """
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, TypeError, IndexError) as exc:
        raise ScrapeError(f"unreadable /metrics: {exc}") from None
    values: dict[str, list[float]] = {}
    sums: dict[str, _Sums] = {}
    info: dict[str, int] = {}
    for family in families:
        samples = [s for s in family.samples if not s.name.endswith("_created")]
        if family.name in _GAUGES:
            values.setdefault(_GAUGES[family.name], []).extend(s.value for s in samples)
        elif family.name in _HISTOGRAMS:
            acc = sums.setdefault(_HISTOGRAMS[family.name], _Sums())
            for s in samples:
                if s.name.endswith("_bucket"):
                    le = float(s.labels["le"])
                    acc.buckets[le] = acc.buckets.get(le, 0.0) + s.value
                elif s.name.endswith("_count"):
                    acc.count += s.value
                elif s.name.endswith("_sum"):
                    acc.total += s.value
        elif family.name == "vllm:cache_config_info":
            for s in samples:
                for label in ("num_gpu_blocks", "block_size"):
                    raw = s.labels.get(label)
                    if raw not in (None, "", "None"):
                        info[label] = int(float(raw))

    def total(key: str) -> float | None:
        return sum(values[key]) if values.get(key) else None

    usage = values.get("kv_cache_usage")
    return InstanceMetrics(
        running=total("running"),
        waiting=total("waiting"),
        # Each engine reports its own usage; the instance's is their mean.
        kv_cache_usage=sum(usage) / len(usage) if usage else None,
        preemptions_total=total("preemptions_total"),
        prefix_cache_queries=total("prefix_cache_queries"),
        prefix_cache_hits=total("prefix_cache_hits"),
        num_gpu_blocks=info.get("num_gpu_blocks"),
        block_size=info.get("block_size"),
        **{key: acc.histogram() for key, acc in sums.items()},
    )


async def scrape(client: httpx.AsyncClient, base_url: str, timeout_s: float) -> InstanceMetrics:
    """GET ``{base_url}/metrics`` within ``timeout_s``; ScrapeError on any failure."""
    url = base_url.rstrip("/") + "/metrics"
    try:
        response = await client.get(url, timeout=timeout_s)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise ScrapeError(f"{url}: {type(exc).__name__}: {exc}") from None
    return parse_metrics(response.text)
