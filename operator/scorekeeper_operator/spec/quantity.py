"""Kubernetes resource quantities (k8s.io/apimachinery/pkg/api/resource): the grammar, and the value a string means.

The API server stores quantities in canonical form (`0.5` → `500m`, `1.5Gi` → `1536Mi`, `2000` → `2k`), so what we
apply and what we read back differ as strings; comparing their values keeps that from looking like drift forever.
"""

from __future__ import annotations

import math
import re
from decimal import ROUND_CEILING, Decimal, localcontext
from typing import Any

# The grammar of quantity.go (parseQuantityString + the suffixer), without the sign: requests and limits cannot be
# negative. `K` is not a suffix (only `k` and `Ki`); `1.` and `.5` are numbers; an exponent may carry a sign.
QUANTITY_PATTERN = r"^\+?([0-9]+(\.[0-9]*)?|\.[0-9]+)([numkMGTPE]|[KMGTPE]i|[eE][-+]?[0-9]+)?$"
_QUANTITY = re.compile(QUANTITY_PATTERN)
_DECIMAL_SUFFIXES = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_NANO = Decimal("1e-9")
_MAX = Decimal(2**63 - 1)  # quantity.go's maxAllowed: larger values are capped


def quantities_as_strings(data: Any, keys: tuple[str, ...]) -> Any:
    """The CRD takes a quantity as a string or as a YAML number (`cpu: 1.5`, as a Deployment does); the API and the
    kubernetes client want strings. A boolean stays what it is, and fails the pattern."""
    if not isinstance(data, dict):
        return data
    return {k: str(v) if k in keys and isinstance(v, int | float) and not isinstance(v, bool) else v
            for k, v in data.items()}


def parse_quantity(text: str) -> Decimal:
    """The value of a quantity, rounded up to nano precision as the API server does. Raises ValueError."""
    match = _QUANTITY.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity (e.g. 500m, 2, 1.5Gi, 512Mi, 1e3)")
    number, suffix = Decimal(match[1]), match[3] or ""
    if suffix.endswith("i"):
        scale, base = "KMGTPE".index(suffix[0]) + 1, Decimal(1024)
    elif suffix[:1] in ("e", "E") and len(suffix) > 1:
        scale, base = max(-40, min(40, int(suffix[1:]))), Decimal(10)  # beyond: capped or rounded up anyway
    else:
        scale, base = _DECIMAL_SUFFIXES[suffix], Decimal(10)
    with localcontext() as context:
        context.prec = 100
        value = min(number * base**scale, _MAX)
        return value.quantize(_NANO, rounding=ROUND_CEILING) if value else Decimal(0)


def quantity_bytes(text: str) -> int:
    """A quantity of bytes (`20Gi`, `500M`, `1e9`) as a whole number of bytes, rounded up. Raises ValueError."""
    return math.ceil(parse_quantity(text))


def same_quantity(left: object, right: object) -> bool:
    """Equal values (`0.5` and `500m`, `1.5Gi` and `1536Mi`); anything that is not a quantity compares as is."""
    if left == right:
        return True
    try:
        return parse_quantity(str(left)) == parse_quantity(str(right))
    except ValueError:
        return False
