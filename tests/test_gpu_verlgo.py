"""`gpu.sh verlgo` (issue #21 step 2 as one repeated device call) run on CPU with fakes: the real gpu.sh,
a committed-tree archive holding the real gpu.sh, config and src/ plus a fake scripts/verl-env.sh, and a
`python3` shim on PATH that hands `-m sqlrl.cli` to a fake CLI (train writes veRL-like step lines,
checkpoints and latest_checkpointed_iteration.txt; export and eval write their files), `-m pip` and
`-m ray.scripts.scripts` to a log, everything else to the real interpreter; a fake `nvidia-smi`.

Covered: the phases' order (setup, veRL install, train, export of the last step's actor, eval on the
validation split with the config's budgets), the train's environment (veRL's site first, the
save-before-expiry timestamp) and its sdpa attention (the arguments through the real `sqlrl train`), a
train stopped by the budget (`timeout`) and continued by the next call from its checkpoint, a tracker
left on a deleted step, a finished run skipped entirely, DEST within the device's 8 files (verlgo.tgz)
and nothing weight-like in it, the record returned after a failed setup, a stuck install and an export
stopped at the budget, a fresh machine without the staged veRL parts refused before setup. Not covered:
veRL, vLLM, Ray or a GPU (nothing real is trained; whether veRL honours the timestamp is read in its
code, not run)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FAKE_SQLRL = r"""
import json, os, sys, time
from pathlib import Path

def log(*words):
    with open(os.environ["PHASES"], "a") as f:
        f.write(" ".join(str(w) for w in words) + "\n")

def opt(args, name):
    return args[args.index(name) + 1]

args = sys.argv[2:]
if sys.argv[1:3] == ["model", "fetch"]:
    log("model-fetch", sys.argv[3])
    d = Path(os.environ["SQLRL_CACHE"]) / "models" / sys.argv[3]
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text("{}")
elif sys.argv[1] == "train":
    from sqlrl import config as C
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    cfg = C.load(args[0], sets)
    run = Path(opt(args, "--out"))
    ck = run / "checkpoints"
    latest = ck / "latest_checkpointed_iteration.txt"
    start = int(latest.read_text()) if latest.exists() else 0
    model = opt(args, "--model-path")
    assert Path(model, "config.json").is_file(), model
    assert os.environ["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    esi = int(os.environ["MLP_CURRENT_CAPACITY_BLOCK_EXPIRATION_TIMESTAMP"])
    with open(os.environ["PHASES"] + ".esi", "a") as f:
        f.write(f"{esi - int(time.time())}\n")
    with open(os.environ["PHASES"] + ".argv", "a") as f:
        f.write(json.dumps({"cwd": os.getcwd(), "args": args}) + "\n")
    log("train", "from", start, "engine", opt(args, "--engine"), "gpus", opt(args, "--gpus-per-node"),
        "attn", opt(args, "--attn-implementation"),
        "path0", os.environ["PYTHONPATH"].split(":")[0])
    if os.environ.get("FAKE_CRASH"):
        sys.exit("Traceback: fake veRL failure")
    (run / "data").mkdir(parents=True, exist_ok=True)
    (run / "verl.yaml").write_text(f"trainer:\n  total_training_steps: {cfg.grpo.steps}\n")
    (run / "data" / "gold_audit.json").write_text("{}")
    tb = Path(os.environ["TENSORBOARD_DIR"])
    tb.mkdir(parents=True, exist_ok=True)
    (tb / f"events.out.tfevents.{start}").write_bytes(b"tb")
    for s in range(start + 1, cfg.grpo.steps + 1):
        print(f"(TaskRunner pid=42) step:{s} - timing_s/step:{10 + s} - perf/throughput:{100 * s}", flush=True)
        if s % cfg.run.checkpoint_every == 0 or s == cfg.grpo.steps:
            actor = ck / f"global_step_{s}" / "actor"
            actor.mkdir(parents=True, exist_ok=True)
            (actor / "model_world_size_1_rank_0.pt").write_bytes(b"w" * 64)
            (actor.parent / "data.pt").write_bytes(b"d")
            latest.write_text(str(s))
        if start == 0 and s == int(os.environ.get("FAKE_HANG_AT", "0")):
            time.sleep(600)  # a run longer than the call's budget: `timeout` stops it
elif sys.argv[1] == "export":
    out = Path(opt(args, "-o"))
    log("export", Path(args[0]).relative_to(os.environ["SQLRL_SCRATCH"]), "path0",
        os.environ["PYTHONPATH"].split(":")[0])
    out.mkdir(parents=True)
    if os.environ.get("FAKE_EXPORT_HANG"):
        time.sleep(600)  # an export longer than what is left of the call: `timeout` stops it
    (out / "model.safetensors").write_bytes(b"w" * 64)
    (out / "identity.json").write_text('{"weights_hash": "h"}')
elif sys.argv[1] == "eval":
    out = Path(opt(args, "--out"))
    last = {a: args[len(args) - 1 - args[::-1].index(a) + 1] for a in args if a.startswith("--")}
    log("eval", Path(last["--model"]).relative_to(os.environ["SQLRL_SCRATCH"]), last["--split"],
        *(f"{k[2:]}={last[k]}" for k in ("--max-schema-chars", "--max-context-tokens", "--max-new-tokens",
                                         "--turns", "--val-fraction", "--engine", "--self-consistency")
          if k in last))
    out.mkdir(parents=True)
    (out / "summary.json").write_text('{"accuracy": 0.5}')
    (out / "results.jsonl").write_text('{"task_id": "t0", "solved": true}\n')
else:
    sys.exit(f"fake sqlrl: unexpected {sys.argv[1:]}")
"""

SHIM = """#!/bin/bash
if [ "$1" = -m ] && [ "$2" = sqlrl.cli ]; then shift 2; exec "$REAL_PY" "$FAKE_SQLRL" "$@"; fi
if [ "$1" = -m ] && [ "$2" = pip ]; then echo pip >> "$PHASES"; exit 0; fi
if [ "$1" = -m ] && [ "$2" = ray.scripts.scripts ]; then echo "ray $3" >> "$PHASES"; exit 0; fi
exec "$REAL_PY" "$@"
"""

NVIDIA_SMI = """#!/bin/bash
case "$*" in
  *-lms*) echo "timestamp, memory.used [MiB]"; i=0
          while :; do echo "2026/12/07 00:00:0$i.000, $((1000 + i)) MiB"; i=$(( (i + 1) % 10 )); sleep 0.2; done ;;
  *) echo "FakeGPU, 81559 MiB, 1" ;;
esac
"""


def _exe(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)


def _parts(folder: Path, chunks: list[bytes], name: str) -> None:
    folder.mkdir(parents=True)
    for i, c in enumerate(chunks):
        (folder / f"part{i:02d}").write_bytes(c)
    sha = hashlib.sha256(b"".join(chunks)).hexdigest()
    (folder / "MANIFEST").write_text(f"name {name}\nsha256 {sha}\nparts {len(chunks)}\n")


def _checkout(tmp: Path) -> tuple[Path, dict]:
    """A device-side checkout with staged files, and the environment of a call (fakes first on PATH)."""
    co = tmp / "checkout"
    _exe(co / "scripts" / "gpu.sh", (ROOT / "scripts" / "gpu.sh").read_text())
    _parts(co / ".stage" / "q", [b"gguf-a", b"gguf-b"], "qwen.gguf")
    _parts(co / ".stage" / "verl", [b"wheels-a", b"wheels-b"], "verl-wheels.tar")
    (co / ".whl").mkdir()
    (co / ".whl" / "x-1-py3-none-any.whl").write_bytes(b"whl")
    (tmp / "spider").mkdir()
    (tmp / "spider" / "tables.json").write_text("[]")
    with tarfile.open(co / ".stage" / "spider.tgz", "w:gz") as t:
        t.add(tmp / "spider", arcname="spider")
    fake_env = (
        '#!/bin/bash\necho "verl-install $1" >> "$PHASES"; mkdir -p "$3"\n'
        '[ -z "$FAKE_INSTALL_HANG" ] || sleep 600\n'
    )
    _exe(tmp / "tree-extra" / "scripts" / "verl-env.sh", fake_env)
    with tarfile.open(co / ".stage" / "tree.tgz", "w:gz") as t:
        t.add(ROOT / "scripts" / "gpu.sh", arcname="scripts/gpu.sh")
        t.add(ROOT / "scripts" / "verl_steps.py", arcname="scripts/verl_steps.py")
        t.add(tmp / "tree-extra" / "scripts" / "verl-env.sh", arcname="scripts/verl-env.sh")
        t.add(ROOT / "configs" / "spider-0.5b-gpu.toml", arcname="configs/spider-0.5b-gpu.toml")
        t.add(
            ROOT / "src" / "sqlrl",
            arcname="src/sqlrl",
            filter=lambda i: None if "__pycache__" in i.name else i,
        )
    _exe(tmp / "bin" / "python3", SHIM)
    _exe(tmp / "bin" / "nvidia-smi", NVIDIA_SMI)
    (tmp / "fake_sqlrl.py").write_text(FAKE_SQLRL)
    env = {
        **os.environ,
        "PATH": f"{tmp / 'bin'}:{os.environ['PATH']}",
        "REAL_PY": sys.executable,
        "FAKE_SQLRL": str(tmp / "fake_sqlrl.py"),
        "PHASES": str(tmp / "phases.log"),
        "SQLRL_SCRATCH": str(tmp / "S"),
        "GPU_PARTS": ".stage/q",
        "VERLGO_SETS": "grpo.steps=3 run.checkpoint_every=1",
        "VERLGO_RESERVE_S": "1",
        "VERLGO_MIN_S": "1",
        "VERLGO_SAVE_S": "2",
    }
    return co, env


def _gpu(co: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["bash", "scripts/gpu.sh", *args], cwd=co, env=env, capture_output=True, text=True, timeout=120
    )


def _phases(tmp: Path) -> list[str]:
    return (tmp / "phases.log").read_text().splitlines()


def _weight_like(dest: Path) -> list[str]:
    bad = (".safetensors", ".pt", ".bin", ".gguf", ".whl", ".tar")
    return [
        str(p.relative_to(dest))
        for p in dest.rglob("*")
        if p.suffix in bad
        or "global_step" in str(p)
        or p.name.startswith("part")
        or p.stat().st_size > 1 << 20
    ]


def _record(dest: Path) -> Path:
    """DEST as the device returns it (at most 8 files of at most 16 MiB, none in a folder), and the
    record unpacked from its verlgo.tgz (a folder beside DEST)."""
    files = sorted(p.name for p in dest.iterdir())
    assert len(files) <= 8 and "verlgo.tgz" in files, files
    assert all((dest / f).is_file() and (dest / f).stat().st_size <= 16 << 20 for f in files), files
    rec = dest.with_name(dest.name + "-record")
    with tarfile.open(dest / "verlgo.tgz") as t:
        t.extractall(rec, filter="data")
    for f in files:  # the files beside the archive are copies of the record's
        assert f == "verlgo.tgz" or (dest / f).read_bytes() == (rec / f).read_bytes(), f
    return rec


def test_verlgo_stops_at_the_budget_resumes_then_skips_what_is_done(tmp_path):
    co, env = _checkout(tmp_path)
    S = tmp_path / "S"
    for cmd in (["stage", "00"], ["verl", "stage", "00"]):
        assert _gpu(co, env, *cmd).returncode == 0
    # call 1: 8 s budget, 1 s reserve; the fake run hangs after checkpointing step 2 of 3
    d1 = tmp_path / "out1"
    r = _gpu(co, {**env, "FAKE_HANG_AT": "2"}, "verlgo", str(d1), "8")
    assert r.returncode == 0, r.stdout + r.stderr
    r1 = _record(d1)
    assert "train: exit 124" in r.stdout and "checkpointed step 2 of 3" in r.stdout, r.stdout
    assert "no new checkpoint" not in r.stdout
    site = f"path0 {S}/verl-site"
    first = ["pip", "model-fetch qwen2.5-coder-0.5b-instruct", "verl-install --gpu-install"]
    assert _phases(tmp_path) == [*first, f"train from 0 engine verl gpus 1 attn sdpa {site}", "ray stop"]
    assert (S / "verl-run" / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "2"
    # veRL's save-before-expiry timestamp: VERLGO_SAVE_S (2) before the train's `timeout` of `left` s
    left = int((r1 / "verl-run.log").read_text().split("train, ")[1].split(" s,")[0])
    esi_in = int((tmp_path / "phases.log.esi").read_text().split()[0])
    assert left - 2 - 2 <= esi_in <= left - 2, (left, esi_in)  # 2 s for the fake's start
    assert not (S / "verl-run" / "final").exists()
    assert "not finished" in r.stdout
    timings = (r1 / "timings.tsv").read_text().splitlines()
    assert [row.split("\t")[1:2] + row.split("\t")[3:4] for row in timings[1:]] == [
        ["setup", "0"],
        ["verl-install", "0"],
        ["train", "124"],
    ]
    assert (r1 / "verl-steps.log").read_text().splitlines() == [
        "step:1 - timing_s/step:11 - perf/throughput:100",
        "step:2 - timing_s/step:12 - perf/throughput:200",
    ]
    assert (r1 / "gpu_mem.csv").read_text().startswith("timestamp, memory.used [MiB]")
    # call 2: setup and install skipped; the run continues from step 2, then export and eval
    d2 = tmp_path / "out2"
    r = _gpu(
        co, {**env, "FAKE_HANG_AT": "2", "VERLGO_EVAL_ARGS": "--self-consistency 4"}, "verlgo", str(d2), "120"
    )
    assert r.returncode == 0, r.stdout + r.stderr
    r2 = _record(d2)
    assert _phases(tmp_path)[5:] == [
        f"train from 2 engine verl gpus 1 attn sdpa {site}",
        "ray stop",  # after a finished train too: nothing of veRL holds the GPU during the eval
        "export verl-run/checkpoints/global_step_3/actor path0 /tmp/site",
        # the config's budgets (configs/spider-0.5b-gpu.toml: 6000 chars, 3072 tokens, 256 new tokens,
        # 1 turn, val_fraction 0.1), not `sqlrl eval`'s defaults (8000, 4096); VERLGO_EVAL_ARGS added last
        "eval verl-run/final validation max-schema-chars=6000 max-context-tokens=3072 max-new-tokens=256"
        " turns=1 val-fraction=0.1 engine=auto self-consistency=4",
    ]
    assert "verlgo: done" in r.stdout
    steps = (r2 / "verl-steps.log").read_text().splitlines()
    assert [s.split(" - ")[0] for s in steps] == ["step:1", "step:2", "step:3"]
    for name in (
        "verl.yaml",
        "summary.json",
        "results.jsonl",
        "final_identity.json",
        "gpu_mem.csv",
        "eval.log",
    ):
        assert (r2 / name).is_file(), name
    assert (r2 / "tensorboard" / "events.out.tfevents.2").is_file()
    assert [row.split("\t")[:2] for row in (r2 / "timings.tsv").read_text().splitlines()[4:]] == [
        ["2", "train"],
        ["2", "export"],
        ["2", "eval"],
    ]
    summary = json.loads((r2 / "verl_summary.json").read_text())
    assert summary["steps_logged"] == 3 and summary["time_step_s"]["median"] == 12.0
    assert summary["throughput_tokens_per_s_per_gpu"]["mean"] == 200.0
    assert summary["gpu_memory_used_peak_mib"] >= 1000
    assert summary["phases"]["train"] == {
        "seconds": summary["phases"]["train"]["seconds"],
        "calls": 2,
        "rc": [124, 0],
    }
    assert len((r2 / "verl_steps.jsonl").read_text().splitlines()) == 3
    assert (S / "verl-run" / "final" / "model.safetensors").is_file()  # the weights stay on the machine
    assert _weight_like(r1) == [] and _weight_like(r2) == []
    assert sorted(p.name for p in d2.iterdir()) == [
        "final_identity.json",
        "summary.json",
        "timings.tsv",
        "verl-steps.log",
        "verl_summary.json",
        "verlgo.tgz",
    ]
    # call 3: everything done, nothing runs again; DEST still gets the record
    d3 = tmp_path / "out3"
    r = _gpu(co, env, "verlgo", str(d3), "120")
    assert r.returncode == 0 and "verlgo: done" in r.stdout, r.stdout + r.stderr
    assert len(_phases(tmp_path)) == 9
    r3 = _record(d3)
    assert (r3 / "summary.json").is_file() and _weight_like(r3) == []


def test_verlgo_trains_with_sdpa_attention_through_the_real_train_cli(tmp_path, monkeypatch):
    """The GPU machine has no flash_attn: the train arguments gpu.sh passes, parsed by the real `sqlrl
    train --engine verl`, ask `verl-config` for sdpa (not `auto`, which would follow whatever imports)."""
    import sqlrl.cli.verl_config as vcli
    from sqlrl.cli.train import cli_main

    co, env = _checkout(tmp_path)
    for cmd in (["stage", "00"], ["verl", "stage", "00"]):
        assert _gpu(co, env, *cmd).returncode == 0
    r = _gpu(co, env, "verlgo", str(tmp_path / "out"), "120")
    assert r.returncode == 0, r.stdout + r.stderr
    call = json.loads((tmp_path / "phases.log.argv").read_text().splitlines()[0])
    seen: list[list[str]] = []
    monkeypatch.setattr(vcli, "cli_main", lambda args: seen.append(args) or 0)
    monkeypatch.chdir(call["cwd"])
    assert cli_main([*call["args"], "--dry-run"]) == 0
    args = seen[0]
    assert args[args.index("--attn-implementation") + 1] == "sdpa"
    assert args[args.index("--gpus-per-node") + 1] == "1"


def test_verlgo_refuses_a_fresh_machine_before_setup(tmp_path):
    """Only the carried last veRL part is there (the machine was given back after the staging calls)."""
    co, env = _checkout(tmp_path)
    (co / ".stage" / "verl" / "part00").unlink()
    r = _gpu(co, env, "verlgo", str(tmp_path / "out"), "60")
    assert r.returncode == 1
    assert "1 of 2 veRL parts staged" in r.stderr and "gpu.sh verl stage NN" in r.stderr, r.stderr
    assert not (tmp_path / "phases.log").exists() and not (tmp_path / "S" / "tree").exists()


def test_verlgo_failed_setup_still_returns_the_record(tmp_path):
    """The model's parts do not join to their MANIFEST: setup fails, the call exits 1 before veRL's
    install, and DEST still holds the record (setup.log, timings) in verlgo.tgz."""
    co, env = _checkout(tmp_path)
    (co / ".stage" / "q" / "part00").write_bytes(b"gguf-X")
    r = _gpu(co, env, "verlgo", str(tmp_path / "out"), "60")
    assert r.returncode == 1, r.stdout + r.stderr
    rec = _record(tmp_path / "out")
    assert "sha256 mismatch" in (rec / "setup.log").read_text()
    rows = (rec / "timings.tsv").read_text().splitlines()[1:]
    assert [row.split("\t")[1] + " " + row.split("\t")[3] for row in rows] == ["setup 1"]
    assert not (tmp_path / "phases.log").exists()  # neither pip, veRL's install nor a train ran


def test_verlgo_resumes_from_the_newest_complete_step_when_the_tracker_names_a_deleted_one(tmp_path):
    """A kill between veRL deleting step 2 (keep_checkpoints = 1) and writing the tracker for step 3:
    the tracker says 2, global_step_2 is gone, global_step_3 has its actor but no data.pt, global_step_1
    is complete. The call points the tracker at 1 (veRL would otherwise start from 0) and trains from 1;
    with no complete step left it says veRL starts again."""
    co, env = _checkout(tmp_path)
    ck = tmp_path / "S" / "verl-run" / "checkpoints"
    for step, data in ((1, True), (3, False)):
        (ck / f"global_step_{step}" / "actor").mkdir(parents=True)
        if data:
            (ck / f"global_step_{step}" / "data.pt").write_bytes(b"d")
    (ck / "latest_checkpointed_iteration.txt").write_text("2")
    r = _gpu(
        co, {**env, "VERLGO_SETS": "grpo.steps=4 run.checkpoint_every=1"}, "verlgo", str(tmp_path / "o"), "60"
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert (
        "the tracker named step 2, whose folder is gone (a kill mid-save); resuming from step 1" in r.stdout
    )
    assert [p for p in _phases(tmp_path) if p.startswith("train")][0].startswith("train from 1 ")
    # nothing complete left: the call says so
    co2, env2 = _checkout(tmp_path / "b")
    ck2 = tmp_path / "b" / "S" / "verl-run" / "checkpoints"
    (ck2 / "global_step_3" / "actor").mkdir(parents=True)
    (ck2 / "latest_checkpointed_iteration.txt").write_text("2")
    r = _gpu(co2, env2, "verlgo", str(tmp_path / "b" / "o"), "60")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no complete step is left: veRL starts again from step 0" in r.stdout


def test_verlgo_export_stopped_at_the_budget_is_not_a_failure(tmp_path):
    """The train finishes, the export is stopped by the call's budget (exit 124): the call exits 0 and
    says to run it again; the next call exports from a clean final.tmp and evaluates."""
    co, env = _checkout(tmp_path)
    r = _gpu(co, {**env, "FAKE_EXPORT_HANG": "1"}, "verlgo", str(tmp_path / "o1"), "18")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "verlgo: not finished" in r.stdout
    rows = (_record(tmp_path / "o1") / "timings.tsv").read_text().splitlines()[1:]
    assert [row.split("\t")[1] + " " + row.split("\t")[3] for row in rows][-2:] == ["train 0", "export 124"]
    r = _gpu(co, env, "verlgo", str(tmp_path / "o2"), "60")
    assert r.returncode == 0 and "verlgo: done" in r.stdout, r.stdout + r.stderr
    assert [p.split()[0] for p in _phases(tmp_path)][-3:] == ["export", "export", "eval"]


def test_verlgo_stuck_install_is_stopped_and_returns_the_record(tmp_path):
    """veRL's install hangs: it is stopped 20 s before the budget (exit 124), the call exits 1 and DEST
    holds the install's log and timings; no train starts."""
    co, env = _checkout(tmp_path)
    r = _gpu(co, {**env, "FAKE_INSTALL_HANG": "1"}, "verlgo", str(tmp_path / "o"), "24")
    assert r.returncode == 1, r.stdout + r.stderr
    rows = (_record(tmp_path / "o") / "timings.tsv").read_text().splitlines()[1:]
    assert [row.split("\t")[1] + " " + row.split("\t")[3] for row in rows] == ["setup 0", "verl-install 124"]
    assert not (tmp_path / "S" / "verl.done").exists()
    assert [p.split()[0] for p in _phases(tmp_path)] == ["pip", "model-fetch", "verl-install"]


def test_verlgo_reports_a_crashed_train_and_exports_nothing(tmp_path):
    """A train that fails (not the budget) makes the call exit 1 with the log's tail; no export or eval."""
    co, env = _checkout(tmp_path)
    r = _gpu(co, {**env, "FAKE_CRASH": "1"}, "verlgo", str(tmp_path / "out"), "60")
    assert r.returncode == 1, r.stdout + r.stderr
    assert [p.split()[0] for p in _phases(tmp_path)] == ["pip", "model-fetch", "verl-install", "train", "ray"]
    assert "train: exit 1" in r.stdout and "fake veRL failure" in r.stdout, r.stdout
    assert "no new checkpoint in this call (still none)" in r.stdout
    rec = _record(tmp_path / "out")
    assert "fake veRL failure" in (rec / "verl-run.log").read_text()
    assert not (tmp_path / "S" / "verl-run" / "final").exists()


def test_verl_steps_reads_a_resumed_log(tmp_path):
    """Hand-made: step 2 logged twice (a resumed run redoing it: the last record counts), Ray's prefix on
    some lines, a non-number value skipped, numpy scalars as veRL prints them (`np.float64(6.25)`); two
    calls' nvidia-smi samples with repeated headers; step times 10, 30 (not 20), 20: mean 20, median 20, max 30; peak 5120 MiB; train 100 + 50 s in 2 calls."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import verl_steps
    finally:
        sys.path.pop(0)
    log = tmp_path / "verl-run.log"
    log.write_text(
        "== call 1\nstep:1 - timing_s/step:10.0 - perf/throughput:100 - perf/max_memory_allocated_gb:4.5\n"
        "(TaskRunner pid=7) step:2 - timing_s/step:20.0 - perf/throughput:200 - note:x\nKilled\n"
        "(TaskRunner pid=9) step:2 - timing_s/step:30.0 - perf/throughput:300\n"
        "step:3 - timing_s/step:20.0 - perf/throughput:400 - perf/max_memory_allocated_gb:np.float64(6.25)"
        " - perf/max_memory_reserved_gb:np.float64(7.5) - actor/pg_loss:np.float64(-1.5e-05)\n"
    )
    mem = tmp_path / "gpu_mem.csv"
    mem.write_text(
        "timestamp, memory.used [MiB]\nt, 1 MiB\nt, 5120 MiB\ntimestamp, memory.used [MiB]\nt, 4000 MiB\n"
    )
    tsv = tmp_path / "timings.tsv"
    tsv.write_text("call\tphase\tseconds\trc\tended\n1\ttrain\t100\t124\tx\n2\ttrain\t50\t0\tx\n")
    out, js = tmp_path / "s.jsonl", tmp_path / "s.json"
    args = [str(log), "--mem", str(mem), "--timings", str(tsv), "--jsonl", str(out), "--json", str(js)]
    assert verl_steps.main(args) == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert rows[1] == {"step": 2, "timing_s/step": 30.0, "perf/throughput": 300.0}
    s = json.loads(js.read_text())
    assert s["steps_logged"] == 3 and s["last_step"] == 3
    assert s["time_step_s"] == {"n": 3, "mean": 20.0, "median": 20.0, "max": 30.0}
    assert s["throughput_tokens_per_s_per_gpu"]["mean"] == (100 + 300 + 400) / 3
    assert rows[2]["actor/pg_loss"] == -1.5e-05  # veRL's numpy scalars, `np.float64(x)` under numpy 2
    assert s["max_memory_allocated_gb"] == 6.25 and s["max_memory_reserved_gb"] == 7.5
    assert s["gpu_memory_used_peak_mib"] == 5120.0
    assert s["phases"] == {"train": {"seconds": 150, "calls": 2, "rc": [124, 0]}}
    assert verl_steps.main([str(tmp_path / "none.log"), "--jsonl", str(out), "--json", str(js)]) == 2
