"""txnstream test suite (a package, so its conftest and helpers have unique module names)."""
