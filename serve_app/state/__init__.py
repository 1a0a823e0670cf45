"""State, what outlives one request (imports `families/` and below; the only home of Redis): the store interface (`store`), its backends (`memory`,
`redis`; the embedded store deployment lives in `deployments/store.py`) and the Responses
API's stored state on top (`responses`). Never imports FastAPI or Ray."""

from serve_app.state.memory import MemoryStore
from serve_app.state.responses import ResponseStore, StoredTurn
from serve_app.state.store import BoundedStore, Store, StoreUnavailable

__all__ = ["BoundedStore", "MemoryStore", "ResponseStore", "Store", "StoreUnavailable", "StoredTurn"]
