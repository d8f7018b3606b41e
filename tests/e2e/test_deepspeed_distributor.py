"""torchspark.DeepspeedTorchDistributor against PySpark's own, on local-cluster[2,1,1024]:
the constructor (values, input_params, errors), the command-line contract the training
processes get (--deepspeed, --deepspeed_config PATH after the user's arguments; a dict
written to a JSON file where they run), in local and distributed mode, function and script.

The training side is a script or function that records the arguments and the config file it
receives; the real `deepspeed` package is exercised by the last test when it is installed
(it is not in tests/requirements.txt: see docs/distributor.md, "DeepspeedTorchDistributor").
"""
import json
import sys

import pytest
from pyspark import cloudpickle
from pyspark.ml.deepspeed.deepspeed_distributor import DeepspeedTorchDistributor as Stock

from torchspark import DeepspeedTorchDistributor

cloudpickle.register_pickle_by_value(sys.modules[__name__])

CONFIG = {"train_batch_size": 8, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}

# Writes what this rank received: its arguments and, if given, the config file's content.
RECORDER = r'''
import json, os, sys
out = sys.argv[1]
argv = sys.argv[1:]
cfg = None
if "--deepspeed_config" in argv:
    with open(argv[argv.index("--deepspeed_config") + 1]) as f:
        cfg = json.load(f)
with open(os.path.join(out, "rank%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({"argv": argv, "config": cfg, "main": __name__}, f)
'''


@pytest.fixture(scope="module")
def spark(spark_cluster):
    return spark_cluster


def outcome(fn):
    try:
        d = fn()
        return ("ok", d.input_params, d.num_tasks, d.num_processes, d.ssl_conf)
    except Exception as e:  # compare type and exact text
        return (type(e).__name__, str(e))


@pytest.mark.parametrize("kwargs", [
    dict(numGpus=2, nnodes=1, localMode=True, useGpu=False),
    dict(numGpus=1, nnodes=2, localMode=False, useGpu=False, deepspeedConfig=CONFIG),
    dict(numGpus=1, nnodes=2, localMode=False, useGpu=False, deepspeedConfig="/x/ds.json"),
    dict(numGpus=0, nnodes=2, localMode=False, useGpu=False),
    dict(numGpus=1, nnodes=2, localMode=False, useGpu=True),  # task GPU amount unset
    dict(),  # stock's defaults: useGpu=True, local mode, and no GPU on this driver
])
def test_construction_matches_stock(spark, kwargs):
    assert outcome(lambda: DeepspeedTorchDistributor(**kwargs)) == outcome(lambda: Stock(**kwargs))


def test_script_keyword_arguments_refused_like_stock(spark, tmp_path):
    script = tmp_path / "t.py"
    script.write_text("pass\n")
    errors = []
    for cls in (DeepspeedTorchDistributor, Stock):
        with pytest.raises(ValueError) as e:
            cls(numGpus=1, nnodes=1, localMode=True, useGpu=False).run(str(script), lr=1)
        errors.append(str(e.value))
    assert errors[0] == errors[1]


def _records(out, n):
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(n)]


@pytest.mark.parametrize("local_mode", [True, False])
@pytest.mark.parametrize("config", ["dict", "path", None])
def test_script_gets_deepspeed_arguments(spark, tmp_path, local_mode, config):
    script = tmp_path / "train.py"
    script.write_text(RECORDER)
    out = tmp_path / "out"
    out.mkdir()
    path = tmp_path / "given.json"
    path.write_text(json.dumps(CONFIG))
    ds_config = {"dict": CONFIG, "path": str(path), None: None}[config]
    d = DeepspeedTorchDistributor(numGpus=1 if not local_mode else 2,
                                  nnodes=2 if not local_mode else 1,
                                  localMode=local_mode, useGpu=False, deepspeedConfig=ds_config)
    assert d.run(str(script), str(out), 7) is None
    for rec in _records(out, 2):
        argv = rec["argv"]
        assert argv[:2] == [str(out), "7"]
        assert rec["main"] == "__main__"
        if config is None:
            assert argv[2:] == ["--deepspeed"]
            assert rec["config"] is None
        else:
            assert argv[2:4] == ["--deepspeed", "--deepspeed_config"] and len(argv) == 5
            assert rec["config"] == CONFIG
            if config == "path":
                assert argv[4] == str(path)


def test_function_gets_deepspeed_arguments_and_returns(spark):
    def train(x, scale=1):
        import json
        import os
        import sys
        argv = sys.argv[1:]
        with open(argv[argv.index("--deepspeed_config") + 1]) as f:
            cfg = json.load(f)
        return {"rank": os.environ["RANK"], "argv0": argv[0], "config": cfg, "x": x * scale}

    d = DeepspeedTorchDistributor(numGpus=1, nnodes=2, localMode=False, useGpu=False,
                                  deepspeedConfig=CONFIG)
    got = d.run(train, 3, scale=2)
    assert got == {"rank": "0", "argv0": "--deepspeed", "config": CONFIG, "x": 6}


def test_real_deepspeed_on_cpu(spark, tmp_path):
    pytest.importorskip("deepspeed")

    def train():
        import argparse
        import deepspeed
        import deepspeed.comm.torch as ds_torch
        import torch
        # DeepSpeed's CPU accelerator otherwise JIT-compiles its shared-memory all-reduce
        # (minutes) on first use; gloo does the job here.
        ds_torch.build_shm_op = lambda: None
        p = deepspeed.add_config_arguments(argparse.ArgumentParser())
        args = p.parse_args()
        model = torch.nn.Linear(4, 1)
        engine, _, _, _ = deepspeed.initialize(args=args, model=model,
                                               model_parameters=model.parameters())
        loss = engine(torch.ones(4, 4)).sum()
        engine.backward(loss)
        engine.step()
        return engine.train_batch_size()

    d = DeepspeedTorchDistributor(numGpus=1, nnodes=2, localMode=False, useGpu=False,
                                  deepspeedConfig=CONFIG)
    assert d.run(train) == 8
