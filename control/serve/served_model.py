"""The RoBERTa length model the daemon serves: loaded from settings or the registry, and swapped
for another between two inference batches, dropping nothing."""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from steersman.control.serve.predictor import Predictor
from steersman.control.serve.sections import PredictorSettings
from steersman.learners.batching import Estimate, MicroBatcher
from steersman.storage.registry import model_versions

log = logging.getLogger(__name__)

Event = Callable[[str, str, dict[str, Any]], None]


def load_length_model(
    settings: PredictorSettings, engine: Any
) -> tuple[Any, str | None, Path | None]:
    """(RoBERTa model or None, its version, its directory). A directory that cannot be loaded
    is reported and the fast predictor serves instead: the daemon starts either way."""
    directory = settings.model_dir
    version = None
    if directory is None:
        try:
            promoted = [v for v in model_versions(engine) if v.get("status") == "promoted"]
        except Exception:
            promoted = []
        if not promoted:
            return None, None, None
        directory, version = Path(promoted[-1]["path"]), promoted[-1]["version"]
    try:
        model = _load(directory, settings)
    except Exception as exc:
        log.error("length model %s cannot be loaded (%s): using the fast predictor", directory, exc)
        return None, None, None
    if version is None:
        meta = Path(directory) / "steersman.json"
        with contextlib.suppress(OSError, ValueError, AttributeError):
            version = json.loads(meta.read_text()).get("version")
    return model, version or Path(directory).name, Path(directory)


def validation_errors(directory: Path | None) -> list[float] | None:
    """What a model's training measured of its errors on held-out prompts (the quantiles of
    ``val_error_quantiles``), or ``None`` (a model trained before it was kept, no directory)."""
    if directory is None:
        return None
    with contextlib.suppress(OSError, ValueError, AttributeError, TypeError, KeyError):
        got = json.loads((Path(directory) / "steersman.json").read_text())["metrics"]
        errors = got.get("val_error_quantiles")
        return [float(v) for v in errors] if isinstance(errors, list) else None
    return None


class ServedModel:
    """The model behind ``predictor`` and its micro-batcher. ``swap`` serves another from the
    next batch on; what was learned online against the old one (the corrector's residuals, the
    compensation) starts over: ``forget`` is called with the new model's validation errors."""

    def __init__(
        self,
        predictor: Predictor,
        settings: PredictorSettings,
        models_dir: Path,
        *,
        event: Event,
        forget: Callable[[list[float] | None], None],
        model: Any = None,
        directory: Path | None = None,
    ) -> None:
        self.predictor = predictor
        self.settings = settings
        self.models_dir = models_dir
        self.event = event
        self.forget = forget
        self.directory = directory
        self.batcher: MicroBatcher | None = None
        if model is not None:
            self.batcher = self._batcher(model)
            predictor.batcher = self.batcher

    def _batcher(self, model: Any) -> MicroBatcher:
        s = self.settings
        return MicroBatcher(
            self._tokens_of(model), max_batch=s.max_batch, max_wait_s=s.max_wait_ms / 1000
        )

    def _tokens_of(self, model: Any) -> Callable[[list[str]], list[Estimate]]:
        """The model's answers in tokens, with the prompts' vectors while the similar-prompt
        prior is on."""
        vectors = self.settings.similar_prompts > 0

        def tokens(texts: list[str]) -> list[Estimate]:
            values, found = model.predict_with_vectors(texts, vectors=vectors)
            return [Estimate(math.expm1(v), f) for v, f in zip(values, found, strict=True)]

        return tokens

    def swap(self, model: Any, version: str, directory: Path | None = None) -> None:
        """Serve ``model`` from the next inference batch on; no request is dropped or stalled."""
        if self.batcher is None:
            self.batcher = self._batcher(model)
            self.predictor.batcher = self.batcher
        else:
            self.batcher.swap(self._tokens_of(model))
        previous = self.predictor.model_version
        self.predictor.model_version = version
        self.directory = directory or self.models_dir / version
        self.forget(validation_errors(self.directory))
        self.event("model", f"serving {version} (was {previous or 'the fast predictor'})", {})

    def swap_from(self, directory: Path) -> bool:
        """Hot-swap to a model directory; one that does not load is refused, the current model
        stays and an event says why."""
        try:
            model = _load(directory, self.settings)
        except Exception as exc:
            self.event("model", f"refused {directory}: {exc}", {"path": str(directory)})
            return False
        self.swap(model, Path(directory).name, Path(directory))
        return True

    def close(self) -> None:
        if self.batcher is not None:
            self.batcher.close()


def _load(directory: Path, settings: PredictorSettings) -> Any:
    """A trained length model, ready to serve; a pretrained base whose head never learned is
    refused (it would predict noise)."""
    from steersman.learners.hf import LengthModel  # torch loads only when needed

    model = LengthModel.load(
        directory,
        device=settings.device,
        quantize=settings.quantize,
        threads=settings.threads,
        compiled=settings.quantize,
    )
    if not model.trained:
        raise ValueError(
            f"{directory}: a {model.model_type} encoder with no trained length head: fine-tune "
            "it first (steersman train --base-model DIR)"
        )
    return model
