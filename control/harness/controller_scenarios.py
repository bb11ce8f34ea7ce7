"""Scenarios that prove the controller, on simulated instances in virtual time: a stationary
workload with a good predictor, a predictor that breaks (constant, shuffled, or trained for
another served model) and is mended, and an abrupt shift of the workload from chat to code.

Requests have log-normal lengths per class; the "good" base prediction is the truth times a
log-normal error (a model as good as a decent length model); the online corrector, the bands,
the controller and the scheduler are the real ones.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from steersman.control.core.scheduler import Arrival, Outcome, Report, Scheduler, Ticket
from steersman.control.core.settings import ControllerSettings, DispatchSettings
from steersman.control.sim.driver import CoreDriver
from steersman.control.sim.engine import SimEngine, SimRequest
from steersman.control.sim.profiles import load_profile
from steersman.control.sim.virtual import run_cluster
from steersman.learners.corrector import BASE_KEY, LengthCorrector

# request class -> (median output tokens, log-normal sigma)
CLASSES = {"chat": (220.0, 0.6), "code": (60.0, 0.8)}
BREAKS = ("constant", "shuffled", "other-model")


@dataclass
class Timeline:
    """Per finished request, in order: its mode when it finished, miss, and whether its actual
    length fell in its band; for every FALLBACK entry, the arrival index of the request whose
    outcome started it, and whether the FALLBACK before it ran its full ``fallback_s`` (a break
    that outlasts one period is entered again: the rule working, not flapping)."""

    modes: list[str] = field(default_factory=list)
    misses: list[bool] = field(default_factory=list)
    inside: list[bool] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)
    entries: list[int] = field(default_factory=list)
    renewed: list[bool] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    expired: bool = False  # how the last FALLBACK ended


class _Watched(Scheduler):
    """The core as is, keeping the timeline; at the request ``mend`` a better model is promoted,
    which, as in the daemon, starts the corrector over."""

    def __init__(self, *args: Any, timeline: Timeline, mend: str | None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeline = timeline
        self.mend = mend

    def add(self, arrival: Arrival, now: float) -> Ticket:
        if arrival.request_id == self.mend:
            self.forget()
        return super().add(arrival, now)

    def tick(self, now: float) -> Report:
        report = super().tick(now)
        if any(e.kind == "mode" and e.to_mode == "NORMAL" for e in report.events):
            self.timeline.expired = True
        return report

    def finish(self, request_id: str, outcome: Outcome, now: float) -> Report:
        ticket = self.scheduled(request_id)
        entry = self._entries.get(request_id)
        report = super().finish(request_id, outcome, now)
        t = self.timeline
        if ticket is not None and entry is not None:
            t.modes.append(self.state.mode)
            t.misses.append(bool(report.miss))
            t.inside.append(ticket.low <= outcome.actual <= ticket.high)
            t.classes.append(entry.arrival.request_class)
            for e in report.events:
                if e.kind == "mode" and e.to_mode == "FALLBACK":
                    t.entries.append(int(request_id[1:]))  # its place in arrival order
                    t.renewed.append(t.expired)
                    t.reasons.append(e.reason)
                elif e.kind == "mode":
                    t.expired = e.reason.startswith("fallback ended")
        return report


def run(
    scenario: str,
    *,
    n: int = 2400,
    break_at: int = 800,
    mend_at: int | None = 1300,
    rate: float = 8.0,
    instances: int = 4,
    seed: int = 0,
    coverage: float = 0.8,
) -> dict[str, Any]:
    """``scenario``: "stationary", "shift" (chat, then code from ``break_at``), or a break of
    the predictor from ``break_at`` (one of BREAKS) mended at ``mend_at`` (a better model)."""
    rng = random.Random(seed)
    requests, features = [], {}
    t = 0.0
    truths: list[int] = []
    for i in range(n):
        cls = "code" if scenario == "shift" and i >= break_at else "chat"
        if scenario == "stationary" and rng.random() < 0.3:
            cls = "code"
        median, sigma = CLASSES[cls]
        truth = max(1, min(1500, round(median * math.exp(rng.gauss(0, sigma)))))
        truths.append(truth)
        base = truth * math.exp(rng.gauss(0, 0.35))  # a good model: it ranks well
        broken = scenario in BREAKS and break_at <= i and (mend_at is None or i < mend_at)
        if broken and scenario == "constant":
            base = 128.0
        elif broken and scenario == "shuffled":
            base = truths[rng.randrange(len(truths))] * math.exp(rng.gauss(0, 0.35))
        elif broken and scenario == "other-model":
            base = truth * 4.0 * math.exp(rng.gauss(0, 0.35))  # a far more verbose model's
        t += rng.expovariate(rate)
        rid = f"r{i}"
        requests.append(SimRequest(rid, t, 64, truth))
        features[rid] = {"request_class": cls, BASE_KEY: base, "prompt_tokens_log": 4.0}
    timeline = Timeline()
    core = _Watched(
        DispatchSettings(policy="predictive"),
        ControllerSettings(),
        corrector=LengthCorrector(coverage=coverage),
        timeline=timeline,
        mend=f"r{mend_at}" if scenario in BREAKS and mend_at is not None else None,
    )
    profile = load_profile("a100-llama2-7b")
    driver = CoreDriver(core, profile.coefficients(), features=features)
    engines = [SimEngine(profile, "steersman") for _ in range(instances)]
    run_cluster(requests, engines, driver)
    return summarize(scenario, timeline, break_at, mend_at, coverage, core)


def summarize(
    scenario: str,
    t: Timeline,
    break_at: int,
    mend_at: int | None,
    coverage: float,
    core: Scheduler,
) -> dict[str, Any]:
    """The figures the tests and the benchmark read (request indices in finishing order, which
    is close to arrival order at this load)."""
    fallback = [m == "FALLBACK" for m in t.modes]
    out: dict[str, Any] = {
        "scenario": scenario,
        "requests": len(t.modes),
        "fallback_share": round(sum(fallback) / max(len(fallback), 1), 4),
        "fallback_entries": t.entries,
        "fallback_reasons": t.reasons,
        "coverage_target": coverage,
        "coverage_overall": round(sum(t.inside) / max(len(t.inside), 1), 4),
        "band_resets": getattr(core.corrector, "band_resets", 0),
    }
    if scenario in BREAKS:
        after = [i for i in t.entries if i >= break_at]
        out["detected_after"] = after[0] - break_at if after else None
        end = mend_at if mend_at is not None else len(t.modes)
        fresh = [i for i, renewed in zip(t.entries, t.renewed, strict=True) if not renewed]
        out["entries_in_break"] = sum(1 for i in fresh if break_at <= i < end)
        out["entries_after_mend"] = sum(1 for i in fresh if end <= i < end + 300)
        normal = next(
            (i for i in range(after[0], len(t.modes)) if t.modes[i] == "NORMAL" and i >= end)
            if after
            else iter(()),
            None,
        )
        out["normal_after_mend"] = None if normal is None else max(normal - end, 0)
    if scenario == "shift":
        code = [inside for inside, c in zip(t.inside, t.classes, strict=True) if c == "code"]
        out["shift_coverage_by_300"] = _recovered(code, coverage)
        out["entries_in_shift"] = sum(1 for i in t.entries if i >= break_at)
    return out


def _recovered(inside: list[bool], target: float, window: int = 100) -> int | None:
    """Requests after the shift until the coverage over the last ``window`` is within 5 points
    of the target (None if it never is)."""
    for end in range(window, len(inside) + 1):
        share = sum(inside[end - window : end]) / window
        if abs(share - target) <= 0.05:
            return end
    return None
