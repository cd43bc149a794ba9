"""scatter: .at[].set/add/max/min/mul and gather gradients (being written)."""
