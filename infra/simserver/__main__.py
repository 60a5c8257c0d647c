"""`python -m infra.simserver [options]` is `llmload sim [options]`."""

import sys

from infra.cli import main

sys.exit(main(["sim", *sys.argv[1:]]))
