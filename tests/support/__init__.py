"""Helpers shared by the tests (not test files themselves)."""
