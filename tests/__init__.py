"""The test suites of torchspark (docs/testing.md)."""
