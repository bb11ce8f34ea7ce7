"""Scrapes every vLLM instance's /metrics on a fixed period and keeps the latest state of each."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

import httpx

from steersman.telemetry.vllm_metrics import Histogram, InstanceMetrics, ScrapeError, scrape

log = logging.getLogger(__name__)

Sink = Callable[[dict[str, Any]], None]


@dataclass(frozen=True)
class InstanceState:
    """What the last scrapes of one instance said. ``metrics`` is None until one succeeds."""

    name: str
    url: str
    metrics: InstanceMetrics | None = None
    scraped_at: float | None = None
    failures: int = 0  # consecutive
    last_error: str | None = None

    @property
    def reachable(self) -> bool:
        return self.metrics is not None and self.failures == 0


class InstanceScraper:
    """``await scraper.run(stop)`` scrapes all instances concurrently every ``interval_s``.

    Each scrape has its own deadline; a failed one keeps the previous metrics and counts the
    failure. Every ``aggregate_s`` one ``instance_stats`` row per instance goes to ``sink``, with
    TTFT and inter-token means over the observations made since the previous row.
    """

    def __init__(
        self,
        instances: Mapping[str, str],
        client: httpx.AsyncClient,
        *,
        interval_s: float = 0.25,
        timeout_s: float = 0.2,
        aggregate_s: float = 1.0,
        sink: Sink | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.client = client
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.aggregate_s = aggregate_s
        self.sink = sink
        self._clock = clock
        self._wall = wall
        self.states = {name: InstanceState(name, url) for name, url in instances.items()}
        self._reported: dict[str, tuple[Histogram | None, Histogram | None]] = {}
        self._next_row = float("-inf")

    async def scrape_once(self) -> dict[str, InstanceState]:
        results = await asyncio.gather(
            *(self._scrape(state) for state in self.states.values()), return_exceptions=False
        )
        self.states = {s.name: s for s in results}
        now = self._clock()
        if now >= self._next_row:
            self._next_row = now + self.aggregate_s
            self._emit_rows()
        return self.states

    async def _scrape(self, state: InstanceState) -> InstanceState:
        try:
            metrics = await scrape(self.client, state.url, self.timeout_s)
        except ScrapeError as exc:
            if state.failures == 0:
                log.warning("instance %s: /metrics failed: %s", state.name, exc)
            return replace(state, failures=state.failures + 1, last_error=str(exc))
        return replace(
            state, metrics=metrics, scraped_at=self._clock(), failures=0, last_error=None
        )

    async def run(self, stop: asyncio.Event) -> None:
        deadline = self._clock()
        while not stop.is_set():
            await self.scrape_once()
            deadline += self.interval_s
            delay = deadline - self._clock()
            if delay < 0:  # a slow round: start the next one now, on a fresh schedule
                deadline = self._clock()
                delay = 0
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=delay)

    def _emit_rows(self) -> None:
        if self.sink is None:
            return
        ts = datetime.fromtimestamp(self._wall(), UTC)
        for state in self.states.values():
            m = state.metrics if state.reachable else None
            ttft = itl = None
            if m is not None:
                before_ttft, before_itl = self._reported.get(state.name, (None, None))
                ttft = m.ttft.since(before_ttft).mean if m.ttft else None
                itl = m.itl.since(before_itl).mean if m.itl else None
                self._reported[state.name] = (m.ttft, m.itl)
            row = {
                "ts": ts,
                "instance": state.name,
                "healthy": m is not None,
                "running": None if m is None else _int(m.running),
                "waiting": None if m is None else _int(m.waiting),
                "kv_cache_usage": None if m is None else m.kv_cache_usage,
                "preemptions_total": None if m is None else m.preemptions_total,
                "prefix_cache_queries": None if m is None else m.prefix_cache_queries,
                "prefix_cache_hits": None if m is None else m.prefix_cache_hits,
                "ttft_mean_s": ttft,
                "itl_mean_s": itl,
            }
            try:
                self.sink(row)
            except Exception:
                log.exception("instance_stats sink failed")


def _int(value: float | None) -> int | None:
    return None if value is None else round(value)
