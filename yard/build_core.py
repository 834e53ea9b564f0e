"""``python -m yard.build_core [build | status | clean]``: compile the scheduler
core with mypyc, say which core yard runs, or remove the build
(:mod:`yard.compiled`)."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Sequence

from yard import compiled


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv) or ["build"]
    if args == ["build"]:
        print(f"compiling yard/core with mypyc into {compiled.BUILD} (a minute or two)", flush=True)
        compiled.build()
    elif args == ["clean"]:
        shutil.rmtree(compiled.BUILDS, ignore_errors=True)
    elif args != ["status"]:
        print("usage: python -m yard.build_core [build | status | clean]", file=sys.stderr)
        return 2
    print(f"yard's core: {compiled.state()[1]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
