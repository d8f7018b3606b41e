"""A barrier task's DataFrame partition, staged once for the node's training processes.

``TorchDistributor.train_on_dataframe`` runs one barrier task per partition (through
``mapInArrow``, which hands the task its partition as Arrow record batches). The task
writes the batches once, as an Arrow IPC stream (PySpark's format), into a file under
Spark's local dirs, and every training process of the node memory-maps it
(torchspark/data.py). The file has no name from the start (O_TMPFILE, or created and
unlinked at once where the file system lacks it): the task holds its descriptor and the
workers open it as ``/proc/<task pid>/fd/<n>``. So the kernel frees it when the last
process holding it ends, however the run ends: success, a failure, or a cancel, where
Spark SIGKILLs the Python worker and no ``finally`` runs. Nothing is ever left behind.

Kept free of torch: this runs in the executor's Python worker.
"""
from __future__ import annotations

import os
import re
import tempfile
from typing import Any, Dict, Iterator, List, Optional

from torchspark.task._spec import DataFrameSpec, NodeSpec

PARTITION_FILE_ENV = "TORCHSPARK_PARTITION_FILE"
# PySpark's variables, pointing at the same stream and a schema file: PySpark's own
# _get_spark_partition_data_loader works inside torchspark's train_on_dataframe too.
STOCK_FILE_ENV = "SPARK_PARTITION_ARROW_DATA_FILE"
STOCK_SCHEMA_ENV = "SPARK_DATAFRAME_SCHEMA_FILE"
SPARK_SCHEMA_KEY = b"torchspark.spark_schema"

EMPTY_PARTITION = ("Empty Spark partition is not allowed in "
                   "TorchDistributor.train_on_dataframe.")  # PySpark's message
WRONG_PARTITIONS = ("TorchDistributor._train_on_dataframe requires setting num_processes "
                    "equal to input spark dataframe partition number.")  # PySpark's message
# Marks a task's refusal of its input (an empty partition, the partition count), raised
# on the driver as the ValueError it is, with PySpark's message.
INPUT_ERROR = "TORCHSPARK_DATAFRAME_INPUT_ERROR"


def local_dirs() -> List[str]:
    """Spark's local dirs as the executor's Python worker sees them (PythonRunner passes
    the block manager's dirs as SPARK_LOCAL_DIRS), then the cluster managers' variables;
    the system's temporary directory when none exists (the driver in local mode)."""
    found: List[str] = []
    for var, sep in (("SPARK_LOCAL_DIRS", ","), ("SPARK_EXECUTOR_DIRS", os.pathsep),
                     ("LOCAL_DIRS", ",")):
        for d in os.environ.get(var, "").split(sep):
            d = d.strip()
            if d and os.path.isdir(d) and os.access(d, os.W_OK | os.X_OK) and d not in found:
                found.append(d)
        if found:
            return found
    return [tempfile.gettempdir()]


def unnamed_file(directory: str) -> int:
    """A read-write descriptor (close-on-exec) of a new file in directory that has no name."""
    try:
        return os.open(directory, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
    except (AttributeError, OSError):  # no O_TMPFILE (kernel, file system): name it briefly
        fd, name = tempfile.mkstemp(prefix=".torchspark-partition-", dir=directory)
        os.unlink(name)
        return fd


def fd_path(fd: int) -> str:
    """A path that opens fd's file from this process's descendants."""
    return f"/proc/{os.getpid()}/fd/{fd}"


class StagedPartition:
    """The staged file: its descriptors (held until close()), rows and the environment
    that leads the training processes to it."""

    def __init__(self, data_fd: int, schema_fd: int, num_rows: int, nbytes: int) -> None:
        self.data_fd, self.schema_fd = data_fd, schema_fd
        self.num_rows, self.nbytes = num_rows, nbytes
        self.env: Dict[str, str] = {
            PARTITION_FILE_ENV: fd_path(data_fd),
            STOCK_FILE_ENV: fd_path(data_fd),
            STOCK_SCHEMA_ENV: fd_path(schema_fd),
        }

    def close(self) -> None:
        for fd in (self.data_fd, self.schema_fd):
            if fd >= 0:
                os.close(fd)
        self.data_fd = self.schema_fd = -1

    def __enter__(self) -> "StagedPartition":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def stage(batches: Iterator[Any], spark_schema_json: str, partition_id: int = 0,
          directory: Optional[str] = None) -> StagedPartition:
    """Writes the record batches (a mapInArrow iterator) to an unnamed Arrow IPC stream
    under Spark's local dirs (spread over them by partition id); ValueError with
    PySpark's message when the partition has no rows."""
    import pyarrow as pa

    if directory is None:
        dirs = local_dirs()
        directory = dirs[partition_id % len(dirs)]
    data_fd = unnamed_file(directory)
    schema_fd = -1
    try:
        with os.fdopen(os.dup(data_fd), "wb") as f:
            rows = write_stream(pa.PythonFile(f, mode="w"), batches, spark_schema_json)
            nbytes = f.tell()
        if rows == 0:
            raise ValueError(EMPTY_PARTITION)
        schema_fd = unnamed_file(directory)
        with os.fdopen(os.dup(schema_fd), "w", encoding="utf-8") as f:
            f.write(spark_schema_json)
        return StagedPartition(data_fd, schema_fd, rows, nbytes)
    except BaseException:
        os.close(data_fd)
        if schema_fd >= 0:
            os.close(schema_fd)
        raise


# Record batches are written at least this large (rows or bytes, whichever comes first):
# Spark hands a task 10,000 rows at a time (spark.sql.execution.arrow.maxRecordsPerBatch),
# 160 KB for 4 float columns, and each record batch costs the readers a fixed ~10 us a
# column to set up and a concatenation for every training batch that spans two of them.
COALESCE_ROWS = 1 << 16
COALESCE_BYTES = 4 << 20


def write_stream(sink: Any, batches: Iterator[Any], spark_schema_json: str) -> int:
    """Writes the record batches to sink as an Arrow IPC stream, the Spark schema in its
    metadata, small batches joined (a copy of at most COALESCE_BYTES and one batch at a
    time); returns the number of rows."""
    import pyarrow as pa

    rows, writer = 0, None  # type: int, Any
    pending: List[Any] = []
    pending_rows = pending_bytes = 0

    def flush() -> None:
        nonlocal pending_rows, pending_bytes
        if not pending:
            return
        if len(pending) == 1:
            writer.write_batch(pending[0])
        elif hasattr(pa, "concat_batches"):  # pyarrow >= 19
            writer.write_batch(pa.concat_batches(pending))
        else:
            writer.write_table(pa.Table.from_batches(pending).combine_chunks())
        pending.clear()
        pending_rows = pending_bytes = 0

    for batch in batches:
        if writer is None:
            meta = dict(batch.schema.metadata or {})
            meta[SPARK_SCHEMA_KEY] = spark_schema_json.encode("utf-8")
            writer = pa.ipc.new_stream(sink, batch.schema.with_metadata(meta))
        if batch.num_rows:
            pending.append(batch)
            pending_rows += batch.num_rows
            pending_bytes += batch.nbytes
            rows += batch.num_rows
            if pending_rows >= COALESCE_ROWS or pending_bytes >= COALESCE_BYTES:
                flush()
    if writer is not None:
        flush()
        writer.close()
    return rows


def check_partitions(num_partitions: int, num_tasks: int, num_processes: int,
                     per_task: int) -> None:
    """The DataFrame's partitions must be the job's barrier tasks: PySpark's message,
    then what to change."""
    if num_partitions == num_tasks:
        return
    per = f" ({per_task} processes per task)" if per_task > 1 else ""
    raise ValueError(
        f"{WRONG_PARTITIONS} The DataFrame has {num_partitions} partitions, but "
        f"num_processes={num_processes}{per} makes {num_tasks} training tasks: repartition "
        f"it (df.repartition({num_tasks})) or set num_processes={num_partitions * per_task}.")


# ---- the hooks: driver (TorchDistributor.train_on_dataframe) and task (run_node) -------------

def dataframe_spec(dist: Any, df: Any) -> DataFrameSpec:
    """Checks a train_on_dataframe call on the driver; what every task needs to stage its
    partition (spec["dataframe"])."""
    if dist.local_mode:
        raise ValueError("TorchDistributor.train_on_dataframe requires setting "
                         "TorchDistributor.local_mode to False.")  # PySpark's message
    per_task = dist._gpus_per_task if dist.use_gpu else 1
    num_partitions = _num_partitions(df)
    if num_partitions is not None:  # else (Spark Connect) every task checks it
        check_partitions(num_partitions, dist.num_tasks, dist.num_processes, per_task)
    return {"schema_json": df.schema.json(), "num_tasks": dist.num_tasks,
            "num_processes": dist.num_processes, "per_task": per_task}


def _num_partitions(df: Any) -> Optional[int]:
    """The DataFrame's partition count when it is known without running anything, else
    None (the tasks check it then). Read from the physical plan, on classic and on Spark
    Connect (which has no RDD on the client). On classic, ``df.rdd.getNumPartitions()``
    is exact but executes the plan's shuffles and subqueries first under adaptive query
    execution (a DataFrame ending in ``repartition(k)``, the usual way to match the
    tasks, would be computed twice), so it is used only for plans that have none."""
    try:
        remote = not hasattr(df, "_jdf")
        if remote:
            text = df._explain_string(mode="simple")
        else:
            jvm = df.sparkSession._jvm
            text = jvm.PythonSQLUtils.explainString(df._jdf.queryExecution(), "simple")
    except Exception:
        return None
    n = plan_partitions(text)
    if n is None and not remote and not re.search(r"Exchange|Subquery", text):
        try:
            return df.rdd.getNumPartitions()
        except Exception:
            return None
    return n


# Physical operators that keep their child's partitions (one child, row by row or
# partition by partition), as `explain` prints them.
_NARROW = frozenset(("AdaptiveSparkPlan", "Project", "Filter", "Sample", "Generate",
                     "ColumnarToRow", "RowToColumnar", "MapInArrow", "MapInPandas",
                     "PythonMapInArrow", "ArrowEvalPython", "BatchEvalPython",
                     "SerializeFromObject", "DeserializeToObject", "MapPartitions",
                     "MapElements"))
_REPARTITIONED = re.compile(r"Exchange (?:RoundRobinPartitioning\((\d+)\)|"
                            r"hashpartitioning\(.*, (\d+)\)|Single(Partition)), "
                            r"REPARTITION_BY_NUM\b")
_RANGE = re.compile(r"Range \(.*, splits=(\d+)\)$")
_COALESCE = re.compile(r"Coalesce (\d+)$")


def plan_partitions(text: str) -> Optional[int]:
    """The partition count of a physical plan (``explain(mode="simple")``'s text) when
    its root is narrow operators over an explicit ``repartition(n)``/``repartition(n,
    cols)`` (an exchange adaptive execution never coalesces), a ``range`` with its
    partitions given, or a ``coalesce``; None otherwise (a scan, a join, an aggregate,
    a range repartitioning, which may make fewer partitions than asked)."""
    cap = None
    for line in text.split("== Physical Plan ==", 1)[-1].strip("\n").splitlines():
        if line.lstrip().startswith(":"):  # an operator with several children above
            return None
        op = re.sub(r"^[\s+-]*(?:\*\(\d+\) )?", "", line)
        m = _REPARTITIONED.match(op) or _RANGE.match(op)
        if m:
            n = next(g for g in m.groups() if g is not None)
            n = 1 if n == "Partition" else int(n)  # repartition(1): SinglePartition
            return n if cap is None else min(n, cap)
        m = _COALESCE.match(op)
        if m:
            cap = int(m.group(1)) if cap is None else min(cap, int(m.group(1)))
        elif op.split(" ", 1)[0] not in _NARROW:
            return None
    return None


def stage_task_input(spec: NodeSpec, iterator: Iterator[Any],
                     ctx: Any) -> Optional[StagedPartition]:
    """In a barrier or gang task: the DataFrame's partition staged for the node's processes
    (their environment in .env; close() when the node is done), or None for run(),
    whose input rows carry nothing."""
    frame = spec.get("dataframe")
    if frame is None:
        for _ in iterator:
            pass
        return None
    try:
        # A gang task (_gang.py) ran its JOIN: the gang formed of the run's nodes, and a
        # partition beyond them was refused there.
        count = frame["num_tasks"] if spec.get("gang") else len(ctx.getTaskInfos())
        check_partitions(count, frame["num_tasks"], frame["num_processes"], frame["per_task"])
        return stage(iterator, frame["schema_json"], ctx.partitionId())
    except ValueError as e:
        raise ValueError(f"{INPUT_ERROR}: {e}") from None



def train_on_dataframe(dist: Any, train_function: Any, df: Any, args: Any, kwargs: Any) -> Any:
    """TorchDistributor.train_on_dataframe: the checks, then distributed training with df
    as the barrier stage's input."""
    import re

    from pyspark import cloudpickle

    frame = dataframe_spec(dist, df)
    if isinstance(train_function, str):  # a script, as run() takes one
        if kwargs:
            raise ValueError("Running pytorch file does not support key-word type arguments.")
        fn_bytes, script_args = None, [str(a) for a in args]
    else:
        fn_bytes, script_args = cloudpickle.dumps((train_function, args, kwargs)), []
    try:
        return dist._run_distributed_training(train_function, fn_bytes, script_args,
                                              dataframe=(df, frame))
    except Exception as e:
        text = f"{e}\n{e.__cause__}"
        m = re.search(re.escape(INPUT_ERROR) + r": (.*)", text)
        if m is None:
            raise
        raise ValueError(m.group(1).strip()) from e
