"""Level 3: candidates from re-synthesis; the smallest verified one wins (placeholder)."""


def optimize3(lowered, opt, verify, seed, deadline, report, basis, coupling=None):
    return opt
