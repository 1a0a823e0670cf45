"""Ray Serve deployments: thin shells over `serve_app`."""
