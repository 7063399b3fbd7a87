"""Python client of the Selectivity service for model managers (and producers).

    from selectivity_client import Client
    with Client("http://127.0.0.1:8000", api_key, stream="clicks") as sel:
        table = sel.train_set()                  # pyarrow.Table, epoch_of(table)
        features = sel.featurize(rows)           # DataFrame (pyarrow.Table without pandas)

``AsyncClient`` has the same methods as coroutines; ``selectivity_client.sklearn``'s
``SelectivityFeaturizer`` is a scikit-learn transformer (the ``sklearn`` extra). Errors are
typed, after the service's error kinds (``selectivity_client.errors``).
"""

from selectivity_client._core import Event, IngestResult, epoch_of
from selectivity_client.aio import AsyncClient
from selectivity_client.client import Client
from selectivity_client.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    NotFound,
    PayloadTooLarge,
    RetrainRequired,
    SelectivityError,
    Unauthorized,
    Unavailable,
    UnsupportedMediaType,
    ValidationError,
)

__all__ = [
    "AsyncClient",
    "BadRequest",
    "Client",
    "Conflict",
    "Event",
    "Forbidden",
    "IngestResult",
    "NotFound",
    "PayloadTooLarge",
    "RetrainRequired",
    "SelectivityError",
    "Unauthorized",
    "Unavailable",
    "UnsupportedMediaType",
    "ValidationError",
    "epoch_of",
]
__version__ = "0.1.0"
