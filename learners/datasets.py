"""Prompt/response data sets in the shared JSON Lines format, read with bad rows reported."""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True, slots=True)
class PromptRecord:
    id: str
    source: str
    prompt: str
    response: str

    @property
    def group(self) -> str:
        """Rows sharing a group share a prompt (AlpacaEval answers each prompt 12 times):
        a train/validation split must keep a group on one side.

        >>> PromptRecord("alpacaeval-042-gpt4", "alpaca_eval/gpt4", "p", "r").group
        'alpacaeval-042'
        >>> PromptRecord("alpaca5k-0007", "alpaca", "p", "r").group
        'alpaca5k-0007'
        """
        if self.id.startswith("alpacaeval-"):
            return "-".join(self.id.split("-")[:2])
        return self.id


@dataclass
class LoadReport:
    path: str
    rows: int = 0
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line number, why)

    def summary(self) -> str:
        if not self.skipped:
            return f"{self.path}: {self.rows} rows"
        lines = ", ".join(str(n) for n, _ in self.skipped[:20])
        more = "" if len(self.skipped) <= 20 else f" and {len(self.skipped) - 20} more"
        return (
            f"{self.path}: {self.rows} rows, skipped {len(self.skipped)} bad row(s) "
            f"at line(s) {lines}{more}"
        )


def _open(path: Path):
    return (
        gzip.open(path, "rt", encoding="utf-8")
        if path.suffix == ".gz"
        else open(path, encoding="utf-8")
    )


def iter_prompt_set(path: Path, report: LoadReport | None = None) -> Iterator[PromptRecord]:
    """Rows with a non-empty string ``prompt`` and a string ``response``; others are skipped
    and listed in ``report`` with their line numbers."""
    report = report if report is not None else LoadReport(str(path))
    with _open(Path(path)) as fh:
        for line_no, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                report.skipped.append((line_no, f"not JSON: {exc.msg}"))
                continue
            if not isinstance(obj, dict):
                report.skipped.append((line_no, "not an object"))
                continue
            prompt, response = obj.get("prompt"), obj.get("response")
            if not isinstance(prompt, str) or not prompt.strip():
                report.skipped.append((line_no, "missing or empty prompt"))
                continue
            if not isinstance(response, str):
                report.skipped.append((line_no, "missing response"))
                continue
            report.rows += 1
            yield PromptRecord(
                str(obj.get("id", f"line-{line_no}")), str(obj.get("source", "")), prompt, response
            )


def load_prompt_set(path: Path) -> tuple[list[PromptRecord], LoadReport]:
    report = LoadReport(str(path))
    return list(iter_prompt_set(path, report)), report
