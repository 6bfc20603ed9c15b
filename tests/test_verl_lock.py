"""The GPU wheel set of veRL: scripts/verl-gpu.lock parses and says what docs/verl.md says, and
scripts/verl-env.sh's --gpu-pack / --gpu-install carry a (tiny, hand-made) wheel set through parts and
install it into a target folder, refusing corrupt, missing or stale parts and unmet requirements."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import verl_lock  # noqa: E402


def test_real_lock_parses_and_pins_the_chosen_set():
    rows = verl_lock.read_lock(ROOT / "scripts" / "verl-gpu.lock")
    by = {(r["kind"], r["name"]): r for r in rows}
    assert by[("carry", "verl")]["version"] == "0.9.1"
    assert by[("carry", "vllm")]["version"] == "0.24.0"
    assert by[("carry", "ray")]["version"] == "2.60.0"
    assert by[("carry", "transformers")]["version"] == "5.9.0"  # the machine's 5.17.0 is above veRL's <5.11
    assert by[("device", "torch")]["version"] == "2.11.0"  # the machine's own torch, never carried
    assert by[("device", "numpy")]["version"] == "2.5.2"
    assert {r["name"] for r in rows if r["kind"] == "override"} == {"numba", "numpy"}
    travelling = verl_lock.travelling(rows, extra=False)
    assert not {"torch", "numpy", "triton"} & {r["name"] for r in travelling}
    # every extra row is one the spec names, with its reason
    spec = verl_lock.read_spec(ROOT / "scripts" / "verl-gpu.in")
    assert {r["name"] for r in rows if r["kind"] == "extra"} <= set(spec["extra"])
    assert "flashinfer-cubin" in {r["name"] for r in rows if r["kind"] == "extra"}


@pytest.mark.parametrize(
    "line, why",
    [
        ("carry verl 0.9.1 verl-0.9.1-py3-none-any.whl 10 abc", "sha256"),
        ("carry verl 0.9.1 vllm-0.9.1-py3-none-any.whl 10 " + "0" * 64, "is not verl 0.9.1"),
        ("carry verl 0.9.1 verl-0.9.1-py3-none-any.whl", "6 fields"),
        ("wheel verl 0.9.1", "unknown row kind"),
    ],
)
def test_lock_rejects_malformed_rows(tmp_path, line, why):
    p = tmp_path / "bad.lock"
    p.write_text(line + "\n")
    with pytest.raises(verl_lock.LockError, match=why):
        verl_lock.read_lock(p)


def test_lock_rejects_a_name_twice(tmp_path):
    p = tmp_path / "twice.lock"
    p.write_text("device torch 2.11.0\ndevice Torch 2.11.0\n")
    with pytest.raises(verl_lock.LockError, match="appears twice"):
        verl_lock.read_lock(p)


def _wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    """A minimal pure-Python wheel: module `name` with __version__, METADATA with `requires`, RECORD."""
    files = {
        f"{name}/__init__.py": f"__version__ = {version!r}\n",
        f"{name}-{version}.dist-info/METADATA": "Metadata-Version: 2.1\n"
        f"Name: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires),
        f"{name}-{version}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(text.encode())}")
    record.append(f"{name}-{version}.dist-info/RECORD,,")
    files[f"{name}-{version}.dist-info/RECORD"] = "\n".join(record) + "\n"
    out = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, text in sorted(files.items()):
            z.writestr(zipfile.ZipInfo(path, date_time=(2020, 1, 1, 0, 0, 0)), text)
    return out


def _lock(path: Path, wheels: list[Path], extra_rows: str = "") -> Path:
    rows = []
    for w in wheels:
        name, version = w.name.split("-")[:2]
        rows.append(f"carry {name} {version} {w.name} {w.stat().st_size} {verl_lock.sha256_file(w)}")
    pip_version = importlib.metadata.version("pip")  # a package every Python with pip has: a device row
    path.write_text("\n".join(rows) + f"\ndevice pip {pip_version}\n" + extra_rows)
    return path


def _env_sh(args: list[str], lock: Path, **env) -> subprocess.CompletedProcess:
    full = {**os.environ, "VERL_LOCK": str(lock), "PYTHON": sys.executable, "PYTHONPATH": "", **env}
    return subprocess.run(
        ["bash", "scripts/verl-env.sh", *args],
        cwd=ROOT,
        env=full,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture
def wheelset(tmp_path):
    w = tmp_path / "wheels"
    w.mkdir()
    a = _wheel(w, "fakea", "1.0", ["fakeb>=2.0"])
    b = _wheel(w, "fakeb", "2.0", [])
    return w, [a, b]


def test_pack_splits_into_parts_that_join_to_the_manifest(tmp_path, wheelset):
    """Two small wheels make one 10240-byte tar record (GNU tar's default blocking), so 1 KiB parts are
    exactly 10; the manifest's sha256 is the joined parts' and its lock line the lock's sha256."""
    wdir, wheels = wheelset
    lock = _lock(tmp_path / "fake.lock", wheels)
    out = tmp_path / "stage"
    r = _env_sh(["--gpu-pack", str(wdir), str(out), "1K"], lock)
    assert r.returncode == 0, r.stderr
    parts = sorted(out.glob("part*"))
    assert [p.name for p in parts] == [f"part{i:02d}" for i in range(10)]
    manifest = dict(line.split(" ", 1) for line in (out / "MANIFEST").read_text().splitlines())
    joined = b"".join(p.read_bytes() for p in parts)
    assert manifest["bytes"] == "10240" == str(len(joined))
    assert manifest["sha256"] == hashlib.sha256(joined).hexdigest()
    assert manifest["lock"] == verl_lock.sha256_file(lock) and manifest["parts"] == "10"
    # the same files pack to the same bytes
    again = tmp_path / "again"
    assert _env_sh(["--gpu-pack", str(wdir), str(again), "1K"], lock).returncode == 0
    assert (again / "MANIFEST").read_text() == (out / "MANIFEST").read_text()


def test_install_puts_the_set_into_target(tmp_path, wheelset):
    wdir, wheels = wheelset
    lock = _lock(tmp_path / "fake.lock", wheels)
    out, target = tmp_path / "stage", tmp_path / "site"
    assert _env_sh(["--gpu-pack", str(wdir), str(out), "4K"], lock).returncode == 0
    r = _env_sh(["--gpu-install", str(out), str(target)], lock, VERL_IMPORT_CHECK="fakea fakeb")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (target / "fakea" / "__init__.py").is_file() and (target / "fakeb-2.0.dist-info").is_dir()
    assert "fakea 1.0" in r.stdout and "fakeb 2.0" in r.stdout and "installed 2 files" in r.stdout


def test_install_refuses_a_corrupt_part(tmp_path, wheelset):
    wdir, wheels = wheelset
    lock = _lock(tmp_path / "fake.lock", wheels)
    out = tmp_path / "stage"
    assert _env_sh(["--gpu-pack", str(wdir), str(out), "4K"], lock).returncode == 0
    part = out / "part01"
    data = bytearray(part.read_bytes())
    data[0] ^= 0xFF
    part.write_bytes(bytes(data))
    r = _env_sh(["--gpu-install", str(out), str(tmp_path / "site")], lock)
    assert r.returncode == 1 and "MANIFEST says" in r.stderr
    assert not (tmp_path / "site").exists()


def test_install_refuses_missing_parts_and_another_lock(tmp_path, wheelset):
    wdir, wheels = wheelset
    lock = _lock(tmp_path / "fake.lock", wheels)
    out = tmp_path / "stage"
    assert _env_sh(["--gpu-pack", str(wdir), str(out), "4K"], lock).returncode == 0
    (out / "part02").unlink()
    r = _env_sh(["--gpu-install", str(out), str(tmp_path / "site")], lock)
    assert r.returncode == 2 and "holds 2 of 3 parts" in r.stderr
    assert _env_sh(["--gpu-pack", str(wdir), str(out), "4K"], lock).returncode == 0
    lock.write_text(lock.read_text() + "# edited after packing\n")
    r = _env_sh(["--gpu-install", str(out), str(tmp_path / "site")], lock)
    assert r.returncode == 2 and "packed from another lock" in r.stderr


def test_install_reports_unmet_requirements_unless_overridden(tmp_path):
    """fakea needs fakeb>=3 and the set holds fakeb 2.0: pip check's line is reported (exit 1) unless the
    lock overrides fakeb."""
    wdir = tmp_path / "wheels"
    wdir.mkdir()
    wheels = [_wheel(wdir, "fakea", "1.0", ["fakeb>=3"]), _wheel(wdir, "fakeb", "2.0", [])]
    for override, want in (("", 1), ("override fakeb fakeb>=2\n", 0)):
        lock = _lock(tmp_path / "fake.lock", wheels, override)
        out, target = tmp_path / "stage", tmp_path / f"site{want}"
        assert _env_sh(["--gpu-pack", str(wdir), str(out), "4K"], lock).returncode == 0
        r = _env_sh(["--gpu-install", str(out), str(target)], lock, VERL_IMPORT_CHECK="fakea")
        assert r.returncode == want, r.stdout + r.stderr
        if want:
            assert "fakea 1.0 has requirement fakeb>=3, but you have fakeb 2.0" in r.stderr
            r = _env_sh(
                ["--gpu-install", str(out), str(target)],
                lock,
                VERL_IMPORT_CHECK="fakea",
                VERL_ALLOW_UNMET="1",
            )
            assert r.returncode == 0 and "fakeb>=3" in r.stderr  # reported, then the install goes on


def test_fetch_checks_files_already_there(tmp_path, wheelset):
    """Every file of the lock is already in the folder with its sha256: nothing is downloaded."""
    wdir, wheels = wheelset
    lock = _lock(tmp_path / "fake.lock", wheels)
    r = _env_sh(["--gpu-fetch", str(wdir)], lock)
    total = sum(w.stat().st_size for w in wheels)
    assert r.returncode == 0 and f"2 files, {total} bytes: ok" in r.stdout


def test_cpu_venv_reads_versions_from_the_lock(tmp_path):
    """A lock without a verl row stops the CPU venv before anything is created (exit 2)."""
    lock = tmp_path / "noverl.lock"
    lock.write_text("device torch 2.11.0\n")
    r = _env_sh([], lock, VENV=str(tmp_path / "venv"))
    assert r.returncode == 2 and "verl is not in" in r.stderr
    assert not (tmp_path / "venv").exists()


def _gpu_sh(
    args: list[str], lock: Path, parts: Path, scratch: Path, cwd: Path = ROOT, **more: str
) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "VERL_LOCK": str(lock),
        "VERL_PARTS": str(parts),
        "SQLRL_SCRATCH": str(scratch),
        **more,
    }
    env.update(PYTHON=sys.executable, PYTHONPATH="", VERL_IMPORT_CHECK="fakea fakeb")
    return subprocess.run(
        ["bash", "scripts/gpu.sh", "verl", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _small_checkout(tmp_path: Path) -> Path:
    """A git checkout of this repository's scripts and constraints only: the working tree the preflight
    measures is then a few hundred KB, whatever this checkout's results/ weighs (over 64 MiB since
    2026-12-07, which is what `gpu.sh slim` is for)."""
    import shutil

    co = tmp_path / "co"
    shutil.copytree(ROOT / "scripts", co / "scripts")
    for f in ROOT.glob("constraints*.txt"):
        shutil.copy(f, co / f.name)
    for cmd in (["init", "-q"], ["add", "-A"]):
        subprocess.run(["git", *cmd], cwd=co, check=True, capture_output=True)
    return co


def test_gpu_sh_verl_preflight_stage_install(tmp_path, wheelset):
    """The device flow on CPU: preflight here, one staging call per part, then install from the last one."""
    wdir, wheels = wheelset
    lock = _lock(tmp_path / "fake.lock", wheels)
    parts, scratch, co = tmp_path / "stage", tmp_path / "scratch", _small_checkout(tmp_path)
    assert _env_sh(["--gpu-pack", str(wdir), str(parts), "4K"], lock).returncode == 0
    r = _gpu_sh(["preflight"], lock, parts, scratch, co)
    assert r.returncode == 0 and "verl preflight ok" in r.stdout and "3 calls" in r.stdout, r.stdout
    r = _gpu_sh(["stage", "00", "01"], lock, parts, scratch, co)
    assert r.returncode == 0 and "verl staged: 2 parts, 8192 bytes" in r.stdout
    r = _gpu_sh(["install"], lock, parts, scratch, co)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (scratch / "verl.done").is_file() and (scratch / "verl-site" / "fakea" / "__init__.py").is_file()
    assert not (scratch / "verl-parts").exists()  # the parts are removed once installed
    assert "installed in" in _gpu_sh(["install"], lock, parts, scratch, co).stdout  # once per machine


def test_gpu_sh_verl_preflight_says_slim_when_the_tree_is_too_large(tmp_path, wheelset):
    """A working tree that leaves no room for a part (results/ tracked) is named as the cause, with the
    command that removes it from the calls."""
    wdir, wheels = wheelset
    lock = _lock(tmp_path / "fake.lock", wheels)
    parts, co = tmp_path / "stage", _small_checkout(tmp_path)
    assert _env_sh(["--gpu-pack", str(wdir), str(parts), "4K"], lock).returncode == 0
    (co / "results").mkdir()
    with open(co / "results" / "big.bin", "wb") as f:
        f.truncate((64 << 20) - 2048)  # the tree alone fits, a 4 KB part beside it does not
    subprocess.run(["git", "add", "results"], cwd=co, check=True)
    r = _gpu_sh(["preflight"], lock, parts, tmp_path / "scratch", co)
    assert r.returncode == 1 and "bash scripts/gpu.sh slim" in r.stdout, r.stdout


def test_gpu_sh_verl_preflight_sizes_the_verlgo_call(tmp_path, wheelset):
    """With the model's parts (GPU_PARTS) the preflight also sizes the repeated verlgo call (the last
    model part and the last veRL part travel together): a 64 MiB last model part does not fit."""
    wdir, wheels = wheelset
    lock = _lock(tmp_path / "fake.lock", wheels)
    parts, model, co = tmp_path / "stage", tmp_path / "model", _small_checkout(tmp_path)
    assert _env_sh(["--gpu-pack", str(wdir), str(parts), "4K"], lock).returncode == 0
    r = _gpu_sh(["preflight"], lock, parts, tmp_path / "scratch", co)
    assert r.returncode == 0 and "the verlgo call not checked: no model parts" in r.stdout, r.stdout
    model.mkdir()
    (model / "MANIFEST").write_text("parts 2\n")
    (model / "part00").write_bytes(b"x" * 1024)
    (model / "part01").write_bytes(b"x" * 1024)
    r = _gpu_sh(["preflight"], lock, parts, tmp_path / "scratch", co, GPU_PARTS=str(model))
    # the small checkout has no .stage/spider.tgz, .whl or .stage/tree.tgz: the call carries the tree,
    # the last model part and its MANIFEST, the last veRL part and its MANIFEST
    carried = re.search(r"the verlgo call carries (\d+) B of (\d+)", r.stdout)
    tree = re.search(r"working tree (\d+) B", r.stdout)
    assert carried and tree, r.stdout
    total, limit = int(carried[1]), int(carried[2])
    assert limit == 64 << 20 and total >= int(tree[1]) + 1024 + len("parts 2\n"), r.stdout
    assert total < 1 << 20 and r.returncode == 0, r.stdout
    with open(model / "part01", "wb") as f:
        f.truncate(64 << 20)  # with the rest of the call, over 64 MiB
    r = _gpu_sh(["preflight"], lock, parts, tmp_path / "scratch", co, GPU_PARTS=str(model))
    assert r.returncode == 1 and "the verlgo call needs" in r.stdout, r.stdout


def test_gpu_sh_verl_preflight_finds_a_stale_pack(tmp_path, wheelset):
    wdir, wheels = wheelset
    lock = _lock(tmp_path / "fake.lock", wheels)
    parts = tmp_path / "stage"
    assert _env_sh(["--gpu-pack", str(wdir), str(parts), "4K"], lock).returncode == 0
    lock.write_text(lock.read_text() + "# edited\n")
    r = _gpu_sh(["preflight"], lock, parts, tmp_path / "scratch", _small_checkout(tmp_path))
    assert r.returncode == 1 and "packed from another lock" in r.stdout
    r = _gpu_sh(["no-such"], lock, parts, tmp_path / "scratch")
    assert r.returncode == 2 and "usage: gpu.sh verl" in r.stderr
