"""torchspark.data on Arrow files written here with pyarrow (no Spark job): PySpark's
loader compared batch by batch with PySpark's own dataset on the same file, several
DataLoader workers, local-rank shares, the columnar API (dtypes, zero copy, shuffling,
wrap-around), clear errors, and a partition twice the size of a memory cap."""
import io
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from pyspark.ml.linalg import VectorUDT
from pyspark.ml.torch.data import _SparkPartitionTorchDataset
from pyspark.sql.types import (ArrayType, DoubleType, FloatType, IntegerType, LongType,
                               ShortType, StringType, StructField, StructType)
from torch.utils.data import DataLoader

from torchspark import data
from torchspark.task import _partition

SPARK_SCHEMA = StructType([
    StructField("id", LongType()), StructField("x", FloatType()), StructField("d", DoubleType()),
    StructField("i", IntegerType()), StructField("s", ShortType()),
    StructField("a", ArrayType(FloatType())), StructField("ai", ArrayType(IntegerType())),
    StructField("v", VectorUDT()),
])
VECTOR = pa.struct([pa.field("type", pa.int8(), nullable=False), ("size", pa.int32()),
                    ("indices", pa.list_(pa.field("element", pa.int32(), nullable=False))),
                    ("values", pa.list_(pa.field("element", pa.float64(), nullable=False)))])
DIM = 5


def vectors(ids, dense_only=False):
    """ML vectors as Spark ships them: odd ids dense, even ids sparse (unless dense_only)."""
    out = []
    for k in ids:
        k = int(k)
        if dense_only or k % 2:
            out.append({"type": 1, "size": None, "indices": None,
                        "values": [k + j / 10 for j in range(DIM)]})
        else:
            out.append({"type": 0, "size": DIM, "indices": [k % DIM, (k + 2) % DIM][: 1 + k % 3 // 2],
                        "values": [float(k), -1.0][: 1 + k % 3 // 2]})
    return pa.array(out, type=VECTOR)


def table(n, dense_only=False):
    ids = np.arange(n, dtype=np.int64)
    return pa.table({
        "id": ids, "x": (ids * 0.5).astype(np.float32), "d": ids * 0.25,
        "i": ids.astype(np.int32) * 3, "s": (ids % 100).astype(np.int16),
        "a": pa.array([[k, k + 0.5, -k] for k in ids.tolist()], pa.list_(pa.float32())),
        "ai": pa.array([[k, 2 * k] for k in ids.tolist()], pa.list_(pa.int32())),
        "v": vectors(ids, dense_only),
    })


def write(path, tbl, chunk=7, stream=True, spark_schema=SPARK_SCHEMA):
    schema = tbl.schema
    if spark_schema is not None:
        schema = schema.with_metadata({data.SPARK_SCHEMA_KEY: spark_schema.json()})
    with pa.OSFile(str(path), "wb") as f:
        w = (pa.ipc.new_stream if stream else pa.ipc.new_file)(f, schema)
        w.write_table(tbl.cast(schema), max_chunksize=chunk)
        w.close()
    return str(path)


@pytest.fixture
def partition(tmp_path, monkeypatch):
    """Points the readers at a file, as a barrier task does; env for local shares."""
    def use(tbl, local=(0, 1), **kw):
        path = write(tmp_path / f"p{len(os.listdir(tmp_path))}.arrow", tbl, **kw)
        monkeypatch.setenv(data.PARTITION_FILE_ENV, path)
        monkeypatch.setenv("LOCAL_RANK", str(local[0]))
        monkeypatch.setenv("LOCAL_WORLD_SIZE", str(local[1]))
        return path
    monkeypatch.delenv(data.STOCK_FILE_ENV, raising=False)
    return use


def stock_batches(path, num_samples, batch_size):
    """PySpark's own dataset, the reference. Its numpy rows are read-only, so torch's collate
    warns "The given NumPy array is not writable" (PySpark's warning, not ours: ours is
    test_no_warning_reaches_the_user); kept out of the test output here."""
    ds = _SparkPartitionTorchDataset(path, SPARK_SCHEMA, num_samples)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "The given NumPy array is not writable", UserWarning)
        return list(DataLoader(ds, batch_size, num_workers=0))


def assert_same_batches(ours, ref):
    assert len(ours) == len(ref)
    for b, (x, y) in enumerate(zip(ours, ref, strict=True)):
        assert len(x) == len(y)
        for c, (t, u) in enumerate(zip(x, y, strict=True)):
            assert t.dtype == u.dtype, (b, SPARK_SCHEMA[c].name, t.dtype, u.dtype)
            assert torch.equal(t, u), (b, SPARK_SCHEMA[c].name)


@pytest.mark.parametrize("num_samples", [10, 23, 61])
def test_stock_loader_matches_pyspark_dataset(partition, num_samples):
    """Same batches, values and dtypes as PySpark's dataset on the same stream file: fewer
    samples than rows, all of them, and wrapping around (rows over 7-row record batches)."""
    path = partition(table(23))
    ref = stock_batches(path, num_samples, 4)
    ours = list(data.get_spark_partition_data_loader(num_samples, 4, num_workers=0))
    assert_same_batches(ours, ref)
    assert len(data.get_spark_partition_data_loader(num_samples, 4, num_workers=0)) == len(ref)


NO_WARNING = textwrap.dedent("""
    import os, sys, warnings
    warnings.simplefilter("error")  # any warning, torch's "not writable" included, fails
    import pyarrow as pa
    from tests.e2e import test_dataframe_loader as t
    from torchspark import data
    d = sys.argv[1]
    os.environ.update(LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    tbl = t.table(50)
    for name, opts in [("stream", {}), ("file", {"stream": False})]:
        os.environ[data.PARTITION_FILE_ENV] = t.write(os.path.join(d, name), tbl, **opts)
        for workers in (0, 2):
            assert len(list(data.get_spark_partition_data_loader(101, 8, num_workers=workers)))
        for kw in ({}, {"shuffle": True}, {"num_samples": 77}):
            assert sum(1 for _ in data.partition_batches(8, **kw))
    path = os.path.join(d, "zstd")  # decompressed buffers live outside the mapping
    with pa.OSFile(path, "wb") as f:
        schema = tbl.schema.with_metadata({data.SPARK_SCHEMA_KEY: t.SPARK_SCHEMA.json()})
        w = pa.ipc.new_stream(f, schema, options=pa.ipc.IpcWriteOptions(compression="zstd"))
        w.write_table(tbl.cast(schema), max_chunksize=7)
        w.close()
    os.environ[data.PARTITION_FILE_ENV] = path
    assert len(list(data.get_spark_partition_data_loader(101, 8, num_workers=0)))
    assert sum(1 for _ in data.partition_batches(8, shuffle=True))
    print("no warning")
""")


def test_no_warning_reaches_the_user(tmp_path, monkeypatch):
    """Both loaders give torch writable memory: no warning (torch's "The given NumPy array
    is not writable" warns once per process, so a fresh one runs every path with warnings
    as errors): stream and file, DataLoader workers, shuffled, wrapped, decompressed."""
    monkeypatch.delenv(data.STOCK_FILE_ENV, raising=False)
    r = subprocess.run([sys.executable, "-c", NO_WARNING, str(tmp_path)],
                       cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and "no warning" in r.stdout, r.stderr[-3000:]
    assert "Warning" not in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize("workers", [1, 2])
def test_stock_loader_workers_keep_the_order(partition, workers):
    path = partition(table(50), stream=False)  # the Arrow file format reads the same
    loader = data.get_spark_partition_data_loader(101, 8, num_workers=workers)
    assert_same_batches(list(loader), stock_batches(write(path + ".s", table(50)), 101, 8))


def test_stock_loader_refuses_types_as_pyspark(partition):
    tbl = table(5).append_column("name", pa.array(list("abcde")))
    schema = StructType(SPARK_SCHEMA.fields + [StructField("name", StringType())])
    partition(tbl, spark_schema=schema)
    with pytest.raises(ValueError, match="SparkPartitionTorchDataset does not support loading "
                                         "data from field of type string."):
        data.get_spark_partition_data_loader(5, 2)


def test_stock_loader_reads_pyspark_files(tmp_path, monkeypatch):
    """Under PySpark's own distributor (its variables, its schema file), too."""
    path = write(tmp_path / "data.arrow", table(9), spark_schema=None)
    schema_file = tmp_path / "schema.json"
    schema_file.write_text(SPARK_SCHEMA.json())
    monkeypatch.delenv(data.PARTITION_FILE_ENV, raising=False)
    monkeypatch.setenv(data.STOCK_FILE_ENV, path)
    monkeypatch.setenv(data.STOCK_SCHEMA_ENV, str(schema_file))
    ours = list(data.get_spark_partition_data_loader(9, 4, num_workers=0))
    assert_same_batches(ours, stock_batches(path, 9, 4))


def test_local_ranks_read_disjoint_shares(partition, monkeypatch):
    seen = []
    for r in range(3):
        partition(table(31), local=(r, 3))
        ids = [i for b in data.partition_batches(4) for i in b["id"].tolist()]
        stock_ids = [i for b in data.get_spark_partition_data_loader(len(ids), 4, num_workers=2)
                     for i in b[0].tolist()]
        assert ids == stock_ids and ids == sorted(ids)
        assert data.partition_num_rows() == len(ids)
        seen += ids
    assert seen == list(range(31))
    partition(table(2), local=(0, 3))
    with pytest.raises(ValueError, match="has 2 rows, fewer than the 3 processes.*local rank 0"):
        data.partition_batches(4)


def test_columnar_types_shapes_and_zero_copy(partition):
    path = partition(table(40, dense_only=True).append_column("name", pa.array(
        [f"n{k}" for k in range(40)])).append_column("ok", pa.array([k % 3 == 0 for k in range(40)])),
        chunk=20)
    batches = list(data.partition_batches(10))
    assert len(batches) == 4
    b = batches[1]
    assert b["x"].dtype == torch.float32 and b["id"].dtype == torch.int64
    assert b["s"].dtype == torch.int16 and b["i"].dtype == torch.int32
    assert b["a"].shape == (10, 3) and b["a"].dtype == torch.float32
    assert b["v"].shape == (10, DIM) and b["v"].dtype == torch.float64
    assert b["ok"].dtype == torch.bool and b["ok"].tolist() == [k % 3 == 0 for k in range(10, 20)]
    assert b["name"] == [f"n{k}" for k in range(10, 20)]
    assert b["id"].tolist() == list(range(10, 20))
    assert torch.equal(b["a"][:, 2], -b["id"].float())
    assert b["v"][3].tolist() == [13 + j / 10 for j in range(DIM)]
    # Views of the mapped file: numeric columns, arrays and dense vectors.
    part = data._open(path)
    for name in ("id", "x", "a", "v"):
        assert part._lo <= b[name].data_ptr() < part._hi, name
    # PySpark's loader: columns already of PySpark's dtype travel from the worker as row
    # ranges and are views here too (a, v); converted ones are copies (x: float -> float64).
    path2 = partition(table(40, dense_only=True), chunk=20)
    part2 = data._open(path2)
    compat = list(data.get_spark_partition_data_loader(40, 10, num_workers=1))[1]
    a = compat[[f.name for f in SPARK_SCHEMA].index("a")]
    assert torch.equal(a, b["a"]) and part2._lo <= a.data_ptr() < part2._hi
    assert part2._lo <= compat[7].data_ptr() < part2._hi  # v
    assert not part2._lo <= compat[1].data_ptr() < part2._hi  # x
    # Writable, privately: the files and fresh mappings keep the original values.
    b["a"].mul_(0)
    a.mul_(0)
    for p in (path, path2):
        assert data.Partition(p).batches[0].column("a")[10].as_py() == [10.0, 10.5, -10.0]


def test_columnar_sparse_vectors_and_spans(partition):
    partition(table(23))  # 7-row record batches: most batches span two of them
    got = list(data.partition_batches(5, columns=["v", "id"]))
    assert [list(b) for b in got] == [["v", "id"]] * 5
    v = torch.cat([b["v"] for b in got])
    ref = torch.stack([b[7] for b in stock_batches(data._partition_path()[0], 23, 1)]).squeeze(1)
    assert torch.equal(v, ref)
    assert v[4].tolist() == [0, 0, 0, 0, 4.0]  # sparse: size 5, index 4 -> 4.0


def test_columnar_shuffle_drop_last_and_wrap(partition):
    partition(table(53))
    ids = [b["id"] for b in data.partition_batches(8, shuffle=True, seed=3)]
    flat = torch.cat(ids).tolist()
    assert sorted(flat) == list(range(53)) and flat != list(range(53))
    again = torch.cat([b["id"] for b in data.partition_batches(8, shuffle=True, seed=3)]).tolist()
    other = torch.cat([b["id"] for b in data.partition_batches(8, shuffle=True, seed=4)]).tolist()
    assert again == flat and other != flat
    b = next(data.partition_batches(8, shuffle=True, seed=3))
    assert torch.equal(b["a"][:, 0], b["id"].float()) and torch.equal(b["x"], b["id"] * 0.5)
    assert [len(b["id"]) for b in data.partition_batches(8, drop_last=True)] == [8] * 6
    wrapped = [b["id"].tolist() for b in data.partition_batches(8, num_samples=60)]
    assert sum(wrapped, []) == list(range(53)) + list(range(7))


def test_columnar_in_order_is_every_row_once(partition):
    """In order, a batch inside one record batch is a plain view; one that spans record
    batches, wraps around or meets sparse vectors is assembled: either way, sample s of a
    share [lo, hi) is row lo + s % (hi - lo), with every column's values of that row."""
    for chunk, n, bs, samples, local in [(7, 23, 5, None, (0, 1)), (20, 61, 4, 130, (1, 2)),
                                         (16, 64, 8, 64, (0, 1)), (50, 45, 64, None, (2, 3))]:
        path = partition(table(n), chunk=chunk, local=local)
        part = data._open(path)
        lo, hi = n * local[0] // local[1], n * (local[0] + 1) // local[1]
        total = hi - lo if samples is None else samples
        for cols in (None, ["id", "x", "a"]):  # sparse vectors in every record batch, or none
            got = list(data.partition_batches(bs, columns=cols, num_samples=samples))
            assert [len(b["id"]) for b in got] == [min(bs, total - k) for k in range(0, total, bs)]
            ids = torch.cat([b["id"] for b in got])
            assert ids.tolist() == [lo + s % (hi - lo) for s in range(total)], (chunk, n, bs)
            for col in ["x", "a"] + (["v"] if cols is None else []):
                one = [b[col] for b in data.partition_batches(1, columns=cols)]
                assert torch.equal(torch.cat([b[col] for b in got]),
                                   torch.cat(one * -(-total // (hi - lo)))[:total]), col
            inside = [b for b in got if part.locate(int(b["id"][0])) ==
                      part.locate(int(b["id"][-1])) and b["id"][-1] >= b["id"][0]]
            assert inside and all(part._lo <= b["x"].data_ptr() < part._hi for b in inside)


def test_columnar_in_dataloader_workers(partition):
    partition(table(45))

    class Rows(torch.utils.data.IterableDataset):
        def __iter__(self):
            return data.partition_batches(4, columns=["id", "a"])

    got = [b["id"].tolist() for b in DataLoader(Rows(), batch_size=None, num_workers=2)]
    assert got == [b["id"].tolist() for b in data.partition_batches(4)]


def test_clear_errors(partition, monkeypatch):
    partition(pa.table({"t": pa.array([1, 2], pa.timestamp("us")), "x": [1.0, 2.0]}),
              spark_schema=None)
    with pytest.raises(TypeError, match=r"column 't' has Arrow type timestamp\[us\].*cast"):
        data.partition_batches(2)
    assert next(data.partition_batches(2, columns=["x"]))["x"].tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="no column 'y'; its columns are t, x"):
        data.partition_batches(2, columns=["y"])
    partition(pa.table({"x": [1.0, None]}), spark_schema=None)
    with pytest.raises(ValueError, match=r"column 'x' has 1 null value\(s\).*na.fill"):
        data.partition_batches(2)
    partition(pa.table({"a": pa.array([[1.0, 2.0], [3.0]])}), spark_schema=None)
    with pytest.raises(ValueError, match=r"rows of column 'a' have different lengths \(2 and 1\)"):
        data.partition_batches(2)
    with pytest.raises(ValueError, match="batch_size must be a positive integer"):
        data.partition_batches(0)
    monkeypatch.delenv(data.PARTITION_FILE_ENV)
    with pytest.raises(RuntimeError, match="inside the train function given to "
                                           "TorchDistributor.train_on_dataframe"):
        data.get_spark_partition_data_loader(1, 1)


STAGED_READER = textwrap.dedent("""
    from pyspark.ml.torch.distributor import _get_spark_partition_data_loader
    from torchspark import data
    ours = [i for b in data.partition_batches(6) for i in b["id"].tolist()]
    stock = [i for b in _get_spark_partition_data_loader(20, 6, num_workers=0)
             for i in b[0].tolist()]
    print(ours == stock == list(range(20)), flush=True)
""")


def test_stage_writes_an_unnamed_stream_for_both_loaders(tmp_path, monkeypatch):
    """The task's file has no name in the local dir; a child process (as a training
    worker) reads it through the variables, with torchspark's and with PySpark's loader."""
    fds_before = len(os.listdir("/proc/self/fd"))
    batches = table(20).to_batches(max_chunksize=7)
    with _partition.stage(iter(batches), SPARK_SCHEMA.json(), directory=str(tmp_path)) as sp:
        assert os.listdir(tmp_path) == []
        assert os.fstat(sp.data_fd).st_nlink == 0 and sp.num_rows == 20
        env = dict(os.environ, **sp.env)
        env.pop("LOCAL_WORLD_SIZE", None)
        out = subprocess.run([sys.executable, "-c", STAGED_READER], env=env,
                             capture_output=True, text=True, timeout=120)
        assert out.stdout.strip() == "True", out.stderr
    assert len(os.listdir("/proc/self/fd")) == fds_before
    # Spark's small record batches are joined when written (fewer for the readers to set up).
    with _partition.stage(iter(batches), SPARK_SCHEMA.json(), directory=str(tmp_path)) as sp:
        part = data.Partition(sp.env[data.PARTITION_FILE_ENV])
        assert [b.num_rows for b in part.batches] == [20]
        assert part.batches[0].column("id").to_pylist() == list(range(20))
    monkeypatch.setattr(_partition, "COALESCE_ROWS", 10)
    for old_pyarrow in (False, True):  # with pyarrow's concat_batches, then without (< 19)
        if old_pyarrow:
            monkeypatch.delattr(pa, "concat_batches")
        with _partition.stage(iter(batches), SPARK_SCHEMA.json(), directory=str(tmp_path)) as sp:
            part = data.Partition(sp.env[data.PARTITION_FILE_ENV])
            assert [b.num_rows for b in part.batches] == [14, 6]
            assert [i for b in part.batches for i in b.column("id").to_pylist()] == list(range(20))
            del part
    empty = pa.record_batch([pa.array([], pa.int64())], names=["id"])
    for it in ([], [empty]):
        with pytest.raises(ValueError, match="^Empty Spark partition is not allowed in "
                                             "TorchDistributor.train_on_dataframe.$"):
            _partition.stage(iter(it), SPARK_SCHEMA.json(), directory=str(tmp_path))
    assert len(os.listdir("/proc/self/fd")) == fds_before and os.listdir(tmp_path) == []


def test_local_dirs_follow_spark(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    monkeypatch.setenv("SPARK_LOCAL_DIRS", f"{a},{tmp_path / 'missing'},{b}")
    assert _partition.local_dirs() == [str(a), str(b)]
    monkeypatch.delenv("SPARK_LOCAL_DIRS")
    monkeypatch.setenv("SPARK_EXECUTOR_DIRS", f"{b}{os.pathsep}{a}")
    assert _partition.local_dirs() == [str(b), str(a)]


BIG_READER = textwrap.dedent("""
    import os, sys, threading, time
    CAP = int(sys.argv[1])
    peak = [0]

    def anon_kib():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1])

    def watch():  # the cap on this process's own memory (file pages are the page cache's)
        while True:
            peak[0] = max(peak[0], anon_kib())
            if peak[0] > CAP // 1024:
                print(f"over the cap: {peak[0]} KiB", flush=True)
                os._exit(3)
            time.sleep(0.002)

    threading.Thread(target=watch, daemon=True).start()
    import torch
    from torchspark import data
    from torchspark.task import _partition
    rows = ids = total = 0
    model = torch.nn.Linear(256, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for b in data.partition_batches(8192, shuffle=True):  # a training step on every batch
        rows += len(b["id"])
        ids += int(b["id"].sum())
        total += float(b["a"][:, -1].sum())  # a float in every 1 KiB row: every page
        loss = torch.nn.functional.mse_loss(model(b["a"]).squeeze(1), b["id"].float() % 2)
        opt.zero_grad()
        loss.backward()
        opt.step()
    n = 0
    for i, a in data.get_spark_partition_data_loader(rows, 8192, num_workers=0):
        n += len(i)
    print(rows, n, ids, total, peak[0], flush=True)
""")


class _SparseFile(io.RawIOBase):
    """A file sink that leaves runs of zeros of 1 MiB or more as holes: a 2 GiB partition
    written in a second instead of the disk's time; its reader still maps and touches
    every page of it."""

    def __init__(self, path):
        self.f = open(path, "wb")

    def writable(self):
        return True

    def write(self, b):
        m = memoryview(b).cast("B")
        if len(m) >= 1 << 20 and not np.frombuffer(m, np.uint8).any():
            self.f.seek(len(m), os.SEEK_CUR)
        else:
            self.f.write(m)
        return len(m)

    def tell(self):
        return self.f.tell()

    def close(self):
        if not self.f.closed:
            self.f.truncate()
            self.f.close()
        super().close()


def test_partition_twice_the_memory_cap(tmp_path):
    """A 2 GiB partition trained on (a linear model, shuffled batches) and read through
    PySpark's loader by a process whose anonymous memory is capped at 1 GiB (a watchdog
    ends it above that): nothing is materialised."""
    width, rows_per_batch, nbatches = 256, 1 << 16, 32  # 1 KiB + 8 B a row, 2.16 GB in all
    arrays = pa.FixedSizeListArray.from_arrays(
        pa.array(np.zeros(rows_per_batch * width, dtype=np.float32)), width)
    schema = pa.schema([("id", pa.int64()), ("a", arrays.type)])
    path = tmp_path / "big.arrow"
    try:
        sink = pa.PythonFile(_SparseFile(str(path)), mode="w")
        with pa.ipc.new_stream(sink, schema) as w:
            for k in range(nbatches):
                ids = pa.array(np.arange(k * rows_per_batch, (k + 1) * rows_per_batch))
                w.write_batch(pa.record_batch([ids, arrays], schema=schema))
        sink.close()
        assert path.stat().st_size > 2 << 30
        env = dict(os.environ, **{data.PARTITION_FILE_ENV: str(path)})
        env.pop("LOCAL_WORLD_SIZE", None)
        out = subprocess.run([sys.executable, "-c", BIG_READER, str(1 << 30)], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stdout + out.stderr
        rows, n, ids, total, peak_kib = out.stdout.split()
        n_rows = rows_per_batch * nbatches
        assert int(rows) == int(n) == n_rows
        assert int(ids) == n_rows * (n_rows - 1) // 2 and float(total) == 0.0
        print(f"read {rows} rows, peak anonymous memory {int(peak_kib) >> 10} MiB")
        assert int(peak_kib) < 1 << 20
    finally:
        path.unlink(missing_ok=True)


PLANS = {  # explain(mode="simple") as Spark 4.3 prints it -> the partitions, None: unknown
    3: """== Physical Plan ==
AdaptiveSparkPlan isFinalPlan=false
+- Project [id#0L, (cast(x#1 as double) + 1.0) AS y#9]
   +- Exchange RoundRobinPartitioning(3), REPARTITION_BY_NUM, [plan_id=43]
      +- Project [id#0L, cast(id#0L as float) AS x#1]
         +- Filter (id#0L > 1)
            +- Range (0, 10, step=1, splits=2)""",
    5: """== Physical Plan ==
AdaptiveSparkPlan isFinalPlan=false
+- MapInArrow <lambda>(id#0L, x#1)#20, [id#21L, x#22], false
   +- Sample 0.0, 0.5, false, 8130424032598127184
      +- Exchange hashpartitioning(id#0L, 5), REPARTITION_BY_NUM, [plan_id=60]
         +- FileScan parquet [id#30L] Batched: true, Location: InMemoryFileIndex(1 paths)""",
    2: """== Physical Plan ==
*(1) Project [id#0L, x#1, UDF(cast(array(x#1) as array<double>)) AS v#2]
+- *(1) Project [id#0L, cast(id#0L as float) AS x#1]
   +- *(1) Range (0, 10, step=1, splits=2)""",
    1: ["""== Physical Plan ==
Coalesce 1
+- *(1) Range (0, 10, step=1, splits=2)""", """== Physical Plan ==
AdaptiveSparkPlan isFinalPlan=false
+- Exchange SinglePartition, REPARTITION_BY_NUM, [plan_id=9]
   +- Range (0, 10, step=1, splits=2)"""],
    None: ["""== Physical Plan ==
AdaptiveSparkPlan isFinalPlan=false
+- Exchange rangepartitioning(id#0L ASC NULLS FIRST, 4), REPARTITION_BY_NUM, [plan_id=76]
   +- Range (0, 10, step=1, splits=2)""", """== Physical Plan ==
AdaptiveSparkPlan isFinalPlan=false
+- HashAggregate(keys=[], functions=[sum(id#0L)])
   +- Exchange SinglePartition, ENSURE_REQUIREMENTS, [plan_id=106]
      +- Range (0, 10, step=1, splits=2)""", """== Physical Plan ==
*(1) Union
:- *(1) Range (0, 10, step=1, splits=2)
+- *(1) Range (0, 10, step=1, splits=2)""", """== Physical Plan ==
*(1) ColumnarToRow
+- FileScan parquet [id#31L] Batched: true, Location: InMemoryFileIndex(1 paths)""",
        """== Physical Plan ==
Coalesce 4
+- Exchange hashpartitioning(id#0L, 200), ENSURE_REQUIREMENTS, [plan_id=6]
   +- Range (0, 10, step=1, splits=2)"""],
}


def test_partition_count_from_the_plan():
    """What the driver can tell from the physical plan without running it: explicit
    repartitions and ranges under narrow operators, coalesce; nothing else."""
    for n, plans in PLANS.items():
        for text in plans if isinstance(plans, list) else [plans]:
            assert _partition.plan_partitions(text) == n, text
