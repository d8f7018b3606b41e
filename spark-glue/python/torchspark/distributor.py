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
import sys
from typing import Any, Callable, Dict, List, Optional, Union

from pyspark import cloudpickle
from pyspark.sql import SparkSession

from torchspark.driver import (_channel, _conf, _doctor, _failure, _gang, _job, _local, _progress,
                               _restart, _ship, _timing)
from torchspark.native import _native, _rendezvous
from torchspark.native._lib import json_call
from torchspark.task import _report_rows
from torchspark.driver._report import TorchDistributorError
from torchspark.task._spec import NodeSpec, ShipSpec

__all__ = ["TorchDistributor", "TorchDistributorError"]


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
        from torchspark.driver import _spark

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
        # Read again, once, by each run() (_read_settings), which passes them along.
        self._conf_args = {
            "progress": ("progress", progress), "job.maxRestarts": ("max_restarts", max_restarts),
            "job.minNodes": ("min_nodes", min_nodes), "hangTimeout": ("hang_timeout", hang_timeout),
            "hangAction": ("hang_action", hang_action)}
        self._conf_run = {"nodes": 1 if local_mode else self.num_tasks, "gpu": use_gpu}  # local: one
        settings = self._settings = _conf.read(self.spark, self._conf_args, self.logger, run=self._conf_run)
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

    def _shape(self, driver_gpus: Optional[List[str]] = None) -> Dict[str, Any]:
        """The run's tasks and each task's GPUs, stock's rules and sentences, and with the
        driver's GPU addresses those the run on the driver uses, decided in C
        (tsp_shape_plan, docs/protocol.md 11.1)."""
        conf, local = self.spark.conf, self.use_gpu and self.local_mode  # the facts it reads
        return dict(json_call("tsp_shape_plan", {
            "product": "TorchDistributor", "num_processes": self.num_processes,
            "use_gpu": self.use_gpu, "local_mode": self.local_mode,
            "task_gpu_amount": conf.get("spark.task.resource.gpu.amount", None)
            if self.use_gpu and not self.local_mode else None,
            "driver_gpu_amount": conf.get("spark.driver.resource.gpu.amount", None) if local else None,
            "driver_gpu": local and "gpu" in _get_resources(self.spark), "driver_gpus": driver_gpus},
            error=RuntimeError))

    def _get_num_tasks(self) -> int:
        """More local processes than the driver's GPUs are cut to them with stock's warning."""
        shape = self._shape()
        if shape["warning"]:
            self.logger.warning(shape["warning"])
        self.num_processes, self._gpus_per_task = shape["processes"], shape["per_task"]
        return int(shape["tasks"])

    def _validate_input_params(self) -> None:
        if self.num_processes <= 0:
            from torchspark.driver import _spark

            raise ValueError(_spark.NUM_PROCESSES_ERROR[_spark.version() >= (4, 0)])

    def _check_encryption(self) -> None:
        _conf.check_encryption(self.spark, self.ssl_conf, self.logger)  # stock's name

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
        self._read_settings()
        if self.local_mode:
            result = self._run_local_training(train_object, fn_bytes, script_args)
        else:
            result = self._run_distributed_with_restarts(train_object, fn_bytes, script_args)
        clock.report("local" if self.local_mode else "distributed")
        return result

    _clock = _timing.Clock(False)  # run()'s waterfall (torchspark/driver/_timing.py)

    def train_on_dataframe(self, train_function: Callable, df: Any, *args: Any,
                           **kwargs: Any) -> Any:
        """PySpark's ``_train_on_dataframe``: one barrier task per partition of df, whose
        processes read it with torchspark.get_spark_partition_data_loader or
        torchspark.partition_batches (docs/dataframes.md); returns rank 0's value."""
        from torchspark.task import _partition

        self._read_settings()
        return _partition.train_on_dataframe(self, train_function, df, args, kwargs)

    _train_on_dataframe = train_on_dataframe  # PySpark's name

    def _read_settings(self) -> None:
        """Every spark.torchspark.* setting for this run, read once (the C key table, with
        the constructor's arguments and the driver's switches) and passed along."""
        self._settings = _conf.read(self.spark, self._conf_args, warn=False, run=self._conf_run)

    hang_timeout: Optional[float] = None  # the hang doctor (_doctor.configure)
    hang_action = "report"

    def _run_local_training(self, train_object: Union[Callable, str],
                            fn_bytes: Optional[bytes], script_args: List[str]) -> Optional[Any]:
        return _local.run(self, train_object, fn_bytes, script_args)

    # Per attempt of a run (torchspark/driver/_restart.py): the training processes'
    # TORCHSPARK_ATTEMPT etc. with restarts (an elastic run's TORCHSPARK_MAX_NODES its nodes
    # while an attempt runs on fewer: _gang.ask); the controller's submit: its number, its
    # lines' prefix template, whether a failure of it raises (last: it then waits for
    # Spark's own error). train_on_dataframe's job: no restarts.
    _attempt_env: Dict[str, str] = {}
    _attempt_submit: Dict[str, Any] = {"attempt": 0, "last": True}

    def _run_distributed_with_restarts(self, train_object: Union[Callable, str],
                                       fn_bytes: Optional[bytes],
                                       script_args: List[str]) -> Optional[Any]:
        full = (self.num_tasks, self.num_processes)
        per_task = self.num_processes // self.num_tasks

        def attempt(submit: Dict[str, Any]) -> Optional[Any]:
            self._attempt_env = dict(submit["env"])  # the run controller's (_restart.py)
            self._attempt_submit = submit
            # Elastic (min_nodes): this attempt's nodes, each with its processes.
            self.num_tasks, self.num_processes = submit["nodes"], submit["nodes"] * per_task
            return self._run_distributed_training(train_object, fn_bytes, script_args)

        self.attempts = []
        try:
            return _restart.run(attempt, _restart.start_event(self), spark=self.spark,
                                logger=self.logger, record=self.attempts, times=self._failure_times)
        finally:
            self._attempt_env, self._attempt_submit = {}, TorchDistributor._attempt_submit
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
        except _failure.NoRendezvous as e:
            # Before any training started: the same job through allGather, from now on.
            _RENDEZVOUS_UNREACHABLE.append(str(e))
            self.logger.warning(str(e))  # the library's line (docs/protocol.md 10)
            result = self._run_distributed_job(train_object, fn_bytes, script_args, ship, dataframe)
        except _failure.NotInstalled as e:
            # Before any training started: ship this driver's package and run again.
            ship = _ship.ship(self.spark, self.is_remote, self.logger, str(e))
            result = self._run_distributed_job(train_object, fn_bytes, script_args, ship, dataframe)
        self.logger.info(
            f"Finished distributed training with {self.num_processes} executor processes")
        return result

    def _run_distributed_job(self, train_object: Union[Callable, str],
                             fn_bytes: Optional[bytes], script_args: List[str],
                             ship: Optional[ShipSpec],
                             dataframe: Optional[tuple] = None) -> Optional[Any]:
        """One barrier job (one attempt): the channel open for its duration (_channel.py),
        the job submitted, its failure raised or rank 0's value returned."""
        driver_host = _get_conf(self.spark, "spark.driver.host", "")
        driver_gpus = self._driver_gpus()
        bind_host, advertised = self._log_server_host(driver_host)
        use_rdv = not _RENDEZVOUS_UNREACHABLE and _rendezvous.enabled(
            self._settings, self.is_remote,
            gang=self._settings["launch"] == _gang.GANG)
        with _channel.Channel(drain_on_failure=1.0) as ch:
            ch.open(self, bind_host, fmt=self._attempt_submit.get("prefix"),  # the controller's
                    rendezvous_host=(bind_host or "127.0.0.1") if use_rdv else None)
            server = ch.server
            if server is not None and fn_bytes is not None:
                # Into memory: no more than Spark's collect() would take.
                server.output_limit(self.spark.conf.get("spark.driver.maxResultSize", None))
                server.expect_output(None)
            spec = self._node_spec(train_object, fn_bytes, script_args, ship, driver_gpus,
                                   driver_host, advertised, ch)
            if dataframe is not None:  # train_on_dataframe: (df, its tasks' part of spec)
                spec["dataframe"] = dataframe[1]
            if ch.hub is not None:  # reports spilled by agents come back as rows
                spec["report_rows"] = _report_rows.new_tag()
            gang = _gang.start(self, ch.rdv, spec, self._settings)  # dynamic allocation
            out = self._submit(spec, server, dataframe[0] if dataframe else None, gang)
            if out.gang_failure is not None:
                raise TorchDistributorError(out.gang_failure["message"],
                                            out.gang_failure) from None
            if out.spark_error is not None or out.root is not None:
                nproc = self._gpus_per_task if self.use_gpu else 1
                raise (ch.hang_error("distributed")
                       or _failure.of_job(out, ch, nproc)) from out.spark_error
            chunks, spilled = _report_rows.split(out.chunks or [], spec.get("report_rows"))
            if ch.hub is not None:
                ch.hub.add(spilled)
            ch.stop_pump()
            unreachable = ch.warn_unreachable(self, spec["log_endpoint"])
            result = ch.result(self, chunks, unreachable) if fn_bytes is not None else None
            ch.ok = True
        return result

    def _submit(self, spec: NodeSpec, server: Any, input_df: Any,
                gang: Any = None) -> "_job.Outcome":
        """The job of one attempt through Spark: one barrier stage of num_tasks tasks, or
        num_tasks ordinary tasks that gang up through the driver (gang: _gang.py; _job.py).
        Restarts left: the next attempt starts at once on the root cause, without waiting
        for Spark's barrier abort (up to 3 s under load: docs/benchmarks.md,
        "Recovery on local-cluster")."""
        self._clock.mark("job_submitted")
        submit = self._attempt_submit  # the run controller's (docs/protocol.md 11)
        self._failure_times["server"] = server  # the grow watch's checkpoint_and_stop
        out = _job.run_barrier_job(self.spark, spec, self.num_tasks, server,
                                   remote=self.is_remote, input_df=input_df,
                                   spark_grace_s=_job.SPARK_GRACE_S if submit["last"] else _job.RESTART_GRACE_S,
                                   revive=submit["attempt"] > 0 and _job.REVIVE_ON_RESTART,
                                   gang=gang)
        self._clock.mark("job_ended")
        self._failure_times.update(
            root_at=out.root_at, ended_at=out.ended_at,
            silent_node=(out.root or {}).get("node_rank") if _job.silent(out.root) else None,
            silent_executor=out.silent_executor)
        return out

    def _driver_gpus(self) -> List[str]:
        """The driver's GPUs a run on it takes, as tsp_shape_plan picks them (raw addresses:
        an agent assigns them against the mask it inherits; no global RNG touched): local
        mode the first num_processes (not on Spark Connect), a local master's GPU job every
        one (each task takes its own k); too few is an error, not a CPU run."""
        if not self.use_gpu or (self.is_remote if self.local_mode else not self.is_spark_local_master):
            return []
        return list(self._shape(list(_get_resources(self.spark)["gpu"].addresses))["gpus"])

    def _node_spec(self, train_object: Union[Callable, str], fn_bytes: Optional[bytes],
                   script_args: List[str], ship: Optional[ShipSpec], driver_gpus: List[str],
                   driver_host: str, advertised: str, ch: "_channel.Channel") -> NodeSpec:
        """What every barrier task of the job needs (_spec.NodeSpec)."""
        server, settings = ch.server, self._settings
        return {
            "version": _version(), "ship": ship, "use_gpu": self.use_gpu,
            "gpus_per_task": self._gpus_per_task, "local_master": self.is_spark_local_master,
            "driver_gpus": driver_gpus, "driver_host": driver_host, "fn_bytes": fn_bytes,
            "script": None if fn_bytes is not None else str(train_object),
            "script_file": None if fn_bytes is not None or self.local_mode  # local: not shipped
            else _ship.script_file(str(train_object)),
            "driver_cwd": os.getcwd(), "script_args": script_args,
            "log_endpoint": (_native.endpoint_text(advertised or server.host, server.port)
                             if server else None),
            "log_secret_hex": server.secret_hex if server else None,
            "result_via_channel": server is not None,
            "nccl_check": settings["run"]["nccl_check_s"],  # 0 without GPUs (_conf.read's run)
            "warm_idle_s": settings["run"]["warm_idle_s"] if fn_bytes is not None else 0,
            "gpu_resource": settings["gpuResource"],
            "timing_env": self._clock.env(),  # run()'s waterfall: {} unless timing is on
            "rendezvous": ch.rdv.spec(advertised or driver_host) if ch.rdv is not None else None,
            "attempt_env": self._attempt_env,  # restarts (torchspark/driver/_restart.py)
        }

    def _log_server_host(self, driver_host: str) -> "tuple[str, str]":
        """(address the log server binds, address the executors are told). Classic: where
        Spark's own driver endpoint binds, advertised as spark.driver.host. Connect: this
        client is not Spark's driver; the address of its route towards the server."""
        if not self.is_remote:
            bind = _get_conf(self.spark, "spark.driver.bindAddress", "") or driver_host
            return bind or "127.0.0.1", driver_host
        from torchspark.driver import _connect

        return _connect.client_address(self.spark)


# Set once a task could not reach the driver's rendezvous: this process uses allGather.
_RENDEZVOUS_UNREACHABLE: List[str] = []


def _version() -> str:
    import torchspark

    return torchspark.__version__
