"""Progress of a long step, as a user reads it: a live bar on a terminal; where the output is
piped or logged (no terminal, where a bar shows nothing until the end), a line when the step
starts, one every ``every_s`` seconds with how far it is, and one when it ends."""

from __future__ import annotations

import time
from collections.abc import Callable
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class StepProgress:
    """``with StepProgress(console, "training") as step: step.update(completed=3, total=10)``.

    >>> import io
    >>> clock = iter([0.0, 1.0, 22.0, 23.0, 30.0]).__next__
    >>> out = Console(file=io.StringIO(), width=80)
    >>> with StepProgress(out, "requests", total=3, clock=clock) as step:
    ...     step.update(advance=1)
    ...     step.update(advance=1, info="queue 0")
    ...     step.update(advance=1)
    >>> print(out.file.getvalue().strip())
    requests: started
    requests: 2/3 queue 0 (22 s)
    requests: done, 3/3 queue 0 (30 s)

    A step that never reports (a model found cached) says nothing.
    """

    def __init__(
        self,
        console: Console,
        description: str,
        *,
        total: float | None = None,
        info: str = "",
        every_s: float = 20.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.console = console
        self.description = description
        self.total = total
        self.completed = 0.0
        self.info = info
        self.every_s = every_s
        self.clock = clock
        self._bar: Progress | None = None
        self._task = None
        self._started = self._said = 0.0
        self._begun = False  # a line-mode step says it started at its first report

    def __enter__(self) -> StepProgress:
        if self.console.is_terminal:
            self._bar = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeElapsedColumn(),
                console=self.console,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.description, total=self.total, info=self.info)
        else:
            self._started = self.clock()
        return self

    def update(
        self,
        *,
        completed: float | None = None,
        total: float | None = None,
        advance: float = 0,
        info: str | None = None,
    ) -> None:
        if completed is not None:
            self.completed = completed
        self.completed += advance
        if total is not None:
            self.total = total
        if info is not None:
            self.info = info
        if self._bar is not None:
            self._bar.update(self._task, completed=self.completed, total=self.total, info=self.info)
            return
        now = self.clock()
        if not self._begun:
            self._begun, self._said = True, now
            self._line("started")
        elif now - self._said >= self.every_s:
            self._said = now
            self._line(f"{self._count()} {self.info}".strip(), now)

    def remove(self) -> None:
        """Nothing ran (a failure before the step began): the bar goes, no end line is said."""
        if self._bar is not None:
            self._bar.remove_task(self._task)
        self._begun = False

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._bar is not None:
            self._bar.__exit__(kind, exc, tb)
        elif self._begun:
            ended = "done" if kind is None else "stopped"
            self._line(f"{ended}, {self._count()} {self.info}".strip(), self.clock())

    def _count(self) -> str:
        done = f"{self.completed:g}"
        return done if self.total is None else f"{done}/{self.total:g}"

    def _line(self, text: str, now: float | None = None) -> None:
        took = "" if now is None else f" ({now - self._started:.0f} s)"
        self.console.print(f"{self.description}: {text}{took}", markup=False, highlight=False)
