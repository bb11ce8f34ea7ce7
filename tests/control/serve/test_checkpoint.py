"""Checkpoints: atomic writes; an unreadable or foreign file means a fresh start, not a crash."""

from __future__ import annotations

import pickle

import pytest

from steersman.control.core.controller import ControllerState
from steersman.control.serve import checkpoint as ckpt
from steersman.learners.corrector import VECTOR_KEY, LengthCorrector


def test_round_trip_keeps_learned_state(tmp_path):
    corrector = LengthCorrector()
    for _ in range(50):
        corrector.learn_one({"brief": 1.0}, 20)
    path = tmp_path / "ck" / "state.pkl"
    ckpt.save(path, ckpt.Checkpoint(1.0, corrector, {}, ControllerState(mode="FALLBACK")))
    back = ckpt.load(path)
    assert back is not None and back.controller.mode == "FALLBACK"
    assert back.corrector.predict_one({"brief": 1.0}) == corrector.predict_one({"brief": 1.0})
    assert [p.name for p in path.parent.iterdir()] == ["state.pkl"]  # no temporary left


def test_unusable_checkpoints_are_ignored(tmp_path):
    missing = tmp_path / "none.pkl"
    assert ckpt.load(missing) is None
    truncated = tmp_path / "truncated.pkl"
    truncated.write_bytes(pickle.dumps(ckpt.Checkpoint(1.0, None, {}, None))[:20])
    assert ckpt.load(truncated) is None
    foreign = tmp_path / "foreign.pkl"
    foreign.write_bytes(pickle.dumps({"not": "a checkpoint"}))
    assert ckpt.load(foreign) is None
    older = tmp_path / "older.pkl"  # an earlier format's corrector lacks what this one reads
    older.write_bytes(pickle.dumps(ckpt.Checkpoint(1.0, LengthCorrector(), {}, None, format=1)))
    assert ckpt.load(older) is None


@pytest.mark.parametrize(("version", "kept"), [(None, True), ("v-old", False)])
def test_what_was_learned_against_another_length_model_starts_over(tmp_path, version, kept):
    from steersman.control.serve.daemon import Daemon
    from tests.control.serve.serving import settings_for

    settings = settings_for(tmp_path, [{"name": "sim-0", "sim": "cpu-tiny"}])
    corrector = LengthCorrector()
    for k in range(50):
        corrector.learn_one({"brief": 1.0, VECTOR_KEY: [1.0, k / 50]}, 20)
    learned = corrector.predict_one({"brief": 1.0})
    state = ControllerState(mode="FALLBACK")
    path = settings.data_dir / "checkpoints" / "state.pkl"
    ckpt.save(path, ckpt.Checkpoint(1.0, corrector, {}, state, model_version=version))
    daemon = Daemon(settings)  # serves no length model (version None): the fast path
    try:
        restored = daemon.service.scheduler.corrector
        assert daemon.service.scheduler.state.mode == "FALLBACK"  # the controller's, either way
        assert len(restored.similar) == (50 if kept else 0)
        assert (restored.predict_one({"brief": 1.0}) == learned) is kept
    finally:
        daemon.close()
