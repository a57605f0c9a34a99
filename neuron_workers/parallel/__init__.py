"""Tensor parallelism: the pure shard plan (`shard_plan`), the injected collectives (`collectives`) and the
TP layers swapped into a loaded HF model (`layers.apply_tp`). Used by the cpu_tp and neuron backends."""
