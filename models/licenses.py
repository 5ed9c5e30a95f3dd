"""License classes: which licenses pass on their own, and which need a named person's sign-off.

The one table is `PERMISSIVE`: SPDX ids whose terms ask for attribution and a notice at most. From it:

- `permissive`: every license an SPDX expression obliges one to follow is in the table (`A AND B`: both;
  `A OR B`: the user may choose, so either; `A WITH E`: A). Passes the license review automatically.
- `sign-off`: any other license: `other` or `LicenseRef-*` with a name and a link (the NVIDIA Open Model
  License, the Gemma terms, the Llama community licenses), or an SPDX id outside the table (GPL, CC-BY-NC).
  The license review (checklist item `license-review`) waits for a named person's sign-off.
- an expression naming no known SPDX id is an error (`LicenseClassError`); the catalog reports it with the
  entry and the field.

The catalog (models/catalog.py), `unmask models`, the license check (evals/license.py, whose bundled policy
takes its `permitted` tier from this table) and the `license_review` gate all read the class from here.
"""

from __future__ import annotations

import functools
from typing import Any

PERMISSIVE_CLASS = "permissive"
SIGN_OFF_CLASS = "sign-off"
LICENSE_CLASSES = (PERMISSIVE_CLASS, SIGN_OFF_CLASS)
OTHER = "other"

# SPDX ids (case-insensitive) that pass without a person reading them.
PERMISSIVE = frozenset(
    {
        "MIT",
        "MIT-0",
        "Apache-2.0",
        "BSD-2-Clause",
        "BSD-3-Clause",
        "BSD-3-Clause-Clear",
        "ISC",
        "Zlib",
        "BSL-1.0",
        "Unlicense",
        "CC0-1.0",
        "CC-BY-4.0",
        "CC-BY-3.0",
        "PSF-2.0",
        "Python-2.0",
        "UPL-1.0",
        "0BSD",
    }
)
_PERMISSIVE_KEYS = frozenset(p.lower() for p in PERMISSIVE)


class LicenseClassError(ValueError):
    """A license string that names no known license; the caller adds where it was written."""


@functools.cache
def spdx_licensing() -> Any:  # license_expression's Licensing (the package ships no types)
    """The SPDX license index; building it parses a large JSON, so it is built once per process."""
    from license_expression import get_spdx_licensing

    return get_spdx_licensing()


def is_custom(expression: str) -> bool:
    """`other` or a `LicenseRef-*`: a license outside SPDX, known by its name and link."""
    return expression.strip().lower() == OTHER or expression.strip().startswith("LicenseRef-")


def normalized_spdx(expression: str) -> str:
    """The SPDX-normalised form of `expression` (LicenseRef-* allowed); LicenseClassError when it names an
    unknown id or does not parse."""
    not_spdx = f"{expression!r} is not an SPDX license id"
    try:
        info = spdx_licensing().validate(expression)
    except AttributeError:
        # license-expression's validate() fails on its own error path for some characters (e.g. '\x1b')
        raise LicenseClassError(not_spdx) from None
    invalid = [str(s) for s in info.invalid_symbols if not str(s).startswith("LicenseRef-")]
    if invalid:
        raise LicenseClassError(f"{not_spdx} (unknown: {', '.join(invalid)})")
    if info.normalized_expression is None and not info.invalid_symbols:
        raise LicenseClassError(f"{not_spdx} ({'; '.join(info.errors) or 'empty'})")
    return str(info.normalized_expression or expression)  # with a LicenseRef-* it is kept as written


@functools.lru_cache(maxsize=256)
def license_class(expression: str) -> str:
    """`permissive` or `sign-off` for a catalog license (an SPDX expression, `other`, or a LicenseRef-*)."""
    if is_custom(expression):
        return SIGN_OFF_CLASS
    from license_expression import AND, OR, LicenseSymbol, LicenseWithExceptionSymbol

    def permissive(node: Any) -> bool:
        if isinstance(node, LicenseWithExceptionSymbol):
            return permissive(node.license_symbol)
        if isinstance(node, LicenseSymbol):
            return str(node.key).lower() in _PERMISSIVE_KEYS
        parts = [permissive(arg) for arg in node.args]
        if isinstance(node, AND):
            return all(parts)
        if isinstance(node, OR):
            return any(parts)
        raise LicenseClassError(f"{expression!r}: unexpected {type(node).__name__} in an SPDX expression")

    parsed = spdx_licensing().parse(normalized_spdx(expression), validate=False)
    return PERMISSIVE_CLASS if permissive(parsed) else SIGN_OFF_CLASS


def review_class(expression: str) -> str:
    """The class of what a license field or a model card says; a string naming no known license is for a
    person to read (`sign-off`), where the catalog would refuse it."""
    try:
        return license_class(expression)
    except LicenseClassError:
        return SIGN_OFF_CLASS
