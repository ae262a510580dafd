"""Runs of consecutive numbers, as people and Slurm write them: [0, 1, 2, 5] -> '0-2, 5';
and a sweep's range() as people mean it. Plain stdlib, for the CLI's one-line summaries,
`hpcdl status`'s array tasks and the sweeps' range()."""

from __future__ import annotations

import decimal
import itertools
from collections.abc import Iterable


def number_spans(numbers: Iterable[int]) -> list[tuple[int, int]]:
    """[0, 1, 2, 5, 7, 8] -> [(0, 2), (5, 5), (7, 8)] (sorted, duplicates once)."""
    spans: list[list[int]] = []
    for n in sorted(set(numbers)):
        if spans and n == spans[-1][1] + 1:
            spans[-1][1] = n
        else:
            spans.append([n, n])
    return [(a, b) for a, b in spans]


def number_ranges(numbers: Iterable[int], sep: str = ", ") -> str:
    """[0, 1, 2, 5, 7, 8] -> '0-2, 5, 7-8' (a 1000-trial sweep's cancel is one short line)."""
    return sep.join(str(a) if a == b else f"{a}-{b}" for a, b in number_spans(numbers))


def parse_number_ranges(text: str) -> list[int]:
    """'3,4,10-12' -> [3, 4, 10, 11, 12], in order given, duplicates once; ValueError
    naming the part that is no number or range ('10-x')."""
    numbers: list[int] = []
    for part in (p.strip() for p in text.split(",")):
        first, dash, last = part.partition("-")
        if not (first.isdigit() and (last.isdigit() if dash else True)):
            raise ValueError(f"{part!r} is no number or range (e.g. 3,4,10-12)")
        if dash and int(last) < int(first):
            raise ValueError(f"{part!r} runs backwards (write {last}-{first})")
        for n in range(int(first), int(last if dash else first) + 1):
            if n not in numbers:
                numbers.append(n)
    return numbers


def range_values(start: float, stop: float, step: float = 1) -> list[str]:
    """A sweep's range(start, stop, step) as people mean it, as the values' text: Python's
    range() for integers; with a float in it, each value rounded to the decimals of start
    and step, and the stop left out. Added up in binary floating point, range(0.1,0.5,0.1)
    gives 0.30000000000000004 and range(0.7,1.0,0.1) a fourth value, 0.9999999999999999 (as
    Hydra's range() does). ValueError for a zero step, or more than MAX_RANGE_VALUES."""
    if step == 0:
        raise ValueError("the step of range() must not be 0")
    if not any(isinstance(v, float) for v in (start, stop, step)):
        integers = range(int(start), int(stop), int(step))
        if len(integers) > MAX_RANGE_VALUES:
            raise ValueError(f"range() gives more than {MAX_RANGE_VALUES} values")
        return [str(v) for v in integers]
    places = max(_decimals(start), _decimals(step))
    values: list[str] = []
    for index in itertools.count():
        number = round(start + index * step, places)
        if (number >= stop) if step > 0 else (number <= stop):
            return values
        if index >= MAX_RANGE_VALUES:
            raise ValueError(f"range() gives more than {MAX_RANGE_VALUES} values")
        values.append(repr(float(number)))
    raise AssertionError("unreachable")  # pragma: no cover


MAX_RANGE_VALUES = 100_000  # a step far too small for its span: refused, not a hang


def _decimals(number: float) -> int:
    exponent = decimal.Decimal(repr(number)).as_tuple().exponent
    return -exponent if isinstance(exponent, int) and exponent < 0 else 0
