"""`selectivity demo`: the product end to end against a running server (the one `make run`
starts), over HTTP as a model manager would use it, on a synthetic click log (no data needed).

It registers a stream, ingests a few windows with forced rolls, downloads the train set (Arrow),
trains LightGBM on it, scores the next window through `featurize`, and prints the log-loss
against the label prior, the privacy ledger's headline and where the pages are.
"""

from __future__ import annotations

import argparse
import io
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

if TYPE_CHECKING:
    import numpy as np

BATCH = 1000


def _fail(resp: httpx.Response) -> None:
    if resp.status_code >= 400:
        try:
            body = resp.json()
            msg = f"{body.get('error')}: {body.get('detail')}"
        except ValueError:
            msg = resp.text[:300]
        sys.exit(f"error {resp.status_code} from {resp.request.url.path}: {msg}")


def _log_loss(y: np.ndarray, p: np.ndarray) -> float:
    import numpy as np

    p = np.clip(p, 1e-7, 1 - 1e-7)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def run(args: argparse.Namespace) -> None:
    # the numerical stack here, not at the top: `selectivity --help` imports this module
    import lightgbm as lgb
    import numpy as np
    import pyarrow as pa
    from rich.console import Console
    from rich.progress import Progress

    from service.cli.synthetic import ClickLogSpec, generate, stream_body

    logging.getLogger("httpx").setLevel(logging.WARNING)
    console = Console()
    key = args.key or os.environ.get("SELECTIVITY_API_KEY")
    if not key:
        path = Path(os.environ.get("SELECTIVITY_DATA_DIR", ".selectivity")) / "admin.key"
        if not path.exists():
            sys.exit(f"error: no admin key: pass --key, set SELECTIVITY_API_KEY, or run {path}")
        key = path.read_text().strip()
    admin = httpx.Client(base_url=args.url, headers={"Authorization": f"Bearer {key}"}, timeout=120)
    try:
        admin.get("/readyz").raise_for_status()
    except httpx.HTTPError as exc:
        sys.exit(f"error: no server at {args.url} ({type(exc).__name__}); start it with `make run`")

    def client_for(role: str) -> httpx.Client:
        r = admin.post("/v1/admin/keys", json={"role": role, "name": f"demo-{role}"})
        _fail(r)
        return httpx.Client(
            base_url=args.url, headers={"Authorization": f"Bearer {r.json()['key']}"}, timeout=120
        )

    producer, model = client_for("producer"), client_for("model")
    spec = ClickLogSpec(n_categorical=8, n_numeric=2, max_cardinality=2000)
    name = f"demo-{secrets.token_hex(3)}"
    body = stream_body(name, spec, passthrough=False)
    body["privacy"] = {"mechanism": "laplace", "epsilon": args.epsilon}
    body["hot_windows"] = 1
    body["sketch"] = {"width": 4096, "depth": 3}
    _fail(admin.post("/v1/streams", json=body))
    log = generate(
        args.rows * (args.windows + 1), seed=int.from_bytes(secrets.token_bytes(4)), spec=spec
    )
    console.print(
        f"[bold]stream {name}[/]: {spec.n_categorical} categorical + {spec.n_numeric} numeric "
        f"features, laplace ε = {args.epsilon} per window, {args.windows} windows of "
        f"{args.rows:,} clicks"
    )
    with Progress(console=console) as progress:
        task = progress.add_task("ingest and roll", total=args.windows)
        for w in range(args.windows):
            for start in range(w * args.rows, (w + 1) * args.rows, BATCH):
                obs = log.observations(start, min(start + BATCH, (w + 1) * args.rows))
                _fail(producer.post(f"/v1/streams/{name}/observations", json={"observations": obs}))
            if w < args.windows - 1:
                _fail(admin.post(f"/v1/streams/{name}/roll"))
            progress.advance(task)
    r = model.get(f"/v1/streams/{name}/trainset", params={"format": "arrow"})
    _fail(r)
    table = pa.ipc.open_stream(io.BytesIO(r.content)).read_all()
    epoch = r.headers.get("X-Selectivity-Epoch")
    cols = [c for c in table.column_names if c not in ("label", "id", "event_time", "window")]
    x = np.column_stack([table.column(c).to_numpy(zero_copy_only=False) for c in cols])
    y = (np.asarray(table.column("label").to_pylist()) == "1").astype(float)
    booster = lgb.train(
        # one thread: OpenMP's threads, spinning at each barrier, cost ten times the CPU on
        # a machine whose cores the server (and anything else) also uses
        {
            "objective": "binary",
            "learning_rate": 0.05,
            "num_leaves": 15,
            "num_threads": 1,
            "verbose": -1,
        },
        lgb.Dataset(x, y),
        num_boost_round=200,
    )
    console.print(
        f"train set at epoch {epoch}: {table.num_rows:,} rows × {len(cols)} count columns "
        f"({len(r.content) / 1e6:.1f} MB of Arrow); LightGBM trained"
    )
    # the next window's clicks, featurized by the service before they are ingested
    start = args.windows * args.rows
    test = log.observations(start, start + args.rows)
    feats = []
    for i in range(0, len(test), BATCH):
        rows = [o["features"] for o in test[i : i + BATCH]]
        fr = model.post(f"/v1/streams/{name}/featurize", json={"rows": rows})
        _fail(fr)
        out = fr.json()
        idx = [out["columns"].index(c) for c in cols]
        feats += [[row[j] for j in idx] for row in out["rows"]]
    yt = np.asarray([o["label"] == "1" for o in test], dtype=float)
    ll = _log_loss(yt, np.asarray(booster.predict(np.asarray(feats, dtype=float)), dtype=float))
    prior = _log_loss(yt, np.full(len(yt), y.mean()))
    console.print(
        f"next window ({len(yt):,} clicks, featurized through the API): log-loss "
        f"[bold]{ll:.4f}[/] vs the label prior's {prior:.4f} ({ll / prior - 1:+.1%})"
    )
    led = admin.get(f"/v1/streams/{name}/privacy")
    _fail(led)
    ledger: dict[str, Any] = led.json()
    part = ledger.get("observation") or {}
    eps, delta = part.get("epsilon"), part.get("delta")
    console.print(
        f"privacy ledger, per observation: ε = {eps}, δ = {delta} "
        f"({part.get('composition', '')}); the whole ledger: GET /v1/streams/{name}/privacy"
    )
    console.print(
        f"pages: {args.url}/ui/ (the console: streams, break glass, audit log), "
        f"{args.url}/ui/annotate (annotators), {args.url}/ui/curate (curators), "
        f"{args.url}/ui/anonymize (k-anonymised releases); API docs: {args.url}/docs"
    )


def register(sub: Any) -> None:
    p = sub.add_parser("demo", help="the product end to end against a running server")
    p.add_argument("--url", default=os.environ.get("SELECTIVITY_URL", "http://127.0.0.1:8000"))
    p.add_argument(
        "--key",
        help="an admin key (default: $SELECTIVITY_API_KEY, then the bootstrap key in the data dir)",
    )
    p.add_argument("--windows", type=int, default=6)
    p.add_argument("--rows", type=int, default=10000, help="clicks per window")
    p.add_argument("--epsilon", type=float, default=1.0)
    p.set_defaults(fn=run)
