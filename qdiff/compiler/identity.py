"""Pass: drop gates that are the identity up to global phase (id, rz(0), rz(2pi), u3(0,a,-a))."""
from qdiff.compiler import peephole


def remove_identities(circuit):
    """Circuit -> Circuit without identity gates."""
    return peephole.run(circuit, lambda a, b: None, lambda a, b: True, lookback=0)
