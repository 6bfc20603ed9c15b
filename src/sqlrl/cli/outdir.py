"""Checks of a command's `--out` folder, made before anything is written (each a one-line ValueError
naming the folder, why it is refused and what to do instead).

- `check_eval_out`: `sqlrl eval` writes only into a new or empty folder or one holding an unfinished
  evaluation (whose partial predictions it resumes or, made with other settings, replaces); never
  into a finished evaluation, another kind of run, any other non-empty folder, an experiment's folder
  or a data folder.
- `check_outside_data`: no run folder inside the data folder it reads (the policy's sandbox can reach
  that folder), nor a folder in the Spider or BIRD layout.
- `make_folder` (a folder a command writes files into, e.g. a cache) and `check_report_file` (a file a
  command writes at its end): not a file where a folder is meant, nor a folder where a file is meant,
  nor a path whose folder cannot be made or written.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlrl.artifacts import RUN_LOCK_FILE, check_out_folder, check_out_path, run_kind

# what an interrupted `sqlrl eval` leaves in its folder (runner.PARTIAL, runner.PARTIAL_KEY, the gold
# cache) besides the lock file and the temporary files of a killed atomic write
EVAL_PARTIAL_NAMES = {"trajectories.partial.jsonl", "partial.json", ".goldcache", RUN_LOCK_FILE}


def _experiment_above(folder: Path) -> Path | None:
    """The nearest folder at or above `folder` holding an experiment.json, or None."""
    here = folder.expanduser().absolute()
    return next((p for p in [here, *here.parents] if (p / "experiment.json").is_file()), None)


def looks_like_data(folder: Path) -> bool:
    """Whether `folder` is in the Spider layout (tables.json) or a BIRD folder (its split files)."""
    from sqlrl.tasks.bird import bird_splits

    return folder.is_dir() and ((folder / "tables.json").is_file() or bool(bird_splits(folder.resolve())))


def check_outside_data(out: str | Path, data: str | Path, option: str = "--data") -> None:
    """Refuse an output folder that is, or is inside, the data folder `data`, or is a data folder."""
    from sqlrl.tasks.data import resolve_data_root

    folder = Path(out).expanduser().resolve()
    root = resolve_data_root(str(data)).expanduser().resolve()
    inside = folder == root or root in folder.parents
    if inside or looks_like_data(folder):
        where = (
            f"{'the' if folder == root else 'inside the'} data folder {root} ({option})"
            if inside
            else "a data folder (Spider or BIRD layout)"
        )
        raise ValueError(
            f"--out {out} is {where}; run files there would mix with the data, within reach of the policy's "
            "SQL; choose an --out folder outside any data folder"
        )


def check_eval_out(out: str | Path, data: str | Path, self_consistency: bool = False) -> None:
    """Refuse an `--out` that `sqlrl eval` would overwrite or mix files into (see the module doc). With
    `self_consistency`, a finished greedy evaluation without its self_consistency.json (a run stopped
    while sampling) is accepted: the same command evaluates again, greedy then self-consistency."""
    folder = Path(out)
    check_out_path(folder)
    check_out_folder(folder, "eval", "an evaluation")
    exp = _experiment_above(folder)
    if exp is not None:
        raise ValueError(
            f"--out {out} is inside the experiment folder {exp}; `sqlrl eval` would replace or mix files "
            "into it; choose an --out folder outside the experiment"
        )
    check_outside_data(folder, data)
    if not folder.is_dir():
        return
    if run_kind(folder) == "an evaluation" or (folder / "summary.json").exists():
        if self_consistency and not (folder / "self_consistency.json").exists():
            return  # stopped while sampling: evaluated again, greedy then self-consistency
        raise ValueError(
            f"--out {out} holds a finished evaluation; `sqlrl eval` would replace it; choose another "
            f"--out folder, or delete {out} to evaluate again"
        )
    other = sorted(
        p.name
        for p in folder.iterdir()
        if p.name not in EVAL_PARTIAL_NAMES and not (p.name.startswith(".") and p.name.endswith(".tmp"))
    )
    if other:
        raise ValueError(
            f"--out {out} is not empty and holds no unfinished evaluation (it has {other[0]}"
            f"{f' and {len(other) - 1} more' if len(other) > 1 else ''}); choose a new or empty --out folder"
        )


def _nearest_existing(path: Path) -> Path:
    here = path.expanduser().absolute()
    return next(p for p in [here, *here.parents] if p.exists() or p.is_symlink())


def make_folder(path: str | Path, option: str) -> Path:
    """Create the folder `path` (with its parents) for `option`, or ValueError naming why it cannot be."""
    folder = Path(path).expanduser()
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{option} {path} is a file, not a folder; give a folder path")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ValueError(
            f"{option} {path}: cannot create the folder ({e.strerror}: {e.filename}); give a folder you can "
            "write"
        ) from None
    return folder


def check_report_file(path: str | Path, option: str) -> None:
    """Refuse a file path `option` names that is a folder, or whose folder is a file or not writable
    (ValueError, one line); a missing folder is created when the file is written."""
    target = Path(path).expanduser()
    if target.is_dir():
        raise ValueError(f"{option} {path} is a folder; give a file path, e.g. {Path(path) / 'result.json'}")
    above = _nearest_existing(target.parent)
    if not above.is_dir():
        raise ValueError(f"{option} {path}: {above} is a file, not a folder; give a path in a folder")
    if not os.access(above, os.W_OK | os.X_OK):
        raise ValueError(
            f"{option} {path}: no permission to write in {above}; give a path in a folder you can write"
        )
