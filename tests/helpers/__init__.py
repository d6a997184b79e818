"""Test helpers shared by the test tiers (importable as `helpers` from tests/): the fake KV cache and the memory rig,
a settable clock, the endpoint's server fixtures, the snapshot fuzzer, the native-library build for the attention
tests, the hostile suite, and the child processes the crash and persistence tests start and kill (by path)."""
