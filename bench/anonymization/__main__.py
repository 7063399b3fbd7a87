import sys

from bench.anonymization import main

main(sys.argv[1:])
