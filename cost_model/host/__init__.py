"""Host work a kernel's roofline does not see: framework dispatch, FSDP2 hooks, DTensor, per-step overheads."""
