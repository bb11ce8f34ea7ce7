"""`steersman model ...`: build the tiny demo model that vLLM CPU serves."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from steersman.data import PROMPT_SETS, path
from steersman.learners.datasets import iter_prompt_set

model_app = typer.Typer(help="Models served by vLLM in tests and the demo.", no_args_is_help=True)


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


@model_app.command("build-tiny")
def build_tiny(
    out_dir: Annotated[Path, typer.Argument(help="Directory to write the model into.")],
    seed: Annotated[int, typer.Option(help="Seed of the random weights.")] = 0,
    force: Annotated[bool, typer.Option(help="Rebuild even if a build is there.")] = False,
) -> None:
    """Build a tiny random Llama (hidden 128, 2 layers) with a byte-level BPE tokenizer of
    2048 tokens trained here on the bundled data; nothing is downloaded."""
    built = ensure_tiny_model(out_dir, seed=seed, force=force)
    typer.echo(str(built))
