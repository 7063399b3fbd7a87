import sys

from bench.scale.cli import main

main(sys.argv[1:])
