"""rng_bit_generator, reduce_precision, nextafter, partition_id/replica_id, optimization_barrier (being written)."""
