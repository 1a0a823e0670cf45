"""The pure core: tokens in, the response stream, events out (imports only `api/`)."""
