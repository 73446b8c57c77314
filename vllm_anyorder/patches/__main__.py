"""``python -m vllm_anyorder.patches [--write]``: print (or write ``docs/PATCHES.md``) the
patch ledger table."""

from __future__ import annotations

import sys
from pathlib import Path

from vllm_anyorder import patches

HEADER = """# The patch ledger

Generated from `vllm_anyorder/patches/__init__.py` (`LEDGER`) by
`python -m vllm_anyorder.patches --write`; a test checks it is current. Each patch's full
entry (Why / What / Checked / Remove) is the docstring of its function in
`vllm_anyorder/patches/`. Disable one for diagnosis with
`VLLM_ANYORDER_DISABLE_PATCHES=name,...`.

"""

DOC = Path(__file__).resolve().parents[2] / "docs" / "PATCHES.md"


def render() -> str:
    return HEADER + patches.markdown_table()


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        DOC.write_text(render())
        print(f"wrote {DOC}")
    else:
        print(render(), end="")
