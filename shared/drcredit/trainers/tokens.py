"""Per-turn advantages onto per-token advantages (docs/method.md, "Advantages", last paragraph).

The service scores turns; a GRPO trainer's loss is over tokens. Every token the policy
generated in a turn takes that turn's advantage, and tool-observation tokens (mask 0)
take 0 because the trainer masks them out of the loss anyway: a non-zero value there
would only hide a span mistake. Spans are checked strictly for the same reason: a span
that is off by one turn silently trains on the wrong sign.

numpy is required; torch is optional and imported only by
:func:`broadcast_advantages_torch`, so this module imports in torch-free processes.
"""

from __future__ import annotations

import importlib
import math
import operator
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any, SupportsIndex

import numpy as np
import numpy.typing as npt

Span = tuple[int, int]
#: Span bounds may be any integers, numpy's included (not floats, not bools).
SpanLike = tuple[SupportsIndex, SupportsIndex]
FloatArray = npt.NDArray[np.float32]


def broadcast_advantages(
    turn_advantages: Sequence[float],
    turn_spans: Sequence[SpanLike],
    response_mask: npt.ArrayLike,
    *,
    length: int | None = None,
    allow_empty_spans: bool = False,
) -> FloatArray:
    """Return the float32 per-token advantages of one rollout's response.

    ``turn_spans[t] = (start, end)`` (half-open) locates turn ``t`` in the response
    tokens; spans must be in turn order and must not overlap, and gaps between them
    (for example tool observations) are allowed. Policy tokens (mask 1) inside span
    ``t`` get ``turn_advantages[t]``; everything else is 0. A span whose mask is 0
    throughout is an error unless ``allow_empty_spans``: it nearly always means the spans
    and the mask disagree, and the turn's advantage would be lost without a trace.
    ``length``, when given, is the expected number of response tokens.
    """
    mask = _mask_1d(response_mask)
    n = mask.shape[0]
    if length is not None and n != length:
        raise ValueError(f"response mask has {n} tokens but length={length}")
    if len(turn_spans) != len(turn_advantages):
        raise ValueError(
            f"{len(turn_spans)} spans for {len(turn_advantages)} turn advantages: exactly one span per turn is needed"
        )
    advantages = _advantages(turn_advantages)
    spans = _spans(turn_spans, n)
    out = np.zeros(n, dtype=np.float32)
    for t, ((start, end), advantage) in enumerate(zip(spans, advantages, strict=True)):
        inside = mask[start:end]
        if not allow_empty_spans and not inside.any():
            raise ValueError(
                f"span {t} ({start}, {end}) covers no policy token (the mask is 0 throughout); "
                "pass allow_empty_spans=True if that turn really generated nothing"
            )
        out[start:end] = np.where(inside, np.float32(advantage), np.float32(0.0))
    return out


def broadcast_advantages_torch(
    turn_advantages: Sequence[float],
    turn_spans: Sequence[SpanLike],
    response_mask: Any,
    *,
    length: int | None = None,
    allow_empty_spans: bool = False,
    dtype: Any = None,
    device: Any = None,
) -> Any:
    """:func:`broadcast_advantages` as a torch tensor (``float32`` unless ``dtype``) on ``device``.

    ``response_mask`` may be a tensor on any device. The return type is ``Any`` because
    torch is imported lazily and need not be installed where this module is type-checked.
    """
    try:
        torch = importlib.import_module("torch")
    except ModuleNotFoundError as exc:
        raise ImportError("broadcast_advantages_torch needs torch; use broadcast_advantages for numpy") from exc
    values = broadcast_advantages(
        turn_advantages,
        turn_spans,
        _host(response_mask),
        length=length,
        allow_empty_spans=allow_empty_spans,
    )
    return torch.as_tensor(values, dtype=dtype if dtype is not None else torch.float32, device=device)


def broadcast_batch(
    advantages: Sequence[Sequence[float]],
    spans: Sequence[Sequence[SpanLike]],
    mask: Any,
    *,
    pad_to: int | None = None,
    allow_empty_spans: bool = False,
) -> FloatArray:
    """Per-token advantages for a batch of rollouts, as a ``(batch, width)`` float32 array.

    ``mask`` is a 2-D array (rows already padded; padding is mask 0) or a list of 1-D
    masks of different lengths. The width is ``pad_to`` when given, else the longest row;
    columns past a row's own length are 0. Errors name the offending row.
    """
    rows = _mask_rows(mask)
    if not len(advantages) == len(spans) == len(rows):
        raise ValueError(
            f"batch sizes differ: {len(advantages)} advantage lists, {len(spans)} span lists, {len(rows)} mask rows"
        )
    if pad_to is not None and (isinstance(pad_to, bool) or not isinstance(pad_to, int) or pad_to < 0):
        raise ValueError(f"pad_to must be a non-negative integer, got {pad_to!r}")
    width = max((row.shape[0] for row in rows), default=0) if pad_to is None else pad_to
    out = np.zeros((len(rows), width), dtype=np.float32)
    for b, row in enumerate(rows):
        if row.shape[0] > width:
            raise ValueError(f"rollout {b}: mask has {row.shape[0]} tokens, more than pad_to={width}")
        try:
            values = broadcast_advantages(advantages[b], spans[b], row, allow_empty_spans=allow_empty_spans)
        except ValueError as exc:
            raise ValueError(f"rollout {b}: {exc}") from exc
        out[b, : values.shape[0]] = values
    return out


def policy_spans(response_mask: npt.ArrayLike) -> list[Span]:
    """The maximal runs of policy tokens, as half-open spans.

    When every turn is one contiguous block of generated tokens between tool
    observations (one tool call per assistant message), these are the turn spans. When an
    assistant message makes several tool calls, the converter gives one turn per call and
    the trainer must split that message's run itself.
    """
    mask = _mask_1d(response_mask).astype(np.int8)
    edges = np.diff(np.concatenate(([0], mask, [0])))
    starts = np.flatnonzero(edges == 1)
    ends = np.flatnonzero(edges == -1)
    return [(int(s), int(e)) for s, e in zip(starts, ends, strict=True)]


def turn_advantages(document: Mapping[str, Any], rollout_id: str) -> list[float]:
    """The ``advantage`` of each turn of one rollout in an API advantages document, in turn order.

    The document is the body of ``GET /v1/groups/{id}/advantages``. Turns are ordered
    by their ``index``, which must run 0..n-1 with no gap, so a reordered or truncated
    document fails here rather than shifting advantages onto the wrong spans.
    """
    status = document.get("status")
    if status is not None and status != "done":
        raise ValueError(f"the advantages document is {status!r}, not 'done'")
    rollouts = document.get("rollouts")
    if not isinstance(rollouts, list):
        raise ValueError("the advantages document has no 'rollouts' list")
    found = [r for r in rollouts if isinstance(r, Mapping) and r.get("id") == rollout_id]
    if not found:
        known = ", ".join(repr(r.get("id")) for r in rollouts if isinstance(r, Mapping))
        raise ValueError(f"rollout {rollout_id!r} is not in the advantages document (it has {known or 'none'})")
    if len(found) > 1:
        raise ValueError(f"rollout {rollout_id!r} appears {len(found)} times in the advantages document")
    turns = found[0].get("turns")
    if not isinstance(turns, list):
        raise ValueError(f"rollout {rollout_id!r} has no 'turns' list")
    by_index: dict[int, float] = {}
    for position, turn in enumerate(turns):
        index = turn.get("index", position) if isinstance(turn, Mapping) else None
        if not isinstance(index, int) or isinstance(index, bool):
            raise ValueError(f"rollout {rollout_id!r} turn {position} has no integer 'index'")
        if index in by_index:
            raise ValueError(f"rollout {rollout_id!r} has turn index {index} twice")
        value = turn.get("advantage") if isinstance(turn, Mapping) else None
        if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(float(value)):
            raise ValueError(f"rollout {rollout_id!r} turn {index} has no finite advantage (got {value!r})")
        by_index[index] = float(value)
    if sorted(by_index) != list(range(len(by_index))):
        raise ValueError(f"rollout {rollout_id!r} turn indices are not 0..{len(by_index) - 1}: {sorted(by_index)}")
    return [by_index[i] for i in range(len(by_index))]


# ----------------------------------------------------------------------------- validation


def _host(value: Any) -> Any:
    """A tensor on any device as a host array; anything else unchanged."""
    if hasattr(value, "detach") and hasattr(value, "cpu"):
        return value.detach().cpu().numpy()
    return value


def _mask_1d(response_mask: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    mask = np.asarray(_host(response_mask))
    if mask.ndim != 1:
        raise ValueError(f"the response mask must be 1-D, got shape {mask.shape}")
    if mask.dtype == np.bool_:
        return mask
    if mask.size and not (np.issubdtype(mask.dtype, np.integer) or np.issubdtype(mask.dtype, np.floating)):
        raise ValueError(f"the response mask must hold 0/1 values, got dtype {mask.dtype}")
    if mask.size and not np.isin(mask, (0, 1)).all():
        bad = int(np.flatnonzero(~np.isin(mask, (0, 1)))[0])
        raise ValueError(f"the response mask must hold only 0 and 1, got {mask[bad].item()!r} at position {bad}")
    return mask.astype(np.bool_)


def _mask_rows(mask: Any) -> list[npt.NDArray[np.bool_]]:
    host = _host(mask)
    if isinstance(host, np.ndarray):
        if host.ndim != 2:
            raise ValueError(f"the batch mask must be 2-D, got shape {host.shape}")
        rows: Sequence[Any] = list(host)
    elif isinstance(host, Sequence):
        rows = host
    else:
        raise ValueError(f"the batch mask must be a 2-D array or a list of 1-D masks, got {type(mask).__name__}")
    out = []
    for b, row in enumerate(rows):
        try:
            out.append(_mask_1d(row))
        except ValueError as exc:
            raise ValueError(f"rollout {b}: {exc}") from exc
    return out


def _advantages(values: Sequence[float]) -> list[float]:
    out: list[float] = []
    for t, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, (Real, np.floating, np.integer)):
            raise ValueError(f"advantage {t} must be a number, got {value!r}")
        number = float(value)
        if not math.isfinite(number):
            raise ValueError(f"advantage {t} is not finite ({number})")
        out.append(number)
    return out


def _spans(spans: Sequence[SpanLike], n: int) -> list[Span]:
    out: list[Span] = []
    for t, span in enumerate(spans):
        try:
            start, end = span
        except (TypeError, ValueError):
            raise ValueError(f"span {t} must be a (start, end) pair, got {span!r}") from None
        if isinstance(start, bool) or isinstance(end, bool):
            raise ValueError(f"span {t} bounds must be integers, got {span!r}")
        try:
            start, end = operator.index(start), operator.index(end)
        except TypeError:
            raise ValueError(f"span {t} bounds must be integers, got {span!r}") from None
        if start >= end:
            raise ValueError(f"span {t} ({start}, {end}) is empty or reversed: start must be < end")
        if start < 0 or end > n:
            raise ValueError(f"span {t} ({start}, {end}) is out of range for a response of {n} tokens")
        if out and start < out[-1][1]:
            raise ValueError(
                f"span {t} ({start}, {end}) starts before span {t - 1} {out[-1]} ends: "
                "spans must be in turn order and must not overlap"
            )
        out.append((start, end))
    return out
