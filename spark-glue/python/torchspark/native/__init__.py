"""The ctypes bindings of libtorchspark (the C core), imported on every side.

Nothing is imported here: see torchspark/__init__.py for the public API."""
