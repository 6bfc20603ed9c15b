"""What the veRL config carries for the GPU machine: attention implementation, Ray workers' environment,
dual clip off (src/sqlrl/integrations/verl/config.py).

The mapping tests (`verl_overrides`, the CLIs with veRL's builder replaced by the mapping) run without veRL;
the ones marked `needs_verl` run veRL 0.9.1's own code (HFModelConfig, run_ppo up to ray.init, its policy
loss) on the generated config and are skipped without it. Nothing here runs on a GPU.
"""

from __future__ import annotations

import importlib.util
import math
import os

import pytest
import torch
import yaml

from sqlrl import config as sqlrl_config
from sqlrl.integrations.verl import config as vc

HAVE_VERL = importlib.util.find_spec("verl") is not None
needs_verl = pytest.mark.skipif(not HAVE_VERL, reason="veRL not importable; run scripts/verl-env.sh --test")


def _installed(monkeypatch, *present: str) -> None:
    """flash_attn / flashinfer import exactly where named in `present` (neither is installed here)."""
    monkeypatch.setattr(vc, "_importable", lambda name: name in present)


def _only_gold_cache_env(monkeypatch, gold_cache) -> None:
    """SQLRL_GOLD_CACHE is this process's only SQLRL_* variable (CI sets its own, e.g. SQLRL_INSTALL_CHROMIUM)."""
    for name in [n for n in os.environ if n.startswith("SQLRL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("SQLRL_GOLD_CACHE", str(gold_cache))


def _model(d: dict) -> dict:
    return d["actor_rollout_ref"]["model"]


# ------------------------------------------------------------------------------------ attention (mapping)


def test_auto_attention_is_sdpa_without_flash_attn_and_turns_remove_padding_off(monkeypatch):
    _installed(monkeypatch)
    m = _model(vc.verl_overrides(sqlrl_config.Config(), worker_env={}))
    assert m["override_config"] == {"attn_implementation": "sdpa"}
    assert m["use_remove_padding"] is False


def test_auto_attention_is_flash_attention_2_where_flash_attn_imports(monkeypatch):
    _installed(monkeypatch, "flash_attn")
    m = _model(vc.verl_overrides(sqlrl_config.Config(), worker_env={}))
    assert m["override_config"] == {"attn_implementation": "flash_attention_2"}
    assert m["use_remove_padding"] is True


@pytest.mark.parametrize(
    ("choice", "remove_padding"), [("eager", False), ("sdpa", False), ("flash_attention_2", True)]
)
def test_explicit_attention_is_kept_whatever_is_installed(monkeypatch, choice, remove_padding):
    _installed(monkeypatch, "flash_attn")
    m = _model(vc.verl_overrides(sqlrl_config.Config(), attn_implementation=choice, worker_env={}))
    assert m["override_config"]["attn_implementation"] == choice
    assert m["use_remove_padding"] is remove_padding


def test_importable_means_the_import_succeeds_not_that_the_package_is_found(tmp_path, monkeypatch):
    """A flash_attn wheel built for another torch is found on the path but raises on import: not usable."""
    (tmp_path / "sqlrl_broken_ext.py").write_text("raise OSError('undefined symbol: _ZN3c10')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert importlib.util.find_spec("sqlrl_broken_ext") is not None
    assert vc._importable("sqlrl_broken_ext") is False
    assert vc._importable("sqlrl_no_such_module") is False
    assert vc._importable("sqlite3") is True


def test_unknown_attention_is_refused():
    with pytest.raises(ValueError, match="attn_implementation 'flash' is not one of auto, flash_attention_2"):
        vc.verl_overrides(sqlrl_config.Config(), attn_implementation="flash", worker_env={})


# ---------------------------------------------------------------------------------- workers' environment


def test_worker_env_has_the_sqlrl_variables_and_turns_the_flashinfer_sampler_off(monkeypatch):
    _installed(monkeypatch)
    environ = {"SQLRL_GOLD_CACHE": "/gc", "SQLRL_REWARD_WORKERS": "4", "HOME": "/h", "MY_SQLRL_X": "1"}
    assert vc.worker_env_vars(environ) == {
        "SQLRL_GOLD_CACHE": "/gc",
        "SQLRL_REWARD_WORKERS": "4",
        "VLLM_USE_FLASHINFER_SAMPLER": "0",
    }
    _installed(monkeypatch, "flashinfer")
    assert vc.worker_env_vars(environ) == {"SQLRL_GOLD_CACHE": "/gc", "SQLRL_REWARD_WORKERS": "4"}
    # a value the user set is forwarded as it is
    assert vc.worker_env_vars({"VLLM_USE_FLASHINFER_SAMPLER": "1"}) == {"VLLM_USE_FLASHINFER_SAMPLER": "1"}


def test_overrides_put_the_environment_of_this_process_in_rays_runtime_env(monkeypatch):
    _installed(monkeypatch)
    monkeypatch.setenv("SQLRL_SQL_TIMEOUT_S", "9.5")
    env = vc.verl_overrides(sqlrl_config.Config())["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]
    assert env["SQLRL_SQL_TIMEOUT_S"] == "9.5" and env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"


# -------------------------------------------------------------------------------------------- dual clip


def test_dual_clip_never_binds_so_the_loss_is_sqlrls():
    """veRL's loss of a token with A < 0 is min(clip_ratio_c*|A|, max(r*|A|, clip(r)*|A|)) with r at most
    exp(20) (its log-ratio clamp); sqlrl's is max(r*|A|, clip(r)*|A|). At r = 5, A = -1: sqlrl 5, veRL's
    default clip_ratio_c = 3 would give 3; the mapped value is above every ratio veRL can form."""
    from sqlrl.training.grpo import policy_loss

    actor = vc.verl_overrides(sqlrl_config.Config(), worker_env={})["actor_rollout_ref"]["actor"]
    assert actor["clip_ratio_c"] > math.exp(20)
    loss, _ = policy_loss(
        torch.tensor([[math.log(5.0)]]), torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1)
    )
    assert loss.item() == pytest.approx(5.0)
    assert min(actor["clip_ratio_c"] * 1.0, max(5.0 * 1.0, 1.2 * 1.0)) == 5.0


# ------------------------------------------------------------------------------------------------- CLIs


def test_verl_config_cli_writes_the_chosen_attention_and_the_environment(tmp_path, monkeypatch):
    import sqlrl.cli.verl_config as cli

    monkeypatch.setattr(cli, "require_verl", lambda: None)
    monkeypatch.setattr(cli, "build_verl_config", vc.verl_overrides)  # the mapping, without veRL's checks
    _installed(monkeypatch)
    _only_gold_cache_env(monkeypatch, tmp_path / "gc")
    toml = tmp_path / "run.toml"
    toml.write_text("[grpo]\nprompts_per_step = 8\n")
    out = tmp_path / "verl.yaml"
    assert cli.cli_main([str(toml), "-o", str(out), "--attn-implementation", "eager"]) == 0
    d = yaml.safe_load(out.read_text())
    assert _model(d)["override_config"]["attn_implementation"] == "eager"
    assert _model(d)["use_remove_padding"] is False
    env = d["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]
    assert env == {"SQLRL_GOLD_CACHE": str(tmp_path / "gc"), "VLLM_USE_FLASHINFER_SAMPLER": "0"}
    assert cli.cli_main([str(toml), "-o", str(out)]) == 0  # default auto: no flash_attn here -> sdpa
    assert _model(yaml.safe_load(out.read_text()))["override_config"]["attn_implementation"] == "sdpa"


@pytest.mark.parametrize(("extra", "expected"), [([], "auto"), (["--attn-implementation", "sdpa"], "sdpa")])
def test_train_engine_verl_passes_the_attention_choice_on(tmp_path, monkeypatch, extra, expected):
    import sqlrl.cli.verl_config as cli
    from sqlrl.cli.train import cli_main

    seen: list[list[str]] = []
    monkeypatch.setattr(cli, "cli_main", lambda args: seen.append(args) or 7)
    argv = ["configs/quickstart.toml", "--engine", "verl", "--out", str(tmp_path / "run"), "--dry-run"]
    assert cli_main(argv + extra) == 7
    args = seen[0]
    assert args[args.index("--attn-implementation") + 1] == expected


# ------------------------------------------------------------------------------------ with veRL's code


@needs_verl
def test_verl_builds_the_actor_and_ref_model_config_with_the_chosen_attention(tmp_path):
    """HFModelConfig (the actor's model config; engine_workers deep-copies it for the ref) reads
    override_config.attn_implementation into hf_config; the actor's use_remove_padding follows the model's."""
    from omegaconf import OmegaConf
    from transformers import Qwen2Config
    from verl.utils.config import omega_conf_to_dataclass

    from sqlrl.generation.scripted import make_chat_tokenizer

    tiny = tmp_path / "tiny"
    Qwen2Config(
        vocab_size=300, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, architectures=["Qwen2ForCausalLM"],
    ).save_pretrained(tiny)  # fmt: skip
    make_chat_tokenizer().save_pretrained(tiny)
    d = vc.build_verl_config(
        sqlrl_config.Config(), n_gpus_per_node=1, model_path=str(tiny), attn_implementation="sdpa"
    )
    assert d["actor_rollout_ref"]["actor"]["use_remove_padding"] is False
    model = omega_conf_to_dataclass(OmegaConf.create(d["actor_rollout_ref"]["model"]))
    assert model.use_remove_padding is False
    assert model.hf_config._attn_implementation == "sdpa"


@needs_verl
def test_run_ppo_passes_the_environment_to_ray_init(tmp_path, monkeypatch):
    """The written YAML, loaded as `main_ppo --config-name verl` loads it, through veRL's run_ppo up to
    ray.init (replaced here): the workers' runtime env holds the SQLRL_* variables and the sampler switch."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from verl.trainer import main_ppo

    import sqlrl.cli.verl_config as cli

    _installed(monkeypatch)
    _only_gold_cache_env(monkeypatch, tmp_path / "gc")
    toml = tmp_path / "run.toml"
    toml.write_text("[grpo]\nprompts_per_step = 8\n")
    assert cli.cli_main([str(toml), "-o", str(tmp_path / "verl.yaml"), "--gpus-per-node", "1"]) == 0
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
        loaded = compose(config_name="verl")
    seen = {}

    class Runner:
        @classmethod
        def remote(cls):
            return cls()

        class run:  # noqa: N801  (a Ray method handle: run.remote(config))
            remote = staticmethod(lambda config: None)

    monkeypatch.setattr(main_ppo.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(main_ppo.ray, "init", lambda **kw: seen.update(kw))
    monkeypatch.setattr(main_ppo.ray, "get", lambda ref: ref)
    main_ppo.run_ppo(loaded, task_runner_class=Runner)
    env = seen["runtime_env"]["env_vars"]
    assert env["SQLRL_GOLD_CACHE"] == str(tmp_path / "gc") and env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert env["TOKENIZERS_PARALLELISM"] == "true"  # veRL's own defaults are still there


@needs_verl
def test_verl_policy_loss_equals_sqlrls_where_the_default_dual_clip_would_bind():
    from omegaconf import OmegaConf
    from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla

    from sqlrl.training.grpo import policy_loss

    cfg = sqlrl_config.Config()
    d = vc.build_verl_config(cfg, n_gpus_per_node=1, validate=False)
    actor = OmegaConf.create(d["actor_rollout_ref"]["actor"])
    actor.global_batch_info = {}
    old = torch.zeros(2, 3)
    logp = torch.log(torch.tensor([[5.0, 40.0, 0.5], [1.1, 2.0, 1000.0]]))  # ratios up to 1000 > 3
    adv = torch.tensor([-1.0, -2.0])
    mask = torch.ones(2, 3, dtype=torch.bool)
    theirs, _ = compute_policy_loss_vanilla(old, logp, adv[:, None].expand(2, 3), mask, "token-mean", actor)
    ours, _ = policy_loss(logp, old, adv, mask, clip_low=cfg.grpo.clip_low, clip_high=cfg.grpo.clip_high)
    assert theirs.item() == pytest.approx(ours.item(), rel=1e-6)
    # (5 + 40 + 0.8 + 2*(1.1 + 2 + 1000)) / 6 by hand: sqlrl's, no dual clip
    assert ours.item() == pytest.approx((5 + 40 + 0.8 + 2 * 1003.1) / 6, rel=1e-6)
