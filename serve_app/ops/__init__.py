"""Operations: the gate (API key, sizes, timeouts), drain, health (cached readiness), metrics,
autoscaling, node names for start errors, and the Ray settings. Imports neither the OpenAI surface nor
the replica."""
