import sys

from bench.anonymization.speed import main

main(sys.argv[1:])
