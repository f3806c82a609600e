"""Operations: the `llmserve` command line (prepare, check, status, ray-env)."""
