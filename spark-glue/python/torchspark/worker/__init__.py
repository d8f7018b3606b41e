"""What runs in the training processes: function mode's runner, the warm worker
pool they are forked from, and ``torchspark.report()``.

Nothing is imported here: see torchspark/__init__.py for the public API."""
