"""examples/slurm/verl-multinode.sbatch: it parses, and run with stand-ins for the cluster's commands it
starts one Ray head and a worker per other node and runs a sqlrl command line the real CLI accepts.

The stand-ins (`scontrol`, `srun`, `ray`, `sqlrl`; a fake venv puts them first on PATH) log what they are
given; `srun` runs its command, `ray status` lists the fake nodes, `sqlrl` records its argv. The recorded
argv then goes through `sqlrl`'s own CLI: without veRL up to the veRL config writer (replaced by a
recorder); with veRL (`scripts/verl-env.sh --test`) the whole `--dry-run` on the embedded Spider subset,
veRL's validation of the 2 x 8 GPU config included.

Not covered: SLURM itself (no cluster here), `ray start` and the GPU run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SBATCH = ROOT / "examples" / "slurm" / "verl-multinode.sbatch"
NODES = ["gpu-a", "gpu-b", "gpu-c"]
needs_verl = pytest.mark.skipif(
    importlib.util.find_spec("verl") is None, reason="veRL not importable; run scripts/verl-env.sh --test"
)

STUBS = {
    "scontrol": 'echo "scontrol $*" >> "$STUB_LOG"; [ "$1 $2" = "show hostnames" ] && tr " " "\\n" <<< "$FAKE_NODES"\n',
    # srun: log, drop the --options, run the rest
    "srun": 'echo "srun $*" >> "$STUB_LOG"\nwhile [ "${1:0:2}" = -- ]; do shift; done\nexec "$@"\n',
    "ray": 'echo "ray $*" >> "$STUB_LOG"\nif [ "$1" = status ]; then for n in $FAKE_NODES; do echo " 1 node_$n"; done; fi\n',
    "sqlrl": 'printf "%s\\0" "$@" > "$SQLRL_ARGV"\n',
}


def _run(tmp_path: Path, **env) -> tuple[subprocess.CompletedProcess, list[str], list[str]]:
    """Run the sbatch script with the stand-ins; (result, stand-ins' log lines, sqlrl's argv)."""
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    for name, body in STUBS.items():
        (stubs / name).write_text("#!/usr/bin/env bash\n" + body)
        (stubs / name).chmod(0o755)
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "activate").write_text(f'export PATH="{stubs}:$PATH"\n')
    log, argv = tmp_path / "stub.log", tmp_path / "sqlrl.argv"
    full = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "SLURM_JOB_NODELIST": "gpu-[a-c]",
        "SLURM_NNODES": str(len(NODES)),
        "SLURM_JOB_ID": "42",
        "FAKE_NODES": " ".join(NODES),
        "STUB_LOG": str(log),
        "SQLRL_ARGV": str(argv),
        "SHARED": "/lustre/team",
        "SQLRL_DIR": str(ROOT),
        "VENV": str(venv),
        "RAY_HEAD_WAIT_S": "0",
        **env,
    }
    r = subprocess.run(["bash", str(SBATCH)], env=full, capture_output=True, text=True, timeout=60)
    lines = log.read_text().splitlines() if log.exists() else []
    args = argv.read_text().split("\0")[:-1] if argv.exists() else []
    return r, lines, args


def test_sbatch_parses():
    r = subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_sbatch_starts_a_head_and_a_worker_per_other_node_then_trains_on_the_head(tmp_path):
    r, log, argv = _run(tmp_path, GPUS_PER_NODE="4")
    assert r.returncode == 0, r.stderr
    starts = [ln for ln in log if ln.startswith("srun") and "ray start" in ln]  # in the background: any order
    heads = [ln for ln in starts if "--head" in ln]
    assert len(starts) == 3 and len(heads) == 1
    assert "--nodelist=gpu-a ray start --head" in heads[0] and "--num-gpus=4 --block" in heads[0]
    ip = heads[0].split("--node-ip-address=")[1].split()[0]
    workers = sorted(ln.split("--nodelist=")[1] for ln in starts if ln not in heads)
    assert workers == [f"{n} ray start --address={ip}:6379 --num-gpus=4 --block" for n in NODES[1:]]
    trains = [i for i, ln in enumerate(log) if "sqlrl train" in ln]
    assert len(trains) == 1 and log[trains[0]].startswith(
        "srun --overlap --nodes=1 --ntasks=1 --nodelist=gpu-a "
    )
    assert trains[0] > log.index(f"ray status --address={ip}:6379")  # after the wait for the nodes
    assert argv == [
        "train", "configs/spider-0.5b-gpu.toml", "--engine", "verl", "--out", "/lustre/team/runs/spider-verl-42",
        "--nnodes", "3", "--gpus-per-node", "4", "--model-path", "/lustre/team/models/qwen2.5-coder-0.5b-instruct",
        "--set", 'data.path="/lustre/team/data/spider"',
    ]  # fmt: skip


def test_sbatch_dry_run_starts_no_ray(tmp_path):
    r, log, argv = _run(tmp_path, DRY_RUN="1")
    assert r.returncode == 0, r.stderr
    assert not [ln for ln in log if ln.startswith("ray") or "ray start" in ln]
    assert argv[-1] == "--dry-run" and argv[argv.index("--gpus-per-node") + 1] == "8"


def test_sbatch_gives_up_when_a_node_does_not_join(tmp_path):
    r, _, argv = _run(tmp_path, FAKE_NODES="gpu-a gpu-b", SLURM_NNODES="3", RAY_WAIT_S="0")
    assert r.returncode == 1 and "fewer than 3 nodes joined the Ray cluster" in r.stderr
    assert argv == []


def test_the_sbatch_command_line_parses_with_the_real_cli(tmp_path, monkeypatch):
    """`sqlrl train ...` as the script runs it (plus --dry-run), through sqlrl's own argument parsing, up to
    the veRL config writer."""
    import sqlrl.cli.verl_config as vcli
    from sqlrl.cli import main

    _, _, argv = _run(tmp_path, RUN=str(tmp_path / "run"))
    seen: list[list[str]] = []
    monkeypatch.setattr(vcli, "cli_main", lambda args: seen.append(args) or 0)
    monkeypatch.chdir(ROOT)
    assert main([*argv, "--dry-run"]) == 0
    args = seen[0]
    assert args[args.index("--nnodes") + 1] == "3" and args[args.index("--gpus-per-node") + 1] == "8"
    assert args[args.index("--set") + 1] == 'data.path="/lustre/team/data/spider"'


@needs_verl
def test_the_sbatch_dry_run_passes_verls_validation_for_two_nodes_of_eight(tmp_path, monkeypatch):
    import yaml

    from sqlrl.cli import main

    env = {"RUN": str(tmp_path / "run"), "DATA": "embedded", "SLURM_NNODES": "2", "FAKE_NODES": "gpu-a gpu-b"}
    _, _, argv = _run(tmp_path, **env)
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("SQLRL_GOLD_CACHE", str(tmp_path / "gc"))
    assert main([*argv, "--dry-run"]) == 0
    d = yaml.safe_load((tmp_path / "run" / "verl.yaml").read_text())
    assert (d["trainer"]["nnodes"], d["trainer"]["n_gpus_per_node"]) == (2, 8)
    assert d["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]["SQLRL_GOLD_CACHE"] == str(tmp_path / "gc")
    assert (
        json.loads((tmp_path / "run" / "data" / "gold_audit.json").read_text())["splits"]["train"]["written"]
        > 0
    )
