"""flowjit-cache: inspect the kernel cache."""
