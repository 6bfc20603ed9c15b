"""Runtime exclusions: an excluded trajectory is masked out (driver) and left out of its GRPO group.

Two pieces, both selected by the config ``build_verl_config`` writes: ``SqlrlAgentLoopManager``
(veRL's ``rollout.agent.agent_loop_manager_class``, instantiated in the trainer driver) zeroes the
``response_mask`` of every trajectory whose reward says ``sqlrl_excluded = 1``, so none of its tokens
is in the policy loss, the KL or entropy terms or the counts that normalize them; and the advantage
estimator ``sqlrl_grpo`` (``compute_sqlrl_grpo_advantage``, ``algorithm.adv_estimator``) computes each
group's mean and std over the trajectories with a non-zero mask only and gives the excluded ones 0.
Importing the manager class (veRL does it by name in the driver) registers the estimator in that
process, which is where veRL computes advantages.

What is covered:
- The advantages of the valid trajectories equal veRL's GRPO on the batch without the excluded ones;
  a group left with one valid trajectory is a singleton group (mean 0, std 1), as in veRL's GRPO.

What is not:
- Validation ``acc`` means are NaN, not lower, when something was excluded (``sqlrl_excluded``
  counts them).
"""

from __future__ import annotations

import logging
from typing import Any

from sqlrl.integrations.verl.common import ADV_ESTIMATOR, PACKAGE, require_verl

log = logging.getLogger(__name__)


def compute_sqlrl_grpo_advantage(
    token_level_rewards,
    response_mask,
    index,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool | None = None,
    config=None,
    **kwargs,
):
    """veRL's GRPO outcome advantage (`core_algos.compute_grpo_outcome_advantage`, 0.9.1) over the
    trajectories that are not excluded; registered with veRL as `sqlrl_grpo`.

    A trajectory is excluded when its `response_mask` is all zero: `SqlrlAgentLoopManager` zeroes it for
    every trajectory whose reward is excluded (and a trajectory that generated nothing has no token to
    train either: its whole group shares the prompt, so the group is all such trajectories and gets
    advantage 0 under plain GRPO as well). Per group (same `index`): mean and unbiased std (`torch.std`)
    of the scores of the valid trajectories only; a group with one valid trajectory gets mean 0 and
    std 1, as veRL's GRPO does for a singleton group; advantage = (score - mean) / (std + epsilon), or
    score - mean when `norm_adv_by_std_in_grpo` is False (Dr. GRPO). Excluded trajectories get exactly
    0. veRL's generic estimator call does not pass `norm_adv_by_std_in_grpo`, so it is read from
    `config` (`algorithm`) when not given. Returns (advantages, returns), both (bs, response_length).
    """
    import torch

    if norm_adv_by_std_in_grpo is None:
        norm_adv_by_std_in_grpo = True
        if config is not None:
            get = config.get if hasattr(config, "get") else lambda k, d: getattr(config, k, d)
            norm_adv_by_std_in_grpo = bool(get("norm_adv_by_std_in_grpo", True))
    scores = token_level_rewards.sum(dim=-1)
    valid = (response_mask.sum(dim=-1) > 0).tolist()
    with torch.no_grad():
        groups: dict[Any, list[int]] = {}
        for i, ok in enumerate(valid):
            if ok:
                groups.setdefault(index[i], []).append(i)
        adv = torch.zeros_like(scores)
        for rows in groups.values():
            s = scores[rows]
            if len(rows) == 1:
                mean, std = torch.tensor(0.0), torch.tensor(1.0)
            else:
                mean, std = torch.mean(s), torch.std(s)
            adv[rows] = (s - mean) / (std + epsilon) if norm_adv_by_std_in_grpo else s - mean
        adv = adv.unsqueeze(-1) * response_mask
    return adv, adv


def register_advantage_estimator() -> None:
    """Register `compute_sqlrl_grpo_advantage` as veRL's `sqlrl_grpo` in this process (idempotent)."""
    require_verl()
    from verl.trainer.ppo import core_algos

    import sqlrl.integrations.verl.advantage as canonical  # one function object, however this file is loaded

    fn = canonical.compute_sqlrl_grpo_advantage
    if core_algos.ADV_ESTIMATOR_REGISTRY.get(ADV_ESTIMATOR) is not fn:
        core_algos.register_adv_est(ADV_ESTIMATOR)(fn)  # raises if another function holds the name


def excluded_rows(data):
    """Boolean numpy array: which trajectories of a veRL DataProto are excluded (reward extra info
    `sqlrl_excluded`, or the agent loop's `sqlrl_infra_error` when the reward has not been merged)."""
    import numpy as np

    nt = data.non_tensor_batch
    n = len(data)
    out = np.zeros(n, dtype=bool)
    if "sqlrl_excluded" in nt:
        out |= np.asarray(nt["sqlrl_excluded"], dtype=float) > 0
    if "sqlrl_infra_error" in nt:
        out |= np.array([bool(x) for x in nt["sqlrl_infra_error"]], dtype=bool)
    return out


def mask_excluded(data) -> int:
    """Zero `response_mask` (in place) for the excluded trajectories of a DataProto; returns how many.

    veRL's losses use `response_mask` as the loss mask: a zero row is in no policy-gradient, KL or entropy
    term, nor in the token (token-mean) or sequence (seq-mean-*) counts that normalize them."""
    import torch

    rows = excluded_rows(data)
    if rows.any():
        data.batch["response_mask"][torch.from_numpy(rows)] = 0
    return int(rows.sum())


def make_manager_class():
    """Build ``SqlrlAgentLoopManager`` and register the ``sqlrl_grpo`` estimator (needs veRL)."""
    require_verl()
    from verl.experimental.agent_loop import AgentLoopManager
    from verl.utils.ray_utils import auto_await

    register_advantage_estimator()  # the driver imports this class by name: the estimator is then there

    class SqlrlAgentLoopManager(AgentLoopManager):
        """veRL's AgentLoopManager (runs in the trainer driver) that masks excluded trajectories out of
        the batch it returns (`mask_excluded`), for training and validation alike."""

        @auto_await
        async def generate_sequences(self, prompts):
            output = await AgentLoopManager.generate_sequences.__wrapped__(self, prompts)
            n = mask_excluded(output)
            if n:
                log.info(f"sqlrl: {n} of {len(output)} trajectories excluded (masked out of the update)")
            return output

    SqlrlAgentLoopManager.__qualname__ = "SqlrlAgentLoopManager"  # picklable by reference
    SqlrlAgentLoopManager.__module__ = PACKAGE  # ... through the package's lazy attribute
    return SqlrlAgentLoopManager
