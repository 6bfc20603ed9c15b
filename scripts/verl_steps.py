"""Per-step time, throughput and memory of a veRL run, from what `gpu.sh verlgo` records.

Reads veRL's console lines (`step:N - key:value - ...`, as veRL's console logger prints them, with or
without Ray's `(TaskRunner pid=...)` prefix, numpy scalars as `np.float64(x)`; a step logged twice by a
resumed run counts once, its last record), the GPU memory samples of `nvidia-smi --query-gpu=timestamp,memory.used --format=csv` (headers
repeated per call are skipped) and verlgo's timings.tsv (call, phase, seconds, rc). Writes one JSON line
per step and a summary: step time (`timing_s/step`), throughput (`perf/throughput`, tokens/s per GPU),
veRL's peak allocated/reserved memory (`perf/max_memory_*_gb`) where logged, the sampled peak, seconds per
phase. Standard library only.

usage: python3 scripts/verl_steps.py LOG --mem CSV --timings TSV --jsonl OUT.jsonl --json OUT.json
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

STEP = re.compile(r"step:(\d+) - (.*)$")
# veRL prints each value with pprint.pformat: numpy scalars (every metric its reduce_metrics takes
# np.mean/np.max of, e.g. actor/* and perf/max_memory_*) read `np.float64(1.5)` under numpy 2
NP_SCALAR = re.compile(r"^np\.\w+\((.*)\)$")


def read_steps(log: str) -> dict[int, dict[str, float]]:
    steps: dict[int, dict[str, float]] = {}
    for line in log.splitlines():
        m = STEP.search(line)
        if not m:
            continue
        rec: dict[str, float] = {}
        for item in m.group(2).split(" - "):
            key, sep, value = item.rpartition(":")
            m_np = NP_SCALAR.match(value.strip())
            try:
                rec[key] = float(m_np.group(1) if m_np else value)
            except ValueError:
                continue
        steps[int(m.group(1))] = rec
    return dict(sorted(steps.items()))


def peak_mib(csv: str) -> float | None:
    vals = []
    for line in csv.splitlines():
        m = re.search(r"([\d.]+) MiB\s*$", line)
        if m:
            vals.append(float(m.group(1)))
    return max(vals) if vals else None


def phases(tsv: str) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for line in tsv.splitlines()[1:]:
        cols = line.split("\t")
        if len(cols) < 4:
            continue
        p = out.setdefault(cols[1], {"seconds": 0, "calls": 0, "rc": []})
        p["seconds"] += int(cols[2])
        p["calls"] += 1
        p["rc"].append(int(cols[3]))
    return out


def _stats(vals: list[float]) -> dict | None:
    if not vals:
        return None
    return {
        "n": len(vals),
        "mean": statistics.fmean(vals),
        "median": statistics.median(vals),
        "max": max(vals),
    }


def summarize(steps: dict[int, dict[str, float]], mem: float | None, ph: dict) -> dict:
    def col(key: str) -> list[float]:
        return [r[key] for r in steps.values() if key in r]

    alloc, reserved = col("perf/max_memory_allocated_gb"), col("perf/max_memory_reserved_gb")
    return {
        "steps_logged": len(steps),
        "last_step": max(steps) if steps else None,
        "time_step_s": _stats(col("timing_s/step")),
        "throughput_tokens_per_s_per_gpu": _stats(col("perf/throughput")),
        "max_memory_allocated_gb": max(alloc) if alloc else None,
        "max_memory_reserved_gb": max(reserved) if reserved else None,
        "gpu_memory_used_peak_mib": mem,
        "phases": ph,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("log", help="the run's console log (verl-run.log)")
    ap.add_argument("--mem", help="nvidia-smi samples (gpu_mem.csv)")
    ap.add_argument("--timings", help="gpu.sh verlgo's timings.tsv")
    ap.add_argument("--jsonl", required=True, help="one line per step")
    ap.add_argument("--json", required=True, help="the summary")
    a = ap.parse_args(argv)
    if not Path(a.log).is_file():
        print(f"verl_steps: no log {a.log}; pass the verl-run.log that gpu.sh verlgo wrote", file=sys.stderr)
        return 2
    steps = read_steps(Path(a.log).read_text(errors="replace"))
    mem = peak_mib(Path(a.mem).read_text()) if a.mem and Path(a.mem).is_file() else None
    ph = phases(Path(a.timings).read_text()) if a.timings and Path(a.timings).is_file() else {}
    with open(a.jsonl, "w") as f:
        for n, rec in steps.items():
            f.write(json.dumps({"step": n, **rec}) + "\n")
    s = summarize(steps, mem, ph)
    Path(a.json).write_text(json.dumps(s, indent=1) + "\n")
    t = s["time_step_s"]
    print(
        f"{s['steps_logged']} steps logged (last {s['last_step']}); step time "
        + (f"median {t['median']:.1f} s" if t else "-")
        + f"; GPU memory peak {mem} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
