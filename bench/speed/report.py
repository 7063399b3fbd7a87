"""The speed section of BENCHMARKS.md: the ratios against their targets, and the tables that say
where the time goes (tables only, ``bench.report``)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from bench.report import Table
from bench.speed.batch import BatchResult
from bench.speed.http_bench import HttpResult
from bench.speed.profile import ingest_profile, trainset_profile

# Issue 17's goals (featurize batch, one-row latency, ingest accepted and counted); the train
# set keeps its earlier target.
TARGETS = MappingProxyType(
    {"featurize": 2.0, "latency": 1.2, "ingest_counted": 0.5, "trainset": 0.5}
)


def rate(runs: list[dict[str, float]]) -> float:
    return statistics.median(r["rows"] / r["seconds"] for r in runs)


def per_row_us(runs: list[dict[str, float]], what: str) -> float:
    """Median CPU microseconds per row of one process over the runs."""
    return statistics.median(1e6 * r[what] / r["rows"] for r in runs if r["rows"])


def quantile(xs: list[float], q: float) -> float:
    return float(np.quantile(np.asarray(xs), q))


@dataclass
class Row:
    key: str  # stable id
    what: str
    ours: float
    baseline: float
    unit: str  # "rows/s" or "ms"
    target: str  # "≥ 1.0×", "≤ 2.0×", or "" (information only)
    ratio: float = 0.0  # ours / baseline, unless given (a median of paired ratios)
    met: bool = True
    spread: str = ""  # the range of the paired ratios, when the ratio is their median

    def __post_init__(self) -> None:
        self.ratio = self.ratio or self.ours / self.baseline
        if self.target:
            bound = float(self.target.split()[1].rstrip("×"))
            self.met = self.ratio >= bound if self.target.startswith("≥") else self.ratio <= bound

    def fmt(self, v: float) -> str:
        return f"{v:,.0f} rows/s" if self.unit == "rows/s" else f"{v:.2f} ms"


def counted(runs: list[dict[str, float]]) -> list[dict[str, float]]:
    """Ingest runs timed until the counting job had counted all their rows (the wait, and the
    server's, worker's and Redis's CPU during it, added)."""
    return [
        {
            **r,
            "seconds": r["seconds"] + r["count_wait"],
            "server_cpu": r["server_cpu"] + r["count_server_cpu"],
            "redis_cpu": r["redis_cpu"] + r["count_redis_cpu"],
            "worker_cpu": r["worker_cpu"] + r["count_worker_cpu"],
        }
        for r in runs
    ]


def summarise(b: BatchResult | None, h: HttpResult | None) -> list[Row]:
    rows: list[Row] = []
    if b is not None:
        ours_s = b.ours_columns if b.ours_columns is not None else b.ours_rows
        assert ours_s is not None
        ours = b.rows / ours_s
        if b.target_encoder:
            what = "featurize batch vs TargetEncoder.transform"
            target = f"≥ {TARGETS['featurize']:.1f}×"
            key = "ours_columns" if b.ours_columns is not None else "ours_rows"
            # each repeat times both, one after the other: their ratio, then the median
            te_s, us_s = b.runs.get("target_encoder", []), b.runs.get(key, [])
            ratios = [te / us for te, us in zip(te_s, us_s, strict=True)]
            rows.append(
                Row(
                    "featurize_te",
                    what + (f", median of {len(ratios)} repeats" if ratios else ""),
                    ours,
                    b.rows / b.target_encoder,
                    "rows/s",
                    target,
                    ratio=statistics.median(ratios) if ratios else 0.0,
                    spread=f"{min(ratios):.2f}–{max(ratios):.2f}×" if len(ratios) > 1 else "",
                )
            )
        if b.count_encoder:
            what = "featurize batch vs CountEncoder.transform"
            rows.append(Row("featurize_ce", what, ours, b.rows / b.count_encoder, "rows/s", ""))
    if h is not None:
        rows += latency_rows(h)
    if h is not None and h.ingest:
        xadd = rate(h.xadd)
        rows += [
            Row(
                "ingest",
                f"HTTP ingest (batches of {h.batch}) vs pipelined XADD",
                rate(h.ingest),
                xadd,
                "rows/s",
                "",
            ),
            Row(
                "ingest_counted",
                "HTTP ingest, accepted and counted, vs pipelined XADD",
                rate(counted(h.ingest)),
                xadd,
                "rows/s",
                f"≥ {TARGETS['ingest_counted']:.1f}×",
            ),
            Row(
                "trainset",
                "train set (Arrow, parsed) vs raw XRANGE",
                rate(h.trainset),
                rate(h.xrange),
                "rows/s",
                f"≥ {TARGETS['trainset']:.1f}×",
            ),
        ]
    return rows


def latency_rows(h: HttpResult) -> list[Row]:
    """featurize against the no-op: each repeat's p50 ratio (the two measured interleaved, so
    load that comes and goes slows both), their median and range; p99 over all repeats. The
    first figures' no-op for comparison with them."""
    runs = h.latency_runs or [h.latency]

    def p50s(name: str) -> list[float]:
        return [1e3 * statistics.median(r[name]) for r in runs]

    def paired(key: str, what: str, floor: str, target: str) -> Row:
        ours, base = p50s("featurize"), p50s(floor)
        ratios = [a / b for a, b in zip(ours, base, strict=True)]
        return Row(
            key,
            what,
            statistics.median(ours),
            statistics.median(base),
            "ms",
            target,
            ratio=statistics.median(ratios),
            spread=f"{min(ratios):.2f}–{max(ratios):.2f}×" if len(ratios) > 1 else "",
        )

    lat = h.latency
    rows = [
        paired(
            "latency_p50",
            f"HTTP featurize p50 (1 row) vs no-op, median of {len(runs)} repeats",
            "noop",
            f"≤ {TARGETS['latency']:.1f}×",
        ),
        Row(
            "latency_p99",
            "HTTP featurize p99 (1 row) vs no-op",
            1e3 * quantile(lat["featurize"], 0.99),
            1e3 * quantile(lat["noop"], 0.99),
            "ms",
            "",
        ),
    ]
    if "noop_last" in lat:
        rows.append(
            paired(
                "latency_p50_first",
                "HTTP featurize p50 vs the first figures' no-op (a route matched last)",
                "noop_last",
                "",
            )
        )
    return rows


def ratios_table(rows: list[Row]) -> Table:
    def line(r: Row) -> list[object]:
        met = "—" if not r.target else ("yes" if r.met else "**no**")
        ratio = f"{r.ratio:.2f}×" + (f" ({r.spread})" if r.spread else "")
        return [r.what, r.fmt(r.ours), r.fmt(r.baseline), ratio, r.target or "(info)", met]

    header = ["measure", "Selectivity", "baseline", "ratio", "target", "met"]
    return Table(header, [line(r) for r in rows])


def batch_table(b: BatchResult) -> Table:
    rows: list[list[object]] = [
        ["rows", f"{b.rows:,} of the synthetic click log, its 26 categorical features"],
        ["columns", f"Selectivity {b.n_columns} (6 per table), the encoders 26"],
    ]
    if b.ours_rows:
        rows.append(
            [
                "Selectivity from row dicts (the HTTP body's shape)",
                f"{b.rows / b.ours_rows:,.0f} rows/s",
            ]
        )
    if b.ours_full:
        rows.append(
            [
                f"Selectivity, all 39 features ({b.n_columns_full} columns)",
                f"{b.rows / b.ours_full:,.0f} rows/s",
            ]
        )
    return Table(["featurize batch", ""], rows, "Featurize batch")


def http_table(h: HttpResult) -> Table:
    lat, t0 = h.latency, h.trainset[0]
    rows: list[list[object]] = [
        ["latency rounds (featurize, no-op, /healthz)", len(lat["featurize"])],
        ["/healthz p50", f"{1e3 * statistics.median(lat['healthz']):.2f} ms"],
        [
            "ingest",
            f"{sum(int(r['rows']) for r in h.ingest):,} rows in {len(h.ingest)} runs, "
            f"batches of {h.batch}",
        ],
        [
            "ingest: wait until counted after the last batch (median)",
            f"{statistics.median(r['count_wait'] for r in h.ingest):.1f} s",
        ],
        [
            "train set",
            f"{int(t0['rows']):,} hot rows, {int(t0['columns'])} columns, "
            f"{t0['bytes'] / 1e6:.0f} MB of Arrow "
            f"({t0['bytes'] / t0['rows'] / 1e3:.1f} kB per row)",
        ],
        [
            "hot window in Redis: JSON rows / by column",
            f"{h.hot_bytes:.0f} / {h.cols_bytes:.0f} B per row",
        ],
    ]
    return Table(["HTTP", ""], rows, "HTTP")


def cpu_table(h: HttpResult) -> Table:
    """Where the time goes: CPU microseconds per row in each process, medians over runs."""
    lines = []
    for label, runs in (
        ("HTTP ingest, accepted", h.ingest),
        ("HTTP ingest, accepted and counted", counted(h.ingest)),
        ("pipelined XADD", h.xadd),
        ("train set (Arrow)", h.trainset),
        ("raw XRANGE", h.xrange),
    ):
        lines.append(
            [
                label,
                f"{rate(runs):,.0f}",
                f"{1e6 / rate(runs):.1f}",
                f"{per_row_us(runs, 'client_cpu'):.1f}",
                f"{per_row_us(runs, 'server_cpu'):.1f}",
                f"{per_row_us(runs, 'worker_cpu'):.1f}",
                f"{per_row_us(runs, 'redis_cpu'):.1f}",
            ]
        )
    header = [
        "path",
        "rows/s",
        "wall µs/row",
        "client CPU µs/row",
        "API CPU µs/row",
        "worker CPU µs/row",
        "Redis CPU µs/row",
    ]
    return Table(header, lines, "CPU per row of each process (medians)")


def profile_tables(batch: int) -> list[Table]:
    """The ingest batch and a train-set chunk timed piece by piece in this process."""
    ing, ts = ingest_profile(batch), trainset_profile()
    ingest = [
        ["body parsed (`json.loads` and the pydantic model)", f"{ing.parse_us:.1f}"],
        ["`check_rows`", f"{ing.validate_us:.1f}"],
        ["the stored rows", f"{ing.rows_us:.1f}"],
        [
            "counting (stored rows parsed, keys, hashes, increments summed and packed)",
            f"{ing.count_us:.1f}",
        ],
        ["`BITFIELD INCRBY` ops per row (count)", f"{ing.ops_per_row:.0f}"],
    ]
    trainset = [
        ["a counted run read (`hotrows.from_ipc`)", f"{ts.counted_us:.2f}"],
        ["the rows' JSON read (`hotrows.parse_chunk`)", f"{ts.read_us:.1f}"],
        ["the same row by row (`hotrows.parse_rows`)", f"{ts.rows_us:.1f}"],
        ["featurized (`transform_encoded`)", f"{ts.featurize_us:.1f}"],
        ["distinct keys hashed per row (count)", f"{ts.keys_per_row:.1f}"],
        ["record batch from a counted run", f"{ts.batch_us:.1f}"],
        ["record batch from JSON", f"{ts.json_batch_us:.1f}"],
        ["IPC message", f"{ts.serialize_us:.1f}"],
    ]
    return [
        Table(["ingest step", "µs per row"], ingest, f"Ingest, one batch of {batch} in process"),
        Table(
            ["train-set step", "µs per row"],
            trainset,
            f"Train set, one chunk of {ts.rows:,} rows in process",
        ),
    ]


def render(b: BatchResult | None, h: HttpResult | None, rows: list[Row]) -> list[Table]:
    parts = [ratios_table(rows)]
    if b is not None:
        parts.append(batch_table(b))
    if h is not None and h.ingest:
        parts += [http_table(h), cpu_table(h), *profile_tables(h.batch)]
    return parts
