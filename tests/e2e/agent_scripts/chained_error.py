"""A worker for the failure-report tests: `chained_error.py MODE TAG [FAILRANK]`.

Global rank FAILRANK (default 1) fails; the others sleep until they are stopped.
  chain    under torch's @record: RuntimeError("outer-TAG") raised from ValueError("root-TAG")
  deep     under torch's @record: a chain of 80 exceptions, ValueError("deep-TAG") first and
           KeyError("last-TAG") last: a traceback of some 600 lines, over the report's cap
  garbage  writes text that is not JSON to its error file and exits 3
"""
import os
import sys
import time

mode, tag = sys.argv[1], sys.argv[2]
fail_rank = int(sys.argv[3]) if len(sys.argv) > 3 else 1
rank = int(os.environ.get("RANK", "0"))


def chain(n: int) -> None:
    if n == 0:
        raise ValueError(f"deep-{tag}")
    try:
        chain(n - 1)
    except Exception as e:
        raise RuntimeError(f"level-{n}") from e


def fail() -> None:
    if mode == "chain":
        try:
            raise ValueError(f"root-{tag}")
        except ValueError as e:
            raise RuntimeError(f"outer-{tag}") from e
    if mode == "deep":
        try:
            chain(80)
        except RuntimeError as e:
            raise KeyError(f"last-{tag}") from e
    if mode == "garbage":
        with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
            f.write('{"message": oops-' + tag + ' "not json\n')
        sys.exit(3)
    sys.exit(f"chained_error.py: unknown mode {mode!r}")


if rank != fail_rank:
    print(f"rank {rank} waiting", flush=True)
    time.sleep(120)
    sys.exit(0)

if mode == "garbage":
    fail()
else:
    from torch.distributed.elastic.multiprocessing.errors import record

    record(fail)()
