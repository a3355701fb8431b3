"""A griffe extension for the API reference (mkdocs.yml): the Sphinx roles some docstrings use
(:class:`ShardCache`, :mod:`fastload.formats.table`, :meth:`~MixedDataset.member_key`) rendered as
code spans, as the plain ``code`` around them is; a ``~`` keeps the last part, as Sphinx does."""

from __future__ import annotations

import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:mod|class|func|meth|attr|data|exc|obj):`(~?)([^`]+)`")


def _as_code(match: re.Match[str]) -> str:
    short, target = match.groups()
    return f"``{target.rsplit('.', 1)[-1] if short else target}``"


class SphinxRoles(griffe.Extension):
    """Rewrites each loaded object's docstring before mkdocstrings parses it."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = ROLE.sub(_as_code, obj.docstring.value)
