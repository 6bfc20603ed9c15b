"""The shell scripts parse, gpu.sh answers an unknown command with its usage and exit code 2, and
curriculum_stats.py computes its paired tests on hand-made outcomes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("script", sorted(p.name for p in (ROOT / "scripts").glob("*.sh")))
def test_shell_scripts_parse(script):
    r = subprocess.run(["bash", "-n", str(ROOT / "scripts" / script)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_gpu_sh_usage(tmp_path):
    env = {**os.environ, "SQLRL_SCRATCH": str(tmp_path / "scratch")}
    r = subprocess.run(
        ["bash", "scripts/gpu.sh", "no-such-command"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert r.returncode == 2 and "preflight" in r.stderr and "go DEST" in r.stderr


def _results(folder: Path, solved: dict[str, list]) -> None:
    folder.mkdir(parents=True)
    with (folder / "results.jsonl").open("w") as f:
        for i, s in enumerate(solved):
            f.write(json.dumps({"task_id": f"t{i}", "solved": s}) + "\n")


def test_curriculum_stats(tmp_path):
    """Hand-made outcomes: base solves 2 of 6, sft 5 of 6 (gains t2, t3, t4; loses none); t5 excluded
    (None) for grpo-single, so sft -> grpo-single pairs 5 tasks. McNemar on 3 discordant pairs, all one
    way: p = 2 * 0.5**3 = 0.25."""
    ev = tmp_path / "evals"
    _results(ev / "base-t1", [True, True, False, False, False, False])
    _results(ev / "sft-t1", [True, True, True, True, True, False])
    _results(ev / "grpo-single-t1", [True, True, True, True, True, None])
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "curriculum_stats.py"), str(tmp_path)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    rows = json.loads((tmp_path / "paired_stats.json").read_text())
    got = {(x["a"], x["b"]): x for x in rows}
    assert set(got) == {("base", "sft"), ("sft", "grpo-single")}  # grpo-multi was not evaluated
    bs = got[("base", "sft")]
    assert bs["n"] == 6 and bs["mcnemar"]["n01"] == 3 and bs["mcnemar"]["n10"] == 0
    assert bs["mcnemar"]["p_value"] == pytest.approx(0.25, abs=1e-12)
    assert bs["bootstrap"]["diff"] == pytest.approx(0.5, abs=1e-12)
    assert got[("sft", "grpo-single")]["n"] == 5 and got[("sft", "grpo-single")]["mcnemar"]["discordant"] == 0
    bad = subprocess.run([sys.executable, str(ROOT / "scripts" / "curriculum_stats.py")], capture_output=True)
    assert bad.returncode == 2


def test_run_records_name_the_commit_of_an_unpacked_git_archive(tmp_path):
    """On the GPU machine the code is a `git archive` unpacked without .git: `gpu.sh tree` writes the
    archive's commit (from its pax header) to .sqlrl_commit, and git_commit() reports it."""
    from sqlrl.artifacts import archive_commit, git_commit

    repo = tmp_path / "repo"
    (repo / "src" / "sqlrl").mkdir(parents=True)
    (repo / "src" / "sqlrl" / "x.py").write_text("x = 1\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    sha = subprocess.run(
        [*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    tgz = tmp_path / "tree.tgz"
    subprocess.run([*git, "archive", "--format=tar.gz", "-o", str(tgz), "HEAD"], check=True)
    assert archive_commit(tgz) == sha
    assert archive_commit(tmp_path / "missing.tgz") is None
    tree = tmp_path / "unpacked"
    (tree / "src" / "sqlrl").mkdir(parents=True)
    assert git_commit(tree / "src" / "sqlrl") == {"commit": None, "dirty": None}
    (tree / ".sqlrl_commit").write_text(sha + "\n")
    assert git_commit(tree / "src" / "sqlrl") == {"commit": sha, "dirty": None, "source": "git archive"}
    (tree / ".sqlrl_commit").write_text("not a commit\n")
    assert git_commit(tree / "src" / "sqlrl")["commit"] is None
    # a real checkout still answers from git
    assert git_commit(repo / "src" / "sqlrl") == {"commit": sha, "dirty": False}


@pytest.mark.skipif(
    not (ROOT.parent / "shared" / "data" / "spider" / "train_spider.json").is_file(),
    reason="needs ../shared/data/spider",
)
def test_bench_reward_stream_runs_on_the_committed_stream(tmp_path):
    """bench_reward_stream.py on the first step of one committed training stream: 256 pairs, every
    verdict of ours agrees with the naive scorer, and both scorers' times are recorded."""
    out = tmp_path / "s.json"
    cmd = [sys.executable, "bench/bench_reward_stream.py", "--steps", "1", "--arms", "grpo"]
    r = subprocess.run(
        [*cmd, "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert r.returncode == 0, r.stderr[-2000:]
    arm = json.loads(out.read_text())["arms"]["grpo"]
    assert arm["pairs"] == 256 and arm["calls"] == 1 and arm["reward_kind"] == "execution"
    n_agree, n = map(int, arm["verdict_agreement_with_naive"].split("/"))
    assert n_agree == n >= 250
    assert arm["naive_s"] > 0 and arm["ours_s"] > 0 and arm["ratio"] > 0


def test_same_sql_compares_eval_and_training_records(tmp_path):
    import gzip

    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import same_sql
    finally:
        sys.path.pop(0)
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl.gz"
    rows = [
        {"task_id": "t1", "final_sql": "SELECT 1", "status": "match"},
        {"task_id": "t2", "final_sql": "X"},
    ]
    a.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with gzip.open(b, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    assert same_sql.main([str(a), str(b)]) == 0
    rows[1]["final_sql"] = "Y"
    b.write_text("".join(json.dumps(r) + "\n" for r in rows))
    b = b.rename(tmp_path / "b.jsonl")
    assert same_sql.main([str(a), str(b)]) == 1
    same, diffs = same_sql.compare(same_sql.read(str(a)), same_sql.read(str(b)))
    assert same == 1 and diffs == ["('t2',): 'X' != 'Y'"]
    train = [{"step": 1, "round": 0, "task_id": "t1", "sample": s, "final_sql": "S"} for s in range(2)]
    c = tmp_path / "c.jsonl"
    c.write_text("".join(json.dumps(r) + "\n" for r in train[:1]))
    d = tmp_path / "d.jsonl"
    d.write_text("".join(json.dumps(r) + "\n" for r in train))
    same, diffs = same_sql.compare(same_sql.read(str(c)), same_sql.read(str(d)))
    assert same == 1 and diffs == ["only in B: (1, 0, 't1', 1)"]


def test_error_kinds_counts_statuses_and_execution_errors_per_arm(tmp_path):
    """Two hand-made arms. base: 3 scored (a match; an exec error whose row has its message; one whose
    row has none, as an older folder's, its message from the gzipped trajectories), 1 unscorable gold;
    grpo: a match, an infrastructure failure (excluded, not scored), a sandbox refusal."""
    import gzip

    def row(tid, status, reward, error=None):
        return json.dumps(
            {"task_id": tid, "status": status, "reward": reward, **({"error": error} if error else {})}
        )

    exp = tmp_path / "exp"
    base, grpo = exp / "arms/base/eval", exp / "arms/grpo/eval"
    base.mkdir(parents=True)
    grpo.mkdir(parents=True)
    (base / "results.jsonl").write_text(
        "\n".join(
            [
                row("t0", "match", 1.0),
                row("t1", "exec_error", 0.0, "no such column: T1.x"),
                row("t2", "exec_error", 0.0),
                row("t3", "gold_unscorable", None),
            ]
        )
        + "\n"
    )
    reward = {
        "status": "exec_error",
        "parts": {"sandbox_status": "syntax_error", "message": 'near "FROM": syntax error'},
    }
    with gzip.open(base / "trajectories.jsonl.gz", "wt") as f:
        f.write(json.dumps({"task_id": "t2", "reward": reward}) + "\n")
    (grpo / "results.jsonl").write_text(
        "\n".join(
            [
                row("t0", "match", 1.0),
                row("t1", "infra_error", None),
                row("t2", "exec_error", 0.0, "too_many_rows: more than 100000 rows"),
            ]
        )
        + "\n"
    )
    out = tmp_path / "k.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "error_kinds.py"), str(exp), "--json", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text()) == {
        "base": {
            "scored": 3,
            "statuses": {"exec_error": 2, "match": 1},
            "excluded": {"gold_unscorable": 1},
            "exec_errors": {"no such column": 1, "syntax error": 1},
        },
        "grpo": {
            "scored": 2,
            "statuses": {"match": 1, "exec_error": 1},
            "excluded": {"infra_error": 1},
            "exec_errors": {"too_many_rows": 1},
        },
    }
    assert "base: 3 scored: exec_error 2 (66.7%), match 1 (33.3%)" in r.stdout
    empty = subprocess.run([*cmd[:2], str(tmp_path / "none")], capture_output=True, text=True)
    assert empty.returncode == 2 and "no arms/*/eval/results.jsonl" in empty.stderr


def test_gpu_sh_collect_puts_a_pack_into_a_results_folder(tmp_path):
    """A pack of exp1s1 (a training log, an eval with trajectories, an empty .leakage folder) over a results
    folder holding COMMANDS.md and an older gzipped trajectory file: the pack's files land, the three logs
    are gzipped (the old .gz replaced), results.jsonl stays plain, COMMANDS.md is kept, no empty folder."""
    import gzip
    import tarfile

    src = tmp_path / "src" / "exp1s1"
    (src / "arms/grpo/train").mkdir(parents=True)
    (src / "arms/grpo/eval").mkdir(parents=True)
    (src / ".leakage").mkdir()
    (src / "arms/grpo/train/sql.jsonl").write_text('{"sql": 1}\n')
    (src / "arms/grpo/eval/trajectories.jsonl").write_text('{"t": "new"}\n')
    (src / "arms/grpo/eval/results.jsonl").write_text('{"r": 1}\n')
    (src / "report.md").write_text("# report\n")
    pack = tmp_path / "exp.tgz"
    with tarfile.open(pack, "w:gz") as tar:
        tar.add(src, arcname="exp1s1")
    dest = tmp_path / "results" / "seed1"
    (dest / "arms/grpo/eval").mkdir(parents=True)
    (dest / "COMMANDS.md").write_text("calls\n")
    with gzip.open(dest / "arms/grpo/eval/trajectories.jsonl.gz", "wt") as f:
        f.write('{"t": "old"}\n')

    def collect(*args):
        return subprocess.run(
            ["bash", "scripts/gpu.sh", "collect", *args], cwd=ROOT, capture_output=True, text=True
        )

    r = collect(str(pack), str(dest))
    assert r.returncode == 0, r.stderr
    files = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert files == [
        "COMMANDS.md",
        "arms/grpo/eval/results.jsonl",
        "arms/grpo/eval/trajectories.jsonl.gz",
        "arms/grpo/train/sql.jsonl.gz",
        "report.md",
    ]
    assert gzip.open(dest / "arms/grpo/eval/trajectories.jsonl.gz", "rt").read() == '{"t": "new"}\n'
    assert (dest / "COMMANDS.md").read_text() == "calls\n" and not (dest / ".leakage").exists()
    missing = collect(str(tmp_path / "none.tgz"), str(dest))
    assert missing.returncode == 2 and missing.stderr == f"collect: no file {tmp_path / 'none.tgz'}\n"
    blocked = tmp_path / "file"
    blocked.write_text("")  # DEST under a file: mkdir fails, nothing reported as collected
    failed = collect(str(pack), str(blocked / "dest"))
    assert failed.returncode == 1 and not failed.stdout
    assert failed.stderr.startswith(f"collect: copying into {blocked / 'dest'} failed: mkdir: ")
    assert failed.stderr.count("\n") == 1
    (tmp_path / "bad.tgz").write_text("not a tar")
    bad = collect(str(tmp_path / "bad.tgz"), str(dest))
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not a .tgz" in bad.stderr


def test_score_share_reads_a_runs_steps(tmp_path):
    """Hand-made steps: 3 steps of 10 + 10 + 20 s with 1 + 3 + 0.5 s scoring (step 2 written twice by a
    resumed run: its last record counts): share 4.5 / 40 = 11.25 %, slowest step 2 at 3 s (one step over
    2 s), 0 + 2 + 1 = 3 deadline timeouts, longest prediction 1.0 s."""
    f = tmp_path / "steps.jsonl"

    def rec(step, total, score, timeouts, longest):
        return {
            "step": step,
            "time_step_s": total,
            "time_rollout_s": total - score - 1,
            "time_score_s": score,
            "time_update_s": 1.0,
            "score_timeouts": timeouts,
            "score_max_exec_s": longest,
        }

    rows = [
        rec(1, 10, 1.0, 0, 0.2),
        rec(2, 12, 9.0, 5, 5.0),
        rec(2, 10, 3.0, 2, 1.0),
        rec(3, 20, 0.5, 1, 1.0),
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "s.json"
    cmd = [sys.executable, str(ROOT / "scripts" / "score_share.py"), str(f), "--json", str(out)]
    r = subprocess.run([*cmd, "--steps", "3"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    s = json.loads(out.read_text())
    assert (s["steps"], s["time_step_s"], s["time_score_s"]) == (3, 40.0, 4.5)
    assert s["score_share"] == 0.1125 and s["target_share_le_10pct"] is False
    assert (s["max_step_score_s"], s["max_step_score_at"], s["steps_scoring_over_2s"]) == (3.0, 2, 1)
    assert (s["score_timeouts"], s["max_prediction_exec_s"]) == (3, 1.0)
    assert "11.2%" in r.stdout and "NOT met" in r.stdout
    assert subprocess.run([*cmd, "--steps", "100"], capture_output=True).returncode == 1
    assert subprocess.run([*cmd[:2], str(tmp_path / "none.jsonl")], capture_output=True).returncode == 2


def _fake_bin(folder: Path, uid: int, with_chromium: bool = False) -> Path:
    """A PATH with only a fake `id` (printing `uid`), a fake `apt-get` that logs its arguments, and
    optionally a fake `chromium`."""
    folder.mkdir()
    log = folder / "apt.log"
    for name, body in (("id", f"echo {uid}"), ("apt-get", f'echo "$@" >> {log}')):
        (folder / name).write_text(f"#!/bin/sh\n{body}\n")
        (folder / name).chmod(0o755)
    if with_chromium:
        (folder / "chromium").write_text("#!/bin/sh\n")
        (folder / "chromium").chmod(0o755)
    return log


@pytest.mark.parametrize(
    ("uid", "opt_in", "chromium", "apt_calls", "says"),
    [
        (0, False, False, [], "install chromium (e.g. sudo apt-get install chromium) or rerun with"),
        (0, True, False, ["update -qq", "install -y -qq chromium"], "installing the Debian package"),
        (1000, True, False, [], "needs root and apt-get"),
        (0, True, True, [], ""),
    ],
)
def test_chromium_sh_installs_system_wide_only_when_asked(tmp_path, uid, opt_in, chromium, apt_calls, says):
    """scripts/test.sh's Chromium step: as root without SQLRL_INSTALL_CHROMIUM=1 it installs nothing and
    says how to get the skipped test; with it (root + apt-get) it installs; a chromium on PATH is used."""
    log = _fake_bin(tmp_path / "bin", uid, chromium)
    env = {"PATH": str(tmp_path / "bin"), **({"SQLRL_INSTALL_CHROMIUM": "1"} if opt_in else {})}
    bash = subprocess.run(["sh", "-c", "command -v bash"], capture_output=True, text=True).stdout.strip()
    r = subprocess.run([bash, str(ROOT / "scripts" / "chromium.sh")], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert (log.read_text().splitlines() if log.exists() else []) == apt_calls
    assert says in r.stderr and (says or r.stderr == "")


def test_hardness_script_prints_the_distribution(tmp_path):
    golds = ["SELECT count(*) FROM t", "SELECT a FROM t WHERE b > (SELECT avg(b) FROM t) ORDER BY a"]
    (tmp_path / "train_spider.json").write_text(
        json.dumps([{"db_id": "d", "question": "q", "query": g} for g in golds])
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
    r = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "hardness.py"), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == (
        "train_spider.json: 2 golds: easy 1 (50.0%), medium 0 (0.0%), hard 0 (0.0%), extra 1 (50.0%)"
    )
    bad = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "hardness.py"), str(tmp_path / "no")], env=env
    )
    assert bad.returncode == 2


@pytest.mark.parametrize(
    "config", ["configs/spider-0.5b-gpu-sft-eq.toml", "configs/spider-0.5b-gpu-final.toml"]
)
@pytest.mark.parametrize(
    ("arms_done", "go_arms", "finished"),
    [
        (["base", "grpo", "no_update", "validity"], "base grpo no_update validity", True),
        (["base", "grpo", "no_update", "validity"], "", False),  # the config's sft arms still to run
        (["base", "grpo", "no_update", "validity", "sft", "grpo_sft"], "", True),
        (["base", "grpo"], "base grpo no_update validity", False),
        (["base", "sft", "grpo_sft"], "base sft grpo_sft", True),  # the other order's first session
        (["base", "sft", "grpo_sft"], "", False),
    ],
)
def test_gpu_sh_finished_wants_every_arm(tmp_path, config, arms_done, go_arms, finished):
    """`go` skips a matrix only when it is finished AND holds every arm wanted now (GO_ARMS, else the
    config's arms), so a seed split over two sessions, in either order, runs its second half."""
    exp = tmp_path / "scratch" / "exp1"
    exp.mkdir(parents=True)
    (exp / "experiment.json").write_text(json.dumps({"finished": "x", "arms": dict.fromkeys(arms_done, {})}))
    env = {
        **os.environ,
        "SQLRL_SCRATCH": str(tmp_path / "scratch"),
        "GPU_CONFIG": config,
        "GO_ARMS": go_arms,
    }
    r = subprocess.run(
        ["bash", "scripts/gpu.sh", "finished", "exp1", "1"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert r.returncode == (0 if finished else 1), r.stdout + r.stderr


def test_gpu_sh_slim_and_unslim_round_trip(tmp_path):
    """`slim` makes results/ neither tracked nor listed as an untracked file (so it does not travel to the
    device), refuses twice and with staged changes; `unslim` restores the index exactly."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    (repo / "results" / "r1").mkdir(parents=True)
    (repo / "scripts" / "gpu.sh").write_bytes((ROOT / "scripts" / "gpu.sh").read_bytes())
    (repo / "results" / "r1" / "a.json").write_text("{}")
    (repo / "src.txt").write_text("x")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "x"], check=True)
    env = {**os.environ, "SQLRL_SCRATCH": str(tmp_path / "scratch")}

    def gpu(*args):
        return subprocess.run(
            ["bash", "scripts/gpu.sh", *args], cwd=repo, env=env, capture_output=True, text=True
        )

    def travelling():
        out = subprocess.run([*git, "ls-files", "-co", "--exclude-standard"], capture_output=True, text=True)
        return sorted(out.stdout.split())

    assert travelling() == ["results/r1/a.json", "scripts/gpu.sh", "src.txt"]
    assert gpu("slim").returncode == 0
    assert travelling() == ["scripts/gpu.sh", "src.txt"]
    assert (repo / "results" / "r1" / "a.json").is_file()  # nothing here is deleted
    assert gpu("slim").returncode == 1  # already slim
    assert gpu("unslim").returncode == 0
    assert travelling() == ["results/r1/a.json", "scripts/gpu.sh", "src.txt"]
    status = subprocess.run([*git, "status", "--porcelain"], capture_output=True, text=True).stdout
    assert status == ""
    (repo / "src.txt").write_text("y")
    subprocess.run([*git, "add", "src.txt"], check=True)
    r = gpu("slim")
    assert r.returncode == 1 and "staged changes" in r.stdout


@pytest.mark.parametrize(
    ("arms_done", "finished"),
    [
        (["base_c2048", "grpo_c2048", "no_update_c2048", "validity_c2048"], True),
        (["base", "grpo", "no_update", "validity"], False),  # names without the context axis
        (["base_c2048", "grpo_c2048"], False),  # the default arms are all wanted
    ],
)
def test_gpu_sh_finished_names_arms_like_the_matrix(tmp_path, arms_done, finished):
    """A config with `experiment.context_tokens` and no `experiment.arms`: the matrix's arm names
    (`_c<tokens>`) of its default arms (base, grpo, no_update, validity)."""
    cfg = tmp_path / "ctx.toml"
    cfg.write_text("[experiment]\ncontext_tokens = [2048]\n")
    exp = tmp_path / "scratch" / "exp1"
    exp.mkdir(parents=True)
    (exp / "experiment.json").write_text(json.dumps({"finished": "x", "arms": dict.fromkeys(arms_done, {})}))
    env = {**os.environ, "SQLRL_SCRATCH": str(tmp_path / "scratch"), "GPU_CONFIG": str(cfg), "GO_ARMS": ""}
    r = subprocess.run(
        ["bash", "scripts/gpu.sh", "finished", "exp1", "1"], cwd=ROOT, env=env, capture_output=True, text=True
    )
    assert r.returncode == (0 if finished else 1), r.stdout + r.stderr


def test_gpu_sh_slim_and_unslim_in_a_git_worktree(tmp_path):
    """In a linked worktree (.git is a file there) `slim` finds the exclude file through git, so it does
    not stop half-way with results/ staged for deletion; `unslim` restores the index exactly."""
    repo, wt = tmp_path / "repo", tmp_path / "wt"
    (repo / "scripts").mkdir(parents=True)
    (repo / "results" / "r1").mkdir(parents=True)
    (repo / "scripts" / "gpu.sh").write_bytes((ROOT / "scripts" / "gpu.sh").read_bytes())
    (repo / "results" / "r1" / "a.json").write_text("{}")
    (repo / "src.txt").write_text("x")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run([*git, "-C", str(repo), "add", "."], check=True)
    subprocess.run([*git, "-C", str(repo), "commit", "-q", "-m", "x"], check=True)
    subprocess.run([*git, "-C", str(repo), "worktree", "add", "-q", str(wt), "-b", "wt"], check=True)
    env = {**os.environ, "SQLRL_SCRATCH": str(tmp_path / "scratch")}

    def gpu(*args):
        return subprocess.run(
            ["bash", "scripts/gpu.sh", *args], cwd=wt, env=env, capture_output=True, text=True
        )

    def travelling():
        out = subprocess.run(
            ["git", "-C", str(wt), "ls-files", "-co", "--exclude-standard"], capture_output=True, text=True
        )
        return sorted(out.stdout.split())

    r = gpu("slim")
    assert r.returncode == 0, r.stdout + r.stderr
    assert travelling() == ["scripts/gpu.sh", "src.txt"]
    assert gpu("slim").returncode == 1  # already slim
    r = gpu("unslim")
    assert r.returncode == 0, r.stdout + r.stderr
    assert travelling() == ["results/r1/a.json", "scripts/gpu.sh", "src.txt"]
    status = subprocess.run(["git", "-C", str(wt), "status", "--porcelain"], capture_output=True, text=True)
    assert status.stdout == ""


def test_gpu_sh_setup_names_missing_parts_on_a_fresh_machine(tmp_path):
    """A machine given back between calls comes back without the parts staged on it: setup says how many
    of the MANIFEST's parts are there and what to do, instead of a bare sha256 mismatch."""
    parts = tmp_path / "parts"
    parts.mkdir()
    (parts / "part02").write_bytes(b"tail")
    (parts / "MANIFEST").write_text("name q.gguf\nbytes 12\nsha256 00\nparts 3\n")
    env = {**os.environ, "SQLRL_SCRATCH": str(tmp_path / "scratch"), "GPU_PARTS": str(parts)}
    r = subprocess.run(["bash", "scripts/gpu.sh", "setup"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert r.returncode == 1
    assert "1 of 3 parts staged" in r.stderr and "gpu.sh stage NN" in r.stderr, r.stderr
    assert not (tmp_path / "scratch" / "qwen.gguf").exists()


def test_error_kinds_with_data_says_where_missing_columns_are(tmp_path):
    """--data: each `no such column` error's column located in the real embedded activity_1 database
    (Activity(actid, activity_name), Student(StuID, ..., Age, ...), ...)."""
    exp = tmp_path / "exp"
    ev = exp / "arms/grpo/eval"
    ev.mkdir(parents=True)

    def row(tid, sql, error):
        r = {"task_id": tid, "db_id": "activity_1", "status": "exec_error", "reward": 0.0}
        return json.dumps({**r, "final_sql": sql, "error": error})

    rows = [
        row("t0", "SELECT T1.Age FROM Activity AS T1 JOIN Student AS T2", "no such column: T1.Age"),
        row("t1", "SELECT activity_name FROM Student", "no such column: activity_name"),
        row("t2", "SELECT T1.age2 FROM Student AS T1", "no such column: T1.age2"),
        row("t3", "SELECT x FROM nope", "no such table: nope"),
    ]
    (ev / "results.jsonl").write_text("\n".join(rows) + "\n")
    out = tmp_path / "k.json"
    data = ROOT / "src/sqlrl/embedded/spider_demo"
    cmd = [sys.executable, str(ROOT / "scripts" / "error_kinds.py"), str(exp), "--data", str(data)]
    r = subprocess.run([*cmd, "--json", str(out)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(out.read_text())["grpo"]["missing_columns"] == {
        "in a table the query names": 1,
        "only in tables the query does not name": 1,
        "in no table": 1,
    }
    assert "no such column: in a table the query names 1" in r.stdout
    bad = subprocess.run([*cmd[:3], "--data", str(tmp_path / "none")], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.startswith("error_kinds: ") and "Traceback" not in bad.stderr
    # a data folder without the evaluation's database
    other = tmp_path / "other"
    shutil.copytree(data, other)
    shutil.rmtree(other / "database/activity_1")
    bad = subprocess.run([*cmd[:3], "--data", str(other)], capture_output=True, text=True)
    assert bad.returncode == 2 and "activity_1" in bad.stderr and "Traceback" not in bad.stderr, bad.stderr


def test_gpu_sh_repack_is_collects_inverse(tmp_path):
    """A results folder made by collect (gzipped logs, COMMANDS.md, call logs, later analyses) repacked:
    one folder EXP, the logs unzipped, the local files left out, an empty .leakage beside leakage.json;
    collect of the repack gives the folder back but for those local files."""
    import gzip
    import tarfile

    dest = tmp_path / "results" / "seed1"
    (dest / "arms/grpo/train").mkdir(parents=True)
    (dest / "arms/grpo/eval").mkdir(parents=True)
    with gzip.open(dest / "arms/grpo/train/sql.jsonl.gz", "wt") as f:
        f.write('{"sql": 1}\n')
    with gzip.open(dest / "arms/grpo/eval/trajectories.jsonl.gz", "wt") as f:
        f.write('{"t": 1}\n')
    (dest / "arms/grpo/eval/results.jsonl").write_text('{"r": 1}\n')
    for name in ("experiment.json", "leakage.json", "report.md", "COMMANDS.md", "exp1s1_call1.log"):
        (dest / name).write_text(name)
    for name in ("score_share.json", "score_share_grpo_sft.json", "error_kinds.json"):
        (dest / name).write_text("{}")

    def gpu(*args):
        return subprocess.run(["bash", "scripts/gpu.sh", *args], cwd=ROOT, capture_output=True, text=True)

    pack = tmp_path / "resume.tgz"
    r = gpu("repack", str(dest), "exp1s1", str(pack))
    assert r.returncode == 0 and r.stdout.startswith(f"repack: {dest} -> {pack} (exp1s1; sha256 "), r.stderr
    with tarfile.open(pack) as tar:
        names = sorted(m.name for m in tar.getmembers() if m.isfile())
        assert tar.getmember("exp1s1/.leakage").isdir()
    assert names == [
        "exp1s1/arms/grpo/eval/results.jsonl",
        "exp1s1/arms/grpo/eval/trajectories.jsonl",
        "exp1s1/arms/grpo/train/sql.jsonl",
        "exp1s1/experiment.json",
        "exp1s1/leakage.json",
        "exp1s1/report.md",
    ]
    back = tmp_path / "back"
    assert gpu("collect", str(pack), str(back)).returncode == 0
    for rel in ("arms/grpo/eval/trajectories.jsonl.gz", "arms/grpo/train/sql.jsonl.gz"):
        assert gzip.open(back / rel).read() == gzip.open(dest / rel).read()
    assert (back / "arms/grpo/eval/results.jsonl").read_text() == '{"r": 1}\n'
    assert not (back / "COMMANDS.md").exists() and not (back / "error_kinds.json").exists()
    no_exp = gpu("repack", str(tmp_path), "exp1s1", str(tmp_path / "x.tgz"))
    assert no_exp.returncode == 2 and "holds no experiment.json" in no_exp.stderr
    bad_name = gpu("repack", str(dest), "../exp", str(tmp_path / "x.tgz"))
    assert bad_name.returncode == 2 and not (tmp_path / "x.tgz").exists()
    assert gpu("repack", str(dest), "-exp", str(tmp_path / "x.tgz")).returncode == 2
    assert (dest / "COMMANDS.md").read_text() == "COMMANDS.md"  # the results folder is left as it is
    link = tmp_path / "link"  # a DIR that is a symbolic link: followed, the folder it names left whole
    link.symlink_to(dest)
    assert gpu("repack", str(link), "exp1s1", str(tmp_path / "l.tgz")).returncode == 0
    with tarfile.open(tmp_path / "l.tgz") as tar:
        assert sorted(m.name for m in tar.getmembers() if m.isfile()) == names
    assert (dest / "COMMANDS.md").exists() and (dest / "exp1s1_call1.log").exists()
    (dest / "arms/grpo/train/sql.jsonl.gz").write_bytes(b"not gzip")
    broken = gpu("repack", str(dest), "exp1s1", str(tmp_path / "b.tgz"))
    assert broken.returncode == 1 and "does not unzip" in broken.stderr and not (tmp_path / "b.tgz").exists()


def test_gpu_sh_restage_needs_the_spider_folder_and_gpu_parts(tmp_path):
    def restage(**env):
        run_env = {k: v for k, v in os.environ.items() if k != "GPU_PARTS"} | env
        return subprocess.run(
            ["bash", "scripts/gpu.sh", "restage"], cwd=ROOT, env=run_env, capture_output=True, text=True
        )

    r = restage(SPIDER_DIR=str(tmp_path / "none"))
    assert (
        r.returncode == 2
        and r.stderr == f"restage: no Spider folder at {tmp_path / 'none'} (set SPIDER_DIR)\n"
    )
    (tmp_path / "Spider-1.0" / "database").mkdir(parents=True)
    r = restage(SPIDER_DIR=str(tmp_path / "Spider-1.0"))
    assert r.returncode == 2 and "restage: set GPU_PARTS" in r.stderr
