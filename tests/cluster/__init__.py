"""The multi-host cluster tests (network namespaces; docs/testing.md)."""
