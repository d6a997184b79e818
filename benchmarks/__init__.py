"""The lab: benchmarks, their workloads and the simulated KV cache (`kv_sim`), outside the product.

Run as `python -m benchmarks <name> --json` from the repository root. Invariants: the wheel does not ship
this package (pyproject's package list names only `evoke_engine*`, `app*` and `evoke_resources*`); nothing in
`evoke_engine/` imports it (tests/unit/test_layers.py); the simulator imports no llama_cpp.
"""
