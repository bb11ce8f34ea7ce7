"""What /admin/state shows: the controller, the queue, the model and every instance, now."""

from __future__ import annotations

from typing import Any

from steersman.control.serve.service import Steersman


def admin_state(svc: Steersman) -> dict[str, Any]:
    core = svc.scheduler
    s, c, d = core.state, core.controller, core.dispatch
    now = svc.clock()
    corrector = core.corrector
    return {
        "mode": s.mode,
        "mode_since_s": round(now - s.since, 3),
        "miss_streak": s.streak,
        "fallbacks": s.fallbacks,
        "fallback_left_s": None if s.fallback_until is None else round(s.fallback_until - now, 3),
        "policy": d.policy,
        "fallback_policy": d.fallback_policy,
        "fallback_enabled": c.enabled,
        "admission": d.admission,
        "target_fill": d.target_fill,
        "kv_held": core.stats.kv_held,
        "kv_overrides": core.stats.kv_overrides,
        "compensation": {
            cls: {"a": comp.a, "b": comp.b} for cls, comp in sorted(s.compensation.items())
        },
        "default_compensation": {"a": c.compensation_a, "b": c.compensation_b},
        "queue_depth": core.depth,
        "model_version": svc.predictor.model_version,
        "predictor": corrector.score.snapshot() if hasattr(corrector, "score") else {},
        # the log-error band a class starts with (the served model's validation; null: x2)
        "initial_band": getattr(corrector, "base_spread", None),
        "instances": [
            {
                "name": i.name,
                "healthy": i.healthy,
                "in_flight": core.in_flight(i.name),
                "cap": i.cap,
                "kv_usage": i.kv_usage,
                "waiting": i.waiting,
                "kv_capacity_tokens": i.kv_capacity,
                "admission": (
                    "max_in_flight only: /metrics gives no KV capacity"
                    if i.name in svc.no_kv_capacity
                    else d.admission
                ),
                "latency_model": {
                    **i.latency.state(now),
                    "step_s": i.coefficients.step(1) if i.coefficients else None,
                },
            }
            for i in svc.instances.values()
        ],
    }
