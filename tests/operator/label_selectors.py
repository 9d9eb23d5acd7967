"""Kubernetes label selectors (equality- and set-based), as the API server evaluates `?labelSelector=`."""

from __future__ import annotations

import re

_REQUIREMENT = re.compile(
    r"\s*(?:(?P<not>!)\s*(?P<absent>[\w./-]+)"
    r"|(?P<key>[\w./-]+)\s*(?:(?P<op>==|!=|=)\s*(?P<value>[\w.-]*)"
    r"|\s+(?P<setop>in|notin)\s+\((?P<values>[^)]*)\))?)\s*(?:,|$)"
)


def matches_selector(selector: str, labels: dict[str, str]) -> bool:
    """True when every comma-separated requirement holds; an empty selector matches everything."""
    position, selector = 0, selector.strip()
    while position < len(selector):
        match = _REQUIREMENT.match(selector, position)
        if match is None or match.end() == position:
            raise ValueError(f"unparsable label selector {selector!r} at {position}")
        position = match.end()
        if match["absent"]:
            ok = match["absent"] not in labels
        elif match["op"]:
            equal = labels.get(match["key"]) == match["value"]
            ok = (not equal) if match["op"] == "!=" else equal
        elif match["setop"]:
            values = {v.strip() for v in match["values"].split(",") if v.strip()}
            inside = match["key"] in labels and labels[match["key"]] in values
            ok = inside if match["setop"] == "in" else not inside
        else:
            ok = match["key"] in labels
        if not ok:
            return False
    return True
