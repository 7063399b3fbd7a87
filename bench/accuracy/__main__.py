import sys

from bench.accuracy.cli import main

main(sys.argv[1:])
