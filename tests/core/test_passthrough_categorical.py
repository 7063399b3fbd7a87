"""Raw categorical values as model features (``passthrough`` on a categorical feature): the
configuration (never the user key), the columns, and the same string for a value at serving
time (``Featurizer.values``, featurize) as in the train set (``Featurizer.value_arrays`` over
the chunk parsers' codes and the counted form's)."""

from __future__ import annotations

import numpy as np
import orjson
import pyarrow as pa
import pytest
from pydantic import ValidationError

from service.core.features import hotrows
from service.core.features.columns import FeatureSpec, encode_column
from service.core.features.featurizer import Featurizer, value_array
from service.core.features.runtime import StreamRuntime, TableRef
from service.core.streamconfig import StreamCreate
from service.core.tables.aggregate import Aggregate

SEED = bytes(range(32))


def body(**over: object) -> dict[str, object]:
    out: dict[str, object] = {
        "name": "s",
        "features": [
            {"name": "user", "kind": "categorical"},
            {"name": "item", "kind": "categorical", "passthrough": True},
            {"name": "city", "kind": "categorical", "passthrough": True},
            {"name": "age", "kind": "numeric", "buckets": [18, 30], "passthrough": True},
        ],
        "labels": ["0", "1"],
        "privacy": {"mechanism": "none"},
        "sketch": {"width": 64, "depth": 3},
    }
    out.update(over)
    return out


def runtime() -> StreamRuntime:
    cfg = StreamCreate.model_validate(body())
    tables = tuple(TableRef(i, f.name, (f.name,), 1) for i, f in enumerate(cfg.features, 1)) + (
        TableRef(9, "user+item", ("user", "item"), 1),
    )
    return StreamRuntime(id=1, name="s", config=cfg, hash_seed=SEED, tables=tables)


def featurizer() -> Featurizer:
    rt = runtime()
    rng = np.random.default_rng(0)
    layout = [(t.id, rt.spec.cells) for t in rt.tables]
    cells = rng.integers(0, 50, rt.spec.cells * len(layout) + 2).astype(np.int64)
    return Featurizer.build(rt, Aggregate(3, 1, 2, [1, 2], layout, cells))


def test_a_categorical_feature_may_be_passed_through() -> None:
    cfg = StreamCreate.model_validate(body())
    assert [f.passthrough for f in cfg.features] == [False, True, True, True]
    rt = runtime()
    assert rt.passthrough == ("age",)  # float columns
    assert rt.passthrough_categorical == ("item", "city")  # string columns


@pytest.mark.parametrize("kind", ["categorical", "numeric"])
def test_the_user_key_is_never_passed_through(kind: str) -> None:
    feature: dict[str, object] = {"name": "uid", "kind": kind, "passthrough": True}
    if kind == "numeric":
        feature["buckets"] = [0]
    with pytest.raises(ValidationError) as err:
        StreamCreate.model_validate(
            body(
                features=[feature, {"name": "item", "kind": "categorical"}],
                privacy={"mechanism": "none", "user_key": "uid"},
            )
        )
    assert "'uid' is privacy.user_key, never passed through" in str(err.value)
    # without passthrough the same stream is fine
    feature["passthrough"] = False
    StreamCreate.model_validate(
        body(
            features=[feature, {"name": "item", "kind": "categorical"}],
            privacy={"mechanism": "none", "user_key": "uid"},
        )
    )


def test_columns_floats_then_strings() -> None:
    fz = featurizer()
    assert fz.value_columns == ["item:value", "city:value"]
    assert fz.columns[-1] == "age:value" and "item:value" not in fz.columns
    assert fz.output_columns == fz.columns + ["item:value", "city:value"]
    assert "city" in fz.encoded_features and "item" in fz.encoded_features


ROWS: list[dict[str, object]] = [
    {"user": "u1", "item": 196, "city": "Zürich", "age": 20},
    {"user": "u2", "item": "196", "city": None, "age": None},
    {"user": "u3", "item": True, "age": 40},
    {"user": "u1", "item": 2.0, "city": "Zürich"},
    {"user": "u4", "item": 2.5, "city": "a b"},
    {"user": "u5", "item": False, "city": "Bern"},
]
WANT_ITEM = ["196", "196", "true", "2", "2.5", "false"]
WANT_CITY = ["Zürich", None, None, "Zürich", "a b", "Bern"]


def test_values_at_serving_time() -> None:
    fz = featurizer()
    assert fz.values(ROWS) == [WANT_ITEM, WANT_CITY]
    assert fz.values(ROWS[:1]) == [["196"], ["Zürich"]]
    # the float matrix is unchanged by the string columns
    assert fz.transform(ROWS).shape == (len(ROWS), len(fz.columns))


def test_value_array_strings_and_nulls() -> None:
    spec = FeatureSpec("city", "categorical")
    arr = value_array(encode_column([r.get("city") for r in ROWS], spec))
    assert arr.type == pa.string()
    assert arr.to_pylist() == WANT_CITY
    assert arr.null_count == 2
    only_missing = value_array(encode_column([None, None], spec))
    assert only_missing.to_pylist() == [None, None]


def _chunk(rows: list[dict[str, object]]) -> bytes:
    return b",".join(
        orjson.dumps({"id": f"i{k}", "f": r, "y": "1", "t": "2026-01-01T00:00:00Z"})
        for k, r in enumerate(rows)
    )


@pytest.mark.parametrize("parser", ["scan", "rows"])
def test_train_set_values_are_the_serving_values(parser: str) -> None:
    """The train set's string columns (from the parsed hot chunk, and from the counting job's
    Arrow form of it) hold exactly what featurize answers for the same rows."""
    fz = featurizer()
    specs = {f.name: f for f in fz.rt.features}
    encode = [specs[f] for f in fz.encoded_features]
    rows = [{k: v for k, v in r.items() if v is not None} for r in ROWS]  # as ingest stores
    parse = hotrows.parse_chunk if parser == "scan" else hotrows.parse_rows
    chunk = parse(_chunk(rows), encode=encode, passthrough=fz.rt.passthrough)
    got = [a.to_pylist() for a in fz.value_arrays(chunk.encoded)]
    assert got == fz.values(rows) == [WANT_ITEM, WANT_CITY]
    blob = hotrows.to_ipc(chunk, after=b"", last=b"1-0", passthrough=fz.rt.passthrough)
    counted = hotrows.from_ipc(blob, encode=fz.encoded_features, passthrough=fz.rt.passthrough)
    assert [a.to_pylist() for a in fz.value_arrays(counted.chunk.encoded)] == got


def test_many_rows_vectorised_the_same() -> None:
    fz = featurizer()
    rng = np.random.default_rng(1)
    pool: list[object] = ["a", "b", "196", 196, True, 1, None, "", "é", 2.5, -3]
    rows = [{"item": pool[int(rng.integers(0, len(pool)))]} for _ in range(500)]
    vals = fz.values(rows)[0]
    assert vals == [fz.values([r])[0][0] for r in rows]
    specs = {f.name: f for f in fz.rt.features}
    encoded, _ = fz.encode_columns({"item": [r.get("item") for r in rows]}, len(rows))
    assert fz.value_arrays(encoded)[0].to_pylist() == vals
    assert specs["item"].kind == "categorical"
