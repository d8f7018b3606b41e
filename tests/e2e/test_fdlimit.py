"""The driver's descriptor limit (native/src/driver/fdlimit.c, through the binding that
TorchDistributor calls before it starts a job's log server): raised to the hard limit, and
a clear error naming the limit and the node count when even that is too low. In a child
process: the limits it lowers are its own."""
import subprocess
import sys

CHILD = r'''
import resource, sys
from torchspark.native import _native
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (300, hard))
_native.fd_check(100)
assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == hard, "not raised"
resource.setrlimit(resource.RLIMIT_NOFILE, (400, 400))
_native.fd_check(72)
try:
    _native.fd_check(2048)
except OSError as e:
    print(e)
else:
    sys.exit("no error for 2048 nodes under a hard limit of 400")
'''


def test_the_limit_is_raised_else_the_error_names_it_and_the_nodes():
    p = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    msg = p.stdout.strip()
    assert msg.startswith("torchspark: the driver may open 400 file descriptors (ulimit -n; "
                          "hard limit 400), but a job of 2048 nodes needs about 4352"), msg
    assert "ulimit -n 4352" in msg and "or run fewer nodes" in msg, msg
