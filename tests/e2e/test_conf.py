"""Every spark.torchspark.* setting through the C core's one key table (torchspark/conf.h,
docs/protocol.md 9), on the user's own path: a real local SparkSession and the
TorchDistributor constructor. The golden cases are tests/contracts/conf.json
(test_contracts.py, and ContractTest through JNI); the docs' tables are checked here."""
import logging
from pathlib import Path

import pytest

from tests.helpers import tsp_spark
from torchspark import TorchDistributor
from torchspark.driver import _conf

ROOT = Path(__file__).resolve().parents[2]


def settings_table() -> str:
    """The settings table of docs/distributor.md and docs/jvm.md, as the key table says."""
    rows = ["| key | type | default | driver's switch (wins) | what |", "|---|---|---|---|---|"]
    for row in _conf.table():
        default = "unset" if row["default"] is None else f"`{row['default']}`"
        env = f"`{row['env']}`" if row["env"] else ""
        rows.append(f"| `{row['key']}` | {row['type']} | {default} | {env} | {row['doc']} |")
    return "\n".join(rows) + "\n"


@pytest.mark.parametrize("doc", ["docs/distributor.md", "docs/jvm.md"])
def test_the_docs_list_every_setting_with_its_default(doc):
    text = (ROOT / doc).read_text()
    assert settings_table() in text, (
        f"{doc}'s settings table is not the key table's (native/src/driver/conf.c); "
        f"put this table under its \"Settings\" heading:\n{settings_table()}")


@pytest.fixture(scope="module")
def spark():
    # Its own (docs/testing.md, "Shared Spark"): local[1], no other module's configuration.
    s = tsp_spark.session("local[1]", {"spark.torchspark.plugin.killGraceMs": "2s"})
    yield s
    s.stop()


@pytest.fixture
def conf(spark):
    keys = []

    def put(key, value):
        keys.append(key)
        spark.conf.set(key, value)

    yield put
    for k in keys:
        spark.conf.unset(k)


def distributor(**kw):
    return TorchDistributor(num_processes=2, local_mode=False, use_gpu=False, **kw)


def test_a_bad_boolean_is_one_sentence_at_the_constructor(conf):
    # Before: a bare AssertionError from run(), after the job's set-up.
    conf("spark.torchspark.warmWorkers", "yes")
    with pytest.raises(ValueError) as e:
        distributor()
    assert str(e.value) == ("spark.torchspark.warmWorkers='yes' is not a boolean: use true or "
                            "false")


def test_nan_and_inf_are_not_timeouts(conf):
    # Before: nan was taken as a hang timeout (nan <= 0 is false) and inf too.
    for value in (float("nan"), float("inf")):
        with pytest.raises(ValueError) as e:
            distributor(hang_timeout=value)
        assert str(e.value).startswith(f"hang_timeout='{value}' is not a duration: use a whole "
                                       "number and a unit of us, ms, s, m, min, h or d")
    conf("spark.torchspark.hangTimeout", "NaN")
    with pytest.raises(ValueError, match=r"^spark.torchspark.hangTimeout='NaN' is not a "):
        distributor()


def test_one_grammar_for_every_duration(conf):
    # Before: 1d was refused by the restart's and the warm pool's parsers, and 1.5min taken.
    conf("spark.torchspark.hangTimeout", "1d")
    conf("spark.torchspark.job.replacementTimeout", "1d")
    assert distributor().hang_timeout == 86400
    conf("spark.torchspark.job.replacementTimeout", "1.5min")
    with pytest.raises(ValueError, match=r"^spark.torchspark.job.replacementTimeout='1.5min' is "
                                         r"not a duration: .*no fractions, as in Spark"):
        distributor()


def test_arguments_win_and_are_checked_under_their_name(conf):
    conf("spark.torchspark.job.maxRestarts", "2")
    assert distributor().max_restarts == 2
    assert distributor(max_restarts=0).max_restarts == 0
    with pytest.raises(ValueError, match=r"^max_restarts=-1 is not a whole number >= 0"):
        distributor(max_restarts=-1)
    with pytest.raises(ValueError, match=r"^min_nodes is 3: give a whole number of nodes"):
        distributor(min_nodes=3)  # above the run's nodes: the run's own check


def test_a_typo_is_a_warning_naming_the_key_meant(conf, caplog):
    conf("spark.torchspark.hangTimout", "30min")
    with caplog.at_level(logging.WARNING):
        d = distributor()
    assert d.hang_timeout is None
    assert ("spark.torchspark.hangTimout is not a torchspark setting and is ignored: did you "
            "mean spark.torchspark.hangTimeout?") in caplog.text
