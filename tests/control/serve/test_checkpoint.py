"""Checkpoints: atomic writes; an unreadable or foreign file means a fresh start, not a crash."""

from __future__ import annotations

import pickle

from steersman.control.core.controller import ControllerState
from steersman.control.serve import checkpoint as ckpt
from steersman.learners.corrector import LengthCorrector


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


def test_a_replica_that_starts_takes_the_newest_checkpoint_of_the_shared_history(
    tmp_path, pg_fresh_url
):
    from steersman.control.serve.daemon import Daemon
    from tests.control.serve.serving import settings_for

    def replica(name: str) -> Daemon:
        settings = settings_for(
            tmp_path / name, [{"name": "sim-0", "sim": "cpu-tiny"}],
            storage={"url": pg_fresh_url}, replica=name,
        )  # fmt: skip
        return Daemon(settings)

    a = replica("a")
    for _ in range(50):
        a.service.scheduler.corrector.learn_one({"brief": 1.0}, 20)
    a.service.scheduler.state = ControllerState(mode="FALLBACK")
    a.save_checkpoint()
    a.close()
    b = replica("b")  # its own empty data directory: only the history has a checkpoint
    try:
        assert not (tmp_path / "b" / "data" / "checkpoints" / "state.pkl").exists()
        learned = a.service.scheduler.corrector.predict_one({"brief": 1.0})
        assert b.service.scheduler.corrector.predict_one({"brief": 1.0}) == learned
        assert b.service.scheduler.state.mode == "FALLBACK"
    finally:
        b.close()
