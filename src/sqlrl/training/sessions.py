"""Training time, machines and pass caps of a run trained over several invocations (`--resume`).

run.json `train_seconds` of `sqlrl train` and `sqlrl sft` is the run's training time: the seconds the
checkpoint it resumed from recorded plus this invocation's since its steps began, less the time that is
not training (learning-curve points, a branch export: `TrainClock.excluded`). Every checkpoint records
the time so far in its sidecar (`extra.train_seconds`, counted just before the sidecar is written, so its
own save included) and run.json is rewritten with it (`Sessions.saved`): run.json is never without the
time, and a crashed invocation's run.json holds that of its last checkpoint. A resume continues from
the checkpoint's value (`resumed_seconds`), never from run.json's, so the time of steps after the
checkpoint, which are trained again, is not counted twice; a checkpoint without the value resumes
from run.json's `train_seconds`, and none from 0.

run.json `machines`: one entry per invocation that trained steps the run kept, {steps: [first, last],
machine (`artifacts.machine_info`), device, started}. A resume keeps the entries up to its checkpoint's
step (`kept_machines`: later ones dropped, the last kept one cut at that step); an earlier run.json
without `machines` counts as one entry of its `machine` for the steps its invocation took. run.json
`machine` is the current invocation's.

GRPO pass caps (`update.PassMemory`) and generation batch (`GenMemory`): every sidecar records those in
force, the config's they came from and the changes so far, run.json is rewritten with the changes; a
resume takes the checkpoint's, each unless the config changed it since (`resumed_memory`, `GenMemory`).

Not covered: time before the first step (loading, building examples, restoring a checkpoint) and after
the last (the final export) is no invocation's training time; neither is the work after the last
checkpoint of an invocation that crashed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlrl.artifacts import json_int, json_number, write_json_atomic
from sqlrl.training.update import PassCaps, PassMemory, resumed_caps


def _nothing() -> float:
    return 0.0


@dataclass
class TrainClock:
    """The run's training seconds so far (`clock()`): `previous_s` (those of the checkpoint resumed from)
    plus the time since `start`, less `excluded()`; before `start`, `previous_s`."""

    previous_s: float = 0.0
    """Training seconds of the checkpoint the invocation resumed from (0.0 for a new run)."""
    excluded: Callable[[], float] = field(default=_nothing)
    """Seconds since `start` that are not training (set by `start`)."""
    t0: float | None = None
    """`now()` at `start`; None before."""

    now = staticmethod(time.perf_counter)

    def start(self, excluded: Callable[[], float] = _nothing) -> None:
        """Training steps begin now; `excluded()` is the time from now on that is not training."""
        self.excluded, self.t0 = excluded, self.now()

    def __call__(self) -> float:
        if self.t0 is None:
            return self.previous_s
        return self.previous_s + self.now() - self.t0 - self.excluded()


def resumed_seconds(sidecar: dict | None, prev_run: dict) -> float:
    """Training seconds a resume continues from: the restored checkpoint's sidecar `extra.train_seconds`,
    else (a checkpoint without them) the earlier run.json's `train_seconds`; 0.0 without a checkpoint."""
    if sidecar is None:
        return 0.0
    t = json_number((sidecar.get("extra") or {}).get("train_seconds"))
    if t is None:
        t = json_number(prev_run.get("train_seconds"))
    return t or 0.0


def resumed_memory(sidecar: dict | None, prev_run: dict, step: int, g, changes: list[str]) -> PassMemory:
    """The update-pass memory state a GRPO resume from the checkpoint of `step` (its sidecar, None
    without one) starts with. Cap changes: the sidecar's `extra.memory_adjustments`, else the earlier
    run.json's, those of steps <= `step`. Caps, each: the config's (`g`, `grpo`) when it differs from
    the one the checkpoint was taken under (`extra.pass_caps_config`), else the checkpoint's
    `extra.pass_caps`; a checkpoint without them: `update.resumed_caps` of the changes and `changes`."""
    extra = (sidecar or {}).get("extra") or {}
    adj = extra.get("memory_adjustments")
    if not isinstance(adj, list):
        adj = prev_run.get("memory_adjustments")
    adj = [a for a in adj or [] if isinstance(a, dict) and (json_int(a.get("step")) or 0) <= step]
    config = PassCaps.of(g)
    used, then = extra.get("pass_caps"), extra.get("pass_caps_config")
    if not (isinstance(used, dict) and isinstance(then, dict)):
        return PassMemory(resumed_caps(g, adj, changes), config, adj)
    caps = {
        k: used[k] if v == then.get(k) and json_int(used.get(k)) is not None else v
        for k, v in config.to_dict().items()
    }
    return PassMemory(PassCaps.named(caps), config, adj)


def gen_batch(policy) -> dict:
    """The generation batch cap of `policy` (`HFPolicy`): {"engine", its `batch_attr`: value}."""
    return {"engine": policy.engine, policy.batch_attr: getattr(policy, policy.batch_attr)}


@dataclass
class GenMemory:
    """A GRPO run's generation memory state: the rollout `policy` (`HFPolicy`), whose batch cap
    out-of-memory errors lower, each change appended to its `memory_adjustments`, and the cap the
    config gave it (`config`, as `gen_batch`)."""

    policy: Any
    """The rollout policy; its batch cap and `memory_adjustments` are the state."""
    config: dict
    """The batch cap the run's config sets (`gen_batch` of the policy as built)."""

    @classmethod
    def resumed(cls, sidecar: dict | None, policy) -> GenMemory:
        """The state of a resume from the checkpoint `sidecar` (None without one), `policy` as built:
        its changes continue the sidecar's `extra.generation_memory_adjustments`, and its batch cap is
        the sidecar's `extra.gen_batch` when the config's (`policy`'s) equals the one the checkpoint was
        taken under (`extra.gen_batch_config`); else, and for a checkpoint without them, the config's."""
        memory = cls(policy, gen_batch(policy))
        extra = (sidecar or {}).get("extra") or {}
        adj = extra.get("generation_memory_adjustments")
        if isinstance(adj, list):
            policy.memory_adjustments[:] = [dict(a) for a in adj if isinstance(a, dict)]
        used, attr = extra.get("gen_batch"), policy.batch_attr
        if extra.get("gen_batch_config") == memory.config and isinstance(used, dict):
            size = json_int(used.get(attr))
            if used.get("engine") == policy.engine and size is not None and 0 < size:
                setattr(policy, attr, size)
        return memory

    def sidecar(self) -> dict:
        """A checkpoint's record of it (sidecar `extra`): `gen_batch` in force, `gen_batch_config`,
        `generation_memory_adjustments` so far."""
        return {
            "gen_batch": gen_batch(self.policy),
            "gen_batch_config": dict(self.config),
            "generation_memory_adjustments": [dict(a) for a in self.policy.memory_adjustments],
        }


def _steps(entry) -> list[int] | None:
    s = entry.get("steps") if isinstance(entry, dict) else None
    ok = isinstance(s, list) and len(s) == 2 and all(json_int(x) is not None for x in s)
    return s if ok else None


def kept_machines(prev_run: dict, step: int) -> list[dict]:
    """The `machines` entries of the earlier run.json `prev_run` for steps 1..`step` (the checkpoint a
    resume restored): entries of later steps dropped, the last one kept cut at `step`. A run.json without
    `machines` gives its `machine` for the steps its invocation took (from `resumed_from_step` + 1)."""
    entries = prev_run.get("machines")
    if not isinstance(entries, list):
        if not isinstance(prev_run.get("machine"), dict):
            return []
        last = prev_run.get("steps")
        entries = [
            {
                "steps": [
                    (prev_run.get("resumed_from_step") or 0) + 1,
                    last if isinstance(last, int) else step,
                ],
                "machine": prev_run["machine"],
                "device": prev_run.get("device"),
                "started": prev_run.get("started"),
            }
        ]
    kept = []
    for e in entries:
        s = _steps(e)
        if s is not None and s[0] <= min(s[1], step):
            kept.append({**e, "steps": [s[0], min(s[1], step)]})
    return kept


class Sessions:
    """run.json of a training invocation (`info`, the dict it writes) with the run's `train_seconds` and
    `machines`, and with a GRPO run's `memory` (`update.PassMemory`) its `memory_adjustments`, with its
    `gen` (`GenMemory`) its `generation_memory_adjustments`; `clock` counts the training time. `write`
    rewrites run.json; a checkpoint takes `extra` and calls `saved`."""

    def __init__(
        self,
        out: Path,
        info: dict,
        clock: TrainClock,
        start_step: int,
        kept: list[dict],
        memory: PassMemory | None = None,
        gen: GenMemory | None = None,
    ):
        self.out, self.info, self.clock, self.start_step, self.kept = out, info, clock, start_step, kept
        self.memory, self.gen = memory, gen

    def extra(self) -> dict:
        """A checkpoint's sidecar `extra` taken now: `train_seconds` so far, the `memory` and `gen` states."""
        return {
            "train_seconds": self.clock(),
            **(self.memory.sidecar() if self.memory is not None else {}),
            **(self.gen.sidecar() if self.gen is not None else {}),
        }

    def fields(self, last_step: int, seconds: float) -> dict:
        """run.json's `train_seconds`, `machines` (and `memory_adjustments`, `generation_memory_adjustments`)
        once this invocation trained up to `last_step` (an entry of its own only when that is past the
        step it started from)."""
        mine = {
            "steps": [self.start_step + 1, last_step],
            "machine": self.info.get("machine"),
            "device": self.info.get("device"),
            "started": self.info.get("started"),
        }
        memory = {} if self.memory is None else {"memory_adjustments": list(self.memory.adjustments)}
        if self.gen is not None:
            memory["generation_memory_adjustments"] = list(self.gen.policy.memory_adjustments)
        return {
            "train_seconds": round(seconds, 2),
            "machines": self.kept + ([mine] if last_step > self.start_step else []),
            **memory,
        }

    def write(self, last_step: int, seconds: float) -> None:
        self.info.update(self.fields(last_step, seconds))
        write_json_atomic(self.out / "run.json", self.info)

    def saved(self, step: int, seconds: float) -> None:
        """The checkpoint of `step` was saved with `seconds` of training: run.json says so."""
        self.write(step, seconds)
