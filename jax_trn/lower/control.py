"""while, case/if: control flow between kernels (being written)."""
