"""`hpcdl run entry=pkg.mod:fn`: `python -m hpcdl.entry pkg.mod:fn '{"kw": 1}'` calls
fn(**kwargs) in a fresh interpreter per rank; an int it returns is the exit status."""

from __future__ import annotations

import json
import sys

from hpcdl.targets import resolve_callable


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m hpcdl.entry package.module:function JSON_KWARGS", file=sys.stderr)
        return 2
    fn = resolve_callable("entry", argv[0])
    result = fn(**json.loads(argv[1]))
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
