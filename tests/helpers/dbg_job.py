import torch
from rt_module_cases import *
def job(plan_json):
    plan = Plan.from_json(plan_json)
    tokens, targets = batch(plan)
    sharded = apply_plan(build("llama"), plan, tokens)
    full = sharded.full_parameters()
    return {k: (type(v).__name__, type(p).__name__, getattr(p, "placements", None)) for (k, v), p in zip(full.items(), sharded.named_parameters().values())}
