"""The scheduling loop on real simulated instances and a real unreachable vLLM address."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import numpy as np
import pytest

from steersman.control.backends.base import InstanceUnavailable
from steersman.control.backends.sim import SimBackend
from steersman.control.backends.vllm_http import VllmHttpBackend
from steersman.control.core.qoe_rule import KNOBS, expectation, knobs_of
from steersman.control.core.scheduler import QueueFull, Scheduler
from steersman.control.core.settings import ControllerSettings, DispatchSettings, QoeSettings
from steersman.control.serve.instances import Instance
from steersman.control.serve.metrics import Metrics
from steersman.control.serve.predictor import Predictor
from steersman.control.serve.sections import ServiceSettings
from steersman.control.serve.service import COMPLETE, NoInstance, Steersman
from steersman.control.serve.settings import load_settings
from steersman.control.sim.profiles import load_profile
from steersman.learners.batching import Estimate, MicroBatcher
from steersman.learners.corrector import VECTOR_KEY, LengthCorrector
from steersman.learners.latency import LatencyModel, StepCoefficients
from tests.conftest import free_port

PRIOR = StepCoefficients(0.004, 0.0002, 1e-5)


def sim(name: str, cap: int = 32) -> Instance:
    return Instance(name, SimBackend(name, load_profile("cpu-tiny")), LatencyModel(PRIOR), cap=cap)


def unreachable(name: str) -> Instance:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    return Instance(name, VllmHttpBackend(name, url, connect_timeout_s=1), LatencyModel(PRIOR))


class Recorder:
    def __init__(self):
        self.rows: dict[str, list[dict]] = {}

    def __call__(self, table: str, row: dict) -> None:
        self.rows.setdefault(table, []).append(row)


def service(
    instances,
    *,
    controller: ControllerSettings | None = None,
    predictor: Predictor | None = None,
    **kw,
) -> tuple[Steersman, Recorder]:
    """A shell with its own core; ``kw`` names dispatch or service settings, or the shell's own
    collaborators."""
    dispatch = {k: kw.pop(k) for k in list(kw) if k in DispatchSettings.model_fields}
    shell = {k: kw.pop(k) for k in list(kw) if k in ServiceSettings.model_fields}
    qoe = kw.pop("qoe", None)
    settings = load_settings(None, {"service": shell}, environ={})
    if qoe is not None:
        settings = settings.model_copy(update={"qoe": qoe})
    core = Scheduler(
        DispatchSettings(**dispatch),
        controller or ControllerSettings(),
        corrector=LengthCorrector(),
    )
    record = Recorder()
    svc = Steersman(
        instances, predictor or Predictor(), core, settings, record=record, metrics=Metrics(), **kw
    )
    return svc, record


async def complete(svc: Steersman, rid: str, max_tokens: int, prompt: str = "hello") -> list:
    body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens}
    job = await svc.prepare(rid, "completion", body)
    return [chunk async for chunk in svc.run(job)]


def test_queue_serves_shortest_predicted_first():
    async def main():
        svc, record = service([sim("a", cap=1)], policy="round-robin")
        finished: list[str] = []

        async def one(rid, n):
            await complete(svc, rid, n)
            finished.append(rid)

        blocker = asyncio.create_task(one("blocker", 30))
        await asyncio.sleep(0)  # the blocker takes the only slot
        waiting = [asyncio.create_task(one(rid, n)) for rid, n in [("long", 40), ("short", 2)]]
        await asyncio.gather(blocker, *waiting)
        return finished, record

    finished, record = asyncio.run(main())
    assert finished == ["blocker", "short", "long"]
    assert len(record.rows["requests"]) == 3
    assert all(r["error"] is None for r in record.rows["requests"])


def test_a_complete_answer_is_accounted_once_the_caller_has_responded():
    async def main():
        svc, record = service([sim("a")])
        body = {"model": "m", "prompt": "hello", "max_tokens": 4}
        plain = [c async for c in svc.run(await svc.prepare("plain", "completion", body))]
        chunks = svc.run(await svc.prepare("first", "completion", body), respond_first=True)
        seen = []
        async for chunk in chunks:
            seen.append(chunk)
            if chunk is COMPLETE:
                break
        before = (svc.scheduler.in_flight("a"), len(record.rows["requests"]))
        await chunks.aclose()
        after = (svc.scheduler.in_flight("a"), len(record.rows["requests"]))
        return plain, seen, before, after, record.rows["requests"][-1]

    plain, seen, before, after, row = asyncio.run(main())
    assert COMPLETE not in plain and len(plain) == len(seen) - 1
    assert seen[-1] is COMPLETE and COMPLETE not in seen[:-1]
    assert before == (1, 1)  # answered, not yet accounted
    assert after == (0, 2)
    assert row["request_id"] == "first" and row["error"] is None and row["actual_tokens"] == 4


def test_aging_lets_a_long_wait_win():
    async def main():
        svc, _ = service([sim("a", cap=1)], aging_s=1e-6)  # waiting dominates at once
        order: list[str] = []

        async def one(rid, n):
            await complete(svc, rid, n)
            order.append(rid)

        first = asyncio.create_task(one("blocker", 20))
        await asyncio.sleep(0)
        long_ = asyncio.create_task(one("long", 40))
        await asyncio.sleep(0.01)
        short = asyncio.create_task(one("short", 2))
        await asyncio.gather(first, long_, short)
        return order

    assert asyncio.run(main()) == ["blocker", "long", "short"]


def test_unreachable_instance_is_retried_elsewhere_and_marked_down():
    async def main():
        svc, record = service([unreachable("dead"), sim("alive")], policy="round-robin")
        chunks = await complete(svc, "r1", 3)
        return svc, record, chunks

    svc, record, chunks = asyncio.run(main())
    assert chunks[-1]["usage"]["completion_tokens"] == 3
    row = record.rows["requests"][0]
    assert row["instance"] == "alive" and row["error"] is None
    assert not svc.instances["dead"].healthy and svc.instances["alive"].healthy
    events = record.rows["controller_events"]
    assert events[0]["kind"] == "instance" and "dead marked down" in events[0]["reason"]
    assert svc.metrics.retries._value.get() == 1


def test_no_instance_left_fails_fast_with_a_row():
    async def main():
        svc, record = service([unreachable("x"), unreachable("y")])
        with pytest.raises(InstanceUnavailable):
            await complete(svc, "r1", 3)
        with pytest.raises(NoInstance):
            await complete(svc, "r2", 3)
        return record

    record = asyncio.run(main())
    rows = record.rows["requests"]
    assert [r["request_id"] for r in rows] == ["r1", "r2"]
    assert "cannot connect" in rows[0]["error"] and rows[1]["error"] == "no healthy instance"


def test_full_queue_is_refused():
    async def main():
        svc, record = service([sim("a", cap=1)], max_queue=1)
        first = asyncio.create_task(complete(svc, "r1", 20))
        await asyncio.sleep(0)
        second = asyncio.create_task(complete(svc, "r2", 20))
        while svc.scheduler.depth < 1:
            await asyncio.sleep(0)
        with pytest.raises(QueueFull):
            await complete(svc, "r3", 2)
        await asyncio.gather(first, second)
        return record

    record = asyncio.run(main())
    errors = {r["request_id"]: r["error"] for r in record.rows["requests"]}
    assert errors["r1"] is None and errors["r2"] is None and "already waiting" in errors["r3"]


def test_cancelled_request_frees_its_slot_and_is_recorded():
    async def main():
        inst = sim("a", cap=1)
        svc, record = service([inst])
        task = asyncio.create_task(complete(svc, "gone", 500))
        while not svc.scheduler.in_flight("a") or inst.backend.engine.stats.steps < 3:
            await asyncio.sleep(0.005)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert not svc.scheduler.in_flight("a")
        assert not inst.backend.engine.has_work()  # the upstream request was aborted
        await complete(svc, "next", 2)  # and the slot is free again
        return record

    record = asyncio.run(main())
    rows = {r["request_id"]: r for r in record.rows["requests"]}
    assert rows["gone"]["error"] == "client disconnected"
    assert rows["next"]["error"] is None


def test_a_prompt_is_predicted_like_the_most_similar_earlier_prompts():
    """The length model's vector of each prompt reaches the core, which learns what each was
    answered with: a new prompt's prediction leans toward its nearest earlier prompts'. The
    base and every text feature here are the same for both topics; only the vectors differ."""

    def model(texts):
        return [Estimate(50.0, np.array([1.0, 0.0] if "alpha" in t else [0.0, 1.0])) for t in texts]

    async def main():
        batcher = MicroBatcher(model, max_wait_s=0)
        svc, record = service(
            [sim("a")],
            predictor=Predictor(batcher, deadline_s=60.0),
            controller=ControllerSettings(miss_streak=10_000),
        )
        try:
            for k in range(24):
                topic, n = ("alpha", 4) if k % 2 == 0 else ("omega", 300)
                body = {"model": "m", "prompt": f"topic {topic} {k}", "max_tokens": 500,
                        "vllm_xargs": {"sim_output_tokens": n}}  # fmt: skip
                async for _ in svc.run(await svc.prepare(f"{topic}{k}", "completion", body)):
                    pass
        finally:
            batcher.close()
        return svc, record

    svc, record = asyncio.run(main())
    rows = record.rows["requests"]
    assert len(svc.scheduler.corrector.similar) == 24
    assert all(VECTOR_KEY not in r["features"] for r in rows)  # the history keeps scalars
    late = {r["request_id"][:5]: r["scheduled_prediction"] for r in rows[-2:]}
    assert late["omega"] > 1.5 * late["alpha"]


def test_fallback_switches_to_round_robin_and_resets_the_corrector():
    async def main():
        hot: list[str] = []
        svc, record = service(
            [sim("a"), sim("b")],
            controller=ControllerSettings(miss_streak=3, adjust_every=1000),
            fallback_policy="round-robin",
            on_hot_update=hot.append,
        )
        # The fast path predicts the class's running mean length, which lengths alternating
        # between 4 and 300 tokens keep missing (it starts at 128).
        for k in range(3):
            body = {
                "model": "m",
                "prompt": "x",
                "max_tokens": 500,
                "vllm_xargs": {"sim_output_tokens": 4 if k % 2 == 0 else 300},
            }
            job = await svc.prepare(f"n{k}", "completion", body)
            async for _ in svc.run(job):
                pass
        mode = svc.scheduler.state.mode
        for k in range(4):
            job = await svc.prepare(
                f"f{k}", "completion", {"model": "m", "prompt": "x", "max_tokens": 3}
            )
            async for _ in svc.run(job):
                pass
        return record, hot, mode

    record, hot, mode = asyncio.run(main())
    assert mode == "FALLBACK"
    assert hot == ["fallback"]
    rows = {r["request_id"]: r for r in record.rows["requests"]}
    assert [rows[f"n{k}"]["miss"] for k in range(3)] == [True, True, True]
    assert {rows[f"f{k}"]["policy"] for k in range(4)} == {"round-robin"}
    assert [rows[f"f{k}"]["instance"] for k in range(4)] in (
        ["a", "b", "a", "b"],
        ["b", "a", "b", "a"],
    )
    assert {rows[f"f{k}"]["mode"] for k in range(4)} == {"FALLBACK"}
    mode_events = [e for e in record.rows["controller_events"] if e["kind"] == "mode"]
    assert (
        mode_events[0]["to_mode"] == "FALLBACK"
        and "3 consecutive misses" in mode_events[0]["reason"]
    )


class Seen(SimBackend):
    """A simulated instance that keeps the requests it was sent."""

    def __init__(self, name: str) -> None:
        super().__init__(name, load_profile("cpu-tiny"))
        self.sent: list = []

    def stream(self, request, result):
        self.sent.append(request)
        return super().stream(request, result)


@pytest.mark.parametrize(
    ("priority", "predictions", "xargs"),
    [
        pytest.param(True, True, {"steersman_predicted_tokens", "steersman_aging_s"}, id="class"),
        pytest.param(True, False, set(), id="vLLM's built-in priority policy"),
        pytest.param(False, True, set(), id="stock vLLM"),
    ],
)
def test_what_an_instance_is_sent_follows_its_settings(priority, predictions, xargs):
    """By default (engine_order pressure) at an instance whose KV usage is not measured: the
    class still gets every prediction, since it ranks every request itself."""
    backend = Seen("a")
    instance = Instance("a", backend, LatencyModel(PRIOR), send_priority=priority,
                        send_predictions=priority and predictions)  # fmt: skip

    async def main():
        svc, _ = service([instance])
        await complete(svc, "r1", 3)

    asyncio.run(main())
    (sent,) = backend.sent
    assert (sent.priority is not None) is priority
    assert set(sent.xargs or {}) == xargs


@pytest.mark.parametrize(
    ("enabled", "stream"),
    [(True, True), (False, True), (True, False)],
    ids=["on, streamed", "off", "on, not streamed: latency stays its objective"],
)
def test_with_streamed_qoe_on_the_engine_hears_each_reader_and_the_rule(enabled, stream):
    backend = Seen("a")  # runs steersman's scheduler class
    instance = Instance("a", backend, LatencyModel(PRIOR), send_predictions=True)
    settings = QoeSettings(enabled=enabled, classes={"code": {"ttft_s": 2.0, "pace_s": 0.05}})

    async def main():
        svc, _ = service([instance], engine_order="always", qoe=settings)
        prompt = "Write a Python function to sort a list."
        body = {"model": "m", "prompt": prompt, "max_tokens": 3, "stream": stream}
        job = await svc.prepare("r1", "completion", body)
        [chunk async for chunk in svc.run(job)]
        return job

    job = asyncio.run(main())
    (sent,) = backend.sent
    got = expectation(sent.xargs or {})
    assert (job.record.expected_ttft_s, job.record.expected_pace_s) == (2.0, 0.05)  # recorded
    assert job.arrival.expected_ttft_s == (2.0 if enabled and stream else None)
    if not (enabled and stream):
        assert got is None and not knobs_of(sent.xargs or {})
        return
    assert got == (2.0, 0.05)  # its class's
    assert knobs_of(sent.xargs) == {k: getattr(settings, k) for k in KNOBS}


def test_with_engine_order_backlog_vllm_gets_arrival_order_below_saturation():
    """engine_order = "backlog": lengths order vLLM's queue only while steersman's own queue is
    backlogged; otherwise the priority is the arrival order."""
    backend = Seen("a")
    instance = Instance("a", backend, LatencyModel(PRIOR))

    async def main():
        svc, _ = service([instance], engine_order="backlog")
        for rid, tokens in (("long", 300), ("short", 2)):
            await complete(svc, rid, tokens)

    asyncio.run(main())
    long_, short = backend.sent
    assert long_.priority <= short.priority  # the first to arrive first, whatever its length
    assert not (long_.xargs or short.xargs)


def test_in_fallback_vllm_gets_no_predicted_lengths():
    backend = Seen("a")
    instance = Instance("a", backend, LatencyModel(PRIOR))

    async def main():
        svc, _ = service([instance], policy="least-load")
        core = svc.scheduler
        core.state = replace(core.state, mode="FALLBACK", fallback_until=float("inf"))
        await complete(svc, "r1", 3)

    asyncio.run(main())
    (sent,) = backend.sent
    assert sent.priority is not None  # arrival order still goes to vLLM
    assert "steersman_predicted_tokens" not in (sent.xargs or {})


class Flaky(SimBackend):
    """A simulated instance whose /health answers as told."""

    def __init__(self, name: str) -> None:
        super().__init__(name, load_profile("cpu-tiny"))
        self.answers = True

    async def health(self, timeout_s: float = 1.0) -> bool:
        return self.answers


def test_an_instance_is_marked_down_after_failed_probes_in_a_row_only():
    backend = Flaky("a")
    instance = Instance("a", backend, LatencyModel(PRIOR))

    async def main():
        svc, record = service([instance], health_failures=3)
        seen = []
        for answers in (False, False, True, False, False, False, True):
            backend.answers = answers
            await svc.check_health()
            seen.append(instance.healthy)
        return seen, record

    seen, record = asyncio.run(main())
    assert seen == [True, True, True, True, True, False, True]
    reasons = [e["reason"] for e in record.rows["controller_events"]]
    assert reasons == [
        "a marked down: /health failed 3 times in a row",
        "a readmitted: /health answered",
    ]


def test_an_instance_that_streams_stays_up_while_its_probes_time_out():
    backend = Flaky("a")
    backend.answers = False  # /health times out, as a loaded server's does
    instance = Instance("a", backend, LatencyModel(PRIOR))

    async def main():
        svc, _ = service([instance], health_failures=2)
        seen = []
        for k in range(3):
            assert await complete(svc, f"r{k}", 5)  # it serves between the probes
            await svc.check_health()
            seen.append(instance.healthy)
        for _ in range(2):  # silence and failed probes: now it is down
            await svc.check_health()
            seen.append(instance.healthy)
        return seen

    assert asyncio.run(main()) == [True, True, True, True, False]


class Recording(LatencyModel):
    """A latency model that keeps what each outcome taught it."""

    def __init__(self, prior):
        super().__init__(prior)
        self.seen: list[dict] = []

    def learn_one(self, x, tpot_s, *, now=None):
        self.seen.append(dict(x))
        super().learn_one(x, tpot_s, now=now)


def test_a_request_learns_the_prefill_of_those_whose_first_token_came_while_it_decoded():
    async def main():
        inst = Instance("a", SimBackend("a", load_profile("cpu-tiny")), Recording(PRIOR))
        svc, record = service([inst])
        body = {"model": "m", "prompt": "a long answer please", "max_tokens": 40}
        decoding = await svc.prepare("decoding", "completion", body)
        first = svc.run(decoding)
        await anext(first)  # its first token: it decodes from here on
        joins = await svc.prepare("joins", "completion", {**body, "prompt": "one two three"})
        joins.body["max_tokens"] = 2
        assert [c async for c in svc.run(joins)]
        assert [c async for c in first]  # it streamed on to its end
        return inst, {r["request_id"]: r["prompt_tokens"] for r in record.rows["requests"]}

    inst, prompts = asyncio.run(main())
    own_prompt, joined_prompt = prompts["decoding"], prompts["joins"]  # as the engine counted
    joined, decoding = inst.latency.seen
    assert joined["prefill_tokens"] == 0  # nothing began after it
    assert decoding["prefill_tokens"] == joined_prompt > 0
    assert decoding["decode_steps"] == 39
    assert inst.prefilled == own_prompt + joined_prompt
