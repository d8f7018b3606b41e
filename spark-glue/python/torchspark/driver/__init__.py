"""The driver's side of torchspark: ``TorchDistributor.run()`` and what it starts
for one run (log channel, rendezvous, restarts, failures, Spark calls).

Nothing is imported here: see torchspark/__init__.py for the public API."""
