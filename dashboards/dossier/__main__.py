"""`python -m dashboards.dossier MODEL --out DIR [--version V] [--stage S] [--no-pdf]`: build one dossier.

Prints the built files as one JSON line; a dossier that cannot be built is one `error:` line on stderr
and exit status 2. `unmask report` runs this and logs what it wrote.
"""

from __future__ import annotations

import argparse
import json
import sys

from dashboards.dossier import DossierError, PdfError, build
from registry import Registry, RegistryError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dashboards.dossier", description=__doc__)
    parser.add_argument("model")
    parser.add_argument("--out", required=True)
    parser.add_argument("--version")
    parser.add_argument("--stage")
    parser.add_argument("--no-pdf", action="store_true")
    args = parser.parse_args(argv)

    try:
        built = build(Registry(), args.model, args.out, args.version, args.stage, pdf=not args.no_pdf)
    except (DossierError, PdfError, RegistryError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(built.to_dict()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
