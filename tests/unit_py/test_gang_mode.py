"""The launch's resolution (the settings' read, _conf.read) and the rendezvous' switch for it
(_rendezvous.enabled): a gang launch turns the driver's rendezvous on under Spark Connect,
where it is off by default; an explicit spark.torchspark.rendezvous=false still wins."""
from torchspark.driver import _conf, _gang
from torchspark.native import _rendezvous


class _Conf:
    def __init__(self, values):
        self.values = values

    def get(self, key, default=None):
        return self.values.get(key, default)


class _Session:  # what _conf.read reads of a session: its conf
    def __init__(self, values):
        self.conf = _Conf(values)


def test_auto_is_gang_under_dynamic_allocation_and_the_key_wins():
    """The glue hands the settings' read Spark's spark.dynamicAllocation.enabled (conf.c
    resolves auto: conf.json's cases); the session's, read as the glue reads it."""
    def launch(conf):
        return _conf.read(_Session(conf), warn=False)["launch"]

    on = {"spark.dynamicAllocation.enabled": "true"}
    assert launch(on) == _gang.GANG
    assert launch({}) == "barrier"
    assert launch({**on, "spark.torchspark.launch": "barrier"}) == "barrier"
    assert launch({"spark.torchspark.launch": "gang"}) == _gang.GANG


def test_a_gang_launch_turns_the_rendezvous_on_under_connect():
    assert not _rendezvous.enabled({"rendezvous": None}, remote=True)
    assert _rendezvous.enabled({"rendezvous": None}, remote=True, gang=True)
    assert _rendezvous.enabled({"rendezvous": None}, remote=False)
    assert not _rendezvous.enabled({"rendezvous": False}, remote=True, gang=True)
    assert not _rendezvous.enabled({"rendezvous": False}, remote=False, gang=True)


def test_an_attempt_holds_the_slots_the_controller_says_from_its_gangs_go():
    """_gang.hold performs the run controller's decision (its submit's "hold",
    runctl.json): a Hold of its slots and sleep when it holds from the gang's GO; none
    without one, or when the Connect probe holds (from "probe", _connect.Probe)."""
    class Attempt:  # what _gang.hold reads of a distributor
        spark = _Session({})  # the Hold's thread finds no range(): nothing is submitted
        _failure_times: dict = {}

    for plan in (None, {"slots": 2, "from": "probe", "ms": 5}):
        Attempt._failure_times = {"submit": {"do": "submit", "hold": plan}}
        assert _gang.hold(Attempt) is None and "hold" not in Attempt._failure_times
    Attempt._failure_times = {"submit": {"do": "submit", "hold": {"slots": 2, "from": "go",
                                                                   "ms": 5}}}
    held = _gang.hold(Attempt)
    assert held is not None and (held.k, held.ms, type(held)) == (2, 5, _gang.Hold)
    assert Attempt._failure_times["hold"] is held  # the grow watch counts by it
    held.drop()
    held.thread.join(5)
    assert not held.thread.is_alive()
