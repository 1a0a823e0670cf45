"""The HTTP routes, one router per resource; `create_app` includes them. Each reads what it
needs (served models, the store, limits) from `request.app.state`, set by `create_app`."""
