"""``SelectivityFeaturizer``: the service's count features as a scikit-learn transformer, so
they drop into a ``Pipeline`` the way ``TargetEncoder`` does (needs the ``sklearn`` extra)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from selectivity_client import _core
from selectivity_client.client import Client
from selectivity_client.errors import RetrainRequired


class SelectivityFeaturizer(TransformerMixin, BaseEstimator):  # type: ignore[misc]
    """Raw feature values in, the stream's count features out (float64, NaN where the service
    has none).

    ``fit(X)`` featurizes ``X`` once to record the epoch (``epoch_``) and the feature columns
    (``feature_names_out_``, or ``columns`` when given); with ``model_id`` and ``report=True``
    it also reports the model as trained at that epoch. ``transform(X)`` featurizes ``X`` and
    gives the fitted columns in the fitted order. It raises :class:`RetrainRequired` when the
    stream's epoch moved past the grace period: with ``model_id`` the service decides (409
    once the model's ``retrain_grace_seconds`` are over); without, when the epoch is more
    than ``max_epoch_lag`` epochs past ``epoch_`` (None: never), or when a fitted column is
    gone. Takes the URL and key, not a client, so that ``clone`` and pickling work.
    """

    def __init__(
        self,
        url: str,
        api_key: str,
        stream: str,
        *,
        model_id: str | None = None,
        columns: list[str] | None = None,
        max_epoch_lag: int | None = None,
        report: bool = True,
        batch_size: int = _core.DEFAULT_BATCH,
    ) -> None:
        self.url = url
        self.api_key = api_key
        self.stream = stream
        self.model_id = model_id
        self.columns = columns
        self.max_epoch_lag = max_epoch_lag
        self.report = report
        self.batch_size = batch_size

    def __repr__(self, N_CHAR_MAX: int = 700) -> str:  # noqa: N803 - sklearn's signature
        return f"SelectivityFeaturizer(url={self.url!r}, stream={self.stream!r}, api_key=***)"

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_client", None)
        return state

    def _http(self) -> Client:
        client = self.__dict__.get("_client")
        if client is None:
            client = Client(self.url, self.api_key, stream=self.stream, batch_size=self.batch_size)
            self._client = client
        return client

    def _featurize(self, X: Any, *, serving: bool) -> pa.Table:  # noqa: N803 - sklearn's
        """Serving calls name the model (the service refuses a stale one); fitting is the
        training, so it does not."""
        model_id = self.model_id if serving else None
        table: pa.Table = self._http().featurize(X, model_id=model_id, output="arrow")
        return table

    def fit(self, X: Any, y: Any = None) -> SelectivityFeaturizer:  # noqa: N803
        table = self._featurize(X, serving=False)
        names = list(self.columns) if self.columns is not None else table.column_names
        missing = [c for c in names if c not in table.column_names]
        if missing:
            raise ValueError(f"columns: not served by stream {self.stream!r}: {missing}")
        self.epoch_ = _core.epoch_of(table)
        self.feature_names_out_ = np.asarray(names, dtype=object)
        self.n_features_out_ = len(names)
        if self.model_id and self.report and self.epoch_ is not None:
            self._http().report_trained(self.model_id, self.epoch_)
        return self

    def transform(self, X: Any) -> np.ndarray:  # noqa: N803
        check_is_fitted(self, "epoch_")
        table = self._featurize(X, serving=True)
        epoch = _core.epoch_of(table)
        if (
            self.max_epoch_lag is not None
            and epoch is not None
            and self.epoch_ is not None
            and epoch - self.epoch_ > self.max_epoch_lag
        ):
            raise RetrainRequired(
                f"fitted at epoch {self.epoch_}, the stream is at epoch {epoch} "
                f"(max_epoch_lag={self.max_epoch_lag}): refit",
                status=0,
            )
        names = list(self.feature_names_out_)
        gone = [c for c in names if c not in table.column_names]
        if gone:
            raise RetrainRequired(
                f"columns fitted at epoch {self.epoch_} are no longer served: {gone}", status=0
            )
        return np.column_stack(
            [table.column(c).to_numpy(zero_copy_only=False) for c in names]
        ).astype(np.float64, copy=False)

    def get_feature_names_out(self, input_features: Any = None) -> np.ndarray:
        check_is_fitted(self, "feature_names_out_")
        return np.asarray(self.feature_names_out_, dtype=object)
