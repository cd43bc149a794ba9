"""sort (multi-operand, stable) and top_k (being written)."""
