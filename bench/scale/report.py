"""The scale benchmark's tables and plot: medians over repeats, ratios to 1 API / 1 worker on
the same Redis (median of the per-repeat ratios), CPU per row or request by role."""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.report import PLOTS, Plot, Table, plot_path, pyplot

BASE = (1, 1)
ROLES = ("api", "worker", "redis", "client")


@dataclass(frozen=True)
class Run:
    kind: str  # standalone | cluster
    n_api: int
    n_worker: int
    rep: int
    what: str  # ingest | featurize
    streams: int  # ingest: streams written (featurize: 0)
    data: dict[str, Any]
    load: float  # 1-minute load average at its start

    def asdict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def rate(self) -> float:
        """Rows/s accepted and counted (ingest) or requests/s (featurize)."""
        d = self.data
        return d["rows"] / d["counted_s"] if self.what == "ingest" else d["requests"] / d["seconds"]

    @property
    def accepted(self) -> float:
        return self.data["rows"] / self.data["accepted_s"]

    @property
    def wall(self) -> float:
        return self.data["counted_s"] if self.what == "ingest" else self.data["seconds"]

    @property
    def units(self) -> int:
        return int(self.data["rows"] if self.what == "ingest" else self.data["requests"])

    def cpu(self, role: str) -> float:
        """CPU seconds of a role's processes (client: the load generator's)."""
        if role == "client":
            return float(self.data["client_cpu"])
        return float(sum(self.data["cpu"][role]))

    def per_unit(self, role: str) -> float:
        """CPU µs of a role per row or request."""
        return 1e6 * self.cpu(role) / self.units

    def cores(self, role: str | None = None) -> float:
        """Cores a role kept busy on average (all roles when None)."""
        roles = [role] if role else ROLES
        return sum(self.cpu(r) for r in roles) / self.wall

    def busiest(self, role: str) -> float:
        """The busiest process of a role, in cores."""
        return max(self.data["cpu"][role]) / self.wall


def _med(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def _groups(runs: Sequence[Run]) -> dict[tuple[str, str, int, int, int], list[Run]]:
    out: dict[tuple[str, str, int, int, int], list[Run]] = {}
    for r in runs:
        out.setdefault((r.kind, r.what, r.streams, r.n_api, r.n_worker), []).append(r)
    return out


def ratio_to_base(runs: Sequence[Run], group: list[Run]) -> float:
    """Median over repeats of rate / the 1 API / 1 worker rate of the same repeat."""
    base = {
        r.rep: r.rate
        for r in runs
        if (r.n_api, r.n_worker) == BASE
        and (r.kind, r.what, r.streams) == (group[0].kind, group[0].what, group[0].streams)
    }
    return _med([r.rate / base[r.rep] for r in group if r.rep in base])


def _config_order(key: tuple[str, str, int, int, int]) -> tuple[int, str, int, int, int]:
    kind, what, streams, n, m = key
    return (0 if kind == "standalone" else 1), what, streams, n, m


def _by_config(
    groups: dict[tuple[str, str, int, int, int], list[Run]],
    keys: Sequence[tuple[str, str, int, int, int]],
    columns: Sequence[str],
    cells: Callable[[list[Run]], Sequence[object]],
    *,
    title: str,
    streams: bool = True,
) -> Table:
    """A row per configuration in ``keys``: Redis, streams (unless ``streams`` is False), API
    processes, workers, then ``cells`` of that configuration's runs under ``columns``."""
    lead = (
        ["Redis", "streams", "API processes", "workers"]
        if streams
        else ["Redis", "API processes", "workers"]
    )
    rows = [
        ((kind, s, n, m) if streams else (kind, n, m)) + tuple(cells(groups[(kind, what, s, n, m)]))
        for kind, what, s, n, m in keys
    ]
    return Table([*lead, *columns], rows, title=title)


def render(runs: Sequence[Run]) -> list[Table]:
    groups = _groups(runs)
    keys = sorted(groups, key=_config_order)
    ingest = [k for k in keys if k[1] == "ingest"]
    feat = [k for k in keys if k[1] == "featurize"]
    t_ingest = _by_config(
        groups,
        ingest,
        [
            "accepted rows/s",
            "accepted and counted rows/s",
            "× 1 API / 1 worker",
            "count lag after the last batch",
            "cores busy (all)",
            "busiest worker, cores",
            "Redis, cores",
            "busiest Redis node's share",
            "load average",
        ],
        lambda g: (
            f"{_med([r.accepted for r in g]):,.0f}",
            f"{_med([r.rate for r in g]):,.0f}",
            f"{ratio_to_base(runs, g):.2f}×",
            f"{_med([r.data['counted_s'] - r.data['accepted_s'] for r in g]):.1f} s",
            f"{_med([r.cores() for r in g]):.2f}",
            f"{_med([r.busiest('worker') for r in g]):.2f}",
            f"{_med([r.cores('redis') for r in g]):.2f}",
            f"{100 * _med([r.busiest('redis') / r.cores('redis') for r in g]):.0f} %",
            f"{_med([r.load for r in g]):.1f}",
        ),
        title="Counted ingest: from the first batch until the worker has counted the last",
    )
    t_cpu = _by_config(
        groups,
        ingest,
        ["API", "worker", "Redis", "load generator", "all"],
        lambda g: (
            *(f"{_med([r.per_unit(role) for r in g]):.1f}" for role in ROLES),
            f"{_med([sum(r.per_unit(x) for x in ROLES) for r in g]):.1f}",
        ),
        title="Counted ingest: CPU µs per row, by role (all processes of the role)",
    )
    t_feat = _by_config(
        groups,
        feat,
        [
            "requests/s",
            "× 1 API / 1 worker",
            "p50",
            "p99",
            "API µs/request",
            "Redis µs/request",
            "load generator µs/request",
            "cores busy (all)",
            "busiest API, cores",
            "load average",
        ],
        lambda g: (
            f"{_med([r.rate for r in g]):,.0f}",
            f"{ratio_to_base(runs, g):.2f}×",
            f"{1e3 * _med([r.data['p50'] for r in g]):.2f} ms",
            f"{1e3 * _med([r.data['p99'] for r in g]):.1f} ms",
            f"{_med([r.per_unit('api') for r in g]):.0f}",
            f"{_med([r.per_unit('redis') for r in g]):.0f}",
            f"{_med([r.per_unit('client') for r in g]):.0f}",
            f"{_med([r.cores() for r in g]):.2f}",
            f"{_med([r.busiest('api') for r in g]):.2f}",
            f"{_med([r.load for r in g]):.1f}",
        ),
        title="Featurize, one row a request, clients one request at a time each",
        streams=False,
    )
    plan = []
    for kind in sorted({k[0] for k in keys}, key=lambda k: k != "standalone"):
        ing = [r for r in runs if r.kind == kind and r.what == "ingest"]
        fz = [r for r in runs if r.kind == kind and r.what == "featurize"]
        for what, rs, role, unit in (
            ("ingest: accepting (body, checks, ingest.lua)", ing, "api", "rows"),
            ("counting: the one counting job at a time", ing, "worker", "rows"),
            ("ingest and counting: Redis", ing, "redis", "rows"),
            ("featurize, 1 row", fz, "api", "requests"),
            ("featurize, 1 row: Redis", fz, "redis", "requests"),
        ):
            if rs:
                us = _med([r.per_unit(role) for r in rs])
                plan.append((kind, what, role, f"{us:.1f}", f"{1e6 / us:,.0f} {unit}/s"))
    t_plan = Table(
        ["Redis", "work", "process", "CPU µs per row or request", "per core of that process"],
        plan,
        title="CPU per row or request of each process kind (medians over every run above)",
    )
    tables = [t_ingest, t_cpu, t_feat, t_plan]
    kinds = {k[0] for k in keys}
    if kinds == {"standalone", "cluster"}:
        rows = []
        for kind, what, s, n, m in keys:
            if kind != "cluster":
                continue
            other = groups.get(("standalone", what, s, n, m))
            if other:
                c = _med([r.rate for r in groups[(kind, what, s, n, m)]])
                rows.append(
                    (
                        what if what == "featurize" else f"counted ingest, {s} stream(s)",
                        n,
                        m,
                        f"{c / _med([r.rate for r in other]):.2f}×",
                    )
                )
        tables.append(
            Table(
                ["measure", "API processes", "workers", "cluster / standalone"],
                rows,
                title="Three-master cluster against the standalone Redis (run one after the other)",
            )
        )
    return tables


def _kind_first(kind: str) -> int:
    return 0 if kind == "standalone" else 1


def plot(runs: Sequence[Run], tag: str = "", directory: Path = PLOTS) -> Plot:
    """Counted ingest and featurize by configuration, and the CPU of a counted row by
    process kind (stacked: where the time goes)."""
    plt = pyplot()
    groups = _groups(runs)
    configs = sorted({(r.n_api, r.n_worker) for r in runs}, key=lambda c: (c[1], c[0]))
    labels = [f"{n} API\n{m} worker{'s' if m > 1 else ''}" for n, m in configs]
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.8))
    for ax, what, unit in (
        (axes[0], "ingest", "rows/s accepted and counted"),
        (axes[1], "featurize", "requests/s (1 row each)"),
    ):
        series = sorted(
            {(k[0], k[2]) for k in groups if k[1] == what}, key=lambda x: (_kind_first(x[0]), x[1])
        )
        width = 0.8 / max(1, len(series))
        for i, (kind, s) in enumerate(series):
            meds, lo, hi = [], [], []
            for n, m in configs:
                rates = [r.rate for r in groups.get((kind, what, s, n, m), [])]
                md = _med(rates)
                meds.append(md)
                lo.append(md - min(rates) if rates else 0)
                hi.append(max(rates) - md if rates else 0)
            xs = [j + (i - (len(series) - 1) / 2) * width for j in range(len(configs))]
            name = kind if what == "featurize" else f"{kind}, {s} stream{'s' if s > 1 else ''}"
            ax.bar(xs, meds, width, yerr=[lo, hi], capsize=3, label=name)
        ax.set_xticks(range(len(configs)), labels)
        ax.set_ylabel(unit)
        ax.set_title("counted ingest" if what == "ingest" else "featurize")
        ax.legend(fontsize=8)
    ax = axes[2]
    kinds = sorted({r.kind for r in runs}, key=_kind_first)
    width = 0.8 / max(1, len(kinds))
    top = 0.0
    for i, kind in enumerate(kinds):
        xs = [j + (i - (len(kinds) - 1) / 2) * width for j in range(len(configs))]
        bottom = [0.0] * len(configs)
        for role, colour in zip(ROLES, ("C0", "C1", "C2", "C7"), strict=True):
            us = [
                _med([r.per_unit(role) for r in runs
                      if (r.kind, r.what, r.n_api, r.n_worker) == (kind, "ingest", n, m)])
                for n, m in configs
            ]  # fmt: skip
            ax.bar(xs, us, width, bottom=bottom, color=colour, edgecolor="white",
                   hatch="" if i == 0 else "//", label=f"{role} ({kind})")  # fmt: skip
            bottom = [b + u for b, u in zip(bottom, us, strict=True)]
        top = max(top, *bottom)
    ax.set_xticks(range(len(configs)), labels)
    ax.set_ylabel("CPU µs per counted row")
    ax.set_title("where a counted row's CPU goes (both stream counts)")
    ax.set_ylim(0, 1.45 * top)  # room for the legend above the bars
    ax.legend(fontsize=7, ncol=2, loc="upper center")
    fig.suptitle(
        "Throughput by API processes and workers (2 shared cores; bars: median, "
        "whiskers: min-max over repeats)",
        fontsize=10,
    )
    fig.tight_layout()
    path = plot_path(f"scale{tag}", directory)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Plot("Throughput by API processes and workers", path)
