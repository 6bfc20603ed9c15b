"""`sqlrl export -o OUT`: an export replaces OUT whole, so OUT may only be new, empty or an earlier export;
never a file, a folder with other files, nor the source or a folder overlapping it. Refused before
anything is read or written, in one line, exit 2, with every file kept."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sqlrl.cli.export import cli_main, fsdp_main, out_problem


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A run folder as a user has it: a config and a log, no checkpoint."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "steps.jsonl").write_text('{"step": 1}\n')
    return run


def _files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): p.read_text() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "make_out,said",
    [
        (
            lambda t, run: _mk(t / "userdir", {"mine.txt": "keep"}),
            "is a folder that is not empty and not an earlier export",
        ),
        (lambda t, run: _mk_file(t / "notes.txt"), "is a file, not a folder"),
        (lambda t, run: _mk_link(t / "gone", t / "nowhere"), "is a symbolic link to"),
        (lambda t, run: _mk_link(t / "to-file", _mk_file(t / "notes.txt")), "is a file, not a folder"),
        (lambda t, run: run, "overlaps it"),
        (lambda t, run: run / "hf", "overlaps it"),
        (lambda t, run: t, "overlaps it"),  # a folder holding the run
    ],
    ids=[
        "user-folder",
        "file",
        "dangling-link",
        "link-to-a-file",
        "the-source",
        "inside-the-source",
        "holding-the-source",
    ],
)
def test_export_refuses_an_out_it_would_destroy(tmp_path, run, capsys, make_out, said) -> None:
    out = make_out(tmp_path, run)
    before = _files(tmp_path)
    assert cli_main([str(run), "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sqlrl export: ") and said in err and err.count("\n") == 1, err
    assert _files(tmp_path) == before  # nothing lost, nothing written


def test_the_fsdp_export_refuses_the_same(tmp_path, run, capsys) -> None:
    out = _mk(tmp_path / "userdir", {"mine.txt": "keep"})
    assert fsdp_main([str(run), "-o", str(out)]) == 2
    assert "not empty" in capsys.readouterr().err and (out / "mine.txt").read_text() == "keep"


def test_new_empty_and_earlier_export_folders_may_receive_an_export(tmp_path, run) -> None:
    assert out_problem(run, tmp_path / "new") is None
    assert out_problem(run, _mk(tmp_path / "empty", {})) is None
    earlier = {"identity.json": json.dumps({"weights_hash": "sha256:00", "source_checkpoint": "x"}), "a": "b"}
    assert out_problem(run, _mk(tmp_path / "earlier", earlier)) is None
    # a run's final/ (export_hf writes source_checkpoint null there) and a folder without the key
    final = {"identity.json": json.dumps({"weights_hash": "sha256:00", "source_checkpoint": None, "step": 3})}
    assert "not an earlier export" in out_problem(run, _mk(tmp_path / "final", final))
    bare = {"identity.json": json.dumps({"weights_hash": "sha256:00"})}
    assert "not an earlier export" in out_problem(run, _mk(tmp_path / "bare", bare))


def _mk(folder: Path, files: dict[str, str]) -> Path:
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text)
    return folder


def _mk_file(path: Path) -> Path:
    path.write_text("notes")
    return path


def _mk_link(link: Path, target: Path) -> Path:
    link.symlink_to(target)
    return link
