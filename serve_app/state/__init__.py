"""What outlives one request: the store interface (`store`), its backends (`memory`,
`redis`; the embedded store deployment lives in `deployments/store.py`) and the Responses
API's stored state on top (`responses`). Never imports FastAPI or Ray."""

from .memory import MemoryStore
from .responses import ResponseStore, StoredTurn
from .store import BoundedStore, Store, StoreUnavailable

__all__ = ["BoundedStore", "MemoryStore", "ResponseStore", "Store", "StoreUnavailable", "StoredTurn"]
