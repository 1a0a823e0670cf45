"""Every Ray Serve deployment and the builder (`builder.build_app`): thin shells over `serve_app`, which may import anything of it."""

import logging


def use_serve_logging() -> None:
    """Send the app's own logs (`serve_app.*`) through the replica's Serve log handlers,
    so they land in the replica's log file and `serve run`'s output."""
    serve_logger = logging.getLogger("ray.serve")
    app_logger = logging.getLogger("responses_serve")
    app_logger.setLevel(logging.INFO)
    app_logger.handlers = list(serve_logger.handlers)
    app_logger.propagate = False
