"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

import math
from typing import Any

from pydantic import ValidationError


class APIError(Exception):
    """An error the client sees with an HTTP status and an OpenAI-shaped body."""

    def __init__(
        self,
        message: str,
        *,
        status_code: int = 400,
        param: str | None = None,
        code: str | None = None,
        type: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.param = param
        self.code = code
        self.type = type
        self.headers: dict[str, str] = {}  # sent with the error (a 429's Retry-After)

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def invalid_request(message: str, *, param: str | None = None, code: str | None = "invalid_value") -> APIError:
    return APIError(message, status_code=400, param=param, code=code)


def model_not_found(model: str) -> APIError:
    return APIError(
        f"The model '{model}' does not exist or you do not have access to it.",
        status_code=404,
        param="model",
        code="model_not_found",
    )


def response_not_found(response_id: str) -> APIError:
    return APIError(f"No response found with id '{response_id}'.", status_code=404, param="response_id", code="not_found")


def item_not_found(item_id: str, *, index: int, stored: bool) -> APIError:
    """An `item_reference` to an item the caller has no stored response with (OpenAI's 404)."""
    hint = (
        ""
        if stored
        else " Items are not persisted when `store` is set to false. Try again with `store` set to true, or remove this item from your input."
    )
    return APIError(f"Item with id '{item_id}' not found.{hint}", status_code=404, param=f"input[{index}]", code="not_found")


def model_unavailable(model: str, state: str) -> APIError:
    error = APIError(
        f"The model '{model}' is unavailable: no engine replica is running ({state}). Try again later.",
        status_code=503,
        param="model",
        code="model_unavailable",
        type="server_error",
    )
    return retry_after(error, 5)


def server_error(message: str, *, status_code: int = 500, code: str = "server_error") -> APIError:
    error = APIError(message, status_code=status_code, code=code, type="server_error")
    return retry_after(error, 1) if status_code == 503 else error


def server_full(message: str, *, code: str, param: str | None = None, retry_after_s: float = 1) -> APIError:
    """A 503: this server (not the client) is at one of its bounds; retry later, elsewhere."""
    return retry_after(APIError(message, status_code=503, param=param, code=code, type="server_error"), retry_after_s)


def retry_after(error: APIError, seconds: float) -> APIError:
    """`error` sent with `Retry-After` (whole seconds, as HTTP has it) and `retry-after-ms`,
    which the `openai` SDK's retry reads first."""
    error.headers = {**error.headers, "retry-after": str(max(1, math.ceil(seconds))), "retry-after-ms": str(math.ceil(seconds * 1000))}
    return error


def _param_path(loc: tuple[Any, ...]) -> str:
    """('input', 0, 'item:message', 'role') -> 'input[0].role'.

    Pydantic puts the union member it tried into `loc`: our tags (`item:message`), type
    labels (`str`, `list[...]`, `function-after[...]`) and model names (`HostedTool`). The
    client never wrote those; API field names are lower-case identifiers.
    """
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        elif ":" in part or "[" in part or part[:1].isupper() or part in _TYPE_LABELS:
            continue
        else:
            path += f".{part}" if path else part
    return path


_TYPE_LABELS = {"str", "constrained-str", "int", "float", "bool", "dict", "list", "none"}


def from_validation_error(exc: ValidationError, at: tuple[str | int, ...] = ()) -> APIError:
    """Turn pydantic's errors into the message the OpenAI API would give. `at`: where the
    validated value sits in the request (a part validated alone); a leading int of an
    error's place is added to its last element (a slice of a list validated alone).

    For a union (`input` is a string or a list of items) pydantic reports one error per
    member; the deepest one is the one about what the client actually wrote.
    """
    error = max(exc.errors(include_url=False), key=lambda e: len(e["loc"]))
    loc = tuple(error["loc"])
    if at and loc and isinstance(at[-1], int) and isinstance(loc[0], int):
        loc = (*at[:-1], at[-1] + loc[0], *loc[1:])
    elif at:
        loc = (*at, *loc)
    param = _param_path(loc) or None
    kind = error["type"]
    where = f"'{param}'" if param else "request body"
    if kind == "missing":
        return invalid_request(f"Missing required parameter: {where}.", param=param, code="missing_required_parameter")
    if kind == "extra_forbidden":
        return invalid_request(f"Unknown parameter: {where}.", param=param, code="unknown_parameter")
    code = "invalid_type" if kind.endswith("_type") or kind in {"model_type", "dict_type", "list_type"} else "invalid_value"
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    return invalid_request(f"Invalid value for {where}: {message}", param=param, code=code)
