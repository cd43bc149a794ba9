"""Kernels written in the kernel language (jax_trn.kernels), each a complete example a
user can read, call from JAX and profile: `matmul` (a first version and a fast one),
`softmax`, `rmsnorm` and `flash_attention` (a causal flash-attention forward).
benchmarks/kernels.py measures them; notebooks/05_writing_a_kernel.ipynb builds the
matmul up step by step."""
