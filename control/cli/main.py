"""The `steersman` command line: builds the settings tree at the entry point, passes it down."""

from __future__ import annotations

import csv
import json
import sys
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import tomli_w
import typer
from rich.console import Console
from rich.table import Table

from steersman.control.cli.bench_cmd import bench_command
from steersman.control.cli.calibrate_cmd import calibrate_command
from steersman.control.cli.dashboard_cmd import dashboard_command
from steersman.control.cli.demo_cmd import demo_command
from steersman.control.cli.eval_cmd import eval_command
from steersman.control.cli.example_config import example_toml
from steersman.control.cli.logs import configure_logging
from steersman.control.cli.model_cmd import model_app
from steersman.control.cli.replay_cmd import replay_command
from steersman.control.cli.serve_cmd import epp_command, serve_command
from steersman.control.cli.telemetry_cmd import telemetry
from steersman.control.cli.train_cmd import train_command
from steersman.control.serve.settings import ConfigError, Settings, load_settings, masked
from steersman.storage import migrate
from steersman.storage.engine import (
    DatabaseUnavailable,
    check_connection,
    make_engine,
    make_read_only_engine,
    mask_url,
)
from steersman.storage.query import NAMED, QueryError, named_sql, run_query

app = typer.Typer(
    name="steersman",
    help="An adaptive, online-learning control plane for LLM serving.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
config_app = typer.Typer(help="Inspect the configuration.", no_args_is_help=True)
db_app = typer.Typer(help="Manage the SQL history database.", no_args_is_help=True)
app.add_typer(config_app, name="config")
app.add_typer(db_app, name="db")
app.command()(telemetry)
app.add_typer(model_app, name="model")
app.command("replay")(replay_command)
app.command("calibrate")(calibrate_command)
app.command("train")(train_command)
app.command("eval-predictor")(eval_command)
app.command("serve")(serve_command)
app.command("epp")(epp_command)
app.command("demo")(demo_command)
app.command("bench")(bench_command)
app.command("dashboard")(dashboard_command)

err = Console(stderr=True, highlight=False, soft_wrap=True)

DbOption = Annotated[
    str | None,
    typer.Option("--db", help="Database URL; overrides storage.url from the settings."),
]


@dataclass
class Context:
    config_file: Path | None

    def settings(self, **flags: Any) -> Settings:
        overrides: dict[str, Any] = {}
        if flags.get("db"):
            overrides["storage"] = {"url": flags["db"]}
        if flags.get("epp"):
            overrides["epp"] = {"enabled": True}
            if flags.get("epp_port") is not None:
                overrides["epp"]["port"] = flags["epp_port"]
        try:
            return load_settings(self.config_file, overrides)
        except ConfigError as exc:
            err.print(str(exc), markup=False)
            raise typer.Exit(2) from None


def _fail(message: str, code: int = 1) -> typer.Exit:
    err.print(message, markup=False)
    return typer.Exit(code)


@app.callback()
def root(
    ctx: typer.Context,
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", envvar="STEERSMAN_CONFIG", help="TOML settings file."),
    ] = None,
) -> None:
    ctx.obj = Context(config_file=config)


# -- config -----------------------------------------------------------------------------------


class ConfigFormat(StrEnum):
    toml = "toml"
    json = "json"


@config_app.command("show")
def config_show(
    ctx: typer.Context,
    fmt: Annotated[ConfigFormat, typer.Option("--format", "-f")] = ConfigFormat.toml,
    db: DbOption = None,
) -> None:
    """Print the effective settings, secrets masked."""
    data = masked(ctx.obj.settings(db=db))
    if fmt is ConfigFormat.json:
        typer.echo(json.dumps(data, indent=2))
    else:
        typer.echo(tomli_w.dumps(_drop_none(data)), nl=False)


@config_app.command("example")
def config_example() -> None:
    """Print an example settings file listing every field with its default and meaning."""
    typer.echo(example_toml(), nl=False)


def _drop_none(data: Any) -> Any:
    """TOML has no null: leave unset fields out, in tables and in arrays of tables."""
    if isinstance(data, dict):
        return {k: _drop_none(v) for k, v in data.items() if v is not None}
    if isinstance(data, list):
        return [_drop_none(v) for v in data]
    return data


# -- db -----------------------------------------------------------------------------------------


def _engine(settings: Settings):
    url = settings.database_url
    try:
        engine = make_engine(url, busy_timeout_ms=settings.storage.sqlite_busy_timeout_ms)
        check_connection(engine)
    except ValueError as exc:
        raise _fail(f"storage.url: {exc}", 2) from None
    except DatabaseUnavailable as exc:
        raise _fail(str(exc)) from None
    return engine


@db_app.command("upgrade")
def db_upgrade(ctx: typer.Context, db: DbOption = None) -> None:
    """Create or migrate the history schema to the latest revision."""
    settings = ctx.obj.settings(db=db)
    engine = _engine(settings)
    migrate.upgrade(engine)
    err.print(f"database {mask_url(engine.url)} at revision {migrate.current_revision(engine)}")


@db_app.command("current")
def db_current(ctx: typer.Context, db: DbOption = None) -> None:
    """Print the schema revision of the database and the newest one available."""
    engine = _engine(ctx.obj.settings(db=db))
    typer.echo(f"current: {migrate.current_revision(engine)}  head: {migrate.head_revision()}")


# -- query --------------------------------------------------------------------------------------


class OutputFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


@app.command()
def query(
    ctx: typer.Context,
    sql: Annotated[str | None, typer.Argument(help="One read-only SQL statement.")] = None,
    named: Annotated[
        str | None, typer.Option("--named", "-n", help=f"One of: {', '.join(NAMED)}.")
    ] = None,
    fmt: Annotated[OutputFormat, typer.Option("--format", "-f")] = OutputFormat.table,
    limit: Annotated[int, typer.Option(help="Most rows to print; 0 prints all.", min=0)] = 1000,
    db: DbOption = None,
) -> None:
    """Ask the SQL history a question, read-only."""
    if (sql is None) == (named is None):
        raise _fail("give either a SQL statement or --named NAME", 2)
    if named is not None and named not in NAMED:
        listing = "\n".join(f"  {q.name:<10} {q.question}" for q in NAMED.values())
        raise _fail(f"unknown named query {named!r}; valid names:\n{listing}", 2)
    settings = ctx.obj.settings(db=db)
    try:
        engine = make_read_only_engine(settings.database_url)
        check_connection(engine)
    except ValueError as exc:
        raise _fail(f"storage.url: {exc}", 2) from None
    except DatabaseUnavailable as exc:
        raise _fail(str(exc)) from None
    text = named_sql(named, engine.dialect.name) if named else sql
    try:
        result = run_query(engine, text or "", limit=limit or None)
    except QueryError as exc:
        raise _fail(f"query failed: {exc}") from None
    _print_result(result.columns, result.rows, fmt)


def _print_result(columns: list[str], rows: list[tuple[Any, ...]], fmt: OutputFormat) -> None:
    if fmt is OutputFormat.json:
        records = [dict(zip(columns, row, strict=True)) for row in rows]
        typer.echo(json.dumps(records, default=str, indent=1))
    elif fmt is OutputFormat.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(columns)
        writer.writerows(rows)
    else:
        table = Table(*columns, show_lines=False)
        for row in rows:
            table.add_row(*("" if v is None else str(v) for v in row))
        Console(soft_wrap=True).print(table)
        err.print(f"{len(rows)} row(s)")


def main() -> None:
    configure_logging("WARNING", "WARNING")  # `serve` raises steersman's own to log_level
    app()
