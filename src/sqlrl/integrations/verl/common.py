"""What the parts of the veRL integration share: names veRL resolves, the veRL import check, task rows.

What is covered:
- ``MANAGER_CLASS`` and ``AGENT_LOOP_CLASS`` are the names veRL's driver and agent-loop workers load;
  they resolve through the package ``sqlrl.integrations.verl`` (its lazy ``__getattr__``).
- ``public_dict`` / ``public_from_row``: a dataset row carries only the public task fields.

What is not:
- ``require_verl`` checks that veRL imports, not its version (only ``VERL_VERSION`` is tested).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

PACKAGE = "sqlrl.integrations.verl"
VERL_VERSION = "0.9.1"
AGENT_NAME = "sqlrl_agent"
DATA_SOURCE = "sqlrl"
ADV_ESTIMATOR = "sqlrl_grpo"
MANAGER_CLASS = f"{PACKAGE}.SqlrlAgentLoopManager"
AGENT_LOOP_CLASS = f"{PACKAGE}.SqlrlAgentLoop"
GOLD_AUDIT_FILE = "gold_audit.json"


class VerlUnavailable(ImportError):
    """veRL (or one of its imports) is not installed in this environment."""


def require_verl():
    """The ``verl`` module; ``VerlUnavailable`` saying how to get it when it does not import."""
    try:
        import verl
    except Exception as e:  # ImportError, or a broken dependency raising something else at import time
        raise VerlUnavailable(
            f"veRL is not importable here ({type(e).__name__}: {e}); it lives in a separate venv because "
            "veRL 0.9.1 pins transformers<5.11: run scripts/verl-env.sh and use .venv-verl/bin/python"
        ) from e
    return verl


def gold_cache_dir() -> str:
    """The gold cache shared by `write_dataset`'s audit and the reward workers (`SQLRL_GOLD_CACHE`)."""
    return os.environ.get("SQLRL_GOLD_CACHE", str(Path.home() / ".cache" / "sqlrl" / "verl-goldcache"))


def public_dict(public) -> dict:
    """The public task fields a dataset row carries (no gold)."""
    return {
        "task_id": public.task_id,
        "db_id": public.db_id,
        "question": public.question,
        "schema": public.schema,
        "evidence": public.evidence,
        "db_path": public.db_path,
    }


def public_from_row(extra_info: Any):
    """The ``PublicTask`` of a dataset row's ``extra_info``."""
    from sqlrl.tasks.data import PublicTask

    d = dict(extra_info["sqlrl_task"])
    return PublicTask(**{k: d[k] for k in ("task_id", "db_id", "question", "schema", "evidence", "db_path")})
