import sys

from bench.reidentification.mnist import main

main(sys.argv[1:])
