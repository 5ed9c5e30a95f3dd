"""`unmask serve`: an OpenAI-compatible server over the registry's aliases, with batching that keeps answers exact.

`create_app(ServeSettings(...))` builds the FastAPI app (serving/app.py); the pool (serving/pool.py)
resolves served names through the registry, checks weights and follows alias moves; the batcher
(serving/batching.py) groups concurrent requests only when that cannot change an answer.
"""

from serving.access import ApiKeyError, load_analysis_keys, load_api_keys
from serving.app import ServeSettings, create_app
from serving.decoding import Limits
from serving.pool import PoolSettings, ServeError, WeightsMismatch

__all__ = [
    "ApiKeyError",
    "Limits",
    "load_analysis_keys",
    "load_api_keys",
    "PoolSettings",
    "ServeError",
    "ServeSettings",
    "WeightsMismatch",
    "create_app",
]
