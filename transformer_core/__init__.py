"""transformer_core."""
