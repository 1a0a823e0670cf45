"""What outlives one request: the store interface (`store`), its backends (`memory`,
`redis`; the embedded store deployment lives in `responses_serve/serve/store.py`) and the Responses
API's stored state on top (`responses`). Never imports FastAPI or Ray."""

from responses_serve.state.memory import MemoryStore
from responses_serve.state.responses import ResponseStore, StoredTurn
from responses_serve.state.store import BoundedStore, Store, StoreUnavailable

__all__ = ["BoundedStore", "MemoryStore", "ResponseStore", "Store", "StoreUnavailable", "StoredTurn"]
