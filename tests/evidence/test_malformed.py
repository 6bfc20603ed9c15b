"""Malformed content in a copy of a committed experiment folder: a folder that cannot be read at all is one
line on stderr and exit 2; a readable folder with a defect is a failed gate check that names it. Gzipped
results are read wherever plain ones are."""

from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import pytest

from sqlrl.cli import main
from sqlrl.evidence import report as report_module
from sqlrl.evidence.gate import evidence_gate
from sqlrl.evidence.pair import compare_runs
from sqlrl.evidence.report import write_report

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from copy_result import RESULTS, SEED0, copy_result  # noqa: E402


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    d = copy_result(SEED0, tmp_path_factory.mktemp("pristine") / "exp")
    for name in ("verdict.json", "report.md", "report.html"):
        (d / name).unlink()
    return d


@pytest.fixture
def exp(pristine, tmp_path) -> Path:
    return Path(shutil.copytree(pristine, tmp_path / "exp"))


def _ev(d: Path, arm: str) -> Path:
    return d / "arms" / arm / "eval"


def _append(path: Path, line: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")


def _edit(path: Path, fn) -> None:
    obj = json.loads(path.read_text(encoding="utf-8"))
    fn(obj)
    path.write_text(json.dumps(obj), encoding="utf-8")


def _arm_spec(arm: str, key: str, value) -> callable:
    return lambda d: _edit(d / "experiment.json", lambda m: m["arms"][arm].__setitem__(key, value))


def _gz_append(d: Path) -> None:
    p = _ev(d, "grpo") / "trajectories.jsonl.gz"
    p.write_bytes(gzip.compress(gzip.decompress(p.read_bytes()) + b"[1]\n"))


def _gz_truncate(d: Path) -> None:  # EOFError when read
    p = _ev(d, "grpo") / "trajectories.jsonl.gz"
    p.write_bytes(p.read_bytes()[:-4000])


def _gz_scramble(d: Path) -> None:  # zlib.error when read
    p = _ev(d, "grpo") / "trajectories.jsonl.gz"
    b = bytearray(p.read_bytes())
    b[100:110] = bytes(10)
    p.write_bytes(bytes(b))


FAILED_CHECKS = {
    "results line a list": (
        lambda d: _append(_ev(d, "grpo") / "results.jsonl", "[1, 2]"),
        "trajectories: arm 'grpo': arms/grpo/eval/results.jsonl missing or unreadable",
    ),
    "results line a number": (
        lambda d: _append(_ev(d, "base") / "results.jsonl", "5"),
        "same_tasks: arm 'base': results.jsonl missing, task set unknown",
    ),
    "trajectories line a list": (
        _gz_append,
        "trajectories: arm 'grpo': arms/grpo/eval/trajectories.jsonl.gz is unreadable",
    ),
    "truncated gzip": (
        _gz_truncate,
        "trajectories: arm 'grpo': arms/grpo/eval/trajectories.jsonl.gz is unreadable",
    ),
    "corrupt gzip": (
        _gz_scramble,
        "trajectories: arm 'grpo': arms/grpo/eval/trajectories.jsonl.gz is unreadable",
    ),
    "train run.json a list": (
        lambda d: (d / "arms" / "validity" / "train" / "run.json").write_text("[1]"),
        "controls: control 'validity': train run missing (arms/validity/train/run.json)",
    ),
    "eval run.json a list": (
        lambda d: (_ev(d, "no_update") / "run.json").write_text("[]"),
        "controls: control 'no_update': eval run missing (arms/no_update/eval/run.json + results.jsonl)",
    ),
}


@pytest.mark.parametrize("case", sorted(FAILED_CHECKS))
def test_a_defect_of_a_readable_folder_is_a_named_failed_check(exp, case, capsys) -> None:
    tamper, problem = FAILED_CHECKS[case]
    tamper(exp)
    assert problem in evidence_gate(exp).missing
    assert main(["report", str(exp), "--n-boot", "20"]) == 1
    out, err = capsys.readouterr()
    assert err == "" and f"missing: {problem}" in out
    assert json.loads((exp / "verdict.json").read_text())["claim_allowed"] is False


UNREADABLE = {
    "turns a string": (_arm_spec("grpo", "turns", "1"), "arm 'grpo': turns is '1', not a whole number >= 1"),
    "eval_run a number": (_arm_spec("grpo", "eval_run", 5), "arm 'grpo': eval_run is 5, not a path"),
    "context_tokens a list": (
        _arm_spec("base", "context_tokens", [1]),
        "arm 'base': context_tokens is [1], not a whole number >= 1",
    ),
    "config a list": (
        lambda d: _edit(d / "experiment.json", lambda m: m.__setitem__("config", [])),
        "'config' is not an object",
    ),
}


@pytest.mark.parametrize("case", sorted(UNREADABLE))
@pytest.mark.parametrize("check", [True, False])
def test_an_unreadable_experiment_json_is_one_line_and_exit_2(exp, case, check, capsys) -> None:
    tamper, needle = UNREADABLE[case]
    tamper(exp)
    assert main(["report", str(exp), *(["--check"] if check else ["--n-boot", "20"])]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("sqlrl report: ") and needle in err
    assert not (exp / "verdict.json").exists()


def test_a_string_model_is_not_shown_and_the_report_is_written(exp, capsys) -> None:
    _edit(_ev(exp, "grpo") / "run.json", lambda r: r.__setitem__("model", "qwen"))
    _edit(_ev(exp, "grpo") / "summary.json", lambda s: s.pop("model", None))
    assert main(["report", str(exp), "--n-boot", "20"]) == 1  # written; no claim: what grpo ran is unknown
    assert capsys.readouterr().err == ""
    md = (exp / "report.md").read_text()
    assert "| grpo | grpo | 1 | `-` |" in md
    assert "identities: arm 'grpo': its eval run.json records no model identity" in md


def test_a_report_that_fails_writes_no_verdict(exp, monkeypatch) -> None:
    def broken(*a, **kw):
        raise RuntimeError("rendering failed")

    monkeypatch.setattr(report_module, "render_html", broken)
    with pytest.raises(RuntimeError):
        write_report(exp, n_boot=20)
    assert not (exp / "verdict.json").exists() and not (exp / "report.md").exists()


@pytest.mark.parametrize(
    "args, said",
    [
        (["--n-boot", "0"], "sqlrl report: --n-boot must be >= 1, got 0"),
        (["--out", "FILE"], "sqlrl report: --out FILE: exists and is not a folder"),
    ],
)
def test_bad_report_options_are_one_line_and_exit_2(exp, tmp_path, args, said, capsys) -> None:
    (tmp_path / "file").write_text("x")
    args = [str(tmp_path / "file") if a == "FILE" else a for a in args]
    assert main(["report", str(exp), *args]) == 2
    assert capsys.readouterr().err == said.replace("FILE", str(tmp_path / "file")) + "\n"
    assert not (exp / "verdict.json").exists()


@pytest.mark.parametrize(
    "args, said",
    [
        (["--n-boot", "0"], "sqlrl seeds: --n-boot must be >= 1, got 0"),
        (["--out", "FILE"], "sqlrl seeds: --out FILE: exists and is not a folder"),
    ],
)
def test_bad_seeds_options_are_one_line_and_exit_2(pristine, tmp_path, args, said, capsys) -> None:
    (tmp_path / "file").write_text("x")
    args = [str(tmp_path / "file") if a == "FILE" else a for a in args]
    argv = ["seeds", str(pristine), str(pristine), *args]
    assert main(argv + ([] if "--out" in args else ["--out", str(tmp_path / "o")])) == 2
    assert capsys.readouterr().err == said.replace("FILE", str(tmp_path / "file")) + "\n"


def test_gzipped_results_count_as_an_eval_run(exp) -> None:
    p = _ev(exp, "grpo") / "results.jsonl"
    p.with_name("results.jsonl.gz").write_bytes(gzip.compress(p.read_bytes()))
    p.unlink()
    v = evidence_gate(exp)
    assert v.claim_allowed, v.missing


def test_compare_reads_a_committed_folder_with_gzipped_results() -> None:
    sft = RESULTS / "2026-12-02-spider-0.5b-sft-grpo100" / "standalone_eval" / "sft"
    assert not (sft / "results.jsonl").exists()
    c = compare_runs(sft, RESULTS / "2026-12-02-spider-0.5b-sft-grpo100" / "arms" / "sft" / "eval", n_boot=20)
    assert (c.a.scored, c.a.correct, c.a.excluded) == (667, 445, 92)


def test_report_md_prints_each_arms_notes_as_report_html_does(exp) -> None:
    _edit(_ev(exp, "grpo") / "summary.json", lambda s: s.__setitem__("execution_match", 0.5))
    write_report(exp, n_boot=20)
    note = "grpo: summary.json execution_match=0.5000 disagrees with results.jsonl ("
    assert note in (exp / "report.html").read_text()
    assert f"- {note}" in (exp / "report.md").read_text()
