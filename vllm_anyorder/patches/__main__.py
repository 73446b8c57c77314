"""``python -m vllm_anyorder.patches [--write | --check DIR]``: print (or write
``docs/PATCHES.md``) the patch ledger table, or check a vLLM source tree (``DIR`` holds the
``vllm`` package, or is it) against what the patches and private imports expect
(``upstream.py``; exit status 1 when something is missing or changed)."""

from __future__ import annotations

import argparse
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


def run_check(directory: str, show_all: bool) -> int:
    from vllm_anyorder.patches import upstream
    from vllm_anyorder.patches.source_tree import SourceTree

    root = upstream.package_root(Path(directory))
    results = upstream.check(root)
    version = SourceTree(root).version() or "unknown version"
    failed = [r for r in results if r.problem]
    print(f"vLLM {version} at {root / 'vllm'}: {len(results) - len(failed)} of {len(results)} "
          f"expectations hold")
    for r in results:
        if r.problem or show_all:
            where = r.found.where(root) if r.found else "-"
            status = f"FAIL {r.problem}" if r.problem else f"ok   {r.found.kind}"
            print(f"{status:<10} {r.expect.symbol}  [{where}]  used by {r.expect.used_by}")
    for name, owner in upstream.FOREIGN.items():
        print(f"skipped    {name}: outside vLLM ({owner})")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m vllm_anyorder.patches",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help=f"write {DOC.name}")
    ap.add_argument("--check", metavar="DIR", help="check the vLLM source tree in DIR")
    ap.add_argument("--all", action="store_true", help="with --check: list passing ones too")
    args = ap.parse_args(argv)
    if args.check:
        return run_check(args.check, args.all)
    if args.write:
        DOC.write_text(render())
        print(f"wrote {DOC}")
    else:
        print(render(), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
