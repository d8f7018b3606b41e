"""End-to-end tests on real Spark and torch (docs/testing.md)."""
