"""Text and free JSON the service can store: checks shared by every input field.

A lone UTF-16 surrogate (``"\\ud800"``) is valid JSON but cannot be encoded as UTF-8, and a
NUL character cannot be stored in a Postgres text column; both are refused where they
arrive, naming the field, instead of failing later in the database. Free JSON (``metadata``,
a tool turn's ``arguments`` and ``response``) is refused past a documented nesting depth.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator

#: Deepest nesting of free JSON (``metadata``, tool ``arguments``/``response``) accepted.
MAX_JSON_DEPTH = 32


def text_problem(value: str) -> str | None:
    """Why ``value`` cannot be stored, or None."""
    if "\x00" in value:
        return f"must not contain NUL characters (\\u0000; first at position {value.index(chr(0))})"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            return f"contains a lone UTF-16 surrogate at position {exc.start}; text must be valid Unicode"
    return None


def storable(value: str) -> str:
    problem = text_problem(value)
    if problem is not None:
        raise ValueError(problem)
    return value


#: A string the service can store (no NUL, no lone surrogate).
Text = Annotated[str, AfterValidator(storable)]


def json_problem(value: Any, max_depth: int = MAX_JSON_DEPTH) -> tuple[str, str] | None:
    """(relative path, why) of the first part of a JSON value that cannot be stored, or None."""
    stack: list[tuple[Any, str, int]] = [(value, "", 1)]
    while stack:
        item, path, depth = stack.pop()
        if isinstance(item, str):
            problem = text_problem(item)
            if problem is not None:
                return path, problem
        elif isinstance(item, (dict, list)):
            if depth > max_depth:
                return path, f"nests deeper than {max_depth} levels"
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            for key, child in pairs:
                if isinstance(key, str):
                    problem = text_problem(key)
                    if problem is not None:
                        return path, f"a key {problem}"
                child_path = f"{path}[{key}]" if isinstance(key, int) else f"{path}.{key}"
                stack.append((child, child_path, depth + 1))
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) >= 2**63:
            return path, "holds an integer too large for the database (at most 19 digits)"
    return None


def _storable_json(value: Any) -> Any:
    found = json_problem(value)
    if found is not None:
        path, problem = found
        raise ValueError(f"{path.lstrip('.')}: {problem}" if path else problem)
    return value


#: Free JSON the service can store (see :func:`json_problem`).
FreeJSON = Annotated[Any, AfterValidator(_storable_json)]
