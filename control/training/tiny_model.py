"""The tiny random Llama that vLLM CPU serves in the demo and the tests, built here from the
bundled data with no download; its tokenizer counts every length in the served model's tokens."""

from __future__ import annotations

from pathlib import Path

from steersman.data import PROMPT_SETS, path
from steersman.learners.datasets import iter_prompt_set


def bundled_texts() -> list[str]:
    """Every prompt and response of the bundled prompt sets, in a fixed order."""
    texts: list[str] = []
    for name in PROMPT_SETS:
        for record in iter_prompt_set(path(name)):
            texts.extend((record.prompt, record.response))
    return texts


def ensure_tiny_model(out_dir: Path, *, seed: int = 0, force: bool = False) -> Path:
    """Build the tiny Llama into ``out_dir`` unless a build is already there."""
    if not force and (out_dir / "config.json").exists() and (out_dir / "steersman.json").exists():
        return out_dir
    from steersman.learners.hf import build_tiny_llama  # torch: only when building

    return build_tiny_llama(out_dir, bundled_texts(), seed=seed)


def served_model(data_dir: Path) -> Path:
    """The served model whose tokenizer counts lengths when none is named: the tiny demo model,
    built into the data directory on first use."""
    return ensure_tiny_model(data_dir / "models" / "tiny-llama")
