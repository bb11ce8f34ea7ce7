"""End to end through the gateway: a deliberately wrong predictor drives exactly 5 misses,
FALLBACK starts, dispatch is the fallback policy while it lasts, NORMAL returns; the events are
in SQL."""

from __future__ import annotations

import httpx
from sqlalchemy import text

from steersman.storage.engine import make_engine
from tests.conftest import wait_until
from tests.control.serve.serving import running, settings_for

SIMS = [{"name": "sim-a", "sim": "cpu-tiny"}, {"name": "sim-b", "sim": "cpu-tiny"}]


def test_five_misses_fallback_round_robin_then_normal(tmp_path):
    settings = settings_for(
        tmp_path,
        SIMS,
        controller={"fallback_s": 3.0, "recover_hits": 1000, "adjust_every": 1000},
        dispatch={"policy": "predictive", "fallback_policy": "round-robin"},
    )
    with running(settings) as (daemon, url):
        client = httpx.Client(base_url=url, timeout=30)

        def send(k: int, tokens: int) -> None:
            # No length model: the fast path predicts each class's running mean length, which
            # lengths alternating between 2 and 300 tokens keep missing.
            body = {
                "model": "steersman-sim",
                "prompt": f"Say something, number {k}.",
                "max_tokens": 400,
                "vllm_xargs": {"sim_output_tokens": tokens},
            }
            assert client.post("/v1/completions", json=body).status_code == 200

        for k in range(4):
            send(k, 2 if k % 2 == 0 else 300)
        assert client.get("/admin/state").json()["mode"] == "NORMAL"
        send(4, 2)  # the fifth miss
        state = client.get("/admin/state").json()
        assert state["mode"] == "FALLBACK" and state["fallbacks"] == 1
        for k in range(5, 9):
            send(k, 3)
        wait_until(
            lambda: client.get("/admin/state").json()["mode"] == "NORMAL", 30, "NORMAL again"
        )
        send(9, 2)
        assert daemon.writer.flush(10)
    engine = make_engine(settings.database_url)
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT request_id, mode, policy, instance, miss FROM requests ORDER BY id")
        ).all()
        events = conn.execute(
            text("SELECT from_mode, to_mode, reason FROM controller_events WHERE kind = 'mode'")
        ).all()
    engine.dispose()
    assert [r.miss for r in rows[:5]] == [True] * 5
    assert [r.mode for r in rows[:5]] == ["NORMAL"] * 5
    during = rows[5:9]
    assert {r.mode for r in during} == {"FALLBACK"} and {r.policy for r in during} == {
        "round-robin"
    }
    assert [r.instance for r in during] in (["sim-a", "sim-b"] * 2, ["sim-b", "sim-a"] * 2)
    assert rows[9].mode == "NORMAL" and rows[9].policy == "predictive"
    assert [(e.from_mode, e.to_mode) for e in events] == [
        ("NORMAL", "FALLBACK"),
        ("FALLBACK", "NORMAL"),
    ]
    assert events[0].reason == "5 consecutive misses over 30%"
    assert events[1].reason == "fallback ended after 3 s"
