"""The scale benchmark's tables, prose and plot: medians over repeats; ratios within one repeat
(W workers ÷ 1 worker on the same Redis and partitions, counted ingest per worker core ÷ the
same repeat's pipelined XADD per Redis core); CPU per row by role and by Redis node; and the
projection to N cores (Amdahl) from the CPU per row and the largest partition's share."""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.report import PLOTS, Plot, Table, plot_path, pyplot

TITLE = "Scale: one stream across workers, partitions and Redis masters"
ROLES = ("api", "worker", "redis", "client")
SERVICE = ("api", "worker", "redis")  # the service's own processes (not the load generator)
CORES = (1, 2, 8, 32)  # the projection's core counts (and N → ∞)


@dataclass(frozen=True)
class Run:
    kind: str  # standalone | cluster
    what: str  # ingest | xadd | featurize
    rep: int
    workers: int  # worker processes up (xadd: 0, none)
    partitions: int  # ingest: the stream's partitions (else 0)
    clients: int  # load-generator processes (featurize: concurrent clients)
    data: dict[str, Any]
    load: float  # 1-minute load average at its start

    def asdict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def units(self) -> int:
        return int(self.data["requests"] if self.what == "featurize" else self.data["rows"])

    @property
    def wall(self) -> float:
        return float(self.data["counted_s"] if self.what == "ingest" else self.data["seconds"])

    @property
    def rate(self) -> float:
        """Rows/s accepted and counted (ingest), rows/s (xadd) or requests/s (featurize)."""
        return self.units / self.wall

    @property
    def accepted(self) -> float:
        return self.data["rows"] / self.data["accepted_s"]

    def cpu(self, role: str) -> float:
        """CPU seconds of a role's processes (client: the load generator's)."""
        if role == "client":
            return float(self.data["client_cpu"])
        return float(sum(self.data["cpu"].get(role, [])))

    def per_unit(self, role: str) -> float:
        """CPU µs of a role per row or request."""
        return 1e6 * self.cpu(role) / self.units

    def per_core(self, role: str) -> float:
        """Rows (requests) per CPU second of a role: rate ÷ (the role's CPU s / wall s)."""
        cpu = self.cpu(role)
        return self.units / cpu if cpu > 0 else math.nan

    def cores(self, roles: Sequence[str] = SERVICE) -> float:
        """Cores the roles kept busy on average."""
        return sum(self.cpu(r) for r in roles) / self.wall

    def busiest(self, role: str) -> float:
        """The busiest process of a role, in cores."""
        return max(self.data["cpu"].get(role) or [0.0]) / self.wall

    def node_us(self) -> list[float]:
        """CPU µs per row of each Redis node (its process tree), in port order."""
        return [1e6 * c / self.units for c in self.data["cpu"]["redis"]]

    @property
    def share(self) -> float:
        """The largest partition's share of the run's rows (1 with one partition)."""
        parts = self.data.get("parts") or [1]
        return max(parts) / sum(parts) if sum(parts) else math.nan


def _med(xs: Sequence[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return statistics.median(xs) if xs else math.nan


def _x(v: float, spec: str = ".2f", unit: str = "×") -> str:
    return "—" if math.isnan(v) else f"{v:{spec}}{unit}"


def _kind_order(kind: str) -> int:
    return 0 if kind == "standalone" else 1


def ingest_groups(runs: Sequence[Run]) -> dict[tuple[str, int, int], list[Run]]:
    """Counted-ingest runs by (Redis kind, partitions, workers), in report order."""
    out: dict[tuple[str, int, int], list[Run]] = {}
    for r in sorted(runs, key=lambda r: (_kind_order(r.kind), r.partitions, r.workers, r.rep)):
        if r.what == "ingest":
            out.setdefault((r.kind, r.partitions, r.workers), []).append(r)
    return out


def _same_rep(runs: Sequence[Run], r: Run, **fields: object) -> Run | None:
    """The run of ``r``'s Redis kind and repeat with these fields (ingest unless ``what``)."""
    want = {"kind": r.kind, "rep": r.rep, "what": "ingest"} | fields
    for o in runs:
        if all(getattr(o, k) == v for k, v in want.items()):
            return o
    return None


def per_repeat(
    runs: Sequence[Run], group: Sequence[Run], ratio: Callable[[Run], float | None]
) -> float:
    """Median over the group's repeats of ``ratio`` (None: that repeat has no base)."""
    return _med([v for v in (ratio(r) for r in group) if v is not None])


def to_one_worker(runs: Sequence[Run], group: Sequence[Run]) -> float:
    """Counted rows/s ÷ the same repeat's 1-worker rate (same Redis, same partitions)."""

    def one(r: Run) -> float | None:
        base = _same_rep(runs, r, partitions=r.partitions, workers=1)
        return r.rate / base.rate if base else None

    return per_repeat(runs, group, one)


def efficiency(runs: Sequence[Run], group: Sequence[Run]) -> float:
    """Counted rows/s per busy core (API, workers, Redis) ÷ the same at 1 worker, same repeat:
    1 when more workers keep every core they use as productive as one worker did."""

    def one(r: Run) -> float | None:
        base = _same_rep(runs, r, partitions=r.partitions, workers=1)
        return (r.rate / r.cores()) / (base.rate / base.cores()) if base else None

    return per_repeat(runs, group, one)


def to_xadd(runs: Sequence[Run], group: Sequence[Run]) -> float:
    """Counted rows per worker CPU second ÷ the same repeat's XADD rows per Redis CPU second."""

    def one(r: Run) -> float | None:
        x = _same_rep(runs, r, what="xadd")
        return r.per_core("worker") / x.per_core("redis") if x else None

    return per_repeat(runs, group, one)


def to_xadd_rate(runs: Sequence[Run], group: Sequence[Run]) -> float:
    """Counted rows/s ÷ the same repeat's XADD rows/s."""

    def one(r: Run) -> float | None:
        x = _same_rep(runs, r, what="xadd")
        return r.rate / x.rate if x else None

    return per_repeat(runs, group, one)


def _per_s(us: float) -> float:
    return 1e6 / us if us > 0 else math.inf


@dataclass(frozen=True)
class Amdahl:
    """One (Redis, partitions): the counted rate on N cores from the CPU per row. The serial
    part is the counting of the largest partition (one job at a time per partition, its
    worker CPU per row times that partition's share); the rest (API processes, the other
    partitions' jobs, Redis) spreads over the cores; and no Redis process can go beyond one
    core (the busiest node's CPU per row). The counting job's own Redis calls are not told
    apart from the ingest's and stay in the parallel part: the figures are upper bounds."""

    kind: str
    partitions: int
    workers: int  # the CPU per row is that of the runs with this many workers
    total_us: float  # API + worker + Redis CPU µs per counted row
    worker_us: float
    share: float  # the largest partition's share of the rows
    redis_node_us: float  # the busiest Redis process's CPU µs per row

    @property
    def serial_us(self) -> float:
        return self.worker_us * self.share

    @property
    def fraction(self) -> float:
        return self.serial_us / self.total_us

    def rate(self, n: float) -> float:
        """Counted rows/s on ``n`` cores (math.inf: the limit)."""
        time = self.serial_us + (self.total_us - self.serial_us) / n
        return min(_per_s(time), _per_s(self.redis_node_us))

    @property
    def limit(self) -> str:
        return "counting" if self.serial_us >= self.redis_node_us else "Redis"


def amdahl(runs: Sequence[Run]) -> list[Amdahl]:
    """The projection per (Redis, partitions), from the medians of its runs with the fewest
    workers (1: the least CPU per row) and again from those with the most (the partitions
    counted in parallel, as N cores would count them: smaller counting runs, each writing
    its partition's dense tables, so more CPU per row)."""
    groups = ingest_groups(runs)
    out = []
    for (kind, parts, w), g in groups.items():
        ws = [k[2] for k in groups if k[:2] == (kind, parts)]
        if w not in (min(ws), max(ws)):
            continue
        out.append(
            Amdahl(
                kind,
                parts,
                w,
                _med([sum(r.per_unit(x) for x in SERVICE) for r in g]),
                _med([r.per_unit("worker") for r in g]),
                _med([r.share for r in g]),
                _med([max(r.node_us()) for r in g]),
            )
        )
    return out


@dataclass(frozen=True)
class Prose(Table):
    """Text among a section's tables, written by the report code from the measured figures."""

    text: str = ""

    def markdown(self) -> str:
        return self.text


def _rows_s(v: float) -> str:
    return "—" if math.isnan(v) else f"{v:,.0f}"


def render(runs: Sequence[Run]) -> list[Table]:
    groups = ingest_groups(runs)
    workers = sorted({k[2] for k in groups})
    kinds = sorted({r.kind for r in runs}, key=_kind_order)
    pairs = sorted({k[:2] for k in groups}, key=lambda k: (_kind_order(k[0]), k[1]))

    def at(kind: str, parts: int, w: int) -> list[Run]:
        return groups.get((kind, parts, w), [])

    summary = Table(
        [
            "Redis",
            "partitions",
            "counted ingest per worker core ÷ pipelined XADD per Redis core (1 worker)",
            *(f"{w} workers ÷ 1 worker (counted rows/s)" for w in workers if w != 1),
            "counted rows/s ÷ XADD rows/s (1 worker)",
        ],
        [
            (
                kind,
                parts,
                _x(to_xadd(runs, at(kind, parts, 1))),
                *(_x(to_one_worker(runs, at(kind, parts, w))) for w in workers if w != 1),
                _x(to_xadd_rate(runs, at(kind, parts, 1))),
            )
            for kind, parts in pairs
        ],
        title="One stream: the ratios, each within one repeat (medians over repeats)",
    )
    t_ingest = Table(
        [
            "Redis",
            "partitions",
            "workers",
            "accepted rows/s",
            "counted rows/s",
            "× 1 worker",
            "count lag after the last batch",
            "cores busy (API, workers, Redis)",
            "counted rows/s per busy core",
            "efficiency (per busy core ÷ 1 worker's)",
            "workers' cores",
            "busiest worker, cores",
            "Redis, cores",
            "busiest Redis node's share",
            "largest partition's share of rows",
            "load average",
        ],
        [
            (
                kind,
                parts,
                w,
                _rows_s(_med([r.accepted for r in g])),
                _rows_s(_med([r.rate for r in g])),
                _x(to_one_worker(runs, g)),
                _x(_med([r.data["counted_s"] - r.data["accepted_s"] for r in g]), ".1f", " s"),
                _x(_med([r.cores() for r in g]), ".2f", ""),
                _rows_s(_med([r.rate / r.cores() for r in g])),
                _x(efficiency(runs, g)),
                _x(_med([r.cores(["worker"]) for r in g]), ".2f", ""),
                _x(_med([r.busiest("worker") for r in g]), ".2f", ""),
                _x(_med([r.cores(["redis"]) for r in g]), ".2f", ""),
                _x(_med([100 * r.busiest("redis") / r.cores(["redis"]) for r in g]), ".0f", " %"),
                _x(_med([100 * r.share for r in g]), ".0f", " %"),
                f"{_med([r.load for r in g]):.1f}",
            )
            for (kind, parts, w), g in groups.items()
        ],
        title="One stream, counted ingest: from the first batch until every partition is counted",
    )
    t_cpu = Table(
        [
            "Redis",
            "partitions",
            "workers",
            "API",
            "worker",
            "Redis",
            "Redis by node",
            "load generator",
            "service (API + worker + Redis)",
        ],
        [
            (
                kind,
                parts,
                w,
                *(f"{_med([r.per_unit(role) for r in g]):.1f}" for role in SERVICE),
                " / ".join(
                    f"{_med([r.node_us()[i] for r in g]):.1f}" for i in range(len(g[0].node_us()))
                ),
                f"{_med([r.per_unit('client') for r in g]):.1f}",
                f"{_med([sum(r.per_unit(x) for x in SERVICE) for r in g]):.1f}",
            )
            for (kind, parts, w), g in groups.items()
        ],
        title="One stream, counted ingest: CPU µs per row by role (every process of the role)",
    )
    t_xadd = Table(
        [
            "Redis",
            "partitions",
            "workers",
            "counted rows per worker CPU s",
            "XADD rows per Redis CPU s",
            "ratio",
        ],
        [
            (
                kind,
                parts,
                w,
                _rows_s(_med([r.per_core("worker") for r in g])),
                _rows_s(
                    _med([r.per_core("redis") for r in runs if (r.kind, r.what) == (kind, "xadd")])
                ),
                _x(to_xadd(runs, g)),
            )
            for (kind, parts, w), g in groups.items()
        ],
        title="Counted ingest per worker core against pipelined XADD per Redis core",
    )
    base = [
        (
            kind,
            _rows_s(_med([r.rate for r in xs])),
            f"{_med([r.per_unit('redis') for r in xs]):.1f}",
            f"{_med([r.per_unit('client') for r in xs]):.1f}",
            _rows_s(_med([r.per_core("redis") for r in xs])),
            f"{_med([r.load for r in xs]):.1f}",
        )
        for kind in kinds
        if (xs := [r for r in runs if (r.kind, r.what) == (kind, "xadd")])
    ]
    t_base = Table(
        [
            "Redis",
            "rows/s",
            "Redis CPU µs/row",
            "client CPU µs/row",
            "rows per Redis CPU s",
            "load average",
        ],
        base,
        title="The baseline: pipelined XADD of the same rows into one stream key, one client",
    )
    feat: dict[tuple[str, int], list[Run]] = {}
    for r in sorted(runs, key=lambda r: (_kind_order(r.kind), r.clients)):
        if r.what == "featurize":
            feat.setdefault((r.kind, r.clients), []).append(r)
    t_feat = Table(
        [
            "Redis",
            "concurrent clients",
            "requests/s",
            "p50",
            "p99",
            "API µs/request",
            "Redis µs/request",
            "load generator µs/request",
            "cores busy (all, clients too)",
            "load average",
        ],
        [
            (
                kind,
                c,
                _rows_s(_med([r.rate for r in g])),
                f"{1e3 * _med([r.data['p50'] for r in g]):.2f} ms",
                f"{1e3 * _med([r.data['p99'] for r in g]):.1f} ms",
                f"{_med([r.per_unit('api') for r in g]):.0f}",
                f"{_med([r.per_unit('redis') for r in g]):.0f}",
                f"{_med([r.per_unit('client') for r in g]):.0f}",
                f"{_med([r.cores(ROLES) for r in g]):.2f}",
                f"{_med([r.load for r in g]):.1f}",
            )
            for (kind, c), g in feat.items()
        ],
        title="Featurize, one row a request, each client one request at a time",
    )
    models = amdahl(runs)
    t_amdahl = Table(
        [
            "Redis",
            "partitions",
            "CPU per row of the runs with",
            "service CPU µs/row",
            "worker µs/row",
            "largest partition's share",
            "serial µs/row",
            "serial fraction",
            "busiest Redis process µs/row",
            *(f"{n} core{'s' if n > 1 else ''}, rows/s" for n in CORES),
            "N → ∞, rows/s",
            "bound by",
            "measured here, best counted rows/s",
        ],
        [
            (
                m.kind,
                m.partitions,
                f"{m.workers} worker{'s' if m.workers > 1 else ''}",
                f"{m.total_us:.1f}",
                f"{m.worker_us:.1f}",
                f"{100 * m.share:.0f} %",
                f"{m.serial_us:.1f}",
                f"{100 * m.fraction:.0f} %",
                f"{m.redis_node_us:.1f}",
                *(_rows_s(m.rate(n)) for n in CORES),
                _rows_s(m.rate(math.inf)),
                m.limit,
                _rows_s(
                    max(
                        _med([r.rate for r in g])
                        for k, g in groups.items()
                        if k[:2] == (m.kind, m.partitions)
                    )  # fmt: skip
                ),
            )
            for m in models
        ],
        title="Counted rate on N cores, projected from the measured CPU per row (Amdahl)",
    )
    return [
        summary,
        t_ingest,
        t_cpu,
        t_xadd,
        t_base,
        t_feat,
        t_amdahl,
        Prose((), (), text=prose(runs, models)),
    ]


def prose(runs: Sequence[Run], models: Sequence[Amdahl]) -> str:
    """The section's reading of its own figures: parallel efficiency on this machine and the
    Amdahl argument, every number computed here from the runs."""
    groups = ingest_groups(runs)
    workers = sorted({k[2] for k in groups})
    out = []
    most = max(workers)
    if most > 1:
        items = []
        for (kind, parts, w), g in groups.items():
            if w != most:
                continue
            one = groups.get((kind, parts, 1), [])
            items.append(
                f"{kind}, P = {parts}: {_x(to_one_worker(runs, g))} the counted rows/s of 1 "
                f"worker, {_x(_med([r.cores() for r in g]), '.2f', '')} cores busy against "
                f"{_x(_med([r.cores() for r in one]), '.2f', '')}, efficiency "
                f"{_x(efficiency(runs, g))}"
            )
        out.append(
            f"**On this machine** (figures above; the load generator shares the cores), "
            f"{most} workers against 1: " + "; ".join(items) + ". Counted rows/s per busy "
            "core is the throughput per core; the efficiency is that figure against 1 "
            "worker's in the same repeat (1.00×: every added core as productive)."
        )
    p_all = sorted({k[1] for k in groups})
    if len(p_all) > 1:
        lo, hi = p_all[0], p_all[-1]
        items = []
        for kind in sorted({k[0] for k in groups}, key=_kind_order):
            a, b = groups.get((kind, lo, 1), []), groups.get((kind, hi, 1), [])
            if not (a and b):
                continue
            t = [_med([sum(r.per_unit(x) for x in SERVICE) for r in g]) for g in (a, b)]
            red = [_med([r.per_unit("redis") for r in g]) for g in (a, b)]
            wk = [_med([r.per_unit("worker") for r in g]) for g in (a, b)]
            text = (
                f"{kind}: {t[1]:.1f} µs against {t[0]:.1f} ({t[1] / t[0]:.2f}×; Redis "
                f"{red[1]:.1f} against {red[0]:.1f}, workers {wk[1]:.1f} against {wk[0]:.1f})"
            )
            if c := groups.get((kind, hi, most), []) if most > 1 else []:
                tc = _med([sum(r.per_unit(x) for x in SERVICE) for r in c])
                rc = _med([r.per_unit("redis") for r in c])
                text += f", and with {most} workers {tc:.1f} µs (Redis {rc:.1f})"
            items.append(text)
        if items:
            out.append(
                f"**What partitions cost**: service CPU per counted row with 1 worker, P = {hi} "
                f"against P = {lo}, " + "; ".join(items) + ". Each partition holds its own "
                "tables, and a counting run writes a table with many increments whole "
                "(`DENSE_RATIO` in `service/counting/service.py`), whatever the rows the run "
                "holds: P partitions, or runs made smaller by counting them at once, write "
                "more table bytes per row."
            )
    if models:
        lines = []
        for m in models:
            proj = ", ".join(f"{n} cores {m.rate(n):,.0f}" for n in CORES[1:])
            lines.append(
                f"- {m.kind}, P = {m.partitions}, CPU per row of the runs with {m.workers} "
                f"worker{'s' if m.workers > 1 else ''}: T = {m.total_us:.1f} µs of service CPU "
                f"per counted row, of which the counting {m.worker_us:.1f} µs; the largest "
                f"partition took {100 * m.share:.0f} % of the rows, so s = {m.serial_us:.1f} µs "
                f"is serial (serial fraction {100 * m.fraction:.0f} %), and the busiest Redis "
                f"process spent {m.redis_node_us:.1f} µs per row. X(N) = 10⁶ / (s + (T − s) / N),"
                f" at most 10⁶ / {m.redis_node_us:.1f} µs: 1 core {m.rate(1):,.0f} rows/s, "
                f"{proj}, N → ∞ {m.rate(math.inf):,.0f} rows/s (bound by {m.limit})."
            )
        out.append(
            "**Amdahl, from the measured CPU per row** (medians; the load generator left out). "
            "One partition is counted by one job at a time, so its worker CPU per row times "
            "its share of the rows is the serial part s; the API processes, the other "
            "partitions' jobs and Redis spread over the cores, except that one Redis process "
            "uses one core at most. The counting job's own Redis calls stay in the parallel "
            "part (they are not told apart from the ingest's), so these are upper bounds for "
            "the CPU per row they start from: that of the fewest workers (the least), and that "
            "of the most (the partitions counted in parallel).\n\n" + "\n".join(lines)
        )
    return "\n\n".join(out)


def plot(runs: Sequence[Run], tag: str = "", directory: Path = PLOTS) -> Plot:
    """Counted rows/s by workers (a line per Redis and partitions), where a counted row's CPU
    goes (stacked by role), and the projection to N cores with the measured points."""
    plt = pyplot()
    groups = ingest_groups(runs)
    pairs = sorted({k[:2] for k in groups}, key=lambda k: (_kind_order(k[0]), k[1]))
    workers = sorted({k[2] for k in groups})
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    ax = axes[0]
    for i, (kind, parts) in enumerate(pairs):
        ws = [w for w in workers if (kind, parts, w) in groups]
        rates = [[r.rate for r in groups[(kind, parts, w)]] for w in ws]
        meds = [_med(x) for x in rates]
        err = [[m - min(x) for m, x in zip(meds, rates, strict=True)],
               [max(x) - m for m, x in zip(meds, rates, strict=True)]]  # fmt: skip
        ax.errorbar(ws, meds, yerr=err, marker="o", capsize=3, color=f"C{i}",
                    linestyle="-" if kind == "standalone" else "--",
                    label=f"{kind}, P = {parts}")  # fmt: skip
    for kind in sorted({r.kind for r in runs}, key=_kind_order):
        xs = [r.rate for r in runs if (r.kind, r.what) == (kind, "xadd")]
        if xs:
            ax.annotate(f"XADD ({kind}): {_med(xs):,.0f} rows/s", xy=(0.02, 0.95 - 0.06 *
                        _kind_order(kind)), xycoords="axes fraction", fontsize=8)  # fmt: skip
    ax.set_xticks(workers)
    ax.set_xlabel("worker processes")
    ax.set_ylabel("rows/s accepted and counted")
    ax.set_ylim(bottom=0)
    ax.set_title("one stream: counted ingest")
    ax.legend(fontsize=8, loc="lower right")

    ax = axes[1]
    keys = list(groups)
    bottom = [0.0] * len(keys)
    for role, colour in zip(ROLES, ("C0", "C1", "C2", "C7"), strict=True):
        us = [_med([r.per_unit(role) for r in groups[k]]) for k in keys]
        ax.bar(range(len(keys)), us, 0.8, bottom=bottom, color=colour, label=role)
        bottom = [b + u for b, u in zip(bottom, us, strict=True)]
    ax.set_xticks(range(len(keys)),
                  [f"{k[0][:4]}\nP{k[1]} W{k[2]}" for k in keys], fontsize=7)  # fmt: skip
    ax.set_ylabel("CPU µs per counted row")
    ax.set_title("where a counted row's CPU goes")
    ax.legend(fontsize=8)

    ax = axes[2]
    ns = [2**i for i in range(7)]
    hue = {pair: f"C{i}" for i, pair in enumerate(pairs)}
    fewest: dict[tuple[str, int], int] = {}
    for m in amdahl(runs):
        first = (m.kind, m.partitions) not in fewest
        fewest.setdefault((m.kind, m.partitions), m.workers)
        ax.plot(ns, [m.rate(n) for n in ns], color=hue[(m.kind, m.partitions)],
                linestyle="-" if first else ":",
                label=f"{m.kind}, P = {m.partitions}, from W = {m.workers}")  # fmt: skip
    for pair in pairs:
        pts = [(r.cores(), r.rate) for k, g in groups.items() if k[:2] == pair for r in g]
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], color=hue[pair], s=12)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("cores (dots: measured runs at the cores they kept busy)")
    ax.set_ylabel("counted rows/s")
    ax.set_ylim(bottom=0)
    ax.set_title("projection from CPU per row (Amdahl)")
    ax.legend(fontsize=8)
    fig.suptitle(
        "One hot stream across workers, partitions and Redis masters (2 shared cores; "
        "whiskers: min-max over repeats)",
        fontsize=10,
    )
    fig.tight_layout()
    path = plot_path(f"scale{tag}", directory)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Plot("One stream across workers, partitions and Redis masters", path)
