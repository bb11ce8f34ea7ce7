"""The settings tree: sources and their precedence, errors that name the field, secrets masked."""

from __future__ import annotations

from pathlib import Path

import pytest

from steersman.control.cli.example_config import example_toml
from steersman.control.serve.settings import ConfigError, load_settings, masked
from tests.conftest import ROOT


def _toml(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "steersman.toml"
    path.write_text(text)
    return path


def test_defaults(monkeypatch):
    s = load_settings(environ={})
    assert s.storage.batch_size == 500
    assert s.database_url == f"sqlite:///{s.data_dir / 'steersman.db'}"
    assert s.spill_dir == s.data_dir / "spill"
    assert "~" not in str(s.data_dir)


def test_flags_beat_environment_beat_file(tmp_path, monkeypatch):
    cfg = _toml(tmp_path, '[storage]\nbatch_size = 7\nurl = "sqlite:///file.db"\nqueue_size = 9\n')
    monkeypatch.setenv("STEERSMAN_STORAGE__BATCH_SIZE", "8")
    s = load_settings(cfg, overrides={"storage": {"url": "sqlite:///flag.db"}})
    assert s.storage.batch_size == 8
    assert s.storage.queue_size == 9
    assert s.storage.url == "sqlite:///flag.db"


def test_a_bad_env_value_names_the_variable_field_and_value(monkeypatch):
    monkeypatch.setenv("STEERSMAN_STORAGE__BATCH_SIZE", "lots")
    with pytest.raises(ConfigError) as info:
        load_settings()
    assert str(info.value) == (
        "config error: storage.batch_size = 'lots' (from STEERSMAN_STORAGE__BATCH_SIZE): "
        "Input should be a valid integer, unable to parse string as an integer"
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[storage]\nbatch_size = 0\n", "storage.batch_size = 0"),
        ("[storage]\nflush_interval_s = -1\n", "storage.flush_interval_s = -1"),
        ('log_level = "LOUD"\n', "log_level = 'LOUD'"),
        ("[storage]\nbatchsize = 5\n", "storage.batchsize = 5"),
        ("unknown_section = 1\n", "unknown_section = 1"),
        ("[qoe]\nexpected_pace_s = 0\n", "qoe.expected_pace_s = 0"),
        ("[qoe.classes.code]\nttft_s = -1\npace_s = 0.1\n", "qoe.classes.code.ttft_s = -1"),
        ("[qoe.classes.chatty]\nttft_s = 1\npace_s = 0.1\n", "qoe.classes = '{...}'"),
    ],
)
def test_a_bad_file_value_names_the_field_value_and_file(tmp_path, text, expected):
    cfg = _toml(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_settings(cfg, environ={})
    message = str(info.value)
    assert message.startswith(f"config error: {expected} (in {cfg}): ")
    assert len(message.splitlines()) == 1


def test_broken_or_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(_toml(tmp_path, "[storage\n"))
    with pytest.raises(ConfigError, match="not found"):
        load_settings(tmp_path / "absent.toml")


def test_masked_hides_database_passwords():
    s = load_settings(overrides={"storage": {"url": "postgresql://ops:hunter2@db:5432/prod"}})
    shown = masked(s)
    assert shown["storage"]["url"] == "postgresql://ops:***@db:5432/prod"
    assert "hunter2" not in repr(shown)


def test_the_example_file_lists_every_field_and_is_current():
    committed = (ROOT / "steersman.example.toml").read_text()
    assert committed == example_toml(), "run: steersman config example > steersman.example.toml"
    import tomllib

    parsed = tomllib.loads(committed)
    assert set(parsed) >= {"data_dir", "log_level", "storage"}
    from steersman.storage.settings import StorageSettings

    for name, field in StorageSettings.model_fields.items():
        if field.default is None:
            assert f"# {name} =" in committed
        else:
            assert name in parsed["storage"]
    # The example is itself a valid configuration.
    load_settings(ROOT / "steersman.example.toml", environ={})


def test_a_flag_beats_the_same_field_from_the_environment_and_derive_keeps_secrets(monkeypatch):
    from steersman.control.serve.settings import derive

    monkeypatch.setenv("STEERSMAN_STORAGE__URL", "sqlite:////tmp/from-env.db")
    monkeypatch.setenv("STEERSMAN_DATA_DIR", "/tmp/from-env")
    s = load_settings(overrides={"storage": {"url": "sqlite:////tmp/from-flag.db"}})
    assert s.storage.url == "sqlite:////tmp/from-flag.db"
    run = derive(s, {"data_dir": "/tmp/run-1", "gateway": {"api_keys": ["k1"]}})
    assert str(run.data_dir) == "/tmp/run-1"  # the environment is not read again
    assert derive(run, {"log_level": "ERROR"}).gateway.api_keys[0].get_secret_value() == "k1"


def test_a_bad_retrain_cron_is_a_config_error_naming_the_field():
    import pytest

    from steersman.control.serve.settings import ConfigError

    with pytest.raises(ConfigError, match=r"jobs.retrain_cron = '61 \* \* \* \*'"):
        load_settings(overrides={"jobs": {"retrain_cron": "61 * * * *"}})
    assert load_settings(overrides={"jobs": {"retrain_cron": "0 3 * * *"}}).jobs.retrain_cron


def test_paths_are_made_absolute_where_the_settings_are_built(tmp_path, monkeypatch):
    """A server started in another directory must not look for a relative path there."""
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "s.toml"
    config.write_text(
        'data_dir = "run"\n[storage]\nspill_dir = "spill"\n'
        '[predictor]\nmodel_dir = "models/m"\ntokenizer_dir = "tok"\n'
        '[[instances]]\nsim = "cal/gpu.json"\n[[instances]]\nsim = "cpu-tiny"\n'
    )
    s = load_settings(config, environ={})
    assert s.data_dir == tmp_path / "run"
    assert s.storage.spill_dir == tmp_path / "spill"
    assert s.predictor.model_dir == tmp_path / "models" / "m"
    assert s.predictor.tokenizer_dir == tmp_path / "tok"
    assert [i.sim for i in s.instances] == [str(tmp_path / "cal" / "gpu.json"), "cpu-tiny"]


def test_unnamed_instances_of_one_profile_are_numbered(tmp_path):
    cfg = _toml(tmp_path, '[[instances]]\nsim = "cpu-tiny"\n[[instances]]\nsim = "cpu-tiny"\n')
    s = load_settings(cfg, environ={})
    assert [i.name for i in s.instances] == ["sim-cpu-tiny-1", "sim-cpu-tiny-2"]


@pytest.mark.parametrize(
    ("tables", "expected"),
    [
        pytest.param(
            '[[instances]]\nname = "a"\nsim = "cpu-tiny"\n[[instances]]\nname = "a"\n'
            'sim = "cpu-tiny"\n',
            "instances[0] and instances[1] are both named 'a'",
            id="one name twice",
        ),
        pytest.param(
            '[[instances]]\nurl = "http://127.0.0.1:9000"\n'
            '[[instances]]\nurl = "http://127.0.0.1:9000/"\n',
            "instances[0] and instances[1] both point at http://127.0.0.1:9000/",
            id="one server twice",
        ),
    ],
)
def test_two_instances_that_would_be_one_are_a_config_error(tmp_path, tables, expected):
    with pytest.raises(ConfigError, match=expected.replace("[", r"\[").replace("]", r"\]")):
        load_settings(_toml(tmp_path, tables), environ={})


def test_an_unknown_request_class_in_qoe_is_named(tmp_path):
    cfg = _toml(tmp_path, "[qoe.classes.chatty]\nttft_s = 1\npace_s = 0.1\n")
    with pytest.raises(ConfigError, match="unknown request class 'chatty': one of chat, code"):
        load_settings(cfg, environ={})


def test_the_endpoint_picker_refuses_a_simulated_instance_naming_it(tmp_path):
    cfg = _toml(tmp_path, '[epp]\nenabled = true\n[[instances]]\nsim = "cpu-tiny"\n')
    with pytest.raises(ConfigError) as refused:
        load_settings(cfg, environ={})
    message = str(refused.value)
    assert message.startswith("config error")
    assert "instances[0].sim = 'cpu-tiny'" in message and "url" in message


@pytest.mark.parametrize(
    ("tables", "moved"),
    [
        ("[gateway]\nretries = 2\n", "gateway.retries is now service.retries"),
        (
            "[dispatch]\nqueue_timeout_s = 5\n",
            "dispatch.queue_timeout_s is now service.queue_timeout_s",
        ),
    ],
)
def test_a_field_that_moved_to_the_service_section_is_named_where_it_went(tmp_path, tables, moved):
    with pytest.raises(ConfigError, match=moved):
        load_settings(_toml(tmp_path, tables), environ={})
    assert load_settings(None, {"service": {"retries": 2}}, environ={}).service.retries == 2
