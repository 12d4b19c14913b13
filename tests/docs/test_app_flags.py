"""The flags the documentation lists are the flags the parsers have, both ways.

- docs/app-contract.md, "Flags every app accepts": exactly the flags that every app's parser has (the
  common parser's and those each bundled app adds alike, such as --monitor);
- each app's page, its "Options" table: every flag it lists exists in that app's parser, and every flag
  of that parser is listed there or on the app-contract page.

Only the first cell of each table row counts (a meaning may mention another app's flag).
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
APP_PAGES = {"apps.stencil": "stencil.md", "apps.md": "md.md", "apps.train": "train.md"}
_FLAG = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")


def parser_flags(app: str) -> set[str]:
    parser = importlib.import_module(f"{app}.app").build_parser()
    return {option for action in parser._actions for option in action.option_strings if option.startswith("--")}


def table_flags(page: str, heading: str) -> set[str]:
    """Flags in the first cell of the table rows of the section whose heading starts with ``heading``."""
    lines = (ROOT / "docs" / page).read_text(encoding="utf-8").splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("#") and line.lstrip("#").strip().startswith(heading)]
    assert len(starts) == 1, f"docs/{page}: expected one section '{heading}', found {len(starts)}"
    flags = set()
    for line in lines[starts[0] + 1:]:
        if line.startswith("#"):
            break
        if line.startswith("|"):
            flags |= set(_FLAG.findall(re.split(r"(?<!\\)\|", line)[1]))   # cells end at unescaped pipes
    return flags


def every_app_flags() -> set[str]:
    return set.intersection(*(parser_flags(app) for app in APP_PAGES))


def test_contract_lists_exactly_the_flags_every_app_has():
    listed = table_flags("app-contract.md", "Flags every app accepts")
    shared = every_app_flags()
    assert listed - shared == set(), f"listed for every app but missing in some app's parser: {sorted(listed - shared)}"
    assert shared - listed == set(), f"in every app's parser but not listed: {sorted(shared - listed)}"


@pytest.mark.parametrize("app", sorted(APP_PAGES))
def test_app_page_lists_exactly_its_parser_flags(app):
    page = APP_PAGES[app]
    listed, flags = table_flags(page, "Options"), parser_flags(app)
    assert listed - flags == set(), f"docs/{page} lists flags {app} does not have: {sorted(listed - flags)}"
    missing = flags - every_app_flags() - listed
    assert missing == set(), f"{app} has flags docs/{page} does not list: {sorted(missing)}"
