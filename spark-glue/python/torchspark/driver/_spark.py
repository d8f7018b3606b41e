"""The PySpark versions torchspark supports (3.5.x and 4.x), and the few places where
their APIs differ. docs/distributor.md's version table says what is tested on which.

What torchspark needs and since when PySpark has it:

- barrier ``DataFrame.mapInArrow(..., barrier=True)`` (Connect, train_on_dataframe): 3.5;
- ``SparkContext.addJobTag`` / ``cancelJobsWithTag`` (a run's own job tag, classic): 3.5;
- ``SparkSession.addTag`` / ``interruptTag`` (the same under Spark Connect): 3.5.

Where 3.5 and 4.x differ, a gate here picks the call:

- ``pyspark.util.InheritableThread(..., session=)`` (copies a Connect session's tags into
  the thread) is new in 4.0: on 3.5 the thread is made without it, which changes nothing
  for torchspark (the barrier job's thread adds its own tag);
- ``DataFrame.toArrow()`` is new in 4.0: on 3.5 the barrier job's chunks are collected
  as rows (BinaryType), which is what toArrow would hold.
"""
from __future__ import annotations

import re
from typing import Any, Callable, List, Optional, Tuple

MINIMUM = (3, 5)
# What a pyspark older than MINIMUM lacks, named in the error.
LACKS = ("barrier DataFrame.mapInArrow (mapInArrow(barrier=True)), SparkContext job tags "
         "(addJobTag, cancelJobsWithTag) and Spark Connect operation tags (addTag, "
         "interruptTag), all new in Spark 3.5")

# Stock's message for num_processes <= 0, as each version words it: (3.5, 4.0+).
NUM_PROCESSES_ERROR = ("num_proccesses has to be a positive integer",
                       "num_processes has to be a positive integer")


def parse(text: str) -> Tuple[int, int]:
    """(major, minor) of a version string such as '3.5.9' or '4.1.0.dev0'."""
    m = re.match(r"(\d+)\.(\d+)", text)
    if not m:
        raise ValueError(f"not a pyspark version: {text!r}")
    return int(m.group(1)), int(m.group(2))


def version() -> Tuple[int, int]:
    """(major, minor) of the pyspark this process imports."""
    import pyspark

    return parse(pyspark.__version__)


def check(text: Optional[str] = None) -> None:
    """Raises a RuntimeError naming what this pyspark (or text) lacks when it is older
    than torchspark supports."""
    if text is None:
        import pyspark

        text = pyspark.__version__
    if parse(text) < MINIMUM:
        raise RuntimeError(
            f"torchspark.TorchDistributor needs pyspark 3.5 or newer, but this is pyspark "
            f"{text}, which lacks {LACKS}. Upgrade pyspark (and the cluster's Spark) to "
            "3.5.x or 4.x, or keep to pyspark.ml.torch.distributor.TorchDistributor on "
            "this version.")


def inheritable_thread(target: Callable[[], None], name: str, session: Any) -> Any:
    """A daemon pyspark InheritableThread; session (a Connect session, or None) is passed
    where PySpark takes it (4.0+; asked of the signature, not the version)."""
    import inspect

    from pyspark.util import InheritableThread

    if "session" in inspect.signature(InheritableThread.__init__).parameters:
        return InheritableThread(target, daemon=True, name=name, session=session)
    return InheritableThread(target, daemon=True, name=name)


def collect_binary(df: Any, column: str) -> List[bytes]:
    """The values of df's BinaryType column, in order: through Arrow where the DataFrame
    has toArrow (4.0+), as rows on 3.5."""
    if hasattr(df, "toArrow"):
        return [v.as_py() for v in df.toArrow().column(column)]
    return [bytes(row[column]) for row in df.collect()]
