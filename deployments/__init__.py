"""Every Ray Serve deployment and the builder (`builder.build_app`): thin shells over `serve_app`, which may import anything of it."""

import logging


def use_serve_logging() -> None:
    """Send the app's own logs (`serve_app.*`, `deployments.*`: each module logs under its
    `__name__`) through the replica's Serve log handlers, so they land in the replica's log
    file and `serve run`'s output."""
    serve_logger = logging.getLogger("ray.serve")
    for name in ("serve_app", "deployments"):
        app_logger = logging.getLogger(name)
        app_logger.setLevel(logging.INFO)
        app_logger.handlers = list(serve_logger.handlers)
        app_logger.propagate = False
