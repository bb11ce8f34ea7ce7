"""What each instance's engine says about its load: KV usage, queue and KV capacity, straight
from a simulated engine or from a vLLM server's /metrics, also recorded as instance_stats rows."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import httpx

from steersman.control.backends.sim import SimBackend
from steersman.control.backends.vllm_http import VllmHttpBackend
from steersman.control.serve.instances import Instance
from steersman.telemetry.scraper import InstanceScraper
from steersman.telemetry.settings import TelemetrySettings

log = logging.getLogger(__name__)


class LoadWatcher:
    """``await step()`` reads every instance once; vLLM servers through ``scraper``."""

    def __init__(
        self,
        instances: list[Instance],
        client: httpx.AsyncClient,
        settings: TelemetrySettings,
        *,
        sink: Callable[[dict[str, Any]], None],
        in_flight: Callable[[str], int],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.instances = instances
        self.clock = clock
        self.settings = settings
        self.in_flight = in_flight
        by_name = {i.name: i for i in instances}

        def with_steps(row: dict[str, Any]) -> None:
            instance = by_name.get(row.get("instance", ""))
            if instance is not None:
                row = {**row, **instance.step_times()}
            sink(row)

        self.sink = with_steps
        urls = {
            i.name: i.backend.base_url for i in instances if isinstance(i.backend, VllmHttpBackend)
        }
        self.scraper = InstanceScraper(
            urls,
            client,
            interval_s=settings.scrape_interval_s,
            timeout_s=settings.scrape_timeout_s,
            sink=with_steps,
        )
        self.no_capacity: set[str] = set()  # said once: these fall back to the count cap
        self._next_row = 0.0

    async def step(self) -> None:
        if self.scraper.states:
            await self.scraper.scrape_once()
        now = self.clock()
        record = now >= self._next_row
        if record:
            self._next_row = now + self.settings.aggregate_s
        for instance in self.instances:
            instance.refresh(now)
            backend = instance.backend
            if isinstance(backend, SimBackend):
                instance.kv_usage, instance.waiting = backend.load()
                if record:  # scraped vLLM servers get their rows from the scraper
                    self.sink(self._sim_row(instance, backend))
            elif (state := self.scraper.states.get(instance.name)) and state.reachable:
                m = state.metrics
                assert m is not None
                instance.kv_usage = m.kv_cache_usage
                instance.waiting = round(m.waiting or 0)
                # Replicas in front of the same server: what it holds beyond our own is theirs.
                held = round((m.running or 0) + (m.waiting or 0))
                instance.others = max(held - self.in_flight(instance.name), 0)
                self._capacity(instance, m.num_gpu_blocks, m.block_size)

    def _capacity(self, instance: Instance, blocks: int | None, block_size: int | None) -> None:
        if blocks and block_size:
            instance.kv_capacity, instance.block = blocks * block_size, block_size
            self.no_capacity.discard(instance.name)
        elif instance.name not in self.no_capacity:
            self.no_capacity.add(instance.name)
            log.warning(
                "instance %s: /metrics gives no KV capacity (vllm:cache_config_info); its "
                "admission falls back to max_in_flight",
                instance.name,
            )

    def _sim_row(self, instance: Instance, backend: SimBackend) -> dict[str, Any]:
        engine = backend.engine
        return {
            "ts": datetime.now(UTC),
            "instance": instance.name,
            "healthy": instance.healthy,
            "running": len(engine.running),
            "waiting": engine.waiting,
            "kv_cache_usage": instance.kv_usage,
            "preemptions_total": float(engine.stats.preemptions),
            "prefix_cache_queries": float(engine.cache.queries) if engine.cache else None,
            "prefix_cache_hits": float(engine.cache.hits) if engine.cache else None,
            "in_flight": self.in_flight(instance.name),
        }
