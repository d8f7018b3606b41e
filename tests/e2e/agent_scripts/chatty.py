"""Prints LINES numbered lines as fast as it can, to stdout and (every third) to stderr,
then one last line without a newline: `chatty.py LINES`. Under `python -u` each print is
two writes (the text, then the newline), which is what could join two ranks' lines."""
import os
import sys

n = int(sys.argv[1])
rank = os.environ.get("RANK", "x")
pad = "y" * (int(rank) * 7 if rank.isdigit() else 0)
for i in range(n):
    print(f"R{rank}-{i:05d}-{pad}", file=sys.stderr if i % 3 == 2 else sys.stdout)
print(f"R{rank}-tail-{pad}", end="")
