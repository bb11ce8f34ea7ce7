"""Workloads from the bundled traces and prompt sets; the replay against a real vLLM server."""

from __future__ import annotations

import itertools
import json
import random
import statistics

import pytest
from typer.testing import CliRunner

from steersman.control.cli.main import app
from steersman.control.harness.workloads import (
    build_workload,
    gamma_arrivals,
    load_trace,
    poisson_arrivals,
    trace_arrivals,
)
from steersman.data import path
from steersman.learners.datasets import load_prompt_set
from steersman.learners.tokens import TokenCounter


def test_bundled_traces_load_whole():
    for name, rows in (("azure_conv", 19366), ("azure_code", 8819), ("mooncake", 12031)):
        trace = load_trace(path(name))
        assert len(trace.rows) == rows and trace.skipped == 0


def test_bad_trace_rows_are_skipped_and_counted(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text(
        "arrival_s,input_tokens,output_tokens\n0.0,10,5\nbad,1,1\n1.0,10\n"
        "2.0,1,1\n1.5,1,1\n2.5,3,-1\n3.0,7,9\n"
    )
    trace = load_trace(csv)
    assert [r.arrival_s for r in trace.rows] == [0.0, 2.0, 3.0] and trace.skipped == 4


def test_trace_arrivals_keep_their_shape_at_the_target_rate():
    trace = load_trace(path("azure_conv"))
    times = trace_arrivals(trace, 500, rate=4.0, rng=random.Random(7))
    assert times[0] == 0 and len(times) == 500
    assert (len(times) - 1) / times[-1] == pytest.approx(4.0)
    assert times == trace_arrivals(trace, 500, rate=4.0, rng=random.Random(7))
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert statistics.stdev(gaps) / statistics.fmean(gaps) > 1.0  # real traffic is bursty


def test_synthetic_arrivals():
    rng = random.Random(1)
    poisson = poisson_arrivals(4000, 10.0, rng)
    assert 3999 / poisson[-1] == pytest.approx(10.0, rel=0.05)
    gamma = gamma_arrivals(4000, 10.0, 3.0, rng)
    gaps = [b - a for a, b in itertools.pairwise(gamma)]
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(3.0, rel=0.2)


def test_workload_lengths_are_real_responses_in_served_tokens(tiny_model):
    records, report = load_prompt_set(path("alpaca"))
    assert report.rows == 5000 and not report.skipped
    counter = TokenCounter(tiny_model)
    items = build_workload(
        records, [0.1 * i for i in range(200)], counter, random.Random(3), max_model_len=1024
    )
    assert len(items) == 200 and len({i.prompt_id for i in items}) == 200
    by_id = {r.id: r for r in records}
    for item in items[:50]:
        response_tokens = counter.count(by_id[item.prompt_id].response)
        assert item.true_tokens == max(1, min(response_tokens, 1024 - item.prompt_tokens - 1))
        assert item.prompt_tokens + item.true_tokens < 1024
    again = build_workload(records, [0.1 * i for i in range(200)], counter, random.Random(3))
    assert again == items


def test_bad_prompt_rows_are_reported_with_line_numbers(tmp_path):
    bad = tmp_path / "p.jsonl"
    bad.write_text(
        '{"id": "a", "prompt": "hi", "response": "yo"}\nnot json\n'
        '{"id": "b", "prompt": "", "response": "x"}\n[1]\n'
        '{"id": "c", "prompt": "ok", "response": "fine"}\n'
    )
    records, report = load_prompt_set(bad)
    assert [r.id for r in records] == ["a", "c"]
    assert [n for n, _ in report.skipped] == [2, 3, 4]
    assert "skipped 3 bad row(s) at line(s) 2, 3, 4" in report.summary()


@pytest.mark.vllm
def test_replay_against_a_real_server_produces_exact_lengths(vllm_servers, tiny_model, tmp_path):
    out = tmp_path / "requests.jsonl"
    result = CliRunner().invoke(
        app,
        [
            "replay",
            "--base-url",
            vllm_servers[0].url,
            "--requests",
            "12",
            "--rate",
            "4",
            "--tokenizer",
            str(tiny_model),
            "--max-tokens-cap",
            "64",
            "--json",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["succeeded"] == 12 and summary["exact_lengths"] == 12
    assert summary["ttft_s"]["p50"] > 0 and 0 < summary["qoe"]["mean"] <= 1
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 12 and all(r["completion_tokens"] == r["true_tokens"] for r in rows)
