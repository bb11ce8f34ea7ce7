"""`steersman model ...`: build the tiny demo model that vLLM CPU serves."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from steersman.control.training.tiny_model import ensure_tiny_model

model_app = typer.Typer(help="Models served by vLLM in tests and the demo.", no_args_is_help=True)


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
