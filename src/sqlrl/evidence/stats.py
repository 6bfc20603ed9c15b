"""Statistics for "did training help?": paired bootstrap, exact McNemar, accuracy intervals.

numpy + standard library only; importing this module never imports torch (tested).

Conventions:
  * Two arms evaluated on the same task list, in the same order: ``a`` is the baseline / control,
    ``b`` the treatment. Every difference is ``diff = mean(b) - mean(a)``: positive means b is better.
  * Per-task outcomes are bool / 0-1 ints (execution match) or floats (any per-task score).
  * Bootstrap intervals are percentile intervals (numpy ``quantile``, linear interpolation) of
    ``n_boot`` resamples; a given (data, n_boot, seed, ci) gives the same numbers on every run of a
    given sqlrl + numpy version (numpy's ``default_rng(seed)`` stream).

Guaranteed: exact McNemar p-values (big-integer arithmetic, correctly rounded to float at the end);
deterministic bootstraps; clear ValueErrors for misaligned or non-finite input. Not guaranteed:
nominal coverage of bootstrap intervals (percentile intervals under-cover for small n, for
accuracies near 0 or 1, and -- in ``hierarchical_bootstrap`` -- for few seeds); the alignment of
tasks across arms (the caller must pass outcomes in the same task order; this module only checks
lengths).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction
from statistics import NormalDist

import numpy as np

__all__ = [
    "paired_bootstrap",
    "mcnemar_exact",
    "accuracy_ci",
    "wilson_interval",
    "hierarchical_bootstrap",
]

# Bootstrap resamples are drawn in blocks of about this many indices to bound memory
# (10k resamples x 1000 tasks would otherwise be an 80 MB index matrix). Changing it changes the
# random stream and hence the numbers, so it is a fixed constant.
_BLOCK_ELEMS = 2_000_000


def _outcomes(x: Sequence[bool | int | float], name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be a 1-D sequence of per-task outcomes, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} is empty")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or inf (drop excluded tasks from both arms first)")
    return arr


def _paired(a, b) -> tuple[np.ndarray, np.ndarray]:
    a_arr = _outcomes(a, "a")
    b_arr = _outcomes(b, "b")
    if a_arr.shape != b_arr.shape:
        raise ValueError(
            f"paired arms must have the same length (same tasks in the same order): "
            f"len(a)={a_arr.size}, len(b)={b_arr.size}"
        )
    return a_arr, b_arr


def _check_boot(n_boot: int, ci: float) -> None:
    if int(n_boot) != n_boot or n_boot < 1:
        raise ValueError(f"n_boot must be a positive integer, got {n_boot}")
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be in (0, 1), got {ci}")


def _percentiles(boot: np.ndarray, ci: float) -> tuple[float, float]:
    alpha = 1.0 - ci
    lo, hi = np.quantile(boot, [alpha / 2.0, 1.0 - alpha / 2.0])
    return float(lo), float(hi)


def _boot_means(d: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    """Means of ``n_boot`` resamples (with replacement, size n) of the 1-D array ``d``."""
    n = d.size
    rows = max(1, _BLOCK_ELEMS // n)
    out = np.empty(n_boot, dtype=np.float64)
    for s in range(0, n_boot, rows):
        k = min(rows, n_boot - s)
        idx = rng.integers(0, n, size=(k, n))  # [k, n]
        out[s : s + k] = d[idx].mean(axis=1)
    return out


def paired_bootstrap(
    a: Sequence[bool | int | float],
    b: Sequence[bool | int | float],
    *,
    n_boot: int = 10000,
    seed: int = 0,
    ci: float = 0.95,
) -> dict:
    """Paired percentile bootstrap of ``diff = mean(b) - mean(a)``.

    Each resample draws n task indices with replacement and uses them for *both* arms (equivalently,
    resamples the per-task differences b_i - a_i), so the correlation between arms on the same task
    is kept. Returns ``{diff, ci_low, ci_high, se, mean_a, mean_b, n, n_boot, seed, ci}``; ``se`` is
    the standard deviation of the bootstrap distribution.
    """
    a_arr, b_arr = _paired(a, b)
    _check_boot(n_boot, ci)
    d = b_arr - a_arr  # [n]
    boot = _boot_means(d, int(n_boot), np.random.default_rng(seed))
    lo, hi = _percentiles(boot, ci)
    return {
        "diff": float(d.mean()),
        "ci_low": lo,
        "ci_high": hi,
        "se": float(boot.std()),
        "mean_a": float(a_arr.mean()),
        "mean_b": float(b_arr.mean()),
        "n": int(d.size),
        "n_boot": int(n_boot),
        "seed": seed,
        "ci": float(ci),
    }


def _binary(x: np.ndarray, name: str) -> np.ndarray:
    if not np.isin(x, (0.0, 1.0)).all():
        raise ValueError(f"{name} must contain only booleans / 0 / 1 for McNemar's test")
    return x.astype(bool)


def mcnemar_exact(a: Sequence[bool | int], b: Sequence[bool | int]) -> dict:
    """Exact (binomial) two-sided McNemar test on paired binary outcomes.

    ``n01`` = tasks a got wrong and b got right, ``n10`` = a right and b wrong. Under H0 the
    discordant pairs split Binomial(n01 + n10, 1/2);
    ``p_value = min(1, 2 * P[X <= min(n01, n10)])``, and 1.0 when there are no discordant pairs.
    Computed with exact integers (``math.comb``) and one final correctly rounded division, so it is
    exact for any n (p-values below ~1e-308 round to 0.0).

    Returns ``{n, n01, n10, discordant, p_value, diff}`` with ``diff = (n01 - n10) / n``
    (= mean(b) - mean(a)).
    """
    a_arr, b_arr = _paired(a, b)
    a_b = _binary(a_arr, "a")
    b_b = _binary(b_arr, "b")
    n01 = int(np.count_nonzero(~a_b & b_b))
    n10 = int(np.count_nonzero(a_b & ~b_b))
    m = n01 + n10
    if m == 0:
        p = 1.0
    else:
        k = min(n01, n10)
        tail = sum(math.comb(m, i) for i in range(k + 1))
        p = float(min(Fraction(1), Fraction(2 * tail, 2**m)))
    n = int(a_arr.size)
    return {
        "n": n,
        "n01": n01,
        "n10": n10,
        "discordant": m,
        "p_value": p,
        "diff": (n01 - n10) / n,
    }


def accuracy_ci(
    x: Sequence[bool | int | float], *, n_boot: int = 10000, seed: int = 0, ci: float = 0.95
) -> dict:
    """Percentile bootstrap CI of one arm's mean (accuracy for 0/1 outcomes).

    Returns ``{accuracy, ci_low, ci_high, n, n_boot, seed, ci}``. For 0/1 outcomes prefer also
    reporting ``wilson_interval`` when n is small or accuracy is near 0 or 1 (the bootstrap then
    collapses to a point at 0 or 1).
    """
    arr = _outcomes(x, "x")
    _check_boot(n_boot, ci)
    boot = _boot_means(arr, int(n_boot), np.random.default_rng(seed))
    lo, hi = _percentiles(boot, ci)
    return {
        "accuracy": float(arr.mean()),
        "ci_low": lo,
        "ci_high": hi,
        "n": int(arr.size),
        "n_boot": int(n_boot),
        "seed": seed,
        "ci": float(ci),
    }


def wilson_interval(successes: int, n: int, *, ci: float = 0.95) -> dict:
    """Wilson score interval for a binomial proportion ``successes / n`` (no continuity correction).

    Returns ``{accuracy, ci_low, ci_high, n, successes, ci}``.
    """
    if int(n) != n or n < 1:
        raise ValueError(f"n must be a positive integer, got {n}")
    if int(successes) != successes or not 0 <= successes <= n:
        raise ValueError(f"successes must be an integer in [0, n], got {successes} with n={n}")
    if not 0.0 < ci < 1.0:
        raise ValueError(f"ci must be in (0, 1), got {ci}")
    z = NormalDist().inv_cdf(0.5 + ci / 2.0)
    p = successes / n
    z2 = z * z
    denom = 1.0 + z2 / n
    center = (p + z2 / (2.0 * n)) / denom
    half = z * math.sqrt(p * (1.0 - p) / n + z2 / (4.0 * n * n)) / denom
    return {
        "accuracy": p,
        # exact endpoints at the boundaries (the formula gives them only up to rounding)
        "ci_low": 0.0 if successes == 0 else max(0.0, center - half),
        "ci_high": 1.0 if successes == n else min(1.0, center + half),
        "n": int(n),
        "successes": int(successes),
        "ci": float(ci),
    }


def _runs(runs: list[list], name: str) -> np.ndarray:
    if len(runs) == 0:
        raise ValueError(f"{name} has no runs")
    arrs = [_outcomes(r, f"{name}[{i}]") for i, r in enumerate(runs)]
    lengths = {x.size for x in arrs}
    if len(lengths) != 1:
        raise ValueError(f"all runs must cover the same tasks; {name} has run lengths {sorted(lengths)}")
    return np.stack(arrs)  # [S, n]


def _run_weights(draws: np.ndarray, s: int) -> np.ndarray:
    """[k, S] run indices drawn with replacement -> [k, S] weights (draw counts / S)."""
    return (draws[:, :, None] == np.arange(s)).sum(axis=1) / s


def hierarchical_bootstrap(
    a_runs: list[list],
    b_runs: list[list],
    *,
    n_boot: int = 10000,
    seed: int = 0,
    ci: float = 0.95,
) -> dict:
    """Two-level bootstrap of ``diff = mean(b) - mean(a)`` with several seeds (runs) per arm.

    ``a_runs[s][i]`` is the outcome of arm a's run s (e.g. training seed s) on task i; every run of
    both arms covers the same n tasks in the same order. Arms may have different numbers of runs.

    Point estimate: mean over b's runs of the run accuracy minus the same for a (equal weight per run).

    Each resample:
      1. resamples runs with replacement *within each arm independently* (S_a draws from a's runs,
         S_b draws from b's runs; run s of a is not paired with run s of b);
      2. resamples n task indices with replacement *once*, shared by every drawn run of both arms
         (the task-level pairing across arms and seeds is kept);
      3. statistic = mean over drawn b runs of their mean on the drawn tasks, minus the same for a.
    With one run per arm this reduces to ``paired_bootstrap`` (different random stream).

    Caveat: with few runs (2-5), step 1 sees a discrete, shrunken (factor (S-1)/S in variance) picture
    of between-seed variability, so the interval is not guaranteed to reach nominal coverage.

    Returns ``{diff, ci_low, ci_high, se, mean_a, mean_b, n, runs_a, runs_b, n_boot, seed, ci}``.
    """
    ra = _runs(a_runs, "a_runs")  # [Sa, n]
    rb = _runs(b_runs, "b_runs")  # [Sb, n]
    if ra.shape[1] != rb.shape[1]:
        raise ValueError(
            f"paired arms must cover the same tasks: a_runs have {ra.shape[1]} tasks, b_runs have {rb.shape[1]}"
        )
    _check_boot(n_boot, ci)
    n_boot = int(n_boot)
    sa, n = ra.shape
    sb = rb.shape[0]
    rng = np.random.default_rng(seed)
    rows = max(1, _BLOCK_ELEMS // n)
    boot = np.empty(n_boot, dtype=np.float64)
    for s in range(0, n_boot, rows):
        k = min(rows, n_boot - s)
        wa = _run_weights(rng.integers(0, sa, size=(k, sa)), sa)  # [k, Sa]
        wb = _run_weights(rng.integers(0, sb, size=(k, sb)), sb)  # [k, Sb]
        per_task = wb @ rb - wa @ ra  # [k, n]: per-task diff of the run-resampled arms
        idx = rng.integers(0, n, size=(k, n))  # [k, n]
        boot[s : s + k] = np.take_along_axis(per_task, idx, axis=1).mean(axis=1)
    lo, hi = _percentiles(boot, ci)
    mean_a = float(ra.mean(axis=1).mean())
    mean_b = float(rb.mean(axis=1).mean())
    return {
        "diff": mean_b - mean_a,
        "ci_low": lo,
        "ci_high": hi,
        "se": float(boot.std()),
        "mean_a": mean_a,
        "mean_b": mean_b,
        "n": int(n),
        "runs_a": int(sa),
        "runs_b": int(sb),
        "n_boot": int(n_boot),
        "seed": seed,
        "ci": float(ci),
    }
