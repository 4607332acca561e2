"""Input errors that name the offending field by its path, e.g. ``rollouts[2].turns[4].id``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: The turn types, in the order the documents list them.
TURN_TYPES = ("search", "visit", "answer", "tool")
#: Union tags pydantic inserts into error locations of a discriminated union; they are
#: not part of the document's shape, so paths skip them.
TURN_TAGS = frozenset(TURN_TYPES)
#: Pydantic's error types for a value that should have been an object (a model).
_NOT_AN_OBJECT = frozenset({"model_type", "model_attributes_type", "dict_type"})


@dataclass(frozen=True)
class FieldError:
    """One problem with the input: the field's path and what is wrong with it."""

    field: str
    message: str

    def __str__(self) -> str:
        return f"{self.field}: {self.message}" if self.field else self.message


class InvalidInput(ValueError):
    """Raised with every :class:`FieldError` found; nothing has been stored."""

    def __init__(self, errors: Sequence[FieldError]):
        self.errors = list(errors)
        super().__init__("; ".join(str(e) for e in self.errors))


def format_path(loc: Iterable[Any]) -> str:
    """Render a pydantic location tuple as ``a.b[3].c``, dropping union tags."""
    out = ""
    previous: Any = None
    before_previous: Any = None
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif (part in TURN_TAGS and isinstance(previous, int) and before_previous == "turns") or (
            isinstance(part, str) and part.startswith("function-")
        ):
            pass
        else:
            out += f".{part}" if out else str(part)
        before_previous, previous = previous, part
    return out


def errors_from_pydantic(errors: Iterable[Mapping[str, Any]], strip: int = 0) -> list[FieldError]:
    """Convert pydantic's ``errors()`` into :class:`FieldError`s.

    Semantic errors raised by our own validators carry their paths in ``ctx.semantic``
    (pydantic cannot point a model-level validator at a nested field), so those win.
    """
    result = []
    for err in errors:
        ctx = err.get("ctx") or {}
        loc = tuple(err.get("loc", ()))[strip:]
        prefix = format_path(loc)
        if "semantic" in ctx:
            for field, detail in ctx["semantic"]:
                path = ".".join(p for p in (prefix, str(field)) if p).replace(".[", "[")
                result.append(FieldError(path, str(detail)))
            continue
        tagged = _union_tag_error(err, prefix)
        if tagged is not None:
            result.append(tagged)
            continue
        message = str(err.get("msg", "invalid value"))
        message = message.removeprefix("Value error, ")
        if err.get("type") in _NOT_AN_OBJECT:
            message = f"must be a JSON object (got {json_kind(err.get('input'))})"
        elif err.get("type") == "missing":
            message = "field required"
        elif err.get("type") == "extra_forbidden":
            message = "unknown field"
        elif "input" in err and err.get("type") not in ("missing", "value_error"):
            # Our own validators already quote the value in their message.
            message = f"{message} (got {_short(err['input'])})"
        result.append(FieldError(prefix, message))
    return result


def _union_tag_error(err: Mapping[str, Any], prefix: str) -> FieldError | None:
    """A turn whose ``type`` is missing or unknown, named on its ``type`` field.

    Pydantic reports these on the turn itself, with the union's internals in the message
    ("Input tag 'browse' found using 'type' does not match any of the expected tags").
    """
    kind = err.get("type")
    if kind not in ("union_tag_invalid", "union_tag_not_found"):
        return None
    ctx = err.get("ctx") or {}
    tag_field = str(ctx.get("discriminator", "type")).strip("'\"")
    field = f"{prefix}.{tag_field}" if prefix else tag_field
    expected = ", ".join(TURN_TYPES)
    if kind == "union_tag_not_found":
        return FieldError(field, f"field required: one of {expected}")
    value = err.get("input")
    got = value.get(tag_field, ctx.get("tag")) if isinstance(value, Mapping) else ctx.get("tag")
    return FieldError(field, f"must be one of {expected} (got {_short(got)})")


def json_kind(value: Any) -> str:
    """What a decoded JSON value is, in JSON's words (``null``, ``an array``, ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"
    if isinstance(value, str):
        return f"the string {_short(value, 40)}"
    if isinstance(value, (list, tuple)):
        return "an array"
    return type(value).__name__


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
