"""The matrix's context-length axis (`experiment.context_tokens`): arm names, each cell's config, the
config errors, and a scripted-policy matrix (no model) over two context lengths on the embedded Spider
databases, down to the report."""

from __future__ import annotations

import json

import pytest

from sqlrl import config as C
from sqlrl import config_tables as T
from sqlrl.experiment.arms import arm_config, arm_name, init_dir, sft_run_config
from sqlrl.experiment.matrix import ExperimentConfig, disk_needed, load_experiment, run_experiment


def test_arm_names_carry_turns_then_context():
    assert arm_name("grpo", 1) == "grpo"
    assert arm_name("grpo", 3) == "grpo_t3"
    assert arm_name("no_update", 1, 2048) == "no_update_c2048"
    assert arm_name("grpo_sft", 3, 4096) == "grpo_sft_t3_c4096"


def test_cells_without_and_with_a_context_axis():
    assert ExperimentConfig(turns=(1, 3)).cells() == [(1, None), (3, None)]
    exp = ExperimentConfig(turns=(1, 3), context_tokens=(2048, 4096))
    assert exp.cells() == [(1, 2048), (1, 4096), (3, 2048), (3, 4096)]


def test_arm_config_sets_the_cell_and_keeps_the_arm_kind():
    cfg = C.from_dict({"agent": {"max_context_tokens": 3072, "max_new_tokens": 128}})
    a = arm_config(cfg, "no_update", 3, 2048)
    assert (a.agent.turns, a.agent.max_context_tokens, a.grpo.lr, a.grpo.control) == (
        3,
        2048,
        0.0,
        "no-update",
    )
    v = arm_config(cfg, "validity", 1, 4096)
    assert (v.agent.max_context_tokens, v.grpo.reward) == (4096, "validity")
    assert arm_config(cfg, "grpo", 1).agent.max_context_tokens == 3072  # no axis: the agent's own
    s = sft_run_config(cfg, 3, 2048)  # the SFT control trains single-turn at its cell's context length
    assert (s.agent.turns, s.agent.max_context_tokens) == (1, 2048)


def test_grpo_sft_starts_from_the_sft_run_of_its_cell(tmp_path):
    assert init_dir(tmp_path, 3, T.SFTConfig(), 2048) == tmp_path / "arms" / "sft_t3_c2048" / "train"
    own = T.sft_from_dict({"init_steps": 4})
    assert init_dir(tmp_path, 1, own, 4096) == tmp_path / "arms" / "grpo_sft_c4096" / "sft_init"
    assert init_dir(tmp_path, 1, T.SFTConfig()) == tmp_path / "arms" / "sft" / "train"


def test_context_axis_from_the_experiment_file(tmp_path):
    p = tmp_path / "e.toml"
    p.write_text(
        "[agent]\nmax_new_tokens = 256\n[experiment]\nturns = [1, 3]\ncontext_tokens = [2048, 4096]\n"
    )
    _, exp = load_experiment(p)
    assert exp.context_tokens == (2048, 4096) and len(exp.cells()) == 4
    p.write_text("[experiment]\nturns = [1]\n")
    _, exp = load_experiment(p)
    assert exp.context_tokens == () and exp.cells() == [(1, None)]


@pytest.mark.parametrize(
    "value, needle",
    [
        ("[2048, 0]", "every context length must be a positive token count"),
        ("[2048, -5]", "every context length must be a positive token count"),
        ("[2048, 4096, 2048]", "lists [2048] twice: each value makes its own arms, list it once"),
        ("[200, 4096]", "[200] cannot hold the prompt and one reply of agent.max_new_tokens = 256 tokens"),
        ("[256]", "use context lengths above 256"),
        ("2048", "must be a list of whole token counts, e.g. [2048, 4096]; got 2048"),
        ("[2048.5]", "must be a list of whole token counts"),
    ],
)
def test_bad_context_axis_is_a_config_error(tmp_path, value, needle):
    p = tmp_path / "e.toml"
    p.write_text(f"[agent]\nmax_new_tokens = 256\n[experiment]\ncontext_tokens = {value}\n")
    with pytest.raises(C.ConfigError, match="experiment.context_tokens") as e:
        load_experiment(p)
    assert needle in str(e.value)


def test_disk_needed_counts_every_cell():
    cfg = C.from_dict(
        {"grpo": {"steps": 2}, "run": {"checkpoint_every": 2, "prune_checkpoints_at_end": True}}
    )
    p = 1_000_000_000  # float32 finals: 4 GB each for grpo and validity, per cell
    assert disk_needed(cfg, ExperimentConfig(context_tokens=(2048, 4096)), p)[0] == 16_200_000_000
    assert disk_needed(cfg, ExperimentConfig(turns=(1, 3), context_tokens=(2048,)), p)[0] == 16_200_000_000


@pytest.fixture
def scripted_matrix(monkeypatch, tmp_path):
    """run_experiment with a policy that writes each task's gold SQL (no model, no training: base arms)."""
    from sqlrl.evaluation import runner
    from sqlrl.experiment import matrix
    from sqlrl.generation import models
    from sqlrl.generation.scripted import ScriptedPolicy
    from sqlrl.tasks.bird import open_data
    from sqlrl.tasks.data import resolve_data_root

    ds = open_data(resolve_data_root("embedded"))
    golds = {t.public.question: t.gold_sql for t in ds.load("validation", seed=0, val_fraction=0.1)}

    def script(text, turn):
        q = next(q for q in golds if f"{q}" in text)
        return f"```sql\n{golds[q]}\n```"

    monkeypatch.setattr(models, "check_model", lambda name: None)
    monkeypatch.setattr(matrix, "check_free_disk", lambda cfg, exp, out: None)
    monkeypatch.setattr(runner, "load_policy", lambda *a, **k: ScriptedPolicy(script))
    cfg = C.from_dict(
        {
            "model": {"name": "scripted"},
            "data": {"path": "embedded", "max_eval_tasks": 4},
            "agent": {"max_new_tokens": 160, "max_schema_chars": 400, "max_context_tokens": 1024},
            "run": {"device": "cpu", "loggers": [], "sandbox_workers": 1},
        }
    )
    return cfg, tmp_path / "exp"


def test_scripted_matrix_over_two_context_lengths(scripted_matrix):
    """Context 8192 holds every prompt (each a few hundred byte tokens): the gold is written, 4 of 4 match.
    Context 161 leaves no room for a 160-token reply after any prompt: every trajectory stops with
    `context_budget` before its first turn, 0 of 4."""
    cfg, out = scripted_matrix
    exp = ExperimentConfig(
        name="ctx", arms=("base",), context_tokens=(8192, 161), leakage_tasks=2, smoke=True
    )
    run_experiment(cfg, exp, out, report=True)
    e = json.loads((out / "experiment.json").read_text())
    assert e["experiment"]["context_tokens"] == [8192, 161]
    assert {n: (a["turns"], a["context_tokens"]) for n, a in e["arms"].items()} == {
        "base_c8192": (1, 8192),
        "base_c161": (1, 161),
    }
    for name, ctx in (("base_c8192", 8192), ("base_c161", 161)):
        summary = json.loads((out / "arms" / name / "eval" / "summary.json").read_text())
        assert (
            summary["budgets"]["max_context_tokens"]
            == ctx
            == e["arms"][name]["budgets"]["max_context_tokens"]
        )
    results = {
        n: [json.loads(x) for x in (out / "arms" / n / "eval" / "results.jsonl").read_text().splitlines()]
        for n in e["arms"]
    }
    assert [r["status"] for r in results["base_c8192"]] == ["match"] * 4
    assert [r["status"] for r in results["base_c161"]] == ["no_sql"] * 4
    assert {r["stop_reason"] for r in results["base_c161"]} == {"context_budget"}
    # one leakage audit per cell, combined
    leak = json.loads((out / "leakage.json").read_text())
    assert set(leak["per_turn_budget"]) == {"t1_c8192", "t1_c161"} and leak["passed"] and leak["tasks"] == 4
    assert (out / "leakage_c8192.json").is_file() and (out / "leakage_c161.json").is_file()
    verdict = json.loads((out / "verdict.json").read_text())
    budgets = next(c for c in verdict["checks"] if c["name"] == "equal_budgets")
    assert budgets["passed"] and "2 cells (turns, context)" in budgets["detail"]
    md = (out / "report.md").read_text()
    assert "| arm | turns | context tokens | accuracy (95% CI) |" in md
    assert "| base_c8192 | 1 | 8192 | 100.0% (" in md and "| base_c161 | 1 | 161 | 0.0% (" in md
    html = (out / "report.html").read_text()
    assert '<th>turns</th><th class="n">context tokens</th>' in html and '<td class="n">161</td>' in html


def test_matrix_without_context_axis_records_no_context(scripted_matrix):
    cfg, out = scripted_matrix
    run_experiment(cfg, ExperimentConfig(name="plain", arms=("base",), leakage_tasks=1, smoke=True), out)
    e = json.loads((out / "experiment.json").read_text())
    assert list(e["arms"]) == ["base"] and "context_tokens" not in e["arms"]["base"]
    assert "context_tokens" not in e["experiment"]
    assert json.loads((out / "leakage.json").read_text())["per_turn_budget"] == {
        "t1": {"passed": True, "tasks": 1}
    }
    assert "context tokens" not in (out / "report.md").read_text()


@pytest.mark.parametrize(
    "line, needle",
    [
        ("turns = [1, 3, 1]", "experiment.turns = [1, 3, 1] lists [1] twice"),
        (
            'arms = ["base", "grpo", "grpo"]',
            "experiment.arms = ['base', 'grpo', 'grpo'] lists ['grpo'] twice",
        ),
    ],
)
def test_a_value_listed_twice_on_an_axis_is_a_config_error(tmp_path, line, needle):
    p = tmp_path / "e.toml"
    p.write_text(f"[experiment]\n{line}\n")
    with pytest.raises(C.ConfigError) as e:
        load_experiment(p)
    assert needle in str(e.value) and "list it once" in str(e.value)
