"""A test's config built from a base and the test's own values, section by section."""

from __future__ import annotations

from typing import Any


def merged(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` on ``base``: a section (a dict) given in both merges key by key, any other value is replaced."""
    return {**base, **{k: {**base[k], **v} if isinstance(v, dict) and isinstance(base.get(k), dict) else v
                       for k, v in over.items()}}
