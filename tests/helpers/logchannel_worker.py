"""A worker for the log channel tests and benchmark: prints LC_LINES lines of random length
(0..8 KiB, every LC_BIG_EVERY-th one 2 MiB), with \\r progress updates and invalid UTF-8,
deterministically from its rank, then writes the count and an order-sensitive SHA-256 of
what it printed to LC_SUMMARY_DIR/<rank>.json."""
import hashlib
import json
import os
import random
import struct
import sys


def lines_for(rank: int, count: int, big_every: int):
    rnd = random.Random(1000 + rank)
    pool = rnd.randbytes(1 << 16).replace(b"\n", b"\xff")
    for i in range(count):
        if big_every and i % big_every == big_every - 1:
            yield (b"%d:%d:" % (rank, i)) + (pool * 33)[: 2 << 20]
        elif i % 97 == 5:
            yield b"".join(b"progress %d%%|%s|\r" % (p, b"#" * (p // 5)) for p in range(0, 101, 10))
        else:
            n = rnd.randrange(0, 8193)
            off = rnd.randrange(0, len(pool) - n)
            yield pool[off:off + n]


def main() -> None:
    rank = int(os.environ["RANK"])
    count = int(os.environ.get("LC_LINES", "1000"))
    big_every = int(os.environ.get("LC_BIG_EVERY", "0"))
    h = hashlib.sha256()
    out = sys.stdout.buffer
    batch = []
    for line in lines_for(rank, count, big_every):
        h.update(struct.pack(">I", len(line)))
        h.update(line)
        batch.append(line)
        if len(batch) >= 16:
            out.write(b"\n".join(batch) + b"\n")
            batch = []
    if batch:
        out.write(b"\n".join(batch) + b"\n")
    out.flush()
    with open(os.path.join(os.environ["LC_SUMMARY_DIR"], "%d.json" % rank), "w") as f:
        json.dump({"count": count, "sha256": h.hexdigest()}, f)
    if os.environ.get("LC_CRASH"):
        print("last words before the crash", flush=True)
        os.abort()


if __name__ == "__main__":
    main()
