"""What runs in a barrier task, in an executor's Python worker: the task's boot,
the election, the torchspark-run agent and the node's DataFrame partition.

Nothing is imported here: see torchspark/__init__.py for the public API."""
