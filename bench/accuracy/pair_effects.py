"""MovieLens's pair (interaction) effects for the simulator (issue 18, part 1): what a pair
table such as ``genres`` + ``age`` could teach a model beyond the user and movie effects.

The simulator's label model is ``σ(c + a_u + b_m)``: no pair of features carries signal beyond
user and movie by construction, so selection cannot find a useful group on it. ``add`` returns
the calibration with, for each interaction in ``INTERACTIONS`` (a movie's genre combination,
the key the ``genres`` table counts, × a user attribute: age bucket, gender, occupation), a
log-odds term ``δ[g, a]`` estimated from the real ratings:

- **cell scores**: with the offset ``z_i`` (the calibration's log-odds, plus the interactions
  estimated before this one) and ``p_i = σ(z_i)``, per cell ``k = (g, a)``:
  ``U_k = Σ_{i∈k} (y_i − p_i)`` and ``I_k = Σ_{i∈k} p_i (1 − p_i)``; the one-step (Newton)
  residual log-odds ``r_k = U_k / I_k`` has sampling variance ``≈ 1 / I_k``;
- **interaction only**: ``r_k`` still holds main effects of ``g`` and of ``a`` that the L2-shrunk
  user and movie effects leave; they are removed by the weighted two-way fit
  ``r_k ≈ α_g + β_a`` (weights ``I_k``, backfitting), leaving ``e_k``;
- **its variance** (random effects ``r_k = α_g + β_a + δ_k + ε_k``, ``δ_k ~ N(0, τ²)``,
  ``ε_k ~ N(0, 1/I_k)``): method of moments on ``Q = Σ_k I_k e_k²``,
  ``E[Q] = A + τ² B``, ``τ̂² = max(0, (Q − A) / B)``, with ``A`` (≈ cells − main effects) and
  ``B`` the expectations of ``Q`` under pure noise and under a unit-variance interaction
  through the same linear fit, computed by Monte Carlo (``DRAWS`` draws; DerSimonian and
  Laird's estimator, 1986, for a two-way layout);
- **the planted effect**: the empirical-Bayes (BLUP) shrinkage
  ``δ̂_k = τ̂² / (τ̂² + 1/I_k) · e_k`` (0 for cells without ratings), so that a small cell's noise
  is not planted as signal; with ``τ̂ = 0`` nothing is planted.

The estimate is conservative: the user and movie effects were fitted to the same labels and
absorb part of any interaction. ``summary`` reports ``τ̂`` and the standard deviation of the
planted ``δ̂`` over the ratings."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from bench import movielens
from bench.accuracy.simulator import Calibration, PairEffect

INTERACTIONS = (("genres", "age"), ("genres", "gender"), ("genres", "occupation"))
DRAWS = 200  # Monte Carlo draws for the moments A and B
SWEEPS = 200  # backfitting sweeps of the two-way fit
SEED = 18  # of the Monte Carlo draws (no privacy role: a benchmark's calibration)


def levels(table: pd.DataFrame, column: str) -> np.ndarray:
    """Each row's level of ``column`` as its table counts it (age by its bucket), as codes."""
    if column == "age":
        return np.searchsorted(movielens.AGE_BUCKETS, table["age"].to_numpy(), side="right")
    return pd.factorize(table[column].astype(str))[0].astype(np.int64)


def two_way_residual(
    r: np.ndarray, w: np.ndarray, rows: np.ndarray, cols: np.ndarray
) -> np.ndarray:
    """``r − α_rows − β_cols`` for the weighted least-squares fit of ``α_g + β_a`` to ``r``
    (weights ``w > 0``), by backfitting (Gauss–Seidel on the normal equations). Linear in
    ``r``."""
    n_rows, n_cols = int(rows.max()) + 1, int(cols.max()) + 1
    w_rows = np.bincount(rows, w, n_rows)
    w_cols = np.bincount(cols, w, n_cols)
    alpha = np.zeros(n_rows)
    beta = np.zeros(n_cols)
    for _ in range(SWEEPS):
        alpha = np.bincount(rows, w * (r - beta[cols]), n_rows) / np.maximum(w_rows, 1e-300)
        beta = np.bincount(cols, w * (r - alpha[rows]), n_cols) / np.maximum(w_cols, 1e-300)
    return r - alpha[rows] - beta[cols]


def interaction(
    rows: np.ndarray,
    cols: np.ndarray,
    y: np.ndarray,
    offset: np.ndarray,
    shape: tuple[int, int] | None = None,
) -> tuple[np.ndarray, float]:
    """The shrunk interaction ``δ̂`` (``shape``: row and column levels, by default the largest
    codes + 1) and ``τ̂²`` for observations in cells ``(rows[i], cols[i])`` with labels ``y``
    (0/1) and log-odds ``offset`` (the module docstring's estimator)."""
    n_rows, n_cols = shape or (int(rows.max()) + 1, int(cols.max()) + 1)
    p = 1.0 / (1.0 + np.exp(-offset))
    cell = rows * n_cols + cols
    u = np.bincount(cell, y - p, n_rows * n_cols)
    info = np.bincount(cell, p * (1.0 - p), n_rows * n_cols)
    seen = np.flatnonzero(info > 0)
    w = info[seen]
    r_rows, r_cols = seen // n_cols, seen % n_cols
    e = two_way_residual(u[seen] / w, w, r_rows, r_cols)
    q = float(np.sum(w * e**2))
    rng = np.random.default_rng(SEED)
    a = b = 0.0
    for _ in range(DRAWS):
        noise = two_way_residual(rng.standard_normal(len(w)) / np.sqrt(w), w, r_rows, r_cols)
        unit = two_way_residual(rng.standard_normal(len(w)), w, r_rows, r_cols)
        a += float(np.sum(w * noise**2)) / DRAWS
        b += float(np.sum(w * unit**2)) / DRAWS
    tau2 = max(0.0, (q - a) / b)
    effect = np.zeros(n_rows * n_cols)
    effect[seen] = tau2 / (tau2 + 1.0 / w) * e
    return effect.reshape(n_rows, n_cols), tau2


def estimate(
    df: pd.DataFrame,
    cal: Calibration,
    interactions: tuple[tuple[str, str], ...] = INTERACTIONS,
) -> tuple[PairEffect, ...]:
    """The pair effects of ``interactions`` (movie column, user column) on the real ratings
    ``df`` (``cal``'s: ``movielens.load()``), estimated in turn, each on the offset that
    includes the ones before it."""
    y = movielens.labels01(df)
    if len(y) != len(cal.users):
        raise ValueError(f"df has {len(y)} ratings, the calibration {len(cal.users)}")
    offset = cal.log_odds(cal.users, cal.movies)
    out = []
    for movie_column, user_column in interactions:
        movie_level = levels(cal.movie_table, movie_column)
        user_level = levels(cal.user_table, user_column)
        shape = (int(movie_level.max()) + 1, int(user_level.max()) + 1)
        effect, tau2 = interaction(movie_level[cal.movies], user_level[cal.users], y, offset, shape)
        pair = PairEffect(
            movie_column, user_column, movie_level, user_level, effect, float(np.sqrt(tau2))
        )
        offset = offset + pair(cal.users, cal.movies)
        out.append(pair)
    return tuple(out)


def add(cal: Calibration, pairs: tuple[PairEffect, ...], gain: float = 1.0) -> Calibration:
    """``cal`` with the pair effects in its label model, each multiplied by ``gain``."""
    if not gain >= 0:
        raise ValueError(f"gain must be >= 0, got {gain=}")
    scaled = tuple(dataclasses.replace(p, effect=gain * p.effect, tau=gain * p.tau) for p in pairs)
    return dataclasses.replace(cal, pairs=scaled)


def summary(cal: Calibration) -> list[dict[str, object]]:
    """Per planted interaction: its ``τ̂`` and the standard deviation of ``δ̂`` over the real
    ratings (log-odds), and how many cells it has."""
    return [
        {
            "pair": f"{p.movie_column}+{p.user_column}",
            "tau": p.tau,
            "sd_planted": float(np.std(p(cal.users, cal.movies))),
            "cells": int(np.count_nonzero(p.effect)),
        }
        for p in cal.pairs
    ]
