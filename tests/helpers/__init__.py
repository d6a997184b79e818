"""Test helpers shared by the test tiers (importable as `helpers` from tests/): fakes for the engine's own logic."""
