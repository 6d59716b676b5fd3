"""Numbers no double holds, in a conversion's output: reported as losses.

orjson, which reads documents everywhere else, gives an integer past 64 bits as a float and
`1e-400` as `0.0`. A conversion's output holds the document's values (a kept part, the
envelope, the obs and tool calls it moves), so its callers (POST /v1/convert, served reads,
`tracestore convert`) read a document whose text may hold such numbers
(`jsontext.may_hold_inexact_numbers`, rare and cheap to tell) with `jsontext.loads_whole`
instead: integers stay whole, and a fraction no double holds becomes a `RoundedFloat`, the
nearest double, which `report_rounded` finds in the output and reports as a loss (so
`lossless` is false). Every other number is a double, read exactly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace as with_changes
from typing import Any, TypeVar

from tracestore.convert.report import Conversion, LossEntry
from tracestore.jsontext import RoundedFloat

T = TypeVar("T")

# A RoundedFloat's text as a loss entry quotes it (a fraction may have hundreds of digits).
_QUOTED_CHARS = 40


def report_rounded(conversion: Conversion[T], output: object, root: str = "") -> Conversion[T]:
    """`conversion` with a `default` loss entry for each place in `output` (a value read
    by `jsontext.loads_whole`, or made from one) that holds a fraction no double holds, written
    rounded; the same conversion when there is none. `root` prefixes the paths."""
    found = _rounded(output, root)
    if not found:
        return conversion
    entries = [
        LossEntry(
            path=places[0] if len(places) == 1 else pattern,
            kind="default",
            detail=f"a number no double holds, written rounded (e.g. {_quote(first)} as "
            f"{float(first)!r})",
            count=len(places),
        )
        for pattern, (first, places) in found.items()
    ]
    total = sum(entry.count for entry in entries)
    warning = (
        f"{total} number{'s' if total > 1 else ''} no double holds (past a double's "
        "precision or range) written rounded: see the loss report"
    )
    return with_changes(
        conversion,
        losses=[*conversion.losses, *entries],
        warnings=(*conversion.warnings, warning),
    )


def whole_or_float(value: int) -> int | float:
    """An integer as a float when a double holds it exactly, else the integer itself (a
    JSON integer no double holds stays the number it is); OverflowError past a double's
    range."""
    as_float = float(value)
    return as_float if as_float == value else value


def _quote(number: RoundedFloat) -> str:
    text = number.text
    return text if len(text) <= _QUOTED_CHARS else text[: _QUOTED_CHARS - 3] + "..."


# A value's place: None at the root, else (its parent's link, its key or index). Paths are
# spelled out only for the rounded numbers found.
_Link = tuple[Any, str | int] | None


def _rounded(value: object, root: str) -> dict[str, tuple[RoundedFloat, list[str]]]:
    """The rounded numbers in `value`, by path pattern (indices as `[*]`): the first one
    and the path of each. An object met at two places (a trace holds each event in its
    time step and in its history; a converted trace shares the obs of the trajectories)
    is written at both, so it is reported at both."""
    found: dict[str, tuple[RoundedFloat, list[str]]] = {}
    stack: list[tuple[_Link, object]] = [(None, value)]
    while stack:
        link, node = stack.pop()
        if isinstance(node, RoundedFloat):
            path, pattern = _path(link, root)
            _, places = found.setdefault(pattern, (node, []))
            places.append(path)
        elif isinstance(node, Mapping | list):
            items = node.items() if isinstance(node, Mapping) else enumerate(node)
            # Reversed: popped in document order, so entries come in that order too.
            stack.extend(((link, k), v) for k, v in reversed(list(items)))
    return found


def _path(link: _Link, root: str) -> tuple[str, str]:
    """The path of a linked place, and its pattern (every index `[*]`)."""
    parts: list[str | int] = []
    while link is not None:
        link, part = link
        parts.append(part)
    path, pattern = root, root
    for part in reversed(parts):
        if isinstance(part, int):
            path, pattern = f"{path}[{part}]", f"{pattern}[*]"
        else:
            sep = "." if path else ""
            path, pattern = f"{path}{sep}{part}", f"{pattern}{sep}{part}"
    return path, pattern
