"""reduce_window (pooling, cumulative ops) and select_and_scatter (being written)."""
