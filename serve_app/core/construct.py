"""SDK models built without validation, for values this package made itself (hot paths)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from pydantic import BaseModel

Model = TypeVar("Model", bound=BaseModel)


def trusted_constructor(cls: type[Model]) -> Callable[[dict[str, Any]], Model]:
    """`cls.model_construct(**values)` for values of every field, with the right types, built
    by the caller: no validation, as pydantic's `model_construct` does it, at a fraction of
    its cost (it resolves aliases and defaults field by field, and openai's override of it
    converts nested dicts) and half the cost of validating."""
    fields_set = set(cls.model_fields)  # shared: every field is in it, so setting one adds nothing
    extra_allowed = cls.model_config.get("extra") == "allow"
    setattr_ = object.__setattr__

    def construct(values: dict[str, Any]) -> Model:
        model = cls.__new__(cls)
        setattr_(model, "__dict__", values)
        setattr_(model, "__pydantic_fields_set__", fields_set)
        setattr_(model, "__pydantic_extra__", {} if extra_allowed else None)
        setattr_(model, "__pydantic_private__", None)
        return model

    return construct
