"""The trainer's metric sinks for W&B and SwanLab (`sqlrl.training.runfolder.MetricSinks`).

Two layers:
- a contract test with stand-in modules (runs everywhere, in the main CI venv): the exact calls made
  (init arguments, scalars only, the step, finish), and the error when a requested tracker is missing;
- the real libraries, offline (no account, no network): runs only where wandb and swanlab are
  installed, i.e. in `.venv-trackers` (`scripts/trackers-env.sh --test`, run by `.ci/run`). They stay
  out of the main venv because wandb 0.31 needs protobuf < 7, which conflicts with constraints.txt.
"""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest

from sqlrl import config as C
from sqlrl.training.runfolder import MetricSinks

METRICS = {
    "reward_mean": 0.25,
    "loss": 0.125,
    "trained_tokens": 42,
    "skipped_nonfinite": False,
    "arm": "grpo",
}
SCALARS = {"reward_mean": 0.25, "loss": 0.125, "trained_tokens": 42}  # no bools, no strings


def cfg(loggers, project="sqlrl"):
    return C.from_dict({"model": {"name": "tiny"}, "run": {"loggers": loggers, "tracker_project": project}})


class _Run:
    def __init__(self, calls, **kw):
        self.calls, self.kw = calls, kw
        calls.append(("init", kw))

    def log(self, data, step=None):
        self.calls.append(("log", dict(data), step))

    def finish(self):
        self.calls.append(("finish",))


def _fake(name, calls):
    mod = types.ModuleType(name)

    if name == "wandb":

        def init(*, project=None, name=None, dir=None, config=None):  # keyword names of wandb 0.31
            return _Run(calls, project=project, name=name, dir=dir, config=config)

    else:

        def init(*, project=None, name=None, log_dir=None, config=None):  # keyword names of swanlab 0.10
            return _Run(calls, project=project, name=name, log_dir=log_dir, config=config)

    mod.init = init
    return mod


def test_sinks_call_wandb_and_swanlab_as_documented(tmp_path, monkeypatch):
    calls = {"wandb": [], "swanlab": []}
    for n in calls:
        monkeypatch.setitem(sys.modules, n, _fake(n, calls[n]))
    c = cfg(["wandb", "swanlab"], project="text2sql")
    out = tmp_path / "runs" / "exp" / "arms" / "grpo" / "train"
    sinks = MetricSinks(c, out)
    sinks.log(METRICS, step=1)
    sinks.log({**METRICS, "reward_mean": 0.5}, step=2)
    sinks.close()
    for n, dir_key in (("wandb", "dir"), ("swanlab", "log_dir")):
        got = calls[n]
        assert got[0] == (
            "init",
            {"project": "text2sql", "name": out.as_posix(), dir_key: str(out), "config": c.resolve()},
        )
        assert got[1] == ("log", SCALARS, 1)
        assert got[2] == ("log", {**SCALARS, "reward_mean": 0.5}, 2)
        assert got[3] == ("finish",) and len(got) == 4


@pytest.mark.parametrize("name", ["wandb", "swanlab"])
def test_a_requested_tracker_that_is_not_installed_is_a_clear_config_error(tmp_path, monkeypatch, name):
    monkeypatch.setitem(sys.modules, name, None)  # import fails as for a missing package
    with pytest.raises(C.ConfigError, match=rf"asks for {name} but it is not installed: pip install {name}"):
        MetricSinks(cfg([name]), tmp_path / "r")


REAL = importlib.util.find_spec("wandb") is not None and importlib.util.find_spec("swanlab") is not None


def _settled(path, keys, timeout_s: float = 30.0) -> bytes:
    """The file's bytes once every key is in it, or after `timeout_s` (the assertions then fail). W&B's
    offline writer is a separate service process: under heavy CPU load its log can lag `finish()`."""
    import time

    deadline = time.monotonic() + timeout_s
    while True:
        blob = path.read_bytes()
        if all(k.encode() in blob for k in keys) or time.monotonic() > deadline:
            return blob
        time.sleep(0.5)


@pytest.mark.skipif(not REAL, reason="wandb and swanlab not installed (scripts/trackers-env.sh --test)")
def test_real_wandb_and_swanlab_offline_record_the_metrics_and_config(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("SWANLAB_MODE", "offline")
    out = tmp_path / "run"
    c = cfg(["wandb", "swanlab"])
    sinks = MetricSinks(c, out)
    for step in (1, 2, 3):
        sinks.log({**METRICS, "reward_mean": step / 8}, step=step)
    sinks.close()
    wb = list(out.glob("wandb/offline-run-*/run-*.wandb"))
    sw = list(out.glob("run-*/run-*.swanlab"))
    assert len(wb) == 1 and len(sw) == 1, sorted(p.relative_to(out).as_posix() for p in out.rglob("*"))
    for f in (wb[0], sw[0]):
        blob = _settled(f, SCALARS)
        for key in SCALARS:  # every scalar key is in the run's own log; booleans and strings are not sent
            assert key.encode() in blob, (f.name, key)
        assert b"skipped_nonfinite" not in blob
    cfg_yaml = next(out.glob("run-*/files/config.yaml")).read_text()
    assert "tracker_project" in cfg_yaml and "loggers" in cfg_yaml  # SwanLab kept the resolved config
    assert b"tracker_project" in wb[0].read_bytes()  # so did W&B (config record in the .wandb log)
