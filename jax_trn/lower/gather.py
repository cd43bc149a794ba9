"""gather: jnp indexing, take, embedding lookups (being written)."""
