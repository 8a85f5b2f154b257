"""Run untrusted code under OS isolation and resource limits (standard library only)."""
