"""A model manager on the Selectivity client: registers a model of a stream, trains LightGBM on
the stream's train set, serves through ``featurize``, and retrains when the service says so
(the ``retrain_required`` server-sent event, or a 409 RetrainRequired while serving).

    pip install ./clients/python lightgbm
    python examples/model_manager/model_manager.py --stream movielens --key $MODEL \\
        --serve rows.ndjson

``--serve`` is a file of raw feature rows (one JSON object a line) scored after each training,
standing in for the requests a real model server would get. Runs until interrupted, or until
it has retrained ``--retrains`` times.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np
from selectivity_client import Client, RetrainRequired, epoch_of

META = ("id", "event_time", "window", "label")


class Manager:
    def __init__(self, client: Client, model_id: str, labels: list[str], min_rows: int) -> None:
        self.client, self.model_id, self.labels, self.min_rows = client, model_id, labels, min_rows
        self.booster: lgb.Booster | None = None
        self.columns: list[str] = []
        self.epoch: int | None = None

    def train(self, wait_seconds: float, at_least: int | None = None) -> None:
        """Train on the current train set and report the training; waits (up to
        ``wait_seconds``) for ``min_rows`` rows, since right after a roll the hot period may
        be nearly empty, and for the epoch ``at_least`` to be served."""
        deadline = time.monotonic() + wait_seconds
        while True:
            table = self.client.train_set(model_id=self.model_id)  # records the training
            epoch = epoch_of(table)
            ready = at_least is None or (epoch is not None and epoch >= at_least)
            if (table.num_rows >= self.min_rows and ready) or time.monotonic() > deadline:
                break
            time.sleep(1)
        if table.num_rows == 0:
            sys.exit("the train set is empty: ingest observations first")
        self.columns = [c for c in table.column_names if c not in META]
        x = np.column_stack([table.column(c).to_numpy(zero_copy_only=False) for c in self.columns])
        y = np.array([self.labels.index(v) for v in table.column("label").to_pylist()])
        params: dict[str, Any] = {"learning_rate": 0.1, "num_leaves": 15, "verbose": -1}
        if len(self.labels) > 2:
            params |= {"objective": "multiclass", "num_class": len(self.labels)}
        else:
            params["objective"] = "binary"
        self.booster = lgb.train(params, lgb.Dataset(x, y), num_boost_round=50)
        assert epoch is not None
        self.client.report_trained(self.model_id, epoch)
        self.epoch = epoch
        print(f"trained at epoch {epoch} on {table.num_rows} rows", flush=True)

    def serve(self, rows: list[dict[str, Any]]) -> np.ndarray:
        """Scores of ``rows``; a RetrainRequired answer is raised to the caller."""
        feats = self.client.featurize(rows, model_id=self.model_id, output="arrow")
        x = np.column_stack([feats.column(c).to_numpy(zero_copy_only=False) for c in self.columns])
        assert self.booster is not None
        return np.asarray(self.booster.predict(x))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("SELECTIVITY_URL", "http://127.0.0.1:8000"))
    p.add_argument("--key", default=os.environ.get("SELECTIVITY_API_KEY"), help="a model key")
    p.add_argument("--stream", required=True)
    p.add_argument("--name", default="lightgbm", help="the model's name")
    p.add_argument("--model-id", help="a model registered before (default: register one)")
    p.add_argument("--serve", type=Path, help="NDJSON raw feature rows to score")
    p.add_argument("--retrains", type=int, default=0, help="stop after this many (0: never)")
    p.add_argument("--min-rows", type=int, default=10)
    p.add_argument("--wait-seconds", type=float, default=60.0)
    args = p.parse_args(argv)
    if not args.key:
        p.error("--key or SELECTIVITY_API_KEY: a key with role model")
    rows = (
        [json.loads(line) for line in args.serve.read_text().splitlines() if line.strip()]
        if args.serve
        else []
    )
    with Client(args.url, args.key, stream=args.stream) as client:
        labels = [str(v) for v in client.stream_info()["labels"]]
        model_id = args.model_id or client.register_model(args.name)["id"]
        print(f"model {model_id} of stream {args.stream}", flush=True)
        # events from now on: the backlog's last id first
        last = None
        for event in client.events(follow_seconds=0, reconnect=False):
            last = event.id
        manager = Manager(client, model_id, labels, args.min_rows)
        manager.train(args.wait_seconds)
        retrains = 0

        def serve() -> None:
            if rows:
                scores = manager.serve(rows)
                print(f"served {len(rows)} rows at epoch {manager.epoch}", flush=True)
                print(f"scores: {np.round(scores[:5], 3).tolist()}", flush=True)

        try:
            serve()
        except RetrainRequired:
            manager.train(args.wait_seconds)
            serve()
        for event in client.events(last_event_id=last, follow_seconds=300):
            if event.event != "retrain_required" or model_id not in event.data["models"]:
                continue
            print(f"retrain required at epoch {event.data['epoch']}", flush=True)
            manager.train(args.wait_seconds, at_least=int(event.data["epoch"]))
            serve()
            retrains += 1
            if args.retrains and retrains >= args.retrains:
                break
    return 0


if __name__ == "__main__":
    sys.exit(main())
