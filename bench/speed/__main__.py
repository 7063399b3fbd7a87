import sys

from bench.speed.cli import main

main(sys.argv[1:])
