"""FastAPI only: the app, its routes, auth, tenants and rate-limit headers. Imports `runtime/` and below; the only home of FastAPI and Starlette."""
