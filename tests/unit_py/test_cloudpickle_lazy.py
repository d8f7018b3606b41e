"""torchspark/worker/_cloudpickle.py in fresh interpreters (as a training process starts): a
function pickled by pyspark's cloudpickle loads without running pyspark/__init__, and
whatever the function then does with pyspark finds the same modules as after a plain
`import pyspark`, whichever way it comes in first. Through run(): test_distributor_speed."""
import subprocess
import sys

import pytest
from pyspark import cloudpickle

LOAD = """
import sys
from torchspark.worker import _cloudpickle
cp = _cloudpickle.load()
fn = cp.loads(bytes.fromhex(sys.argv[1]))
assert "pyspark.sql" not in sys.modules and "pyspark.core" not in sys.modules, sorted(sys.modules)
print(repr(cp.loads(cp.dumps(fn()))))
"""


def _in_fresh_python(fn):
    r = subprocess.run([sys.executable, "-c", LOAD, cloudpickle.dumps(fn).hex()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-1]


def _attribute_first():
    import pyspark
    conf = pyspark.SparkConf  # completes the package
    import pyspark.sql
    return (conf.__module__, pyspark.sql.Row.__module__, pyspark.__version__)


def _alias_first():
    import pyspark.rdd  # made by pyspark/__init__ (sys.modules alias of pyspark.core.rdd)
    import pyspark
    return (pyspark.rdd.RDD is pyspark.RDD, pyspark.rdd.__name__)


def _made_submodule_first():
    import pyspark.util  # imported by pyspark/__init__ itself: never run twice
    import pyspark
    return pyspark.util.InheritableThread is pyspark.InheritableThread


def _from_import_and_new_submodule():
    from pyspark import SparkContext
    from pyspark.sql.functions import col
    import pyspark
    return (SparkContext is pyspark.SparkContext, col.__module__, "SparkContext" in dir(pyspark))


def _nothing_of_pyspark():
    import sys
    return sorted(m for m in sys.modules if m.startswith("pyspark"))


@pytest.mark.parametrize("fn,expect", [
    (_attribute_first, "('pyspark.conf', 'pyspark.sql.types', '{v}')"),
    (_alias_first, "(True, 'pyspark.core.rdd')"),
    (_made_submodule_first, "True"),
    (_from_import_and_new_submodule, "(True, 'pyspark.sql.functions.builtin', True)"),
    (_nothing_of_pyspark, "['pyspark', 'pyspark.cloudpickle', 'pyspark.cloudpickle.cloudpickle']"),
])
def test_lazy_pyspark_is_the_real_package_once_used(fn, expect):
    import pyspark

    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    try:
        assert _in_fresh_python(fn) == expect.format(v=pyspark.__version__)
    finally:
        cloudpickle.unregister_pickle_by_value(sys.modules[__name__])
