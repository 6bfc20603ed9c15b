from __future__ import annotations

from pathlib import Path

import pytest

from sqlrl import config as C
from sqlrl import config_tables as T
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
        ("[agent]\nschema_sample_values = 21\n", "schema_sample_values = 21 must be in [0, 20]"),
        ("[agent]\nschema_order = 'random'\n", "choose one of 'file', 'question'"),
        (
            "[data]\nkind = 'debug'\ntrain_paraphrases = true\n",
            "train_paraphrases needs data.kind = 'text2sql'",
        ),
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


@pytest.mark.parametrize(
    "name", ["quickstart.toml", "spider-0.5b-gpu.toml", "spider-1.5b-gpu.toml", "bird-0.5b-gpu.toml"]
)
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


@pytest.mark.parametrize(
    "override",
    [
        "grpo.lr=inf",
        "grpo.temperature=inf",
        "grpo.kl_coef=inf",
        "grpo.lr=nan",
        "grpo.top_p=-inf",
        "agent.sql_timeout_s=inf",
        "grpo.betas=[0.9, nan]",
        "grpo.lr=1e400",
    ],
)
def test_non_finite_floats_are_rejected(tmp_path, override):
    """Every float field, not a list of them: inf and nan never reach config.json as Infinity/NaN."""
    key = override.split("=", 1)[0]
    with pytest.raises(C.ConfigError, match="is not a finite number.*give a finite value") as e:
        C.load(write(tmp_path, ""), [override])
    assert key.split(".", 1)[1] in str(e.value)


def test_non_finite_floats_in_the_file_and_in_the_sft_table_are_rejected(tmp_path):
    with pytest.raises(C.ConfigError, match=r"grpo\.clip_high = nan is not a finite number"):
        C.load(write(tmp_path, "[grpo]\nclip_high = nan\n"))
    with pytest.raises(C.ConfigError, match=r"sft\.lr = inf is not a finite number"):
        T.sft_from_dict({"lr": float("inf")})
    with pytest.raises(C.ConfigError, match="not a finite number"):
        C.Config().replace(run={}, grpo={"max_grad_norm": float("inf")})


def _cli(argv, capsys):
    from sqlrl.cli import main

    rc = main(argv)
    captured = capsys.readouterr()
    return rc, captured.err.strip()


@pytest.mark.parametrize("command", ["train", "experiment"])
def test_cli_plain_value_where_a_table_is_overridden_is_one_line_exit_2(tmp_path, capsys, command):
    p = write(tmp_path, 'model = "x"\n')
    rc, err = _cli([command, str(p), "--set", "model.name=smollm2-135m-instruct"], capsys)
    assert rc == 2
    assert "model is a plain value (model = 'x')" in err and "[model]" in err
    assert len(err.splitlines()) == 1 and "Traceback" not in err


@pytest.mark.parametrize("command", ["train", "experiment"])
def test_cli_invalid_utf8_file_is_one_line_exit_2(tmp_path, capsys, command):
    p = tmp_path / "bad.toml"
    p.write_bytes(b"[grpo]\nsteps = 3\n# caf\xe9\n")
    rc, err = _cli([command, str(p)], capsys)
    assert rc == 2
    assert "not UTF-8 text (byte b'\\xe9' at offset 22)" in err and "save the file as UTF-8" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("command", ["train", "experiment"])
def test_cli_non_finite_override_is_one_line_exit_2(tmp_path, capsys, command):
    rc, err = _cli([command, str(write(tmp_path, "")), "--set", "grpo.lr=inf"], capsys)
    assert rc == 2 and "grpo.lr = inf is not a finite number" in err and len(err.splitlines()) == 1


def test_schema_and_paraphrase_options_default_off_and_resume_from_older_runs(tmp_path):
    import json

    from sqlrl.training.runfolder import config_changes

    cfg = C.load(write(tmp_path, ""))
    assert (cfg.agent.schema_sample_values, cfg.agent.schema_order, cfg.data.train_paraphrases) == (
        0,
        "file",
        False,
    )
    on = C.load(
        write(tmp_path, ""),
        ["agent.schema_sample_values=3", "agent.schema_order='question'", "data.train_paraphrases=true"],
    )
    assert (on.agent.schema_sample_values, on.agent.schema_order, on.data.train_paraphrases) == (
        3,
        "question",
        True,
    )
    # a run saved before these settings existed resumes (it behaves as the defaults), one that used them does not
    mine = json.loads(json.dumps(cfg.resolve()))
    saved = json.loads(json.dumps(cfg.resolve()))
    del (
        saved["agent"]["schema_sample_values"],
        saved["agent"]["schema_order"],
        saved["data"]["train_paraphrases"],
    )
    assert config_changes(saved, mine) == ([], [])
    blocking = config_changes(saved, json.loads(json.dumps(on.resolve())))[0]
    assert blocking == ["data.train_paraphrases", "agent.schema_sample_values", "agent.schema_order"]


def test_checkpoint_every_zero_is_a_config_error_not_a_crash():
    with pytest.raises(C.ConfigError, match=r"run.checkpoint_every = 0 must be >= 1 .*grpo.steps"):
        C.from_dict({"run": {"checkpoint_every": 0}})


@pytest.mark.parametrize("value", [0, -1.5])
def test_sql_timeout_must_be_positive(value):
    # every sandbox refuses such a limit when it starts, which for a run is after the model has loaded
    with pytest.raises(C.ConfigError, match=r"agent\.sql_timeout_s = .* must be > 0 seconds"):
        C.from_dict({"agent": {"sql_timeout_s": value}})
    assert C.from_dict({"agent": {"sql_timeout_s": 0.5}}).agent.sql_timeout_s == 0.5


@pytest.mark.parametrize(
    ("raw", "msg"),
    [
        ({"run": {"sandbox_workers": 0}}, "run.sandbox_workers = 0 must be in [1, 256]"),
        ({"run": {"sandbox_workers": 100000}}, "run.sandbox_workers = 100000 must be in [1, 256]"),
        ({"run": {"gen_max_batch": 0}}, "run.gen_max_batch = 0 must be >= 1"),
        ({"grpo": {"betas": [0.9, 1.0]}}, "grpo.betas = [0.9, 1.0]: each AdamW beta must be in [0, 1)"),
        ({"grpo": {"betas": [-0.1, 0.9]}}, "grpo.betas = [-0.1, 0.9]: each AdamW beta must be in [0, 1)"),
        ({"model": {"lora_dropout": 1.0}}, "model.lora_dropout = 1.0 must be in [0, 1)"),
        ({"model": {"lora_alpha": 0}}, "model.lora_alpha = 0 must be > 0"),
        ({"model": {"lora_rank": 8, "lora_targets": []}}, "model.lora_targets is empty: LoRA"),
        ({"agent": {"observation_rows": -1}}, "agent.observation_rows = -1 is negative"),
        ({"agent": {"observation_chars": -1}}, "agent.observation_chars = -1 is negative"),
        ({"agent": {"max_sql_executions": -1}}, "agent.max_sql_executions = -1 is negative"),
        ({"run": {"log_rollouts": -1}}, "run.log_rollouts = -1 is negative"),
        ({"grpo": {"weight_decay": -0.1}}, "grpo.weight_decay = -0.1 is negative"),
        ({"data": {"max_train_tasks": -5}}, "data.max_train_tasks = -5 is negative"),
        ({"data": {"max_eval_tasks": -5}}, "data.max_eval_tasks = -5 is negative"),
    ],
)
def test_sizes_and_fractions_out_of_range_name_the_key(raw, msg):
    with pytest.raises(C.ConfigError) as e:
        C.from_dict(raw)
    assert msg in str(e.value) and "\n" not in str(e.value)


def test_full_fine_tuning_may_leave_lora_targets_empty():
    assert C.from_dict({"model": {"lora_targets": []}}).model.lora_rank == 0


@pytest.mark.parametrize(
    ("line", "msg"),
    [
        ("arms = 5", "experiment.arms must be a list, got int 5"),
        ("turns = 2", "experiment.turns must be a list, got int 2"),
        ("extra = 5", "experiment.extra must be a table of notes"),
        ('smoke = "false"', "experiment.smoke must be true or false, got 'false'"),
        ("turns = [1.9]", "experiment.turns[0] must be an integer, got 1.9"),
        ("leakage_tasks = -4", "experiment.leakage_tasks = -4: the leakage audit needs at least one task"),
        ("arms = []", "experiment.arms is empty; list at least one"),
        ("turns = []", "experiment.turns is empty; list at least one"),
        ("name = 3", "experiment.name must be a string, got 3"),
    ],
)
def test_experiment_keys_are_type_checked_not_coerced(tmp_path, line, msg):
    with pytest.raises(C.ConfigError) as e:
        load_experiment(write(tmp_path, f"[experiment]\n{line}\n"))
    assert msg in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(C.ConfigError, match=r"experiment\.turns must be a list, got int 2"):
        load_experiment(write(tmp_path, "[experiment]\n"), ["experiment.turns=2"])
