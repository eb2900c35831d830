"""Bad inputs on every ``fxplan`` verb, in-process through ``fxplan.cli.main.main``.

Each case is ``(argv, needles)``: the command must end with exit code 2 (a ``UserError`` or an
argparse usage error), print no traceback, and its output must contain every needle (the
field and what was expected). ``{name}`` in argv is a file of the ``bad_files`` fixture.
"""

from __future__ import annotations

import pytest

from fxplan.cli.main import main

TINY = ["gpt-tiny", "--cluster", "local-cpu:devices=4", "--batch", "8"]
EST = ["estimate", "gpt-tiny", "--cluster", "local-cpu:devices=4", "--batch", "8"]
CFG = ["--config", "dp=4,tp=1,pp=1,mb=1"]
LAUNCH = ["launch", "{plan_json}", "--data", "synthetic", "--print-command"]

CASES: list[tuple[str, list[str], list[str]]] = [
    # -- graph ---------------------------------------------------------------------------
    ("graph-batch-0", ["graph", "gpt-tiny", "--batch", "0"], ["--batch", "1 … 16,777,216"]),
    ("graph-batch-neg", ["graph", "gpt-tiny", "--batch=-4"], ["--batch", "in 1"]),
    ("graph-batch-huge", ["graph", "gpt-tiny", "--batch", "1000000000000"], ["--batch", "16,777,216"]),
    ("graph-batch-float", ["graph", "gpt-tiny", "--batch", "16.0"], ["--batch", "not an integer"]),
    ("graph-batch-text", ["graph", "gpt-tiny", "--batch", "many"], ["--batch", "not an integer"]),
    ("graph-seq-0", ["graph", "gpt-tiny", "--seq", "0"], ["--seq", "in 1"]),
    ("graph-seq-huge", ["graph", "gpt-tiny", "--seq", "99999999999"], ["--seq", "16,777,216"]),
    ("graph-dtype", ["graph", "gpt-tiny", "--dtype", "fp8"], ["--dtype", "invalid choice"]),
    ("graph-method", ["graph", "gpt-tiny", "--method", "magic"], ["--method", "invalid choice"]),
    ("graph-unknown-model", ["graph", "gpt-tinyy"], ["gpt-tinyy"]),
    ("graph-empty-model", ["graph", ""], ["model"]),
    ("graph-family-bad-key", ["graph", "gpt:layerz=2"], ["layerz"]),
    ("graph-family-neg-layers", ["graph", "gpt:layers=-1"], ["layers"]),
    ("graph-family-zero-hidden", ["graph", "gpt:hidden=0"], ["hidden"]),
    ("graph-family-ln-eps", ["graph", "gpt:layers=2,ln_eps=-1"], ["ln_eps", "> 0"]),
    ("graph-family-dup-key", ["graph", "gpt:layers=2,layers=3"], ["layers"]),
    ("graph-family-huge", ["graph", "gpt:layers=1000000000000"], ["layers"]),
    ("graph-family-float-layers", ["graph", "gpt:layers=2.5"], ["layers"]),
    ("graph-model-missing-file", ["graph", "nope/model.py:build"], ["does not exist"]),
    ("graph-model-dir", ["graph", "{dir}/adir.py:build"], ["adir.py"]),
    ("graph-model-exit0", ["graph", "{exit0_py}:build"], ["sys.exit(0)"]),
    ("graph-model-exit3-in-build", ["graph", "{exit3_py}:build"], ["sys.exit(3)", "build()"]),
    ("graph-model-raises", ["graph", "{raises_py}:build"], ["RuntimeError", "boom in build",
                                                            "raises.py"]),
    ("graph-model-syntax", ["graph", "{syntax_py}:build"], ["SyntaxError"]),
    ("graph-model-returns-int", ["graph", "{returns_py}:build"], ["(model, example_inputs)"]),
    ("graph-model-no-function", ["graph", "{raises_py}:nothere"], ["nothere"]),
    ("graph-hf-missing", ["graph", "hf:{tmp}/none/config.json"], ["does not exist"]),
    ("graph-hf-notjson", ["graph", "hf:{notjson_json}"], ["JSON"]),
    ("graph-hf-binary", ["graph", "hf:{binary_json}"], ["binary.json"]),
    ("graph-hf-hidden-not-heads", ["graph", "hf:llama:hidden_size=33"],
     ["transformers refused the config", "hidden size (33)"]),
    ("graph-hf-odd-head-dim", ["graph", "hf:llama:num_attention_heads=7,hidden_size=49"],
     ["transformers refused the config", "head_dim"]),
    ("graph-hf-no-experts", ["graph", "hf:mixtral:num_local_experts=0"],
     ["num_local_experts=0", "at least one expert"]),
    ("graph-leaf-empty", ["graph", "gpt-tiny", "--leaf", ""], ["leaf_modules", "matched no module"]),
    # -- clusters ------------------------------------------------------------------------
    ("clusters-show-empty", ["clusters", "--show", ""], ["empty cluster spec", "expected"]),
    ("clusters-show-unknown", ["clusters", "--show", "dgx-z100"], ["dgx-z100", "built-in"]),
    ("clusters-show-dir", ["clusters", "--show", "{dir}"], ["directory"]),
    ("clusters-show-latin1", ["clusters", "--show", "{latin1_yaml}"], ["UTF-8"]),
    ("clusters-show-empty-file", ["clusters", "--show", "{empty_yaml}"], ["empty.yaml"]),
    ("clusters-show-list-file", ["clusters", "--show", "{list_yaml}"], ["list.yaml"]),
    ("clusters-show-binary-json", ["clusters", "--show", "{binary_json}"], ["UTF-8"]),
    ("clusters-nodes-0", ["clusters", "--show", "dgx-a100-80g:nodes=0"], ["nodes", "≥ 1"]),
    ("clusters-nodes-neg", ["clusters", "--show", "dgx-a100-80g:nodes=-1"], ["nodes"]),
    ("clusters-nodes-huge", ["clusters", "--show", "dgx-a100-80g:nodes=1000000000"],
     ["nodes", "1,048,576"]),
    ("clusters-nodes-1e30", ["clusters", "--show", "dgx-a100-80g:nodes=1000000000000000000000000000000"],
     ["nodes"]),
    ("clusters-nodes-float", ["clusters", "--show", "dgx-a100-80g:nodes=2.5"], ["nodes"]),
    ("clusters-nodes-text", ["clusters", "--show", "dgx-a100-80g:nodes=four"], ["nodes"]),
    ("clusters-dup-override", ["clusters", "--show", "dgx-a100-80g:nodes=2,nodes=3"],
     ["nodes", "twice"]),
    ("clusters-override-nokey", ["clusters", "--show", "dgx-a100-80g:=3"], ["key=value"]),
    ("clusters-override-novalue", ["clusters", "--show", "dgx-a100-80g:nodes="], ["key=value"]),
    ("clusters-override-unknown", ["clusters", "--show", "dgx-a100-80g:colour=red"], ["colour"]),
    ("clusters-memory-1e300", ["clusters", "--show", "dgx-a100-80g:a100.memory_gib=1e300"],
     ["memory_gib"]),
    ("clusters-memory-neg", ["clusters", "--show", "dgx-a100-80g:a100.memory_gib=-80"],
     ["memory_gib"]),
    ("clusters-memory-nan", ["clusters", "--show", "dgx-a100-80g:a100.memory_gib=.nan"],
     ["memory_gib"]),
    ("clusters-efficiency", ["clusters", "--show", "dgx-a100-80g:nvswitch.efficiency=7"],
     ["efficiency"]),
    ("clusters-devices-per-node-0", ["clusters", "--show", "dgx-a100-80g:devices_per_node=0"],
     ["devices_per_node"]),
    ("clusters-devices-per-node-huge", ["clusters", "--show",
                                        "dgx-a100-80g:devices_per_node=100000"],
     ["devices_per_node", "4,096"]),
    ("clusters-devices-3", ["clusters", "--show", "dgx-a100-80g:devices=12"], ["devices"]),
    ("clusters-local-cpu-0", ["clusters", "--show", "local-cpu:devices=0"], ["devices"]),
    ("clusters-local-cpu-huge", ["clusters", "--show", "local-cpu:devices=100000"],
     ["devices", "4,096"]),
    ("clusters-local-cpu-bool", ["clusters", "--show", "local-cpu:devices=true"], ["devices"]),
    ("clusters-hetero-nodes-3", ["clusters", "--show", "hetero-v100-a100:nodes=3"],
     ["nodes", "multiple"]),
    ("clusters-paddle-dup-ids", ["clusters", "--show", "{paddle_dup_json}"], ["global_id"]),
    ("clusters-json-unknown", ["clusters", "--json", "--show", "nope"], ["nope"]),
    # -- estimate -------------------------------------------------------------------------
    ("estimate-no-config", [*EST[:-2], "--batch", "8"], ["--config"]),
    ("estimate-config-empty", [*EST, "--config", ""], ["config ''", "key=value"]),
    ("estimate-config-unknown-key", [*EST, "--config", "dp=4,xx=1"], ["xx", "expected key=value"]),
    ("estimate-config-dup", [*EST, "--config", "dp=4,dp=4"], ["dp is given twice"]),
    ("estimate-config-dp0", [*EST, "--config", "dp=0"], ["dp", "positive integer"]),
    ("estimate-config-dp-text", [*EST, "--config", "dp=four"], ["dp", "integer"]),
    ("estimate-config-world", [*EST, "--config", "dp=3"], ["dp·tp·pp", "≠ 4"]),
    ("estimate-config-schedule", [*EST, "--config", "dp=4,schedule=zigzag"], ["zigzag", "1f1b"]),
    ("estimate-config-interleaved1", [*EST, "--config", "dp=4,schedule=interleaved:1"],
     ["interleaved"]),
    ("estimate-config-zero9", [*EST, "--config", "dp=4,zero=9"], ["zero_stage", "0, 1, 2 or 3"]),
    ("estimate-config-recompute", [*EST, "--config", "dp=4,recompute=some"], ["recompute"]),
    ("estimate-config-sp-maybe", [*EST, "--config", "dp=4,sp=maybe"], ["sp", "on or off"]),
    ("estimate-config-sp-tp1", [*EST, "--config", "dp=4,tp=1,sp=on"], ["sp=on needs tp > 1"]),
    ("estimate-config-stages-count", [*EST, "--config", "dp=2,pp=2,stages=1/1/0"], ["stage_layers", "positive"]),
    ("estimate-config-stages-sum", [*EST, "--config", "dp=2,pp=2,stages=1/5"], ["stages"]),
    ("estimate-config-batch", [*EST, "--config", "dp=4,mb=3"], ["batch=8", "dp·mb"]),
    ("estimate-config-m", [*EST, "--config", "dp=4,mb=1,m=5"], ["m=5"]),
    ("estimate-config-huge-dp", [*EST, "--config", "dp=99999999999999999999"], ["dp"]),
    ("estimate-plot-txt", [*EST, *CFG, "--plot", "{tmp}/out.txt"], ["--plot", ".png"]),
    ("estimate-plot-nodir", [*EST, *CFG, "--plot", "{tmp}/nodir/out.png"], ["--plot",
                                                                           "does not exist"]),
    ("estimate-plot-dir", [*EST, *CFG, "--plot", "{dir}"], ["--plot", "directory"]),
    ("estimate-dtype-fp8", [*EST, *CFG, "--dtype", "fp8"], ["--dtype"]),
    ("estimate-dtype-lacking", ["estimate", "gpt-tiny", "--cluster", "local-cpu:devices=4",
                                "--batch", "8", *CFG, "--dtype", "bf16"], ["bf16"]),
    ("estimate-batch-0", [*EST[:-1], "0", *CFG], ["--batch"]),
    ("estimate-cluster-missing", ["estimate", "gpt-tiny", "--cluster", "{tmp}/x.yaml",
                                  "--batch", "8", *CFG], ["x.yaml", "no such file"]),
    ("estimate-seq-mismatch", [*EST, *CFG, "--seq", "0"], ["--seq"]),
    # -- plan ----------------------------------------------------------------------------
    ("plan-no-batch", ["plan", "gpt-tiny", "--cluster", "local-cpu:devices=4"], ["--batch"]),
    ("plan-batch-huge", ["plan", *TINY[:-1], "1000000000000"], ["--batch", "16,777,216"]),
    ("plan-batch-bool", ["plan", *TINY[:-1], "True"], ["--batch"]),
    ("plan-time-budget-neg", ["plan", *TINY, "--time-budget", "-1"], ["--time-budget", "≥ 0"]),
    ("plan-time-budget-nan", ["plan", *TINY, "--time-budget", "nan"], ["--time-budget", "finite"]),
    ("plan-time-budget-inf", ["plan", *TINY, "--time-budget", "inf"], ["--time-budget"]),
    ("plan-time-budget-year", ["plan", *TINY, "--time-budget", "31536000"], ["--time-budget",
                                                                              "604,800"]),
    ("plan-time-budget-text", ["plan", *TINY, "--time-budget", "soon"], ["--time-budget"]),
    ("plan-output-nodir", ["plan", *TINY, "-o", "{tmp}/nodir/plan.json"], ["-o", "does not exist"]),
    ("plan-output-dir", ["plan", *TINY, "-o", "{dir}"], ["directory"]),
    ("plan-output-suffix", ["plan", *TINY, "-o", "{tmp}/plan.yaml"], [".json"]),
    ("plan-emit-suffix", ["plan", *TINY, "--emit", "{tmp}/prog.png"], ["--emit", ".py"]),
    ("plan-emit-nodir", ["plan", *TINY, "--emit", "{tmp}/no/prog.py"], ["--emit", "does not exist"]),
    ("plan-plot-txt", ["plan", *TINY, "--plot", "{tmp}/out.txt"], ["--plot", "prefix"]),
    ("plan-plot-dir", ["plan", *TINY, "--plot", "{dir}"], ["--plot", "directory"]),
    ("plan-plot-nodir", ["plan", *TINY, "--plot", "{tmp}/no/pre"], ["--plot", "does not exist"]),
    ("plan-constrain-unknown", ["plan", *TINY, "--constrain", "xp=2"], ["xp"]),
    ("plan-constrain-empty-value", ["plan", *TINY, "--constrain", "tp="], ["tp"]),
    ("plan-constrain-tp3", ["plan", *TINY, "--constrain", "tp=3"], ["tp"]),
    ("plan-constrain-dup", ["plan", *TINY, "--constrain", "tp=2,tp=4"], ["tp"]),
    ("plan-constrain-sp-tp1", ["plan", *TINY, "--constrain", "tp=1,sp=on"], ["sequence parallelism needs tp > 1"]),
    ("plan-constrain-zero9", ["plan", *TINY, "--constrain", "zero=9"], ["zero"]),
    ("plan-cluster-empty", ["plan", "gpt-tiny", "--cluster", "", "--batch", "8"], ["cluster"]),
    ("plan-cluster-dir", ["plan", "gpt-tiny", "--cluster", "{dir}", "--batch", "8"], ["directory"]),
    ("plan-cluster-latin1", ["plan", "gpt-tiny", "--cluster", "{latin1_yaml}", "--batch", "8"],
     ["UTF-8"]),
    ("estimate-nolayers-pp2", ["estimate", "{nolayers_py}:build", "--cluster",
                               "local-cpu:devices=4", "--batch", "8", "--config", "dp=2,pp=2"],
     ["needs repeated layers"]),
    ("plan-seq-0", ["plan", *TINY, "--seq", "0"], ["--seq"]),
    ("plan-leaf-method-export", ["plan", *TINY, "--leaf", "Block", "--method", "export"],
     ["leaf_modules", "symbolic_trace"]),
    # -- export --------------------------------------------------------------------------
    ("export-missing", ["export", "{tmp}/none.json", "--to", "megatron"], ["none.json",
                                                                          "does not exist"]),
    ("export-dir", ["export", "{dir}", "--to", "megatron"], ["directory"]),
    ("export-binary", ["export", "{binary_json}", "--to", "megatron"], ["UTF-8"]),
    ("export-notjson", ["export", "{notjson_json}", "--to", "megatron"], ["not a JSON plan"]),
    ("export-array", ["export", "{array_json}", "--to", "megatron"], ["JSON object"]),
    ("export-target", ["export", "{plan_json}", "--to", "jax"], ["jax", "megatron"]),
    ("export-output-nodir", ["export", "{plan_json}", "--to", "megatron", "-o", "{tmp}/x/y.txt"],
     ["-o", "does not exist"]),
    ("export-output-dir", ["export", "{plan_json}", "--to", "megatron", "-o", "{dir}"],
     ["directory"]),
    # -- profile -------------------------------------------------------------------------
    ("profile-min-run-time-neg", ["profile", "--min-run-time", "-1"], ["--min-run-time", "> 0"]),
    ("profile-min-run-time-nan", ["profile", "--min-run-time", "nan"], ["--min-run-time"]),
    ("profile-min-run-time-0", ["profile", "--min-run-time", "0"], ["--min-run-time"]),
    ("profile-rounds-0", ["profile", "--rounds", "0"], ["--rounds"]),
    ("profile-rounds-huge", ["profile", "--rounds", "10000000"], ["--rounds", "1,000"]),
    ("profile-ops-unknown", ["profile", "--ops", "matmul9"], ["matmul9", "known ops"]),
    ("profile-output-nodir", ["profile", "-o", "{tmp}/no/db.json"], ["-o", "does not exist"]),
    ("profile-output-suffix", ["profile", "-o", "{tmp}/db.txt"], [".json"]),
    ("profile-device", ["profile", "--device", "tpu"], ["--device", "invalid choice"]),
    ("profile-device-model-empty", ["profile", "--device-model", "", "--ops", "add"],
     ["--device-model"]),
    # -- launch --------------------------------------------------------------------------
    ("launch-missing-plan", ["launch", "{tmp}/none.json", "--data", "synthetic",
                             "--print-command"], ["none.json", "does not exist"]),
    ("launch-plan-dir", ["launch", "{dir}", "--data", "synthetic", "--print-command"],
     ["directory"]),
    ("launch-plan-binary", ["launch", "{binary_json}", "--data", "synthetic", "--print-command"],
     ["UTF-8"]),
    ("launch-no-data", ["launch", "{plan_json}", "--print-command"], ["--data"]),
    ("launch-data-missing", ["launch", "{plan_json}", "--data", "{tmp}/none.bin",
                             "--print-command"], ["--data", "no such file"]),
    ("launch-data-dir", ["launch", "{plan_json}", "--data", "{dir}", "--print-command"],
     ["directory"]),
    ("launch-nnodes-0", [*LAUNCH, "--nnodes", "0"], ["--nnodes", "≥ 1"]),
    ("launch-nnodes-neg", [*LAUNCH, "--nnodes", "-1"], ["--nnodes", "≥ 1"]),
    ("launch-nnodes-2", [*LAUNCH, "--nnodes", "2"], ["--nnodes"]),
    ("launch-nproc-0", [*LAUNCH, "--nproc-per-node", "0"], ["--nproc-per-node"]),
    # a world other than the plan's is replanned (docs/elastic.md); one no plan fits is refused
    ("launch-nproc-3", [*LAUNCH, "--nproc-per-node", "3"], ["3 ranks"]),
    ("launch-node-rank-neg", [*LAUNCH, "--node-rank", "-1"], ["--node-rank"]),
    ("launch-steps-0", [*LAUNCH, "--steps", "0"], ["--steps", "≥ 1"]),
    ("launch-steps-neg", [*LAUNCH, "--steps", "-3"], ["--steps", "≥ 1"]),
    ("launch-lr-nan", [*LAUNCH, "--lr", "nan"], ["--lr", "finite"]),
    ("launch-lr-neg", [*LAUNCH, "--lr", "-1"], ["--lr", "> 0"]),
    ("launch-min-lr-above", [*LAUNCH, "--lr", "1e-4", "--min-lr", "1"], ["min_lr", "above"]),
    ("launch-beta1-1", [*LAUNCH, "--beta1", "1"], ["--beta1", "[0, 1)"]),
    ("launch-beta2-neg", [*LAUNCH, "--beta2", "-0.1"], ["--beta2"]),
    ("launch-grad-clip-neg", [*LAUNCH, "--grad-clip", "-1"], ["--grad-clip"]),
    ("launch-wd-inf", [*LAUNCH, "--weight-decay", "inf"], ["--weight-decay"]),
    ("launch-warmup-ge-steps", [*LAUNCH, "--steps", "5", "--warmup-steps", "5"], ["warmup_steps"]),
    ("launch-log-every-0", [*LAUNCH, "--log-every", "0"], ["--log-every"]),
    ("launch-ckpt-every-neg", [*LAUNCH, "--checkpoint-every", "-1"], ["--checkpoint-every"]),
    ("launch-seed-neg", [*LAUNCH, "--seed", "-1"], ["--seed"]),
    ("launch-token-dtype", [*LAUNCH, "--token-dtype", "int8"], ["--token-dtype"]),
    ("launch-optimizer", [*LAUNCH, "--optimizer", "lion"], ["--optimizer"]),
    ("launch-endpoint-noport", [*LAUNCH, "--rdzv-endpoint", "node0"], ["--rdzv-endpoint",
                                                                        "HOST:PORT"]),
    ("launch-endpoint-port0", [*LAUNCH, "--rdzv-endpoint", "node0:0"], ["--rdzv-endpoint"]),
    ("launch-resume-empty", [*LAUNCH, "--resume", "{dir}"], ["--resume"]),
    ("launch-resume-missing", [*LAUNCH, "--resume", "{tmp}/nockpt"], ["nockpt"]),
    ("launch-save-exists", [*LAUNCH, "--save", "{dir}"], ["--save", "exists"]),
    ("launch-config-missing", [*LAUNCH, "--config", "{tmp}/none.toml"], ["--config", "no such"]),
    ("launch-config-types", [*LAUNCH, "--config", "{run_toml}"],
     ["steps", "integer"]),
    ("launch-config-section", [*LAUNCH, "--config", "{badsection_toml}"], ["[nope]"]),
    ("launch-config-syntax", [*LAUNCH, "--config", "{notoml_toml}"], ["TOML"]),
    ("launch-config-dir", [*LAUNCH, "--config", "{dir}"], ["--config", "directory"]),
    ("launch-config-latin1", [*LAUNCH, "--config", "{latin1_toml}"], ["--config"]),
    ("launch-passthrough", [*LAUNCH, "--", "positional"], ["positional", "torchrun"]),
    ("launch-passthrough-own", [*LAUNCH, "--", "--nnodes=2"], ["--nnodes"]),
    ("launch-cluster-other", [*LAUNCH, "--cluster", "local-cpu:devices=2"],
     ["local-cpu:devices=4", "re-plan for this cluster"]),
    ("launch-model-other", [*LAUNCH, "--model", "gpt:layers=3,hidden=64,heads=4"],
     ["was made for model", "re-plan"]),
    ("launch-slurm-nodir", [*LAUNCH[:4], "--slurm", "{tmp}/no/x.sbatch"], ["--slurm",
                                                                          "does not exist"]),
    # -- demo ----------------------------------------------------------------------------
    ("demo-batch-0", ["demo", "--batch", "0"], ["--batch"]),
    ("demo-seq-huge", ["demo", "--seq", "100000000000"], ["--seq"]),
    ("demo-cluster-bad", ["demo", "--cluster", "nope"], ["nope"]),
    ("demo-model-bad", ["demo", "--model", "gpt-nope", "--cluster", "local-cpu:devices=2"],
     ["gpt-nope"]),
    # -- models, doctor, top level ------------------------------------------------------
    ("models-extra-arg", ["models", "gpt"], ["unrecognized"]),
    ("doctor-extra-arg", ["doctor", "--fast"], ["unrecognized"]),
    ("verb-unknown", ["plann"], ["invalid choice"]),
    ("after-dashes-not-launch", ["clusters", "--", "--x"], ["only `fxplan launch`"]),
]


@pytest.mark.parametrize("name,argv,needles", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_refused_in_one_paragraph(name, argv, needles, bad_files, capsys):
    argv = [a.format(**bad_files) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse usage errors
        code = exit_.code
    captured = capsys.readouterr()
    text = captured.out + captured.err
    assert code == 2, f"exit {code}: {text[-2000:]}"
    assert "Traceback" not in text, text
    for needle in needles:
        assert needle in text, f"{needle!r} not in: {text[-1500:]}"


def test_there_are_enough_cases():
    assert len(CASES) >= 150


def test_a_model_file_that_loops_at_import_is_stopped(tmp_path, monkeypatch, capsys) -> None:  # type: ignore[no-untyped-def]
    """A user file that never finishes importing ends with one paragraph and exit 2 once its
    time limit (``FXPLAN_IMPORT_TIMEOUT_S``) passes, instead of hanging the command."""
    from fxplan.cli.main import main

    looping = tmp_path / "loops.py"
    looping.write_text("while True:\n    pass\n")
    monkeypatch.setenv("FXPLAN_IMPORT_TIMEOUT_S", "1")
    assert main(["graph", f"{looping}:build"]) == 2
    err = capsys.readouterr().err
    assert "did not finish in 1 s" in err and "FXPLAN_IMPORT_TIMEOUT_S" in err
    assert "Traceback" not in err
