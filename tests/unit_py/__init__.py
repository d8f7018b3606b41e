"""Pure Python unit and contract tests: no Spark session, no training job (docs/testing.md)."""
