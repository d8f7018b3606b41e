"""The one home of the test helpers (docs/testing.md, "Helpers"): processes and ports
(agentutil), Spark sessions (tsp_spark), the JVM glue (jvmutil), Spark Connect (tsp_connect),
the log channel's protocol client (logproto, logchannel_harness)."""
