"""Hand-edited plan files, refused before anything starts: each case edits the valid gpt-tiny
plan (4 ranks) and runs ``fxplan launch … --print-command`` (which checks the plan against the
model and cluster) and, for what the file says of itself, ``fxplan export``."""

from __future__ import annotations

import copy
import json
from typing import Any, Callable

import pytest

from fxplan.cli.main import main


def _set(path: str, value: Any) -> Callable[[dict], None]:
    """An edit that sets ``plan[a][b]…`` (path ``a.b``, list indices as numbers)."""
    def edit(plan: dict) -> None:
        *parents, last = path.split(".")
        target: Any = plan
        for key in parents:
            target = target[int(key)] if isinstance(target, list) else target[key]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    return edit


def _config(**changes: str) -> Callable[[dict], None]:
    """Edit keys of the one-line config (and the derived mesh fields along with it)."""
    def edit(plan: dict) -> None:
        parts = dict(p.split("=", 1) for p in plan["config"].split(","))
        parts.update(changes)
        plan["config"] = ",".join(f"{k}={v}" for k, v in parts.items())
        for key in ("mesh_shape", "degrees", "summary"):
            plan.pop(key, None)
    return edit


def _delete(key: str) -> Callable[[dict], None]:
    return lambda plan: plan.pop(key)


def _both(*edits: Callable[[dict], None]) -> Callable[[dict], None]:
    def edit(plan: dict) -> None:
        for one in edits:
            one(plan)
    return edit


def _no_estimate(plan: dict) -> None:
    """Drop the prediction, so that the check after the stale-estimate one is reached."""
    plan["estimate"].pop("config")


def _first_node(plan: dict) -> str:
    return next(iter(plan["placements"]["nodes"]))


def _placement(value: str) -> Callable[[dict], None]:
    def edit(plan: dict) -> None:
        plan["placements"]["nodes"][_first_node(plan)] = value
    return edit


def _unknown_node(plan: dict) -> None:
    plan["placements"]["nodes"]["no_such_node"] = "RR"


def _unknown_param(plan: dict) -> None:
    plan["placements"]["params"]["no.such.weight"] = "RR"


def _shard_dim_9(plan: dict) -> None:
    plan["placements"]["nodes"][_first_node(plan)] = "S(9)R"


#: (name, edit, needles, also refused by export)
CASES: list[tuple[str, Callable[[dict], None], list[str], bool]] = [
    ("mesh-shape-8", _set("mesh_shape", [1, 8, 1]), ["mesh_shape", "disagrees"], True),
    ("mesh-shape-neg", _set("mesh_shape", [1, -4, 1]), ["mesh_shape"], True),
    ("mesh-shape-text", _set("mesh_shape", ["1", "4", "1"]), ["mesh_shape[0]", "integer"], True),
    ("mesh-axes", _set("mesh_axes", ["dp", "pp", "tp"]), ["mesh_axes"], True),
    ("degrees", _set("degrees", {"pp": 1, "dp": 2, "tp": 2}), ["degrees"], True),
    ("config-dp-8", _config(dp="8", m="1", mb="1"), ["dp", "8"], True),
    ("config-dp-0", _config(dp="0"), ["dp", "positive"], True),
    ("config-dp-neg", _config(dp="-4"), ["dp", "positive"], True),
    ("config-dp-2-tp-2-stale", _config(dp="2", tp="2", mb="4"), ["stale", "estimate.config"],
     True),
    ("config-world-8", _both(_config(dp="8", mb="1"), _no_estimate), ["8 ranks", "has 4 devices"],
     False),
    ("config-tp-3", _both(_config(dp="1", tp="3", mb="8"), _no_estimate), ["3 ranks", "has 4 devices"],
     False),
    ("config-pp-4-layers", _both(_config(dp="1", pp="4", mb="8", stages="1/1/1/1"),
                                 _no_estimate, _set("stages", [
                                     {"index": i, "layers": [i, i + 1], "has_embedding": i == 0,
                                      "has_head": i == 3} for i in range(4)])),
     ["stages=1/1/1/1", "model has 2"], False),
    ("config-zero-7", _config(zero="7"), ["zero_stage"], True),
    ("config-sp-tp1", _config(sp="on"), ["estimate.config"], True),
    ("config-text", _set("config", 42), ["config", "text form"], True),
    ("config-garbage", _set("config", "dp=four"), ["dp", "integer"], True),
    ("batch-mismatch", _set("batch", 16), ["batch 16", "dp·microbatch_size"], True),
    ("batch-text", _set("batch", "8"), ["batch", "integer"], True),
    ("batch-float", _set("batch", 8.0), ["batch", "integer"], True),
    ("batch-huge", _set("batch", 10 ** 30), ["batch"], True),
    ("seq-zero", _set("seq", 0), ["seq", "in 1"], True),
    ("stages-0-9", _set("stages.0.layers", [0, 9]), ["stages hold 9 layers", "stages=2"], True),
    ("stages-0-9-config", _both(_set("stages.0.layers", [0, 9]), _config(stages="9"),
                                _no_estimate), ["stages=9", "the model has 2"], False),
    ("stages-reversed", _set("stages.0.layers", [2, 0]), ["stages[0].layers"], True),
    ("stages-start-1", _set("stages.0.layers", [1, 2]), ["stages[0].layers", "[0, stop]"], True),
    ("stages-index", _set("stages.0.index", 3), ["stages[0].index", "expected 0"], True),
    ("stages-no-embedding", _set("stages.0.has_embedding", False), ["has_embedding"], True),
    ("stages-embedding-text", _set("stages.0.has_embedding", "yes"), ["has_embedding",
                                                                      "true or false"], True),
    ("stages-extra", _set("stages", [{"index": 0, "layers": [0, 1]},
                                     {"index": 1, "layers": [1, 2]}]), ["stages"], True),
    ("stages-not-list", _set("stages", {"0": [0, 2]}), ["stages", "list"], True),
    ("stage-missing-layers", _set("stages.0", {"index": 0}), ["layers"], True),
    ("placement-syntax", _placement("S(9)XQ"), ["placements"], True),
    ("placement-one-axis", _placement("R"), ["placements"], True),
    ("placement-not-string", _placement(3), ["placement string"], True),
    ("placement-shard-dim-9", _shard_dim_9, ["shards dimension 9"], False),
    ("placement-unknown-node", _unknown_node, ["no node 'no_such_node'"], False),
    ("placement-unknown-param", _unknown_param, ["no parameter 'no.such.weight'"], False),
    ("placement-axes", _set("placements.axes", ["dp"]), ["placements"], True),
    ("axis-levels-unknown", _set("axis_levels", ["-", "warp-drive", "-"]), ["axis_levels",
                                                                            "warp-drive"], False),
    ("axis-levels-short", _set("axis_levels", ["-"]), ["axis_levels"], True),
    ("block-recompute-bad", _set("block_recompute", ["none", "most"]), ["recompute policy"],
     True),
    ("estimate-not-object", _set("estimate", [1]), ["estimate"], True),
    ("estimate-config-other", _set("estimate.config", "dp=2,tp=2,pp=1,mb=4,m=1"),
     ["stale"], True),
    ("format-version", _set("format_version", 1), ["format_version"], True),
    ("unknown-key", _set("colour", "red"), ["unknown keys", "colour"], True),
    ("missing-config", _delete("config"), ["missing", "config"], True),
    ("missing-model", _delete("model"), ["missing", "model"], True),
    ("model-not-string", _set("model", 7), ["model", "string"], True),
    ("cluster-fingerprint", _set("cluster_fingerprint", "0" * 64), ["fingerprint"], False),
    ("graph-fingerprint", _set("graph_fingerprint", "f" * 64), ["graph"], False),
    ("cluster-unknown", _set("cluster", "dgx-z100"), ["dgx-z100"], False),
    ("solver-unknown-key", _set("solver", {"speed": 1}), ["solver", "unknown"], True),
    ("runners-up-not-list", _set("runners_up", "none"), ["runners_up", "list"], True),
]


def _run(argv: list[str], capsys) -> tuple[int, str]:
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize("name,edit,needles,export_too", CASES, ids=[c[0] for c in CASES])
def test_edited_plan_is_refused(name, edit, needles, export_too, valid_plan, tmp_path, capsys):
    plan = copy.deepcopy(valid_plan)
    edit(plan)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    verbs = [["launch", str(path), "--data", "synthetic", "--print-command"]]
    if export_too:
        verbs.append(["export", str(path), "--to", "megatron"])
    for argv in verbs:
        code, text = _run(argv, capsys)
        assert code == 2, f"{argv[0]}: exit {code}: {text[-1500:]}"
        assert "Traceback" not in text and "running:" not in text, text
        for needle in needles:
            assert needle in text, f"{argv[0]}: {needle!r} not in: {text[-1500:]}"


def test_the_valid_plan_launches_and_exports(valid_plan, tmp_path, capsys):
    """The cases above fail because of their edit: the unedited plan passes both verbs."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(valid_plan))
    assert _run(["launch", str(path), "--data", "synthetic", "--print-command"], capsys)[0] == 0
    assert _run(["export", str(path), "--to", "megatron"], capsys)[0] == 0
