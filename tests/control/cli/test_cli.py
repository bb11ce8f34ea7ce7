"""The command line: exit codes, messages and outputs an operator relies on."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from steersman.control.cli.main import app
from steersman.storage.engine import make_engine
from steersman.storage.writer import HistoryWriter
from tests.rows import request_row

runner = CliRunner()


@pytest.fixture(autouse=True)
def _isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("STEERSMAN_DATA_DIR", str(tmp_path / "data"))
    for name in ("STEERSMAN_CONFIG", "STEERSMAN_STORAGE__URL"):
        monkeypatch.delenv(name, raising=False)


def test_the_console_script_is_installed():
    exe = Path(sys.executable).parent / "steersman"
    assert exe.exists(), f"the steersman console script is not installed next to {sys.executable}"
    out = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
    for command in ("config", "db", "query"):
        assert command in out


def test_config_show_masks_secrets():
    result = runner.invoke(
        app, ["config", "show", "--db", "postgresql://ops:hunter2@db/prod", "-f", "json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["storage"]["url"] == "postgresql://ops:***@db/prod"
    assert "hunter2" not in result.output


def test_bad_config_exits_2_with_one_line(tmp_path):
    cfg = tmp_path / "s.toml"
    cfg.write_text("[storage]\nqueue_size = 'big'\n")
    result = runner.invoke(app, ["--config", str(cfg), "config", "show"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"config error: storage.queue_size = 'big' (in {cfg}): "
        "Input should be a valid integer, unable to parse string as an integer"
    ]


def test_db_upgrade_then_query_formats(tmp_path):
    db = f"sqlite:///{tmp_path / 'h.db'}"
    assert runner.invoke(app, ["db", "upgrade", "--db", db]).exit_code == 0
    with HistoryWriter(make_engine(db), tmp_path / "spill") as writer:
        for i in range(3):
            writer.submit("requests", request_row(i))
        assert writer.flush(timeout=30)

    sql = "SELECT request_id, actual_tokens FROM requests ORDER BY request_id"
    as_json = runner.invoke(app, ["query", sql, "--db", db, "-f", "json"])
    assert as_json.exit_code == 0, as_json.output
    assert json.loads(as_json.stdout)[2] == {"request_id": "req-00000002", "actual_tokens": 120}

    as_csv = runner.invoke(app, ["query", sql, "--db", db, "-f", "csv"])
    assert as_csv.stdout.splitlines() == [
        "request_id,actual_tokens",
        "req-00000000,120",
        "req-00000001,120",
        "req-00000002,120",
    ]
    as_table = runner.invoke(app, ["query", sql, "--db", db, "--limit", "2"])
    assert "req-00000001" in as_table.stdout and "req-00000002" not in as_table.stdout

    named = runner.invoke(app, ["query", "--named", "latency", "--db", db, "-f", "json"])
    assert named.exit_code == 0
    assert {r["instance"]: r["requests"] for r in json.loads(named.stdout)} == {
        "vllm-0": 2,
        "vllm-1": 1,
    }


def test_default_database_lives_in_the_data_dir(tmp_path):
    assert runner.invoke(app, ["db", "upgrade"]).exit_code == 0
    assert (tmp_path / "data" / "steersman.db").exists()
    result = runner.invoke(app, ["db", "current"])
    assert result.exit_code == 0 and "current: 0006  head: 0006" in result.stdout


def test_unknown_named_query_lists_valid_names():
    result = runner.invoke(app, ["query", "--named", "nope"])
    assert result.exit_code == 2
    for name in ("accuracy", "misses", "fallbacks", "latency", "telemetry"):
        assert name in result.stderr


def test_sql_error_is_the_database_message_without_traceback(tmp_path):
    db = f"sqlite:///{tmp_path / 'h.db'}"
    runner.invoke(app, ["db", "upgrade", "--db", db])
    result = runner.invoke(app, ["query", "SELECT nope FROM requests", "--db", db])
    assert result.exit_code == 1
    assert result.stderr.strip() == "query failed: no such column: nope"
    refused = runner.invoke(app, ["query", "DELETE FROM requests", "--db", db])
    assert refused.exit_code == 1 and "read-only" in refused.stderr


def test_unreachable_database_names_the_url_with_password_masked():
    result = runner.invoke(
        app, ["query", "SELECT 1", "--db", "postgresql://ops:hunter2@127.0.0.1:1/prod"]
    )
    assert result.exit_code == 1
    assert "cannot reach database postgresql+psycopg://ops:***@127.0.0.1:1/prod" in result.stderr
    assert "hunter2" not in result.output
    missing = runner.invoke(app, ["db", "upgrade", "--db", "mysql://x@h/db"])
    assert missing.exit_code == 2 and "unsupported database 'mysql'" in missing.stderr


def test_sql_or_named_but_not_both():
    assert runner.invoke(app, ["query"]).exit_code == 2
    assert runner.invoke(app, ["query", "SELECT 1", "--named", "latency"]).exit_code == 2


def test_serve_on_a_port_in_use_says_so_in_one_line(tmp_path):
    config = tmp_path / "s.toml"
    config.write_text('[[instances]]\nsim = "cpu-tiny"\n')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        port = taken.getsockname()[1]
        result = runner.invoke(app, ["--config", str(config), "serve", "--port", str(port)])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        f"error: port {port} on 127.0.0.1 is in use; choose another (gateway.port, or --port)"
    ]
