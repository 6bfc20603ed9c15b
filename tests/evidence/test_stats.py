"""Tests for sqlrl.evidence.stats: hand values, scipy cross-checks, bootstrap properties."""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from sqlrl.evidence.stats import (
    accuracy_ci,
    hierarchical_bootstrap,
    mcnemar_exact,
    paired_bootstrap,
    wilson_interval,
)


def _pairs(n01: int, n10: int, n11: int = 0, n00: int = 0) -> tuple[list[int], list[int]]:
    """Build paired 0/1 outcomes with the given cell counts (n01: a wrong, b right)."""
    a = [0] * n01 + [1] * n10 + [1] * n11 + [0] * n00
    b = [1] * n01 + [0] * n10 + [1] * n11 + [0] * n00
    return a, b


# ---------------------------------------------------------------- import hygiene


def test_stats_does_not_import_torch():
    code = (
        "import sys, sqlrl.evidence.stats; assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# ---------------------------------------------------------------- McNemar


def test_mcnemar_hand_values():
    # n01=5, n10=0: m=5, k=0 -> 2 * C(5,0)/2^5 = 2/32 = 0.0625
    r = mcnemar_exact(*_pairs(5, 0, n11=3, n00=2))
    assert (r["n01"], r["n10"], r["discordant"], r["n"]) == (5, 0, 5, 10)
    assert r["p_value"] == 0.0625
    assert r["diff"] == pytest.approx(0.5)
    # n01=10, n10=2: m=12, k=2 -> 2 * (C(12,0)+C(12,1)+C(12,2)) / 2^12 = 2 * (1+12+66) / 4096 = 158/4096
    r = mcnemar_exact(*_pairs(10, 2, n11=7))
    assert r["p_value"] == pytest.approx(158 / 4096, rel=1e-15)
    assert 158 / 4096 == pytest.approx(0.03857421875, rel=1e-15)
    # direction: swapping arms swaps n01/n10, p unchanged, diff flips sign
    a, b = _pairs(10, 2, n11=7)
    s = mcnemar_exact(b, a)
    assert (s["n01"], s["n10"]) == (2, 10) and s["p_value"] == r["p_value"] and s["diff"] == -r["diff"]
    # balanced discordance: 2 * P[X <= 3 | 6] = 2 * 42/64 > 1 -> 1
    assert mcnemar_exact(*_pairs(3, 3))["p_value"] == 1.0
    # no discordant pairs
    r = mcnemar_exact([True, False, True], [True, False, True])
    assert r["p_value"] == 1.0 and r["discordant"] == 0


def test_mcnemar_against_scipy_grid():
    binomtest = pytest.importorskip("scipy.stats").binomtest
    for n01 in range(0, 25):
        for n10 in range(0, 25):
            if n01 + n10 == 0:
                continue
            p = mcnemar_exact(*_pairs(n01, n10, n11=1))["p_value"]
            ref = binomtest(n01, n01 + n10, 0.5, alternative="two-sided").pvalue
            assert p == pytest.approx(ref, rel=1e-9, abs=1e-300), (n01, n10)


def test_mcnemar_large_n_exact_and_against_scipy():
    binomtest = pytest.importorskip("scipy.stats").binomtest
    for n01, n10 in [(1500, 1400), (700, 1300), (2500, 2450), (60, 0)]:
        p = mcnemar_exact(*_pairs(n01, n10))["p_value"]
        ref = binomtest(n01, n01 + n10, 0.5).pvalue
        assert 0.0 <= p <= 1.0
        assert p == pytest.approx(ref, rel=1e-7, abs=1e-300), (n01, n10, p, ref)
    # 60 vs 0: exactly 2 / 2^60
    assert mcnemar_exact(*_pairs(60, 0))["p_value"] == 2.0 / 2**60


def test_mcnemar_rejects_non_binary_and_mismatch():
    with pytest.raises(ValueError, match="0 / 1"):
        mcnemar_exact([0, 1, 2], [0, 1, 1])
    with pytest.raises(ValueError, match="same length"):
        mcnemar_exact([0, 1], [0, 1, 1])


# ---------------------------------------------------------------- paired bootstrap


def _synthetic(n: int, p_a: float, p_b: float, seed: int):
    rng = np.random.default_rng(seed)
    u = rng.random(n)  # shared task difficulty -> strongly correlated arms (paired setting)
    return (u < p_a).astype(int), (u < p_b).astype(int)


def test_paired_bootstrap_deterministic_and_keys():
    a, b = _synthetic(300, 0.5, 0.6, seed=1)
    r1 = paired_bootstrap(a, b, n_boot=2000, seed=7)
    r2 = paired_bootstrap(list(a), list(b), n_boot=2000, seed=7)
    assert r1 == r2
    r3 = paired_bootstrap(a, b, n_boot=2000, seed=8)
    assert (r3["ci_low"], r3["ci_high"]) != (r1["ci_low"], r1["ci_high"])
    assert {"diff", "ci_low", "ci_high", "n", "n_boot", "seed"} <= set(r1)
    assert r1["n"] == 300 and r1["n_boot"] == 2000 and r1["seed"] == 7
    assert r1["diff"] == pytest.approx(np.mean(b) - np.mean(a))  # diff = mean(b) - mean(a)
    assert r1["ci_low"] <= r1["diff"] <= r1["ci_high"]


def test_paired_bootstrap_contains_true_diff_and_direction():
    # true diff 0.1 by construction (b correct on u < 0.6, a on u < 0.5)
    a, b = _synthetic(2000, 0.5, 0.6, seed=2)
    r = paired_bootstrap(a, b, n_boot=4000, seed=0)
    assert r["ci_low"] <= 0.1 <= r["ci_high"]
    assert r["ci_low"] > 0  # clearly better
    r_rev = paired_bootstrap(b, a, n_boot=4000, seed=0)
    assert r_rev["diff"] == pytest.approx(-r["diff"]) and r_rev["ci_high"] < 0


def test_paired_bootstrap_width_shrinks_like_sqrt_n():
    a1, b1 = _synthetic(100, 0.4, 0.55, seed=3)
    a2, b2 = np.tile(a1, 16), np.tile(b1, 16)  # same per-task distribution, 16x the tasks
    w1 = (lambda r: r["ci_high"] - r["ci_low"])(paired_bootstrap(a1, b1, n_boot=4000, seed=0))
    w2 = (lambda r: r["ci_high"] - r["ci_low"])(paired_bootstrap(a2, b2, n_boot=4000, seed=0))
    assert 3.0 < w1 / w2 < 5.0  # sqrt(16) = 4


def test_paired_bootstrap_all_equal_arms():
    a = [1, 0, 1, 1, 0]
    r = paired_bootstrap(a, a, n_boot=500)
    assert (r["diff"], r["ci_low"], r["ci_high"]) == (0.0, 0.0, 0.0)


def test_paired_bootstrap_close_to_normal_approximation_for_large_n():
    a, b = _synthetic(3000, 0.45, 0.52, seed=4)
    d = b - a
    se = d.std(ddof=1) / math.sqrt(d.size)
    z = 1.959963984540054
    r = paired_bootstrap(a, b, n_boot=10000, seed=0)
    assert r["ci_low"] == pytest.approx(d.mean() - z * se, abs=0.1 * se)
    assert r["ci_high"] == pytest.approx(d.mean() + z * se, abs=0.1 * se)
    assert r["se"] == pytest.approx(se, rel=0.05)


def test_paired_bootstrap_coverage_simulation():
    # 200 independent datasets, true diff 0.1; a 90% interval should cover ~90% (binomial sd ~2.1%)
    hits = 0
    for k in range(200):
        a, b = _synthetic(200, 0.5, 0.6, seed=1000 + k)
        r = paired_bootstrap(a, b, n_boot=1000, seed=k, ci=0.90)
        hits += r["ci_low"] <= 0.1 <= r["ci_high"]
    assert 0.83 <= hits / 200 <= 0.96


def test_paired_bootstrap_validation():
    with pytest.raises(ValueError, match=r"same length.*len\(a\)=3, len\(b\)=2"):
        paired_bootstrap([1, 0, 1], [1, 0])
    with pytest.raises(ValueError, match="empty"):
        paired_bootstrap([], [])
    with pytest.raises(ValueError, match="NaN"):
        paired_bootstrap([1.0, float("nan")], [1.0, 0.0])
    with pytest.raises(ValueError, match="ci"):
        paired_bootstrap([1, 0], [1, 0], ci=95)
    with pytest.raises(ValueError, match="n_boot"):
        paired_bootstrap([1, 0], [1, 0], n_boot=0)


# ---------------------------------------------------------------- single-arm intervals


def test_wilson_hand_values():
    # 0/10: upper = z^2 / (n + z^2) = 3.8414588 / 13.8414588 = 0.277533
    w = wilson_interval(0, 10)
    assert w["ci_low"] == 0.0 and w["ci_high"] == pytest.approx(0.2775328, abs=1e-6)
    # 8/10 (textbook): [0.4902, 0.9433]
    w = wilson_interval(8, 10)
    assert w["ci_low"] == pytest.approx(0.49016, abs=1e-4) and w["ci_high"] == pytest.approx(
        0.94331, abs=1e-4
    )
    assert w["accuracy"] == 0.8
    with pytest.raises(ValueError):
        wilson_interval(11, 10)


def test_accuracy_ci_against_wilson_for_moderate_n():
    rng = np.random.default_rng(5)
    x = (rng.random(1000) < 0.6).astype(int)
    r = accuracy_ci(x, n_boot=5000, seed=0)
    w = wilson_interval(int(x.sum()), x.size)
    assert r["accuracy"] == pytest.approx(x.mean())
    assert r["ci_low"] == pytest.approx(w["ci_low"], abs=0.006)
    assert r["ci_high"] == pytest.approx(w["ci_high"], abs=0.006)
    assert accuracy_ci(x, n_boot=500, seed=3) == accuracy_ci(x, n_boot=500, seed=3)


# ---------------------------------------------------------------- hierarchical bootstrap


def test_hierarchical_one_run_each_matches_paired():
    a, b = _synthetic(800, 0.5, 0.58, seed=6)
    h = hierarchical_bootstrap([a], [b], n_boot=5000, seed=0)
    p = paired_bootstrap(a, b, n_boot=5000, seed=0)
    assert h["diff"] == pytest.approx(p["diff"], abs=1e-15)
    # same resampling scheme; only Monte Carlo noise may differ (10% of a standard error)
    assert h["ci_low"] == pytest.approx(p["ci_low"], abs=0.1 * p["se"])
    assert h["ci_high"] == pytest.approx(p["ci_high"], abs=0.1 * p["se"])
    assert h["runs_a"] == 1 and h["runs_b"] == 1 and h["n"] == 800


def test_hierarchical_seed_variance_widens_interval():
    rng = np.random.default_rng(7)
    n = 600
    u = rng.random(n)
    a = (u < 0.5).astype(int)
    # three treatment seeds that differ a lot from each other (0.52, 0.60, 0.68 accuracy)
    b_runs = [(u < p).astype(int) for p in (0.52, 0.60, 0.68)]
    h = hierarchical_bootstrap([a], b_runs, n_boot=4000, seed=0)
    assert h["diff"] == pytest.approx(np.mean([r.mean() for r in b_runs]) - a.mean(), abs=1e-12)
    # ignoring seeds (pool per-task averages over seeds) gives a narrower interval
    pooled = paired_bootstrap(a, np.mean(b_runs, axis=0), n_boot=4000, seed=0)
    assert pooled["diff"] == pytest.approx(h["diff"], abs=1e-12)
    assert (h["ci_high"] - h["ci_low"]) > 1.5 * (pooled["ci_high"] - pooled["ci_low"])
    assert h == hierarchical_bootstrap([a], b_runs, n_boot=4000, seed=0)  # deterministic


def test_hierarchical_identical_seeds_equal_width_to_paired():
    a, b = _synthetic(500, 0.5, 0.6, seed=8)
    h = hierarchical_bootstrap([a, a], [b, b, b], n_boot=4000, seed=1)
    p = paired_bootstrap(a, b, n_boot=4000, seed=1)
    assert (h["ci_high"] - h["ci_low"]) == pytest.approx(p["ci_high"] - p["ci_low"], rel=0.1)


def test_hierarchical_validation():
    with pytest.raises(ValueError, match="same tasks"):
        hierarchical_bootstrap([[1, 0, 1]], [[1, 0]])
    with pytest.raises(ValueError, match="run lengths"):
        hierarchical_bootstrap([[1, 0, 1], [1, 0]], [[1, 0, 1]])
    with pytest.raises(ValueError, match="no runs"):
        hierarchical_bootstrap([], [[1, 0]])
