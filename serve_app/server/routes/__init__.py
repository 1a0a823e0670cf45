"""The HTTP routes, one router per resource; `create_app` includes them. Each reads what it
needs (served models, tenants' state, settings) from the app's `AppContext`, made by
`create_app` (`server.context.app_context(request)`, `tenant_state(request)`)."""
