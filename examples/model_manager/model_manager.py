"""A model manager on the Selectivity client: registers a model of a stream (or reuses the one
of that name), waits until the stream's train set is large enough, trains LightGBM on it,
reports how well it predicts held-out rows, serves through ``featurize``, and retrains when the
service says so (the ``retrain_required`` server-sent event, or a 409 RetrainRequired while
serving).

    pip install ./clients/python lightgbm
    python examples/model_manager/model_manager.py --stream movielens --key $MODEL \\
        --serve rows.ndjson

``--serve`` is a file of raw feature rows (one JSON object a line) scored after each training,
standing in for the requests a real model server would get. Runs until interrupted (Ctrl-C),
until it has retrained ``--retrains`` times, or with ``--once`` after the first training.
See examples/model_manager/README.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import lightgbm as lgb
import numpy as np
from selectivity_client import (
    Client,
    Conflict,
    RetrainRequired,
    Unavailable,
    ValidationError,
    epoch_of,
)

META = ("id", "event_time", "window", "label")
HOLDOUT = 0.2  # the newest fifth of the train set is held out to score the model
T = TypeVar("T")


def say(line: str) -> None:
    print(line, flush=True)


def retrying(what: str, call: Callable[[], T], attempts: int = 6) -> T:
    """``call()``, retried with exponential backoff (1 s, 2 s, ... at most 30 s) on the answers
    a roll can cause for a moment: 503 (the client itself retries it first), 409 (other than
    RetrainRequired) and 422 (an epoch that moved meanwhile)."""
    for attempt in range(attempts):
        try:
            return call()
        except RetrainRequired:
            raise
        except (Unavailable, Conflict, ValidationError) as exc:
            if attempt == attempts - 1:
                raise
            delay = min(30.0, 2.0**attempt)
            say(f"{what}: {exc}; retrying in {delay:g} s")
            time.sleep(delay)
    raise AssertionError("unreachable")


def auc(scores: np.ndarray, positive: np.ndarray) -> float | None:
    """The area under the ROC curve (the Mann-Whitney statistic, ties counted half); None
    without both classes."""
    pos, neg = scores[positive], scores[~positive]
    if len(pos) == 0 or len(neg) == 0:
        return None
    wins = (pos[:, None] > neg[None, :]).sum() + 0.5 * (pos[:, None] == neg[None, :]).sum()
    return float(wins / (len(pos) * len(neg)))


def log_loss(p: np.ndarray, y: np.ndarray) -> float:
    """Mean negative log-likelihood of labels ``y`` (indices) under class probabilities ``p``."""
    p = np.clip(p, 1e-12, 1.0)
    return float(-np.mean(np.log(p[np.arange(len(y)), y])))


class Manager:
    def __init__(
        self,
        client: Client,
        model_id: str,
        labels: list[str],
        *,
        min_rows: int,
        min_per_label: int,
        wait_seconds: float,
        poll_seconds: float,
    ) -> None:
        self.client, self.model_id, self.labels = client, model_id, labels
        self.min_rows, self.min_per_label = min_rows, min_per_label
        self.wait_seconds, self.poll_seconds = wait_seconds, poll_seconds
        self.booster: lgb.Booster | None = None
        self.columns: list[str] = []
        self.epoch: int | None = None

    def _missing(self, counts: Counter[str], n: int) -> list[str]:
        need = []
        if n < self.min_rows:
            need.append(f"{self.min_rows - n} more rows")
        for label in self.labels:
            if counts[label] < self.min_per_label:
                need.append(f"{self.min_per_label - counts[label]} more of label {label!r}")
        return need

    def wait_for_train_set(self, at_least: int | None = None) -> Any:
        """The train set once it has ``min_rows`` rows and ``min_per_label`` of every label
        (and is of epoch ``at_least`` or later), saying what it waits for meanwhile. Right after
        a roll the hot period is nearly empty: observations arrive over the window."""
        deadline = time.monotonic() + self.wait_seconds if self.wait_seconds > 0 else math.inf
        said = None
        while True:
            table = retrying("train set", lambda: self.client.train_set())
            epoch = epoch_of(table)
            counts = Counter(str(v) for v in table.column("label").to_pylist())
            need = self._missing(counts, table.num_rows)
            if at_least is not None and (epoch is None or epoch < at_least):
                need.insert(0, f"epoch {at_least} (the train set is of epoch {epoch})")
            if not need:
                return table
            status = (
                f"waiting for the train set of epoch {epoch}: {table.num_rows} rows "
                f"({', '.join(f'{k!r}: {counts[k]}' for k in self.labels)}); "
                f"needs {', '.join(need)}"
            )
            if status != said:
                say(status)
                said = status
            if time.monotonic() > deadline:
                sys.exit(
                    f"gave up after {self.wait_seconds:g} s (--wait-seconds): {status}; "
                    "ingest labelled observations, or lower --min-rows / --min-per-label"
                )
            time.sleep(self.poll_seconds)

    def train(self, at_least: int | None = None) -> None:
        """Wait for a large enough train set, score a model fitted on all but its newest
        rows on those rows, fit on all of it, and report the training."""
        table = self.wait_for_train_set(at_least)
        epoch = epoch_of(table)
        assert epoch is not None
        self.columns = [c for c in table.column_names if c not in META]
        x = np.column_stack([table.column(c).to_numpy(zero_copy_only=False) for c in self.columns])
        y = np.array([self.labels.index(str(v)) for v in table.column("label").to_pylist()])
        n_eval = int(len(y) * HOLDOUT)
        fit = slice(0, len(y) - n_eval)
        if n_eval >= 2 and len(set(y[fit].tolist())) == len(self.labels):
            p = self._probabilities(self._fit(x[fit], y[fit]), x[-n_eval:])
            prior = np.bincount(y[fit], minlength=len(self.labels)) / len(y[fit])
            line = (
                f"held out the newest {n_eval} rows: log-loss {log_loss(p, y[-n_eval:]):.3f} "
                f"(the label prior's {log_loss(np.tile(prior, (n_eval, 1)), y[-n_eval:]):.3f}), "
                f"accuracy {np.mean(p.argmax(axis=1) == y[-n_eval:]):.3f}"
            )
            if len(self.labels) == 2:
                a = auc(p[:, 1], y[-n_eval:] == 1)
                line += f", AUC {'n/a (one label)' if a is None else f'{a:.3f}'}"
            say(line)
        self.booster = self._fit(x, y)
        retrying("report the training", lambda: self.client.report_trained(self.model_id, epoch))
        self.epoch = epoch
        say(f"trained at epoch {epoch} on {table.num_rows} rows")

    def _fit(self, x: np.ndarray, y: np.ndarray) -> lgb.Booster:
        params: dict[str, Any] = {
            "learning_rate": 0.1,
            "num_leaves": 15,
            "min_data_in_leaf": max(1, min(20, len(y) // 10)),
            "verbose": -1,
        }
        if len(self.labels) > 2:
            params |= {"objective": "multiclass", "num_class": len(self.labels)}
        else:
            params["objective"] = "binary"
        return lgb.train(params, lgb.Dataset(x, y), num_boost_round=50)

    def _probabilities(self, booster: lgb.Booster, x: np.ndarray) -> np.ndarray:
        p = np.asarray(booster.predict(x))
        return np.column_stack([1 - p, p]) if p.ndim == 1 else p

    def serve(self, rows: list[dict[str, Any]]) -> np.ndarray:
        """Class probabilities of ``rows``; a RetrainRequired answer is raised to the caller."""
        feats = retrying(
            "featurize",
            lambda: self.client.featurize(rows, model_id=self.model_id, output="arrow"),
        )
        x = np.column_stack([feats.column(c).to_numpy(zero_copy_only=False) for c in self.columns])
        assert self.booster is not None
        return self._probabilities(self.booster, x)


def model_of(client: Client, name: str) -> tuple[str, bool]:
    """The id of the stream's model ``name``, registered unless it exists: (id, reused)."""
    for m in client.models():
        if m["name"] == name:
            return str(m["id"]), True
    try:
        return str(client.register_model(name)["id"]), False
    except Conflict:  # registered meanwhile by another run
        return next(str(m["id"]) for m in client.models() if m["name"] == name), True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", default=os.environ.get("SELECTIVITY_URL", "http://127.0.0.1:8000"))
    p.add_argument("--key", default=os.environ.get("SELECTIVITY_API_KEY"), help="a model key")
    p.add_argument("--stream", required=True)
    p.add_argument(
        "--model-name",
        "--name",
        dest="name",
        default="lightgbm",
        help="the model's name: reused when the stream has a model of that name, else "
        "registered (default lightgbm)",
    )
    p.add_argument("--model-id", help="a model registered before (instead of --model-name)")
    p.add_argument("--serve", type=Path, help="NDJSON raw feature rows to score")
    p.add_argument("--retrains", type=int, default=0, help="stop after this many (0: never)")
    p.add_argument("--once", action="store_true", help="stop after the first training")
    p.add_argument("--min-rows", type=int, default=50, help="train on at least this many rows")
    p.add_argument(
        "--min-per-label", type=int, default=5, help="and at least this many of every label"
    )
    p.add_argument(
        "--wait-seconds",
        type=float,
        default=0.0,
        help="give up waiting for enough rows after this long (0: wait as long as it takes)",
    )
    p.add_argument("--poll-seconds", type=float, default=5.0, help="between two looks")
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
        if args.model_id:
            model_id, how = args.model_id, "given"
        else:
            model_id, reused = model_of(client, args.name)
            how = (
                f"{args.name!r}, registered before: reused (--model-name NAME for another)"
                if reused
                else f"{args.name!r}, registered"
            )
        say(f"model {model_id} of stream {args.stream} ({how})")
        # events from now on: the backlog's last id first
        last = None
        for event in client.events(follow_seconds=0, reconnect=False):
            last = event.id
        manager = Manager(
            client,
            model_id,
            labels,
            min_rows=args.min_rows,
            min_per_label=args.min_per_label,
            wait_seconds=args.wait_seconds,
            poll_seconds=args.poll_seconds,
        )

        def serve() -> None:
            if not rows:
                return
            p = manager.serve(rows)
            say(f"served {len(rows)} rows at epoch {manager.epoch}")
            for row, probs in list(zip(rows, p, strict=True))[:5]:
                best = int(np.argmax(probs))
                say(f"  {json.dumps(row)}: {labels[best]!r} with probability {probs[best]:.3f}")

        try:
            manager.train()
            try:
                serve()
            except RetrainRequired:
                manager.train()
                serve()
            if args.once:
                return 0
            say("following the stream's events for retrain_required (Ctrl-C to stop)")
            retrains = 0
            for event in client.events(last_event_id=last, follow_seconds=300):
                if event.event != "retrain_required" or model_id not in event.data["models"]:
                    continue
                say(f"retrain required at epoch {event.data['epoch']}")
                manager.train(at_least=int(event.data["epoch"]))
                serve()
                retrains += 1
                if args.retrains and retrains >= args.retrains:
                    break
        except KeyboardInterrupt:
            say("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
