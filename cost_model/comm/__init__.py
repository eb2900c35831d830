"""Communication: α-β collectives over a cluster's levels, the logical mesh and the reshards between placements."""
