"""Every spark.torchspark.* setting, read through the C core's one key table
(torchspark/conf.h, docs/protocol.md 9): the glue only collects the raw strings and the
keyword arguments that stand for keys, and hands back typed values (durations in
milliseconds) or the library's sentence as a ValueError. No parser of its own."""
from __future__ import annotations

import logging
import math
from typing import Any, Dict, Iterable, List, Optional, Tuple

from torchspark.native._lib import json_call

PREFIX = "spark.torchspark."
DYNAMIC = "spark.dynamicAllocation.enabled"
_keys: Optional[List[str]] = None


def table() -> List[Dict[str, Any]]:
    """The key table: [{"key", "type", "default", "doc"}] in its order."""
    return list(json_call("tsp_conf_table", {}))


def _known_keys() -> List[str]:
    global _keys
    if _keys is None:
        _keys = [row["key"] for row in table()]
    return _keys


def _raw(spark: Any, listed: bool) -> Dict[str, str]:
    """The spark.torchspark.* strings of the session's conf: the table's keys one by one
    (14 py4j calls: 1.7 ms on a classic session), and with listed, every key under the prefix
    where Spark lists them (RuntimeConfig.getAll, pyspark 4.0+: 30-55 ms on a classic
    session, so only where unknown keys are looked for: once per constructor)."""
    out = _strings(spark, _known_keys() + [DYNAMIC])  # Spark's: launch=auto resolved by it
    if listed:
        try:
            every = spark.conf.getAll
            every = every() if callable(every) else every
        except Exception:
            every = None
        if isinstance(every, dict):
            out.update({str(k): str(v) for k, v in every.items()
                        if str(k).startswith(PREFIX) and str(k) not in out})
    return out


def _strings(spark: Any, keys: Iterable[str]) -> Dict[str, str]:
    """The values of those keys that the session's conf sets, as strings (one call each)."""
    values = {key: spark.conf.get(key, None) for key in keys}
    return {key: str(value) for key, value in values.items() if value is not None}


def _arg_value(value: Any) -> Any:
    """A keyword argument as JSON: numbers, bools, strings and None as they are; a float
    that JSON cannot carry (nan, inf) and any other object as its text, for the library
    to refuse under the argument's name."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)


def read(spark: Any, args: Optional[Dict[str, Tuple[str, Any]]] = None,
         logger: Optional[logging.Logger] = None, warn: bool = True,
         run: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Every key of the table -> its value (None where unset and without default). args:
    key (without the prefix) -> (the name the user gave it, its value or None), winning over
    the conf; the driver's environment switches that stand for keys (the table's "env")
    win over both. Unknown spark.torchspark.* keys are logged (warn) as the library words
    them. run: the run's {"nodes", "gpu"}; under "run", what the values decide for it (None
    without one): {"nccl_check_s", "warm_idle_s"}, the NCCL preflight's deadline and the
    warm pools' idle timeout in seconds, 0 when off (docs/protocol.md 9, "For a run"). A run
    reads this once and passes the values along."""
    request = {"conf": _raw(spark, warn),
               "args": {PREFIX + k: {"name": name, "value": _arg_value(v)}
                        for k, (name, v) in (args or {}).items()},
               "env": True,  # the driver's switches (TORCHSPARK_NCCL_CHECK, ...), read in C
               "run": run}
    reply = json_call("tsp_conf_read", request)
    for unknown in reply["unknown"] if warn else []:
        (logger or logging.getLogger("TorchDistributor")).warning(unknown["message"])
    return {**{k[len(PREFIX):]: v for k, v in reply["values"].items()}, "run": reply["run"]}


SPARK_SECURITY_KEYS = ("spark.ssl.enabled", "spark.ssl.rpc.enabled", "spark.network.crypto.enabled",
                       "spark.authenticate", "spark.io.encryption.enabled")


def check_encryption(spark: Any, override_key: str, logger: logging.Logger) -> None:
    """What a distributed run does where Spark encrypts, decided by the library
    (docs/protocol.md 9, "Where Spark encrypts") from Spark's security settings and the stock
    override key (pytorch.spark.distributor.ignoreSsl or DeepSpeed's), read as strings from the
    session's conf. Stock refuses a cluster with spark.ssl.enabled unless its ignoreSsl key is
    set, then sends the weights in clear; torchspark's own channel is TLS 1.3 keyed by the
    run's secret, so it goes on wherever Spark encrypts, and logs the library's one line (a
    WARNING where Spark secures its traffic: torch's own data plane is not encrypted)."""
    raw = _strings(spark, SPARK_SECURITY_KEYS + ("spark.torchspark.encryption", override_key))
    decision = json_call("tsp_conf_read", {"conf": raw, "env": True})["encryption"]
    logger.log(logging.getLevelName(decision["level"]), decision["message"])
    if not decision["proceed"]:
        raise RuntimeError(decision["message"])
