"""What every config section shares: the strict base model and how errors name fields."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError


class ConfigError(ValueError):
    """Invalid application args: each problem as (the path of its field, what is wrong)."""

    def __init__(self, problems: list[tuple[str, str]], heading: str = "invalid responses-serve application args") -> None:
        self.problems = problems
        self.heading = heading
        super().__init__(f"{heading}:\n" + "\n".join(f"{path}: {message}" if path else message for path, message in problems))

    def under(self, prefix: str) -> ConfigError:
        """The same problems, their paths inside `prefix` (e.g. `applications[0].args`)."""
        return ConfigError([(f"{prefix}.{path}" if path else prefix, message) for path, message in self.problems], self.heading)


def config_problems(error: ValidationError, data: Any) -> list[tuple[str, str]]:
    """pydantic's errors as (field path, message), the path as a user writes it: `models[0].backend.model`.

    pydantic's locations also name union members (`vllm`, `int`, `literal['auto']`), which are
    no field of the input: a step is kept when it is a key or an index of the input there, or
    the last step (a missing or extra field). Input values are never echoed (a URL may hold a
    password), only numbers.
    """
    problems: dict[str, list[str]] = {}
    for detail in error.errors():
        path, node = "", data
        location = detail["loc"]
        for index, step in enumerate(location):
            if isinstance(node, list) and isinstance(step, int) and 0 <= step < len(node):
                path, node = f"{path}[{step}]", node[step]
            elif isinstance(node, dict) and (step in node or index == len(location) - 1):
                path, node = f"{path}.{step}" if path else str(step), node.get(step)
        message = detail["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        value = detail.get("input")
        if isinstance(value, int | float) and not isinstance(value, bool) and detail["type"] not in ("missing", "extra_forbidden"):
            message += f" (got {value})"
        if message not in problems.setdefault(path, []):
            problems[path].append(message)
    return [(path, "; or ".join(messages)) for path, messages in problems.items()]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")
