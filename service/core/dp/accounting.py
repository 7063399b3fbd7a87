"""Privacy accounting of a stream (docs/ARCHITECTURE.md, "Privacy ledger"): pure functions from
stored configuration to (ε, δ) and ρ, each with its source.

Per observation:
* count tables: each window's tables are ε-DP (laplace, b = Δ1/ε) or ρ-zCDP (gaussian,
  σ = Δ2/sqrt(2ρ)) with respect to one observation; windows hold disjoint observations, so by
  parallel composition the whole history keeps the per-window guarantee (McSherry 2009, Thm 4).
* count-table selection: every selection round is ε_sel-DP at every hot-period size
  (exponential mechanism, McSherry & Talwar 2007, calibrated to the public ``min_records``,
  with a public outcome ⊥ "add no table": ``service.core.dp.selection``) and reads the hot period
  that just ended; an observation is in it for H = ``hot_windows`` rounds. A round may pick ⊥
  and so use no table slot: the slots no longer bound the rounds. The schedule does: rounds run
  only at the rolls to epochs 2 … Q + 1, Q = ``privacy.selection_rounds`` (one round per roll,
  keyed by epoch), and the other reasons a scheduled round releases nothing (no budget, no
  free slot, no candidate, a stale epoch) are public. So a stream releases at most Q rounds
  over its whole life, each charged whether it picks tables or ⊥: an observation is charged
  min(H, Q) rounds (sequential composition), see :func:`selection_rounds`.
* the annotation queues of record payloads linked to the stream (``service.queues``).
Composition: basic (sequential) composition of (ε, δ) (Dwork & Roth 2014, Thm 3.16); when the
tables are Gaussian, also zCDP composition, converting the pure-ε parts by ρ = ε²/2 (Bun &
Steinke 2016, Prop 1.4) and the sum back to (ε, δ) by CKS 2020, Cor 13.

Neighbours (``service.core.dp.budget``). Per observation: adding or removing one observation. With
a user key that can change two counted observations of a window (the user's next one is
counted in its place, a swap), so a window's tables are (2/k)·ε-DP, k the observations the
noise is calibrated to (max(c, 2) for new streams: ε; c for streams created before: 2ε at
c = 1); and a selection round, calibrated to one record, is charged 2·ε_sel by group privacy
(Dwork & Roth 2014, Thm 2.2): the round's noise stays as calibrated (its picks and the stored
rounds of existing streams are unchanged), and the charge says what the round gives.

Per user (with ``user_key`` and at most c counted observations per user per window): each
window's tables are (c/k)·ε-DP (ρ·(c/k)²-zCDP) for a user. Against the one-time attacker of the
threat model (who reads the stores once), a user can appear in every window whose tables exist
at once — the retention windows plus the hot windows — so R + H windows compose sequentially.
(Not only R: the H hot windows' tables are readable by the same attacker, so they are counted
too; expiry keeps nothing from which an older window can be recovered, see
``service.lifecycle.roll``.) Against a continual observer of the outputs (featurize and the
train set read every window's tables while they are counted), every window a user is active in
composes: (c/k)·ε per such window, without a bound over the stream's life. Selection reads
only counted observations, at most c·H of a user per round: group privacy multiplies each
round's ε by c·H. A user may be in every round, and the picks are kept for the stream's life:
all Q rounds a stream can release compose, against either observer. A record annotation queue
protects each submitted candidate (Li, Qardaji & Su); a user may submit any number, so it gives
no per-user bound, and a per-user guarantee of a stream with such a queue excludes it.

Streams created before rounds could pick ⊥ ran a round at every roll with a free slot, each
releasing round committing a table, so at most S = ``max_tables`` − features − 1 rounds; their
stored configuration has no ``selection_rounds``, which then defaults to S (as for every
stream that does not set it). Rounds of the old rule ran at epochs before the upgrade's epoch D,
those of the new rule at D … Q + 1: at most (D − 2) + (Q + 2 − D) = Q rounds when D − 2 <= Q,
else at most S = Q: Q still bounds them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from service.core.dp.noise import zcdp_to_approx_dp

SOURCES = {
    "parallel": "McSherry 2009, Privacy Integrated Queries, Thm 4 (disjoint windows)",
    "laplace": "discrete Laplace with b = Δ1/ε is ε-DP (Ghosh, Roughgarden & Sundararajan 2009; "
    "Canonne, Kamath & Steinke 2020)",
    "gaussian": "discrete Gaussian with σ = Δ2/sqrt(2ρ) is ρ-zCDP (Canonne, Kamath & Steinke "
    "2020, Thm 4)",
    "zcdp_to_dp": "Canonne, Kamath & Steinke 2020, Cor 13",
    "exponential": "exponential mechanism / report-noisy-max with Gumbel noise (McSherry & "
    "Talwar 2007; Durfee & Rogers 2019)",
    "basic": "basic sequential composition (Dwork & Roth 2014, Thm 3.16)",
    "zcdp": "zCDP composition; pure ε-DP is ε²/2-zCDP (Bun & Steinke 2016, Prop 1.4 and Lemma 2.3)",
    "group": "group privacy (Dwork & Roth 2014, Thm 2.2)",
}

# Whom a figure protects against (docs/PRIVACY.md).
ONE_TIME = (
    "one-time compromise: whoever reads the service's stores (Redis and its files, SQL, the "
    "data dir, logs, process memory) once, at any single time"
)
CONTINUAL = (
    "continual observer: whoever sees every output over the stream's life (each featurize "
    "and train set, the selected tables, every queue release), e.g. a model manager who logs "
    "featurize"
)
BOTH = f"both: {ONE_TIME}; and {CONTINUAL}"
ADD_REMOVE_OBSERVATION = "add or remove one observation"
ADD_REMOVE_USER = "add or remove one user (all of the user's observations)"


@dataclass
class Part:
    name: str
    epsilon: float
    delta: float = 0.0
    rho: float | None = None  # set when the part is ρ-zCDP (pure parts: ε²/2)
    parameters: dict[str, float | int | str | None] = field(default_factory=dict)
    source: str = ""
    observer: str = BOTH  # whom the figure protects against
    neighbour: str = ADD_REMOVE_OBSERVATION
    level: str = "event"  # "event" (one observation or candidate) or "user"


@dataclass
class Guarantee:
    unit: str
    parts: list[Part]
    epsilon: float | None  # None: no bound (``unbounded`` says why)
    delta: float
    rho: float | None
    composition: str
    observer: str = BOTH
    neighbour: str = ADD_REMOVE_OBSERVATION
    level: str = "event"
    covers: str = ""
    unbounded: list[str] = field(default_factory=list)


def compose(parts: list[Part], *, delta: float, unit: str) -> Guarantee:
    """Basic composition of the parts; if any part is zCDP, also zCDP composition (taking the
    tighter of the two ε at the same δ). The guarantee's observer, neighbour and level are
    the parts' (the first part's; parts of one guarantee share them)."""
    eps = sum(p.epsilon for p in parts)
    dlt = sum(p.delta for p in parts)
    first = parts[0]
    who = (first.observer, first.neighbour, first.level)
    if any(p.rho is not None and p.delta > 0 for p in parts):
        rho = sum(p.rho if p.rho is not None else p.epsilon**2 / 2 for p in parts)
        eps_z = zcdp_to_approx_dp(rho=rho, delta=delta) if rho > 0 else 0.0
        if eps_z <= eps or dlt > delta:
            return Guarantee(unit, parts, eps_z, delta, rho, SOURCES["zcdp"], *who)
        return Guarantee(unit, parts, eps, dlt, rho, SOURCES["basic"], *who)
    return Guarantee(unit, parts, eps, dlt, None, SOURCES["basic"], *who)


def table_part(
    *,
    mechanism: str,
    epsilon: float | None,
    rho: float | None,
    delta: float,
    windows: int,
    parameters: dict,
    multiplier: float = 1.0,
    observer: str = BOTH,
    neighbour: str = ADD_REMOVE_OBSERVATION,
    level: str = "event",
) -> Part:
    """``windows`` windows of tables composing sequentially (1 per observation; R + H per
    user against a one-time reader), each window (multiplier·ε)-DP or (multiplier²·ρ)-zCDP:
    multiplier = m/k, m the counted observations the neighbour changes, k the observations
    the noise is calibrated to (``service.core.dp.budget.window_multiplier``)."""
    who = {"observer": observer, "neighbour": neighbour, "level": level}
    params = {**parameters, "windows_composed": windows, "window_multiplier": multiplier}
    if mechanism == "laplace":
        assert epsilon is not None
        per_window = epsilon * multiplier
        return Part(
            "count_tables",
            windows * per_window,
            0.0,
            windows * per_window**2 / 2,
            {**params, "epsilon_per_window": per_window},
            SOURCES["laplace"] + "; " + (SOURCES["parallel"] if windows == 1 else SOURCES["basic"]),
            **who,
        )
    if mechanism == "gaussian":
        assert rho is not None
        per_window_rho = rho * multiplier**2
        total = windows * per_window_rho
        return Part(
            "count_tables",
            zcdp_to_approx_dp(rho=total, delta=delta),
            delta,
            total,
            {**params, "rho_per_window": per_window_rho},
            SOURCES["gaussian"] + "; as (ε, δ) by " + SOURCES["zcdp_to_dp"],
            **who,
        )
    return Part(
        "count_tables",
        float("inf"),
        0.0,
        None,
        {**parameters},
        "mechanism 'none': no noise, no guarantee",
        **who,
    )


def selection_rounds(
    *, max_tables: int, features: int, hot_windows: int, max_rounds: int, per_user: bool
) -> tuple[int, int]:
    """(S, rounds charged): S = ``max_tables − features − 1`` free slots (the prior table takes
    one). A round runs only at the rolls to epochs 2 … ``max_rounds`` + 1 (the public schedule,
    Q = ``privacy.selection_rounds``) and only while a slot is free, so a stream releases at most
    Q rounds, whether they pick tables or ⊥, and none when S = 0. One observation is read by H
    of them at most: min(H, Q); a user may be in all: Q."""
    slots = max(max_tables - features - 1, 0)
    if slots == 0:
        return 0, 0
    return slots, (max_rounds if per_user else min(hot_windows, max_rounds))


def selection_part(
    *,
    epsilon_selection: float,
    rounds: int,
    group: int = 1,
    parameters: dict[str, float | int | str | None] | None = None,
    observer: str = BOTH,
    neighbour: str = ADD_REMOVE_OBSERVATION,
    level: str = "event",
) -> Part:
    """``rounds`` rounds, each ε_sel-DP for one record and read by at most ``group`` records
    of the neighbour (2 for one observation of a user-keyed stream: a swap; c·H for a user)."""
    eps = epsilon_selection * rounds * group
    return Part(
        "table_selection",
        eps,
        0.0,
        rounds * (epsilon_selection * group) ** 2 / 2,
        {
            "epsilon_per_round": epsilon_selection,
            "rounds": rounds,
            "group_size": group,
            **(parameters or {}),
        },
        SOURCES["exponential"]
        + "; "
        + SOURCES["basic"]
        + ("; " + SOURCES["group"] if group > 1 else ""),
        observer,
        neighbour,
        level,
    )
