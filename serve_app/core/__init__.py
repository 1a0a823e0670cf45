"""The pure core: tokens in, the response stream, events out. Imports only `api/`."""
