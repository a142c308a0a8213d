import sys

from bench.cli import main

raise SystemExit(main(sys.argv[1:]))
