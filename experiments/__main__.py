"""python -m experiments ...: the lab's command line (experiments/cli.py, main)."""
import sys

from experiments.cli import main

sys.exit(main(sys.argv[1:]))
