"""torchspark.TorchDistributor: a drop-in for pyspark.ml.torch.distributor.TorchDistributor.

Same constructor, run() semantics, input_params, logger name, log messages and
validation errors as PySpark's (Spark 4.x). Underneath: the torchspark-run agent instead
of torchrun, a race-free master port, the interface that reaches the other nodes, one
process per GPU of a task, rank-prefixed logs and rank 0's result over the native
channel, and one exception naming the root cause when any rank fails (script mode too).
"""
from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
import shutil
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from pyspark import cloudpickle
from pyspark.sql import SparkSession

from torchspark import (_boot, _doctor, _job, _native, _rendezvous, _report,
                        _restart, _ship, _task, _timing)
from torchspark import _conf
from torchspark import _progress, _report_rows
from torchspark._pump import _LogPump
from torchspark._report import TorchDistributorError
from torchspark._spec import NodeSpec, ScriptFile, ShipSpec

__all__ = ["TorchDistributor", "TorchDistributorError"]

_TAIL_FROM_SERVER = 20


def _get_conf(spark: SparkSession, key: str, default_value: str) -> str:
    value = spark.conf.get(key, default_value)
    assert value is not None
    return value


def _get_logger(name: str) -> logging.Logger:
    """PySpark's logger setup: INFO, and a stderr handler unless logging is configured."""
    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    if not logger.handlers and not logging.getLogger().handlers:
        logger.addHandler(logging.StreamHandler(sys.stderr))
    return logger


def _get_resources(session: SparkSession) -> Dict[str, Any]:
    try:
        return session.sparkContext.resources
    except Exception:
        return session._client._resources()  # type: ignore[attr-defined]


class TorchDistributor:
    """Runs PyTorch distributed training on Spark; see PySpark's TorchDistributor.

    Parameters
    ----------
    num_processes : int, optional
        Total number of training processes (1 by default).
    local_mode : bool, optional
        True: train on the driver (one agent with ``--standalone``); False: one barrier
        task per node on the executors.
    use_gpu : bool, optional
        Whether training uses GPUs; a distributed task holding k GPUs runs k processes.
    on_report : callable, optional (torchspark extension, keyword only)
        Called on the driver, from one thread, with each ``torchspark.report()`` of any
        rank as a ``torchspark.Report`` (rank, step, time, metrics, received), in order per
        rank, while the run goes on. ``distributor.reports`` holds them all after run().
    progress : bool, optional (torchspark extension, keyword only)
        One live progress line on the driver's stderr (default: conf
        ``spark.torchspark.progress``, true).
    max_restarts : int, optional
        A torchspark extension (keyword only): how many times a failed distributed run is
        submitted again (default: spark.torchspark.job.maxRestarts, else 0); see
        docs/distributor.md, "Restarts".
    min_nodes : int, optional
        A torchspark extension (keyword only), with max_restarts: the fewest nodes (barrier
        tasks) a restarted attempt may run on (default: spark.torchspark.job.minNodes,
        else all of them). When fewer executors than the run's nodes are left but at least
        min_nodes, the next attempt starts at once on those, with a smaller world size,
        instead of waiting for a replacement executor (elastic, as torchrun's
        ``--nnodes=MIN:MAX``); ``distributor.attempts`` records each attempt. Under Spark
        Connect, whose client cannot see the executors, the next attempt leaves out the
        node whose executor was lost, decommissioned or went silent (docs/distributor.md,
        "Limits").
    hang_timeout : float or str, optional
        A torchspark extension (keyword only): the hang doctor. When no rank has printed a
        line or reported for this long (seconds, or a Spark duration such as ``"30min"``;
        default: conf ``spark.torchspark.hangTimeout``, unset: off), the driver asks every
        rank for its Python stacks and prints one line naming the stuck rank and where it
        is (docs/distributor.md, "The hang doctor").
    hang_action : str, optional
        What the hang doctor does after naming the stuck rank: ``"report"`` (default; the
        run goes on) or ``"cancel"`` (the run is stopped and run() raises a
        TorchDistributorError holding every rank's stacks); conf
        ``spark.torchspark.hangAction``.
    """

    _TORCH_SSL_CONF = "pytorch.spark.distributor.ignoreSsl"

    def __init__(self, num_processes: int = 1, local_mode: bool = True, use_gpu: bool = True,
                 _ssl_conf: str = _TORCH_SSL_CONF, *,
                 on_report: Optional[Callable[[Any], Any]] = None,
                 progress: Optional[bool] = None,
                 max_restarts: Optional[int] = None,
                 min_nodes: Optional[int] = None,
                 hang_timeout: Optional[Union[float, str]] = None,
                 hang_action: Optional[str] = None) -> None:
        from torchspark import _spark

        _spark.check()  # pyspark 3.5+: a clear error naming what an older one lacks
        from pyspark.sql.utils import is_remote

        self.is_remote = is_remote()
        self.spark = SparkSession.active()
        master = _get_conf(self.spark, "spark.master", "")
        self.is_spark_local_master = master == "local" or master.startswith("local[")
        self.logger = _get_logger(self.__class__.__name__)
        self.num_processes = num_processes
        self.local_mode = local_mode
        self.use_gpu = use_gpu
        self._gpus_per_task = 1
        self.num_tasks = self._get_num_tasks()
        self.ssl_conf = _ssl_conf
        self._validate_input_params()
        self.input_params = self._create_input_params()
        # Every spark.torchspark.* setting and the keyword arguments standing for them, read
        # by the C core's one key table (_conf.py, docs/protocol.md 9).
        settings = _conf.read(self.spark, {
            "progress": ("progress", progress), "job.maxRestarts": ("max_restarts", max_restarts),
            "job.minNodes": ("min_nodes", min_nodes), "hangTimeout": ("hang_timeout", hang_timeout),
            "hangAction": ("hang_action", hang_action)}, self.logger)
        _progress.configure(self, on_report, settings["progress"])  # torchspark.report()
        self.max_restarts = settings["job.maxRestarts"]
        self.min_nodes = _restart.min_nodes(settings["job.minNodes"], self.num_tasks)
        # One dict per attempt of the last distributed run() with restarts (_restart.run).
        self.attempts: List[Dict[str, Any]] = []
        self._failure_times: Dict[str, Any] = {}  # the last job's (_job.Outcome)
        _doctor.configure(self, settings["hangTimeout"], settings["hangAction"])  # _doctor.py

    def _create_input_params(self) -> Dict[str, Any]:
        return {"num_processes": self.num_processes, "local_mode": self.local_mode,
                "use_gpu": self.use_gpu, "num_tasks": self.num_tasks}

    def _get_num_tasks(self) -> int:
        if self.use_gpu:
            if not self.local_mode:
                key = "spark.task.resource.gpu.amount"
                raw = _get_conf(self.spark, key, "0")
                try:
                    amount = float(raw)
                except ValueError:
                    raise RuntimeError(f"'{key}' is {raw!r}, not a number: set it to the "
                                       "whole number of GPUs each training task uses") from None
                if 0 < amount < 1 or amount != int(amount):
                    # PySpark crashes here with a bare int() error; say what is wrong.
                    raise RuntimeError(
                        f"'{key}' is {raw}, but TorchDistributor needs whole GPUs per task "
                        "(several tasks sharing one GPU cannot each run a training process "
                        f"on it): set '{key}' to 1 or another whole number")
                task_gpu_amount = int(amount)
                if task_gpu_amount < 1:
                    raise RuntimeError(f"'{key}' was unset, so gpu usage is unavailable.")
                if task_gpu_amount > 1 and self.num_processes % task_gpu_amount != 0:
                    raise RuntimeError(
                        f"TorchDistributor 'num_processes' value ({self.num_processes}) "
                        "must be a multiple of 'spark.task.resource.gpu.amount' "
                        f"({task_gpu_amount}) value.")
                self._gpus_per_task = task_gpu_amount
                return self.num_processes // task_gpu_amount
            key = "spark.driver.resource.gpu.amount"
            if "gpu" not in _get_resources(self.spark):
                raise RuntimeError("GPUs were unable to be found on the driver.")
            num_available_gpus = int(_get_conf(self.spark, key, "0"))
            if num_available_gpus == 0:
                raise RuntimeError("GPU resources were not configured properly on the driver.")
            if self.num_processes > num_available_gpus:
                self.logger.warning(
                    "'num_processes' cannot be set to a value greater than the number of "
                    f"available GPUs on the driver, which is {num_available_gpus}. "
                    "'num_processes' was reset to be equal to the number of available GPUs.",
                )
                self.num_processes = num_available_gpus
        return self.num_processes

    def _validate_input_params(self) -> None:
        if self.num_processes <= 0:
            from torchspark import _spark

            raise ValueError(_spark.NUM_PROCESSES_ERROR[_spark.version() >= (4, 0)])

    def _check_encryption(self) -> None:
        """Stock refuses a cluster with spark.ssl.enabled unless its ignoreSsl key is set,
        then sends the weights in clear; torchspark's own channel is TLS 1.3 keyed by the
        run's secret, so it goes on wherever Spark encrypts, and logs the library's one line
        (a WARNING where Spark secures its traffic: torch's own data plane is not encrypted)."""
        decision = _conf.encryption(self.spark, self.ssl_conf)
        self.logger.log(logging.getLevelName(decision["level"]), decision["message"])
        if not decision["proceed"]:
            raise RuntimeError(decision["message"])

    # ---- run ---------------------------------------------------------------------------

    def run(self, train_object: Union[Callable, str], *args: Any, **kwargs: Any) -> Optional[Any]:
        """Runs train_object (a function, or the path of a script) on num_processes ranks.

        A function's return value on rank 0 is returned; a script returns None and gets
        its args as strings (keyword arguments are refused). If any rank fails,
        :class:`TorchDistributorError` names the root cause.
        """
        if isinstance(train_object, str):
            if kwargs:
                raise ValueError("Running pytorch file does not support key-word type arguments.")
            fn_bytes = None
            script_args = [str(a) for a in args]
        else:
            fn_bytes = cloudpickle.dumps((train_object, args, kwargs))
            script_args = []
        clock = self._clock = _timing.Clock(_timing.enabled(self.logger))
        if self.local_mode:
            result = self._run_local_training(train_object, fn_bytes, script_args)
        else:
            result = self._run_distributed_with_restarts(train_object, fn_bytes, script_args)
        clock.report("local" if self.local_mode else "distributed")
        return result

    _clock = _timing.Clock(False)  # run()'s waterfall (torchspark/_timing.py)

    def _timing_from(self, data: Any) -> memoryview:
        """Rank 0's output -> the user's pickled value; the marks of its timing trailer,
        which travels beside the value, join run()'s waterfall."""
        value, marks = _timing.split_result(data)
        if marks is not None:
            self._clock.marks.update(marks)
        return value

    def train_on_dataframe(self, train_function: Callable, df: Any, *args: Any,
                           **kwargs: Any) -> Any:
        """PySpark's ``_train_on_dataframe``: one barrier task per partition of df, whose
        processes read it with torchspark.get_spark_partition_data_loader or
        torchspark.partition_batches (docs/dataframes.md); returns rank 0's value."""
        from torchspark import _partition

        return _partition.train_on_dataframe(self, train_function, df, args, kwargs)

    _train_on_dataframe = train_on_dataframe  # PySpark's name

    def _start_log_server(self, host: str) -> Any:
        """The native log server bound to host, or None (with a WARNING) when it cannot
        start."""
        try:
            tail = _doctor.TAIL_LINES if self.hang_timeout else 100
            return _native.LogServer(host=host, port=0, tail_lines=tail)
        except Exception as e:
            self.logger.warning(
                f"Starting torchspark's log server on {host} failed ({e!r}): worker output "
                "goes to the executors' logs and rank 0's result travels through "
                "collect() (bounded by spark.driver.maxResultSize)")
            return None

    hang_timeout: Optional[float] = None
    hang_action = "report"

    def _start_doctor(self, server: Any, pump: Any, hub: Any) -> Optional[_doctor.HangDoctor]:
        if server is None or not self.hang_timeout:
            return None
        self.hang_reports: List[Any] = []
        return _doctor.HangDoctor(server, pump, hub, self.hang_timeout, self.hang_action,
                                  self.num_processes, self.logger, self.hang_reports)

    def _hang_error(self, doctor: Optional[_doctor.HangDoctor],
                    mode: str) -> Optional[TorchDistributorError]:
        """The error of a run the hang doctor cancelled, or None."""
        if doctor is None:
            return None
        doctor.stop()
        diag = doctor.cancelled
        if diag is None:
            return None
        report = {"version": 1, "kind": "hang", "culprits": diag.culprits,
                  "message": diag.line, "waiting": diag.waiting,
                  "stacks": {r: d.lines for r, d in diag.dumps.items()}}
        return TorchDistributorError(
            _doctor.cancel_message(diag, self.hang_timeout or 0, mode), report)

    def _tail_from_server(self, server: Any, report: Dict) -> Optional[List[str]]:
        rank = report.get("rank")
        if server is None or rank is None:
            return None
        try:
            lines = server.tail(rank, _TAIL_FROM_SERVER)
        except Exception:
            return None
        return [ln.decode("utf-8", errors="replace") for ln in lines] or None

    def _nccl_check_timeout(self, nnodes: int) -> float:
        """The NCCL preflight's deadline in seconds (docs/gpu.md), 0 when off. On by default
        for a GPU job of more than one node (nnodes agents; it costs 0.73 s on an H200:
        F1 in docs/benchmarks.md, "The device check on an H200"), off for one node.
        spark.torchspark.ncclCheck=true|false
        decides otherwise; TORCHSPARK_NCCL_CHECK=1|0 on the driver overrides both;
        spark.torchspark.ncclCheck.timeout (default 180s)."""
        if not self.use_gpu:
            return 0
        env = os.environ.get("TORCHSPARK_NCCL_CHECK", "").strip().lower()
        settings = _conf.read(self.spark, warn=False)
        flag = settings["ncclCheck"]
        if env in ("1", "true"):
            on = True
        elif env in ("0", "false"):
            on = False
        else:
            on = flag is True or (flag is None and nnodes > 1)
        return settings["ncclCheck.timeout"] / 1000 if on else 0

    def _warm_idle_s(self) -> float:
        """How long the executors' warm worker pools (torchspark/_warm.py) outlive their
        last function-mode run, in seconds; 0 when off: spark.torchspark.warmWorkers
        (default true) or TORCHSPARK_WARM=0 on the driver, and
        spark.torchspark.warmWorkers.idleTimeout (default 300s; TORCHSPARK_WARM_IDLE_TIMEOUT
        on the driver overrides it)."""
        env = os.environ.get("TORCHSPARK_WARM_IDLE_TIMEOUT") or None
        settings = _conf.read(self.spark, {"warmWorkers.idleTimeout": (
            "TORCHSPARK_WARM_IDLE_TIMEOUT", env)}, warn=False)
        if os.environ.get("TORCHSPARK_WARM", "").lower() in ("0", "false") or not (
                settings["warmWorkers"]):
            return 0
        return settings["warmWorkers.idleTimeout"] / 1000

    def _run_local_training(self, train_object: Union[Callable, str],
                            fn_bytes: Optional[bytes], script_args: List[str]) -> Optional[Any]:
        env = dict(os.environ)  # os.environ itself is never changed
        gpus = None
        if self.use_gpu and not self.is_remote:
            # The first num_processes of the driver's GPUs: deterministic, and no global RNG
            # is touched. The agent assigns them against the driver's CUDA_VISIBLE_DEVICES.
            owned = list(_get_resources(self.spark)["gpu"].addresses)
            gpus = ",".join(owned[: self.num_processes])
        workdir = tempfile.mkdtemp(prefix="torchspark-")
        server = pump = hub = doctor = None
        try:
            server = self._start_log_server("127.0.0.1")
            if server is not None:
                pump = _LogPump(server)
                hub = _progress.start(self, server)
                doctor = self._start_doctor(server, pump, hub)
            # One node of a barrier task's steps (_task._run_agent), standalone: no election,
            # rendezvous or staging; rank 0's result read from its file here.
            spec = self._local_spec(train_object, fn_bytes, script_args, server)
            self.logger.info(f"Started local training with {self.num_processes} processes")
            self._clock.mark("agents_started")
            env.update(self._clock.env())
            try:
                out_file = _task._run_agent(
                    spec, env, workdir, 0, 1, self.num_processes, None,
                    gpus.split(",") if gpus else None,
                    echo=None if server is not None else _echo_stderr, warm_anchor=os.getpid())
            except _task.NodeFailed as e:
                if pump is not None:
                    pump.stop()
                    pump = None
                hang = self._hang_error(doctor, "local")
                if hang is not None:
                    raise hang from None
                raise e.failure.error("local", self._tail_from_server(
                    server, e.failure.fields)) from None
            if pump is not None:
                pump.stop()
                pump = None
            output = None
            if out_file is not None:
                try:
                    with open(out_file, "rb") as f:
                        output = cloudpickle.load(f)
                        self._timing_from(f.read())  # the trailer after the value
                    self._clock.mark("result_received")
                except Exception as e:
                    raise RuntimeError(
                        "TorchDistributor failed due to a pickling error. "
                        "View stdout logs for detailed error message.") from e
            self.logger.info(f"Finished local training with {self.num_processes} processes")
            return output
        finally:
            if doctor is not None:
                doctor.stop()
            if pump is not None:
                pump.stop()
            if server is not None:
                server.close()
            if hub is not None:
                hub.stop()
            shutil.rmtree(workdir, ignore_errors=True)

    def _local_spec(self, train_object: Union[Callable, str], fn_bytes: Optional[bytes],
                    script_args: List[str], server: Any) -> NodeSpec:
        """The node spec of local mode's one node: the keys _task._run_agent reads (the
        channel, the NCCL check, the warm pool); no ship, rendezvous or staging."""
        return {
            "version": _version(), "ship": None, "use_gpu": self.use_gpu,
            "gpus_per_task": self.num_processes, "local_master": True, "driver_gpus": [],
            "driver_host": "127.0.0.1", "fn_bytes": fn_bytes,
            "script": None if fn_bytes is not None else str(train_object),
            "script_file": None, "driver_cwd": os.getcwd(), "script_args": script_args,
            "log_endpoint": server.endpoint if server is not None else None,
            "log_secret_hex": server.secret_hex if server is not None else None,
            "result_via_channel": False, "nccl_check": self._nccl_check_timeout(1),
            "warm_idle_s": self._warm_idle_s() if fn_bytes is not None else 0,
            "gpu_resource": "gpu", "timing_env": {}, "rendezvous": None, "attempt_env": {},
        }

    # Per attempt of a run with restarts (torchspark/_restart.py): the training processes'
    # TORCHSPARK_ATTEMPT etc., and the driver's line prefix.
    _attempt_env: Dict[str, str] = {}
    _log_fmt: Optional[str] = None

    def _run_distributed_with_restarts(self, train_object: Union[Callable, str],
                                       fn_bytes: Optional[bytes],
                                       script_args: List[str]) -> Optional[Any]:
        if not self.max_restarts:
            return self._run_distributed_training(train_object, fn_bytes, script_args)

        full = (self.num_tasks, self.num_processes)
        per_task = self.num_processes // self.num_tasks

        def attempt(n: int, env: Dict[str, str], nodes: int) -> Optional[Any]:
            self._attempt_env = dict(env)  # the run controller's (_restart.py)
            self._log_fmt = f"[attempt {n}] [rank {{rank}}] "
            # Elastic (min_nodes): this attempt's nodes, each with its processes.
            self.num_tasks, self.num_processes = nodes, nodes * per_task
            return self._run_distributed_training(train_object, fn_bytes, script_args)

        timeout = _conf.read(self.spark, warn=False)["job.replacementTimeout"] / 1000
        self.attempts = []
        try:
            return _restart.run(attempt, limit=self.max_restarts, spark=self.spark,
                                need_slots=self.num_tasks, least_slots=self.min_nodes,
                                replacement_timeout_s=timeout, remote=self.is_remote,
                                logger=self.logger, record=self.attempts,
                                times=self._failure_times)
        finally:
            self._attempt_env, self._log_fmt = {}, None
            self.num_tasks, self.num_processes = full

    def _run_distributed_training(self, train_object: Union[Callable, str],
                                  fn_bytes: Optional[bytes], script_args: List[str],
                                  dataframe: Optional[tuple] = None) -> Optional[Any]:
        self._check_encryption()
        self.logger.info(
            f"Started distributed training with {self.num_processes} executor processes")
        ship = _ship.shipped(self.spark, self.is_remote)
        try:
            result = self._run_distributed_job(train_object, fn_bytes, script_args, ship, dataframe)
        except _NoRendezvous as e:
            # Before any training started: the same job through allGather, from now on.
            _RENDEZVOUS_UNREACHABLE.append(str(e))
            self.logger.warning(
                f"The executors could not reach torchspark's rendezvous on the driver ({e}); "
                "running the job again through BarrierTaskContext.allGather, as every later "
                "run of this process will (about 1 s slower; TORCHSPARK_RENDEZVOUS=0 skips "
                "the attempt)")
            result = self._run_distributed_job(train_object, fn_bytes, script_args, ship, dataframe)
        except _NotInstalled as e:
            # Before any training started: ship this driver's package and run again.
            ship = _ship.ship(self.spark, self.is_remote)
            self.logger.info(
                f"torchspark {ship['version']} is not installed on the executors ({e}); "
                f"shipped the driver's package ({ship['name']}: Python files, "
                "libtorchspark.so, torchspark-run) through Spark's file distribution")
            result = self._run_distributed_job(train_object, fn_bytes, script_args, ship, dataframe)
        self.logger.info(
            f"Finished distributed training with {self.num_processes} executor processes")
        return result

    def _run_distributed_job(self, train_object: Union[Callable, str],
                             fn_bytes: Optional[bytes], script_args: List[str],
                             ship: Optional[ShipSpec],
                             dataframe: Optional[tuple] = None) -> Optional[Any]:
        driver_host = _get_conf(self.spark, "spark.driver.host", "")
        driver_gpus: List[str] = []
        if self.is_spark_local_master and self.use_gpu:
            # Each task takes its own k of the driver's GPUs (raw addresses: its agent
            # assigns them against the mask it inherits); too few is an error, not a CPU run.
            driver_gpus = list(_get_resources(self.spark)["gpu"].addresses)
            need = self.num_tasks * self._gpus_per_task
            if len(driver_gpus) < need:
                raise RuntimeError(
                    f"torchspark: {self.num_tasks} tasks \u00d7 {self._gpus_per_task} GPU(s) "
                    f"need {need} driver GPUs, but the driver has {len(driver_gpus)}: "
                    f"{driver_gpus}; lower num_processes or raise "
                    "spark.driver.resource.gpu.amount")
        bind_host, advertised = self._log_server_host(driver_host)
        server = self._start_log_server(bind_host)
        pump = _LogPump(server, fmt=self._log_fmt) if server is not None else None
        hub = _progress.start(self, server) if server is not None else None
        doctor = self._start_doctor(server, pump, hub)
        # Rank 0's election record through the driver, not allGather (>= 1 s in Spark):
        # _rendezvous.py says when.
        rdv = (_start_rendezvous(bind_host or "127.0.0.1")
               if server is not None and not _RENDEZVOUS_UNREACHABLE
               and _rendezvous.enabled(self.is_remote) else None)
        if server is not None and fn_bytes is not None:
            # Into memory: no more than Spark's collect() would take.
            server.output_limit(self.spark.conf.get("spark.driver.maxResultSize", None))
            server.expect_output(None)
        nproc = self._gpus_per_task if self.use_gpu else 1
        ok = False
        spec: NodeSpec = {
            "version": _version(),
            "ship": ship,
            "use_gpu": self.use_gpu,
            "gpus_per_task": self._gpus_per_task,
            "local_master": self.is_spark_local_master,
            "driver_gpus": driver_gpus,
            "driver_host": driver_host,
            "fn_bytes": fn_bytes,
            "script": None if fn_bytes is not None else str(train_object),
            "script_file": None if fn_bytes is not None else _script_file(str(train_object)),
            "driver_cwd": os.getcwd(),
            "script_args": script_args,
            "log_endpoint": (_native.endpoint_text(advertised or server.host, server.port)
                             if server else None),
            "log_secret_hex": server.secret_hex if server else None,
            "result_via_channel": server is not None,
            "nccl_check": self._nccl_check_timeout(self.num_tasks),
            "warm_idle_s": self._warm_idle_s() if fn_bytes is not None else 0,
            "gpu_resource": _conf.read(self.spark, warn=False)["gpuResource"],
            "timing_env": self._clock.env(),  # run()'s waterfall: {} unless timing is on
            "rendezvous": rdv.spec(advertised or driver_host) if rdv is not None else None,
            "attempt_env": self._attempt_env,  # restarts (torchspark/_restart.py)
        }
        try:
            self._clock.mark("job_submitted")
            if dataframe is not None:  # train_on_dataframe: (df, its tasks' part of spec)
                spec["dataframe"] = dataframe[1]
            if hub is not None:  # reports spilled by agents come back as rows
                spec["report_rows"] = _report_rows.new_tag()
            # Restarts left: the next attempt starts at once on the root cause, without
            # waiting for Spark's barrier abort (up to 3 s under load: docs/benchmarks.md,
            # "Recovery on local-cluster").
            last = self._attempt_env.get(_restart.ATTEMPT_ENV) == self._attempt_env.get(
                _restart.MAX_RESTARTS_ENV)
            grace = _job.SPARK_GRACE_S if last else _job.RESTART_GRACE_S
            restarted = self._attempt_env.get(_restart.ATTEMPT_ENV, "0") != "0"
            out = _job.run_barrier_job(self.spark, spec, self.num_tasks, server,
                                       remote=self.is_remote,
                                       input_df=dataframe[0] if dataframe else None,
                                       spark_grace_s=grace,
                                       revive=restarted and _job.REVIVE_ON_RESTART)
            self._clock.mark("job_ended")
            self._failure_times.update(
                root_at=out.root_at, ended_at=out.ended_at,
                silent_node=(out.root or {}).get("node_rank") if _job.silent(out.root) else None,
                silent_executor=out.silent_executor)
            if out.spark_error is not None or out.root is not None:
                hang = self._hang_error(doctor, "distributed")
                if hang is not None:
                    raise hang from out.spark_error
                raise self._distributed_failure(out, server, nproc) from out.spark_error
            chunks, spilled = _report_rows.split(out.chunks or [], spec.get("report_rows"))
            if hub is not None:
                hub.add(spilled)
            if pump is not None:
                pump.stop()
                pump = None
            unreachable = server is not None and _never_reached(server)
            if unreachable:
                self.logger.warning(
                    f"The executors could not reach torchspark's log server at "
                    f"{spec['log_endpoint']}: the workers' output stayed in the executors' "
                    "logs, and rank 0's result and the workers' reports came back as collected "
                    "rows (bounded by "
                    "spark.driver.maxResultSize). "
                    + ("Set TORCHSPARK_CLIENT_ADDRESS to an address of this machine that "
                       "the executors can reach." if self.is_remote else
                       "Check that spark.driver.host is reachable from the executors."))
            result = None
            if fn_bytes is not None:
                data = server.output_view() if server is not None else None
                if data is None and server is not None:
                    if not chunks:
                        raise TorchDistributorError(
                            "TorchDistributor (distributed): training succeeded but rank 0's "
                            "result did not arrive over torchspark's output channel "
                            f"({server.output_error or 'nothing was received'}); see the "
                            "executors' logs of partition 0 for the agent's message")
                    if not unreachable:
                        self.logger.warning(
                            "rank 0's result did not arrive over torchspark's output channel "
                            f"({server.output_error or 'nothing was received'}); it came "
                            "through collect() instead (bounded by spark.driver.maxResultSize)")
                if data is None:
                    data = b"".join(chunks)
                if not data:
                    raise RuntimeError("TorchDistributor failed during training."
                                       "View stdout logs for detailed error message.")
                try:
                    result = cloudpickle.loads(self._timing_from(data))
                    self._clock.mark("result_received")
                except Exception as e:
                    raise RuntimeError(
                        "TorchDistributor failed due to a pickling error. "
                        "View stdout logs for detailed error message.") from e
            ok = True
        finally:
            # Drain while the pump still runs, so the agents' last lines are shown; after a
            # failure every agent was stopped, so a short drain is enough.
            if doctor is not None:
                doctor.stop()
            if server is not None:
                server.close(drain_timeout=5.0 if ok else 1.0)
            if rdv is not None:
                rdv.close()
            if pump is not None:
                pump.stop()
            if hub is not None:
                hub.stop()
        return result

    def _log_server_host(self, driver_host: str) -> "tuple[str, str]":
        """(address the log server binds, address the executors are told). Classic: where
        Spark's own driver endpoint binds, advertised as spark.driver.host. Connect: this
        client is not Spark's driver; the address of its route towards the server."""
        if not self.is_remote:
            bind = _get_conf(self.spark, "spark.driver.bindAddress", "") or driver_host
            return bind or "127.0.0.1", driver_host
        from torchspark import _connect

        return _connect.client_address(self.spark)

    def _distributed_failure(self, out: "_job.Outcome", server: Any,
                             nproc: int) -> Exception:
        """The run's exception: from the channel's structured root record first, from
        Spark's error text (_SPARK_TEXT, in order) only as a fallback."""
        root = out.root
        if root is not None and root.get("kind") == "failure" and root.get("report"):
            failure = _report.Failure.from_document(
                root["report"], node_rank=root.get("node_rank", -1),
                host=root.get("host") or "?", nproc_per_node=nproc)
            return failure.error("distributed", self._tail_from_server(server, failure.fields),
                                 root.get("detail"))
        text = str(out.spark_error) if out.spark_error is not None else ""
        for marker, make in _SPARK_TEXT:
            if marker == _report.MARKER and root is not None:
                # The channel's other record, a node lost, outranks what a task carried
                # (but not a set-up error: that node was lost to Spark's abort).
                return self._lost_node_error(root, server, nproc)
            found = make(text)
            if isinstance(found, _report.Failure):
                return found.error("distributed", self._tail_from_server(server, found.fields))
            if found is not None:
                return found
        if root is not None:
            return self._lost_node_error(root, server, nproc)
        # Spark's own text, classified by the C core's outcome table (torchspark/outcome.h).
        spark = _report.outcome(None, text or type(out.spark_error).__name__,
                                _report._OUTPUT_WENT["distributed"])
        return TorchDistributorError(
            f"TorchDistributor (distributed) failed: {spark['cause']}\n{spark['advice']}",
            {"version": 2, "kind": spark["kind"], "reason": spark["reason"]})

    def _lost_node_error(self, root: Dict, server: Any, nproc: int) -> TorchDistributorError:
        """A node whose agent vanished (host or executor died, network cut): the log
        server's document of it (docs/protocol.md 1.7), finished with the node's last lines
        by the C core, which writes the message."""
        node = int(root.get("node_rank", -1))
        tail: List[str] = []
        for rank in range(node * nproc, (node + 1) * nproc) if node >= 0 else ():
            got = self._tail_from_server(server, {"rank": rank}) or []
            tail += [_native.line_prefix(rank) + ln for ln in got]
        failure = _report.Failure.from_document(
            root.get("report"), node_rank=node, host=root.get("host") or "?", tail=tail)
        return failure.error("distributed")


# A script that exists on the driver travels with the job (inside the task's closure)
# for executors that lack it; larger ones must be on every executor (stock's rule).
SCRIPT_SHIP_MAX = 16 << 20


def _script_file(path: str) -> Optional[ScriptFile]:
    """{"name", "data"} of a script file on the driver, to ship with the job, or None."""
    try:
        if not os.path.isfile(path) or os.path.getsize(path) > SCRIPT_SHIP_MAX:
            return None
        with open(path, "rb") as f:
            return {"name": os.path.basename(path), "data": f.read()}
    except OSError:
        return None


class _NotInstalled(Exception):
    """A task could not import the driver's torchspark (_boot.prepare): ship it."""


class _NoRendezvous(Exception):
    """A task could not reach the driver's rendezvous (_rendezvous.py): use allGather."""


# Set once a task could not reach the driver's rendezvous: this process uses allGather.
_RENDEZVOUS_UNREACHABLE: List[str] = []


def _after(marker: str, make: Callable[[str], Exception]) -> Callable[[str], Optional[Exception]]:
    """A task's set-up error (_boot.py): ``marker: text`` in Spark's error text."""
    def read(text: str) -> Optional[Exception]:
        m = re.search(re.escape(marker) + r": (.*)", text)
        return make(m.group(1).strip()) if m else None
    return read


def _carried(text: str) -> Optional[_report.Failure]:
    """The oldest failure document a task carried in Spark's error text."""
    documents = _report.find(text)
    return _report.Failure.from_document(documents[0]) if documents else None


# Spark's error text, read only where the channel recorded no failed rank: one ordered
# table of (marker, constructor), the first found wins.
_Found = Optional[Union[Exception, _report.Failure]]
_SPARK_TEXT: Tuple[Tuple[str, Callable[[str], _Found]], ...] = (
    (_boot.NOT_INSTALLED, _after(_boot.NOT_INSTALLED, _NotInstalled)),
    (_rendezvous.UNREACHABLE, _after(_rendezvous.UNREACHABLE, _NoRendezvous)),
    (_boot.SETUP_ERROR, _after(_boot.SETUP_ERROR, TorchDistributorError)),
    (_report.MARKER, _carried),
)


def _never_reached(server: Any) -> bool:
    """True when no agent ever got through to the log server (the executors cannot
    reach the address they were given)."""
    try:
        return server.stats().get("authenticated", 1) == 0
    except Exception:
        return False


def _version() -> str:
    import torchspark

    return torchspark.__version__


def _start_rendezvous(host: str) -> Optional["_rendezvous.Server"]:
    try:
        return _rendezvous.Server(host)
    except OSError:
        return None  # every task then uses allGather


def _echo_stderr(line: str) -> None:
    with _LogPump._print_lock:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
