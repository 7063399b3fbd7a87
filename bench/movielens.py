"""MovieLens 100K as Selectivity observations (shared by the accuracy benchmark and the
end-to-end tests).

The data set is read in place from ``shared/data/movielens-100k`` beside the repository (never
copied). Features: ``user_id``, ``movie_id``, ``genres`` (the movie's genre names joined by
``|``), the user's ``age`` (numeric, bucketed), ``gender``, ``occupation`` and ``zip3`` (the
first three characters of the zip code); label ``"1"`` when ``rating >= 4`` else ``"0"``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from bench.report import DATA as SHARED_DATA

DATA = SHARED_DATA / "movielens-100k"
AGE_BUCKETS = (18, 25, 35, 45, 56)
FEATURES = ("user_id", "movie_id", "genres", "age", "gender", "occupation", "zip3")
CATEGORICAL = tuple(f for f in FEATURES if f != "age")


def available() -> bool:
    return all((DATA / f"{n}.parquet").is_file() for n in ("ratings", "users", "items"))


# what determines what: a user's attributes are the user's, a movie's genres the movie's (the
# stream's public "of" declarations: selection offers no group a table already determines)
OF = {
    "age": "user_id",
    "gender": "user_id",
    "occupation": "user_id",
    "zip3": "user_id",
    "genres": "movie_id",
}


def stream_features() -> list[dict[str, Any]]:
    return [
        (
            {"name": f, "kind": "numeric", "buckets": list(AGE_BUCKETS)}
            if f == "age"
            else {"name": f, "kind": "categorical"}
        )
        | ({"of": OF[f]} if f in OF else {})
        for f in FEATURES
    ]


def genre_columns(items: pd.DataFrame) -> list[str]:
    """The 19 genre flags: the 0/1 integer columns of items (found by content, not by name)."""
    return [
        c
        for c in items.columns
        if c != "movie_id"
        and pd.api.types.is_integer_dtype(items[c])
        and set(items[c].unique()) <= {0, 1}
    ]


def load() -> pd.DataFrame:
    """Every rating with its features and label, in time order (stable for equal timestamps):
    columns ``id``, ``event_time`` (ISO 8601), the FEATURES, ``label``."""
    ratings = pd.read_parquet(DATA / "ratings.parquet")
    users = pd.read_parquet(DATA / "users.parquet")
    items = pd.read_parquet(DATA / "items.parquet")
    genres = genre_columns(items)
    assert len(genres) == 19, genres
    flags = items[genres].to_numpy(dtype=bool)
    names = np.array(genres, dtype=object)
    items = pd.DataFrame(
        {"movie_id": items["movie_id"], "genres": ["|".join(names[row]) or "none" for row in flags]}
    )
    users = pd.DataFrame(
        {
            "user_id": users["user_id"],
            "age": users["age"],
            "gender": users["gender"].astype(str),
            "occupation": users["occupation"].astype(str),
            "zip3": users["zip_code"].astype(str).str[:3],
        }
    )
    df = ratings.merge(users, on="user_id", how="left", validate="many_to_one").merge(
        items, on="movie_id", how="left", validate="many_to_one"
    )
    assert len(df) == len(ratings) and not df[list(FEATURES)].isna().any().any()
    df = df.sort_values(["timestamp", "user_id", "movie_id"], kind="stable").reset_index(drop=True)
    out = pd.DataFrame(
        {
            "id": [f"u{u}-m{m}" for u, m in zip(df["user_id"], df["movie_id"], strict=True)],
            "event_time": pd.to_datetime(df["timestamp"], unit="s", utc=True).dt.strftime(
                "%Y-%m-%dT%H:%M:%SZ"
            ),
            "user_id": df["user_id"].astype(str),
            "movie_id": df["movie_id"].astype(str),
            "genres": df["genres"],
            "age": df["age"].astype(int),
            "gender": df["gender"],
            "occupation": df["occupation"],
            "zip3": df["zip3"],
            "label": np.where(df["rating"] >= 4, "1", "0"),
        }
    )
    return out


def labels01(df: pd.DataFrame) -> np.ndarray:
    """The label as float64 0/1 (``"1"`` is ``rating >= 4``)."""
    return (df["label"] == "1").to_numpy(dtype=np.float64)


def raw_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The raw features for a model with native categorical features (the accuracy baseline):
    every categorical feature as a pandas ``category`` whose categories are its values over
    ``df`` (pass the whole data set and slice afterwards, so that codes agree between a train
    and a test slice), ``age`` as a number."""
    out = pd.DataFrame(index=df.index)
    for f in FEATURES:
        out[f] = df[f].astype(float) if f == "age" else df[f].astype("category")
    return out


def feature_rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows for ``featurize`` (features only), as plain Python values."""
    return [
        dict(zip(FEATURES, vals, strict=True))
        for vals in zip(*(df[f].tolist() for f in FEATURES), strict=True)
    ]


def observations(df: pd.DataFrame) -> list[dict[str, Any]]:
    """Observations for ``POST /observations``."""
    return [
        {"id": i, "event_time": t, "label": y, "features": f}
        for i, t, y, f in zip(
            df["id"].tolist(),
            df["event_time"].tolist(),
            df["label"].tolist(),
            feature_rows(df),
            strict=True,
        )
    ]
