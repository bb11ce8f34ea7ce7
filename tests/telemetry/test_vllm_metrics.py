"""The vLLM /metrics parser and scraper, over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import pytest

from steersman.telemetry.vllm_metrics import Histogram, ScrapeError, parse_metrics, scrape

LABELS = 'engine="0",model_name="tiny"'
BUCKETS = [0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0]


def _histogram(name: str, counts: list[float], total: float) -> str:
    lines = [
        f"# HELP {name} Histogram.",
        f"# TYPE {name} histogram",
        f"{name}_sum{{{LABELS}}} {total}",
    ]
    for le, c in zip([*BUCKETS, "+Inf"], counts, strict=True):
        lines.append(f'{name}_bucket{{engine="0",le="{le}",model_name="tiny"}} {c}')
    lines.append(f"{name}_count{{{LABELS}}} {counts[-1]}")
    return "\n".join(lines)


TTFT_COUNTS = [0, 0, 0, 2, 10, 20, 30, 36, 38, 40, 40, 40, 40, 40, 40]
PAGE = "\n".join(
    [
        "# HELP vllm:num_requests_running Number of requests in model execution batches.",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{LABELS}}} 2.0",
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{LABELS}}} 5.0",
        "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{LABELS}}} 0.375",
        "# HELP vllm:num_preemptions_total Cumulative number of preemption from the engine.",
        "# TYPE vllm:num_preemptions_total counter",
        f"vllm:num_preemptions_total{{{LABELS}}} 7.0",
        _histogram("vllm:time_to_first_token_seconds", TTFT_COUNTS, 1.9),
        _histogram(
            "vllm:inter_token_latency_seconds",
            [0, 5, 50, 90, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100, 100],
            0.9,
        ),
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig",
        "# TYPE vllm:cache_config_info gauge",
        'vllm:cache_config_info{block_size="16",cache_dtype="auto",enable_prefix_caching="True",'
        'gpu_memory_utilization="0.9",num_cpu_blocks="None",num_gpu_blocks="4096"} 1.0',
        "",
    ]
)


def test_parse_a_vllm_metrics_page():
    m = parse_metrics(PAGE)
    assert (m.running, m.waiting, m.kv_cache_usage, m.preemptions_total) == (2, 5, 0.375, 7)
    assert (m.num_gpu_blocks, m.block_size) == (4096, 16)
    assert m.ttft is not None and m.ttft.count == 40 and m.ttft.mean == pytest.approx(1.9 / 40)
    # 20 of 40 observations are below 0.06 s: the median is that bucket's upper edge.
    assert m.ttft.quantile(0.5) == pytest.approx(0.06)
    assert m.ttft.quantile(0.99) == pytest.approx(0.5 - 0.25 * (40 - 39.6) / 2)
    assert m.itl is not None and m.itl.count == 100
    assert m.e2e is None  # not on this page


def test_two_engines_sum_queues_and_average_kv_usage():
    page = PAGE.replace(
        f"vllm:kv_cache_usage_perc{{{LABELS}}} 0.375",
        f"vllm:kv_cache_usage_perc{{{LABELS}}} 0.375\n"
        'vllm:kv_cache_usage_perc{engine="1",model_name="tiny"} 0.125',
    )
    page = page.replace(
        f"vllm:num_requests_running{{{LABELS}}} 2.0",
        f"vllm:num_requests_running{{{LABELS}}} 2.0\n"
        'vllm:num_requests_running{engine="1",model_name="tiny"} 3.0',
    )
    m = parse_metrics(page)
    assert m.running == 5 and m.kv_cache_usage == pytest.approx(0.25)


def test_histogram_window_between_scrapes_and_restarts():
    before = Histogram(((0.1, 10), (1.0, 20), (math.inf, 20)), 20, 5.0)
    after = Histogram(((0.1, 15), (1.0, 40), (math.inf, 40)), 40, 15.0)
    window = after.since(before)
    assert window.count == 20 and window.mean == pytest.approx(0.5)
    assert window.buckets == ((0.1, 5), (1.0, 20), (math.inf, 20))
    restarted = Histogram(((0.1, 1), (1.0, 2), (math.inf, 2)), 2, 0.3)
    assert restarted.since(after) is restarted


def test_garbage_is_a_scrape_error():
    with pytest.raises(ScrapeError):
        parse_metrics("vllm:num_requests_running{engine=0 oops\n")


class _Handler(BaseHTTPRequestHandler):
    release = threading.Event()

    def do_GET(self) -> None:
        if self.path == "/slow/metrics":
            self.release.wait(10)
        status, body = (500, "boom") if self.path == "/broken/metrics" else (200, PAGE)
        self.send_response(status)
        self.send_header("Content-Type", "text/plain; version=0.0.4")
        self.end_headers()
        self.wfile.write(body.encode())

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    _Handler.release.set()
    httpd.shutdown()
    httpd.server_close()


def test_scrape_over_http(server):
    async def go():
        async with httpx.AsyncClient() as client:
            ok = await scrape(client, server, timeout_s=2.0)
            with pytest.raises(ScrapeError, match="500"):
                await scrape(client, server + "/broken", timeout_s=2.0)
            with pytest.raises(ScrapeError, match="Timeout"):
                await scrape(client, server + "/slow", timeout_s=0.2)
            with pytest.raises(ScrapeError, match="ConnectError"):
                await scrape(client, "http://127.0.0.1:1", timeout_s=0.5)
            return ok

    assert asyncio.run(go()).running == 2


def test_instance_scraper_keeps_state_and_writes_rows(server):
    from steersman.storage.models import InstanceStatsRow
    from steersman.telemetry.scraper import InstanceScraper

    rows: list[dict] = []

    async def go():
        async with httpx.AsyncClient() as client:
            scraper = InstanceScraper(
                {"a": server, "b": server + "/broken", "c": "http://127.0.0.1:1"},
                client,
                timeout_s=0.5,
                aggregate_s=3600,
                sink=rows.append,
            )
            await scraper.scrape_once()
            await scraper.scrape_once()
            return scraper.states

    states = asyncio.run(go())
    assert states["a"].reachable and states["a"].metrics.waiting == 5
    assert (
        not states["b"].reachable and states["b"].failures == 2 and "500" in states["b"].last_error
    )
    assert states["c"].failures == 2 and states["c"].metrics is None
    # One row per instance for the first aggregate period only.
    assert [(r["instance"], r["healthy"]) for r in rows] == [
        ("a", True),
        ("b", False),
        ("c", False),
    ]
    assert rows[0]["running"] == 2 and rows[0]["ttft_mean_s"] == pytest.approx(1.9 / 40)
    assert set(rows[0]) <= set(InstanceStatsRow.__table__.columns.keys())


def test_instance_scraper_run_stops_promptly(server):
    from steersman.telemetry.scraper import InstanceScraper

    async def go():
        async with httpx.AsyncClient() as client:
            scraper = InstanceScraper({"a": server}, client, interval_s=0.02, timeout_s=0.5)
            stop = asyncio.Event()
            rounds = 0
            original = scraper.scrape_once

            async def counting():
                nonlocal rounds
                rounds += 1
                if rounds == 5:
                    stop.set()
                return await original()

            scraper.scrape_once = counting
            await asyncio.wait_for(scraper.run(stop), timeout=10)
            return rounds

    assert asyncio.run(go()) == 5
