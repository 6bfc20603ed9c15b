from __future__ import annotations

from pathlib import Path

import pytest

from sqlrl import config as C
from sqlrl.experiment.matrix import load_experiment

ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path, text):
    p = tmp_path / "c.toml"
    p.write_text(text)
    return p


def test_defaults_and_resolved_json_roundtrip(tmp_path):
    cfg = C.load(write(tmp_path, "[grpo]\nsteps = 3\n"))
    assert cfg.grpo.steps == 3 and cfg.grpo.group_size == 8
    again = C.from_dict(cfg.resolve())
    assert again == cfg and again.config_hash() == cfg.config_hash()
    assert cfg.replace(grpo={"steps": 4}).config_hash() != cfg.config_hash()


@pytest.mark.parametrize(
    "text,msg",
    [
        ("[grpo]\nstep = 3\n", "did you mean 'steps'"),
        ("[grop]\nsteps = 3\n", "did you mean [grpo]"),
        ("[grpo]\nsteps = 'many'\n", "must be an integer"),
        ("[grpo]\nlr = 0.0\n", "no-update"),
        ("[grpo]\ncontrol = 'no-update'\nlr = 1e-6\n", "requires grpo.lr = 0"),
        ("[grpo]\ngroup_size = 1\n", "use >= 2"),
        ("[grpo]\nreward = 'vibes'\n", "choose one of"),
        ("[agent]\nturns = 2\nmax_sql_executions = 0\n", "max_sql_executions >= 1"),
        ("[run]\nloggers = ['mlflow']\n", "unknown logger"),
        ("[grpo]\ndynamic_sampling_rounds = -1\n", "dynamic_sampling_rounds = -1 must be in [0, 64]"),
        ("[grpo\n", "not valid TOML"),
    ],
)
def test_errors_say_what_and_how(tmp_path, text, msg):
    with pytest.raises(C.ConfigError, match=msg.replace("[", r"\[").replace("(", r"\(")):
        C.load(write(tmp_path, text))


def test_missing_file():
    with pytest.raises(C.ConfigError, match="does not exist"):
        C.load("nope.toml")


def test_overrides(tmp_path):
    cfg = C.load(write(tmp_path, ""), ["grpo.steps=7", "model.name=smollm2-135m-instruct", "run.loggers=[]"])
    assert cfg.grpo.steps == 7 and cfg.model.name == "smollm2-135m-instruct" and cfg.run.loggers == ()
    with pytest.raises(C.ConfigError, match="section.key=value"):
        C.load(write(tmp_path, ""), ["steps=7"])


def test_every_field_has_a_doc_line():
    for cls in C.SECTIONS.values():
        docs = C.field_docs(cls)
        import dataclasses

        missing = [f.name for f in dataclasses.fields(cls) if not docs.get(f.name)]
        assert not missing, f"{cls.__name__} fields without a doc line: {missing}"


@pytest.mark.parametrize("name", ["quickstart.toml", "spider-0.5b-gpu.toml", "spider-1.5b-gpu.toml"])
def test_shipped_configs_validate(name):
    cfg, exp = load_experiment(ROOT / "configs" / name)
    assert set(exp.arms) == {"base", "grpo", "no_update", "validity"}
    assert cfg.grpo.lr > 0


def test_repo_configs_are_the_packaged_ones():
    from sqlrl.experiment.matrix import packaged_config

    assert (ROOT / "configs" / "quickstart.toml").read_text() == packaged_config(
        "quickstart.toml"
    ).read_text()


def test_quickstart_uses_default_model_and_embedded_data():
    cfg, exp = load_experiment(ROOT / "configs" / "quickstart.toml")
    assert cfg.model.name == C.ModelConfig().name and cfg.data.path == "embedded" and exp.smoke


def test_experiment_files_are_run_files_too():
    cfg = C.load(ROOT / "configs" / "quickstart.toml")  # `sqlrl train configs/quickstart.toml`
    assert cfg.grpo.steps >= 1 and cfg.data.path == "embedded"


def test_the_1_5b_gpu_config_keeps_the_0_5b_recipe():
    """The two sizes compare only if they differ in the model and in memory/disk settings alone."""
    a, ea = load_experiment(ROOT / "configs" / "spider-0.5b-gpu.toml")
    b, eb = load_experiment(ROOT / "configs" / "spider-1.5b-gpu.toml")
    ra, rb = a.resolve(), b.resolve()
    diff = sorted(f"{s}.{k}" for s in ra for k in ra[s] if ra[s][k] != rb[s][k])
    assert diff == ["model.name", "run.checkpoint_every", "run.gen_max_batch"]
    assert (ea.arms, ea.turns) == (eb.arms, eb.turns) and eb.name == "spider-1.5b-single-turn"


@pytest.mark.parametrize("name", ["debug-curriculum.toml", "debug-curriculum-gpu.toml"])
def test_shipped_curriculum_configs_validate(name):
    from sqlrl.training.curriculum import load_curriculum

    cfg, sft, cur = load_curriculum(ROOT / "configs" / name)
    assert [s.kind for s in cur.stages] == ["sft", "grpo", "grpo"] and sft.steps >= 1
    assert cfg.data.kind == "debug"
    if name.endswith("-gpu.toml"):  # the settings the 2026-11-29 GPU runs called for
        assert cfg.grpo.micro_batch_logit_tokens == 4096 and cfg.run.checkpoint_every == 20
