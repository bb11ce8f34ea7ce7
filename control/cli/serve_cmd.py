"""`steersman serve`: the long-lived daemon in front of the configured instances."""

from __future__ import annotations

from typing import Annotated

import typer

from steersman.control.cli.logs import configure_logging
from steersman.control.serve.settings import Settings


def serve_command(
    ctx: typer.Context,
    host: Annotated[str | None, typer.Option(help="Address to bind (gateway.host).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (gateway.port).", min=0)] = None,
    db: Annotated[str | None, typer.Option("--db", help="Database URL (storage.url).")] = None,
) -> None:
    """Serve the OpenAI-compatible gateway with prediction, dispatch, the controller and jobs."""
    _serve(ctx.obj.settings(db=db), host, port)


def epp_command(
    ctx: typer.Context,
    epp_port: Annotated[
        int | None, typer.Option("--epp-port", help="gRPC port (epp.port).", min=0)
    ] = None,
    host: Annotated[str | None, typer.Option(help="HTTP address (gateway.host).")] = None,
    port: Annotated[int | None, typer.Option(help="HTTP port (gateway.port).", min=0)] = None,
    db: Annotated[str | None, typer.Option("--db", help="Database URL (storage.url).")] = None,
) -> None:
    """Serve as the endpoint picker behind Envoy (Envoy's ext_proc gRPC API, GIE's Endpoint
    Picker Protocol): the same prediction, queue, admission, dispatch and history as serve;
    Envoy carries the bytes. The HTTP gateway (metrics, health, admin) runs beside it."""
    _serve(ctx.obj.settings(db=db, epp=True, epp_port=epp_port), host, port)


def _serve(settings: Settings, host: str | None, port: int | None) -> None:
    if not settings.instances:
        typer.echo(
            "config error: instances: none configured; add [[instances]] tables with "
            'url = "http://host:port" (a vLLM server) or sim = "cpu-tiny" (simulated)',
            err=True,
        )
        raise typer.Exit(2)
    configure_logging(settings.log_level, settings.log_libraries)
    from steersman.control.backends.vllm_server import SetupError
    from steersman.control.serve.daemon import serve  # the heavy imports only for this command

    try:
        serve(settings, host, port)
    except SetupError as exc:
        typer.echo(f"error: {exc} (gateway.port, or --port)", err=True)
        raise typer.Exit(2) from None
