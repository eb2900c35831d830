"""One rank of ``fxplan launch`` (the process :mod:`fxplan.worker` runs): its flags, the loss
and data it trains on, the plan for the world it got, the run prepared, resumed, stepped,
reported on by rank 0, and the faults tests inject."""
