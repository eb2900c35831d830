"""``fxplan clusters``: the table, ``--json``, ``--show`` and a bad file (exit code 2)."""

from __future__ import annotations

import json

import yaml

from fxplan.cluster_specs import Cluster, available_specs
from fxplan.cli.main import main


def test_table_lists_every_builtin(capsys):
    assert main(["clusters"]) == 0
    out = capsys.readouterr().out
    for name in available_specs():
        assert name in out
    assert "peak bf16 TFLOP/s" in out and "989" in out and "V100-SXM2-32GB + A100-SXM4-80GB" in out


def test_json_listing_parses(capsys):
    assert main(["clusters", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    by_name = {row["name"]: row for row in rows}
    assert set(by_name) == set(available_specs())
    assert by_name["dgx-a100-80g"]["peak_bf16_tflops"] == [312.0]
    assert by_name["hetero-v100-a100"]["num_devices"] == 32
    assert by_name["aws-p3-v100"]["levels"][1]["bandwidth_gb_per_s"] == 3.125


def test_show_prints_one_spec_in_full(capsys):
    assert main(["clusters", "--show", "dgx-h100:nodes=2"]) == 0
    out = capsys.readouterr().out
    assert "16 devices on 2 nodes" in out and "a valid cluster spec (schema v1)" in out
    canonical = yaml.safe_load(out[out.index("schema_version:"):])
    assert canonical["device_groups"][0]["nodes"] == 2


def test_show_json(capsys):
    assert main(["clusters", "--show", "hetero-v100-a100", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["spec"]["levels"][2]["name"] == "ib-hdr" and len(shown["fingerprint"]) == 64


def test_bad_file_exits_2_with_the_message(tmp_path, capsys):
    spec = Cluster.load("dgx-a100-80g").to_dict()
    spec["levels"][1]["bandwidth_gb_per_s"] = -25
    path = tmp_path / "broken.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    assert main(["clusters", "--show", str(path)]) == 2
    captured = capsys.readouterr()
    assert f"fxplan clusters: error: {path}: levels[1].bandwidth_gb_per_s: found -25" in captured.err
    assert "Traceback" not in captured.err + captured.out


def test_unknown_name_exits_2(capsys):
    assert main(["clusters", "--show", "dgx-z900"]) == 2
    assert "built-in specs: a100-pcie-8" in capsys.readouterr().err
