"""README.md's support table is what ``tigon.patch`` does today on each family's tiny model (tests/support_table.py
builds it from the test matrix and the patch reports); rebuild it with
``PYTHONPATH=src python3 tests/support_table.py --write`` after a change to the family data or the engine."""

from __future__ import annotations

import re

import pytest
import transformers

import support_table as st


def test_readme_holds_the_generated_support_table():
    with open(st.README) as f:
        text = f.read()
    held = st.readme_table(text)
    assert held is not None, f"README.md lost the markers {st.START!r} / {st.END!r}"
    version = re.search(r"Generated with transformers (\S+) ", held)
    if version is None or version.group(1) != transformers.__version__:
        pytest.skip(f"the table was generated with transformers {version and version.group(1)}, this is "
                    f"{transformers.__version__}: transformers' classes decide some rows")
    assert held == st.table(), ("README.md's support table is stale: "
                                "PYTHONPATH=src python3 tests/support_table.py --write")


def test_every_family_spec_has_a_row():
    # a family without a matrix case gets a TABLE_ONLY case (model_matrix.py), a vision tower its container's row
    assert st.families_without_row() == [], "families with no support-table row: add a TABLE_ONLY case"
