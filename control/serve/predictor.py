"""What the core predicts from: a request's features, and RoBERTa's length within a deadline
(the online correction and compensation happen in the scheduling core)."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from steersman.learners.batching import MicroBatcher
from steersman.learners.corrector import BASE_KEY, VECTOR_KEY
from steersman.learners.features import request_features

log = logging.getLogger(__name__)


@dataclass
class Prediction:
    """The inputs of a request's prediction, which the learners also learn from."""

    x: dict[str, Any]  # features, telemetry, and the base prediction and vector when there are
    request_class: str
    prompt_tokens: int | None
    base: float | None  # RoBERTa's, in tokens
    path: str  # "roberta" (base + correction) or "fast" (feature-only, or RoBERTa was late)


class Predictor:
    """``await predict(text, ...)`` never raises. ``batcher`` is None when no RoBERTa model is
    loaded: every request takes the fast path."""

    def __init__(
        self,
        batcher: MicroBatcher | None = None,
        *,
        deadline_s: float = 0.025,
        count_tokens: Callable[[str], int] | None = None,
        model_version: str | None = None,
    ) -> None:
        self.batcher = batcher
        self.deadline_s = deadline_s
        self.count_tokens = count_tokens
        self.model_version = model_version

    async def predict(
        self,
        text: str,
        *,
        turns: int = 1,
        max_tokens: int | None = None,
        context: Mapping[str, Any] | None = None,
        prompt_tokens: int | None = None,
    ) -> Prediction:
        """``prompt_tokens``: the text's token count where the caller has it already."""
        if prompt_tokens is None:
            prompt_tokens = self._count(text)
        x: dict[str, Any] = dict(
            request_features(text, prompt_tokens=prompt_tokens, max_tokens=max_tokens, turns=turns)
        )
        if context:
            x.update(context)
        if max_tokens is not None:
            x["max_tokens"] = max_tokens
        base = None
        if self.batcher is not None:
            estimate = await self.batcher.predict(text, self.deadline_s)
            if estimate is not None:
                base = estimate.value
                if math.isfinite(base):
                    x[BASE_KEY] = base
                    if estimate.vector is not None:
                        x[VECTOR_KEY] = estimate.vector  # the similar-prompt prior's key
        return Prediction(
            x=x,
            request_class=str(x["request_class"]),
            prompt_tokens=prompt_tokens,
            base=base,
            path="roberta" if BASE_KEY in x else "fast",
        )

    def _count(self, text: str) -> int | None:
        if self.count_tokens is None:
            return None
        try:
            return self.count_tokens(text)
        except Exception:  # a tokenizer hiccup costs the feature, not the request
            return None


def request_context(
    telemetry: Callable[[], Mapping[str, Any]],
    instances: Iterable[Any],
    in_flight: Callable[[str], int],
) -> dict[str, Any]:
    """Features of the moment a request arrives: GPU telemetry (``gpu_*``), the cluster's load
    (requests in flight over the caps of healthy instances) and mean KV usage."""
    x: dict[str, Any] = {}
    try:
        for key, value in telemetry().items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                x[f"gpu_{key}"] = value
    except Exception:  # telemetry is advisory: a failing source costs features, not requests
        log.debug("telemetry features failed", exc_info=True)
    healthy = [i for i in instances if i.healthy]
    x["load"] = sum(in_flight(i.name) for i in healthy) / max(sum(i.cap for i in healthy), 1)
    kv = [i.kv_usage for i in healthy if i.kv_usage is not None]
    if kv:
        x["kv_usage"] = sum(kv) / len(kv)
    return x
