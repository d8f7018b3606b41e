"""The launch's resolution (torchspark/driver/_gang.py) and the rendezvous' switch for it
(_rendezvous.enabled): a gang launch turns the driver's rendezvous on under Spark Connect,
where it is off by default; an explicit spark.torchspark.rendezvous=false still wins."""
from torchspark.driver import _gang
from torchspark.native import _rendezvous


class _Conf:
    def __init__(self, values):
        self.values = values

    def get(self, key, default=None):
        return self.values.get(key, default)


class _Session:  # what _gang.mode reads of a session: its conf
    def __init__(self, values):
        self.conf = _Conf(values)


def test_auto_is_gang_under_dynamic_allocation_and_the_key_wins():
    on, off = _Session({"spark.dynamicAllocation.enabled": "true"}), _Session({})
    assert _gang.mode(on, {"launch": "auto"}) == _gang.GANG
    assert _gang.mode(off, {"launch": "auto"}) == _gang.BARRIER
    assert _gang.mode(on, {"launch": "barrier"}) == _gang.BARRIER
    assert _gang.mode(off, {"launch": "gang"}) == _gang.GANG


def test_a_gang_launch_turns_the_rendezvous_on_under_connect():
    assert not _rendezvous.enabled({"rendezvous": None}, remote=True)
    assert _rendezvous.enabled({"rendezvous": None}, remote=True, gang=True)
    assert _rendezvous.enabled({"rendezvous": None}, remote=False)
    assert not _rendezvous.enabled({"rendezvous": False}, remote=True, gang=True)
    assert not _rendezvous.enabled({"rendezvous": False}, remote=False, gang=True)
