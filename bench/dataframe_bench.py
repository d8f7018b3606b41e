"""Reading a Spark partition into tensors: PySpark's loader against torchspark's two, side
by side in one run on the same Arrow files, medians of N runs (alternating).

    .venv/bin/python -m bench.dataframe_bench [--runs 5] [--batch-size 1024] [--workers 1]
        [--cases a,b,c] [--loaders stock,compat,columnar] [--scale 1.0]

Cases, each an Arrow IPC stream written as a barrier task writes it (torchspark's
_partition.write_stream over the 10,000-row record batches Spark hands a task; the Spark
schema in its metadata, PySpark's schema file beside it):
  (a) 4 float columns, (b) one array<float> of 128, (c) an ML dense vector of 128.
Loaders, each in a fresh process (its own imports, page cache already warm):
  stock      pyspark.ml.torch.distributor._get_spark_partition_data_loader
  compat     torchspark.get_spark_partition_data_loader (same arguments, same dtypes)
  columnar   torchspark.partition_batches (Arrow dtypes, zero-copy views)
Every batch is consumed the same way (each tensor summed: every value read once), so a
zero-copy view is not counted as free. rows/s = rows delivered / seconds from creating the
loader to its last batch; MB/s = the same rows' payload bytes in the Arrow file (4x4 B,
128x4 B, 128x8 B a row) per second. Memory, sampled every 50 ms: the loading process's
peak anonymous RSS (RssAnon: its own memory; the mapped file's pages are the page
cache's) and its largest DataLoader worker's peak private dirty memory (smaps_rollup:
what the worker itself wrote; its forked copy of the parent and the file's clean pages
are not its own). CPU seconds (the process and its workers) are reported beside wall
time: on a shared machine they show the work, the wall time shows the waiting too.
The stock loader reads the first rows of the file (it is slow); the others the whole file.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time

from bench import harness

CASES = {  # name: (rows in the file, rows the stock loader reads, payload bytes a row)
    "a_4_floats": (4_000_000, 200_000, 16),
    "b_array_float_128": (1_000_000, 50_000, 512),
    "c_dense_vector_128": (500_000, 20_000, 1024),
}
LOADERS = ("stock", "compat", "columnar")


def write_case(directory, case, rows):
    import numpy as np
    import pyarrow as pa
    from torchspark.task._partition import write_stream
    from pyspark.ml.linalg import VectorUDT
    from pyspark.sql.types import ArrayType, FloatType, StructField, StructType

    rng = np.random.default_rng(0)
    chunk = 10_000  # spark.sql.execution.arrow.maxRecordsPerBatch's default
    if case == "a_4_floats":
        spark = StructType([StructField(f"f{k}", FloatType()) for k in range(4)])
    elif case == "b_array_float_128":
        spark = StructType([StructField("a", ArrayType(FloatType()))])
    else:
        spark = StructType([StructField("v", VectorUDT())])

    def batch(n):
        if case == "a_4_floats":
            return [pa.array(rng.random(n, dtype=np.float32)) for _ in range(4)]
        if case == "b_array_float_128":
            return [pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * 128),
                                             pa.array(rng.random(n * 128, dtype=np.float32)))]
        values = pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * 128),
                                          pa.array(rng.random(n * 128)))
        return [pa.StructArray.from_arrays(
            [pa.array(np.ones(n, np.int8)), pa.nulls(n, pa.int32()),
             pa.nulls(n, pa.list_(pa.int32())), values],
            names=["type", "size", "indices", "values"])]

    first = batch(1)
    schema = pa.schema([pa.field(f.name, a.type) for f, a in zip(spark.fields, first, strict=True)])
    path = os.path.join(directory, f"{case}.arrow")
    with pa.OSFile(path, "wb") as f:  # as a barrier task writes what mapInArrow hands it
        write_stream(f, (pa.record_batch(batch(min(chunk, rows - start)), schema=schema)
                         for start in range(0, rows, chunk)), spark.json())
    with open(os.path.join(directory, f"{case}.schema.json"), "w", encoding="utf-8") as f:
        f.write(spark.json())
    with open(path, "rb") as f:  # warm the page cache: every loader starts from it
        while f.read(64 << 20):
            pass
    return path


def _status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key):
                return int(line.split()[1])
    return 0


def _private_dirty_kib(pid):
    """Memory the process wrote itself (clean pages of the mapped file are page cache)."""
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1])
    return 0


class MemorySampler:
    """Peak RssAnon of this process and peak private dirty memory of each of its children."""

    def __init__(self, period=0.05):
        self.self_kib, self.child_kib = 0, {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period,), daemon=True)
        self._thread.start()

    def _sample(self):
        self.self_kib = max(self.self_kib, _status_kib("self", "RssAnon:"))
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/children") as f:
                    pids = f.read().split()
                for pid in pids:
                    self.child_kib[pid] = max(self.child_kib.get(pid, 0), _private_dirty_kib(pid))
            except OSError:
                pass

    def _run(self, period):
        while not self._stop.wait(period):
            self._sample()

    def stop(self):
        self._stop.set()
        self._thread.join()
        self._sample()
        return self.self_kib / 1024, max(self.child_kib.values(), default=0) / 1024


def child(loader, path, rows, batch_size, workers):
    """One measurement, in this (fresh) process; prints a JSON line."""
    os.environ["SPARK_PARTITION_ARROW_DATA_FILE"] = path
    os.environ["SPARK_DATAFRAME_SCHEMA_FILE"] = path[: -len(".arrow")] + ".schema.json"
    os.environ["TORCHSPARK_PARTITION_FILE"] = path
    import torch

    torch.set_num_threads(1)
    from pyspark.ml.torch.distributor import _get_spark_partition_data_loader

    import torchspark

    def tensors(batch):
        return batch.values() if isinstance(batch, dict) else batch

    got = 0
    checksum = 0.0
    memory = MemorySampler()
    t, cpu = time.perf_counter(), time.process_time()
    if loader == "stock":
        it = _get_spark_partition_data_loader(rows, batch_size, num_workers=workers)
    elif loader == "compat":
        it = torchspark.get_spark_partition_data_loader(rows, batch_size, num_workers=workers)
    else:
        it = torchspark.partition_batches(batch_size, num_samples=rows)
    for batch in it:
        ts = list(tensors(batch))
        got += len(ts[0])
        for x in ts:
            checksum += float(x.sum())
    secs, cpu = time.perf_counter() - t, time.process_time() - cpu
    anon, worker = memory.stop()
    del it  # DataLoader workers end (their CPU time is in RUSAGE_CHILDREN once reaped)
    import gc
    import resource

    gc.collect()
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(json.dumps({"secs": secs, "cpu_s": cpu + kids.ru_utime + kids.ru_stime, "rows": got,
                      "checksum": checksum, "anon_mib": anon, "worker_dirty_mib": worker}))


def measure(loader, path, rows, args):
    cmd = [sys.executable, "-m", "bench.dataframe_bench", "--child", loader, path, str(rows),
           str(args.batch_size), str(args.workers)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=harness.ROOT)
    if out.returncode != 0:
        raise SystemExit(f"{loader} on {path} failed:\n{out.stderr[-3000:]}")
    res = json.loads(out.stdout.strip().splitlines()[-1])
    if res["rows"] != rows:
        raise SystemExit(f"{loader} on {path} delivered {res['rows']} rows, not {rows}")
    return res


def main():
    p = harness.cli(__doc__, runs=5, quick={"scale": 0.01})
    p.add_argument("--batch-size", type=int, default=1024)
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers (PySpark's default: 1)")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every row count")
    p.add_argument("--cases", default="a,b,c", help="which cases, by letter (default: a,b,c)")
    p.add_argument("--loaders", default=",".join(LOADERS),
                   help=f"which loaders (default: {','.join(LOADERS)}); the vs-stock ratios "
                        "need stock")
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = harness.parse(p)
    loaders = [x for x in LOADERS if x in args.loaders.split(",")]
    cases = {k: v for k, v in CASES.items() if k[0] in args.cases.split(",")}
    if not loaders or not cases or set(args.loaders.split(",")) - set(LOADERS):
        p.error(f"--loaders takes some of {','.join(LOADERS)}; --cases some of a,b,c")
    if args.child:
        loader, path, rows, bs, workers = args.child
        return child(loader, path, int(rows), int(bs), int(workers))
    run = harness.Run("dataframe_bench", args)
    results = []
    with tempfile.TemporaryDirectory(prefix="tsp-dfbench-", dir="/var/tmp") as d:
        for case, (rows, stock_rows, row_bytes) in cases.items():
            rows, stock_rows = int(rows * args.scale), int(stock_rows * args.scale)
            path = write_case(d, case, rows)
            runs = {name: [] for name in loaders}
            for _ in range(args.runs):
                for name in loaders:
                    runs[name].append(measure(name, path, stock_rows if name == "stock" else rows, args))
            row = {"case": case, "runs": args.runs, "batch_size": args.batch_size,
                   "workers": args.workers}
            for name, rs in runs.items():
                n = rs[0]["rows"]
                secs = run.figure(f"{case}, {name}, wall", [r["secs"] for r in rs], "s")["median"]
                cpu = run.figure(f"{case}, {name}, CPU", [r["cpu_s"] for r in rs], "s")["median"]
                run.figure(f"{case}, {name}, rows/s", [n / r["secs"] for r in rs], "rows/s", 0)
                row[name] = {"rows": n, "median_s": round(secs, 4), "median_cpu_s": round(cpu, 4),
                             "rows_per_s": round(n / secs),
                             "mb_per_s": round(n * row_bytes / secs / 1e6, 1),
                             "rows_per_cpu_s": round(n / cpu),
                             "mb_per_cpu_s": round(n * row_bytes / cpu / 1e6, 1),
                             "anon_mib": round(harness.median(r["anon_mib"] for r in rs)),
                             "worker_dirty_mib": round(harness.median(r["worker_dirty_mib"] for r in rs))}
            for name in (n for n in loaders if n != "stock" and "stock" in loaders):
                run.comparisons.append({"figure": f"{case}, rows/s", "unit": "rows/s", "ours": name,
                                        "stock": "stock", "ours_median": row[name]["rows_per_s"],
                                        "stock_median": row["stock"]["rows_per_s"],
                                        "ratio": round(row[name]["rows_per_s"] / row["stock"]["rows_per_s"], 2)})
                row[f"{name}_vs_stock"] = round(row[name]["rows_per_s"] / row["stock"]["rows_per_s"], 1)
                row[f"{name}_vs_stock_cpu"] = round(
                    row[name]["rows_per_cpu_s"] / row["stock"]["rows_per_cpu_s"], 1)
            print(json.dumps(row), flush=True)
            results.append(row)
            os.unlink(path)
    run.results = {"rows": results}
    run.finish()
    return results


if __name__ == "__main__":
    main()
