"""python -m experiments ...: the lab's command line (experiments/lab.py, main)."""
import sys

from experiments.lab import main

sys.exit(main(sys.argv[1:]))
