"""A cluster file with a defect, given to `sp-plan plan`: exit 2 and one `error: FIELD: PROBLEM; FIX` line whose
field is the one the user has to fix (the preset-style node form and the full form keep one schema_version rule)."""
from pathlib import Path

import pytest
import yaml

from sp_plan.cli.app import run_line
from sp_plan.planner.calibration import measured_params
from sp_plan.planner.cluster import SCHEMA_VERSION
from sp_plan.planner.errors import PlanError
from sp_plan.planner.profile import KernelSample
from sp_plan.profiles import CLUSTERS, preset_cluster

PLAN = ["plan", "--model", "tiny-gpt", "--seq-len", "4k", "--no-profile"]


def node_file(tmp_path: Path, **change) -> str:
    """cpu-local's node description with ``change`` applied (a value of None drops the key), written to a file."""
    spec = yaml.safe_load((CLUSTERS / "cpu-local.yaml").read_text())
    for k, v in change.items():
        if v is None:
            del spec[k]
        else:
            spec[k] = v
    path = tmp_path / "node.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def error_line(capsys, cluster: str) -> str:
    """The one stderr line of `sp-plan plan --cluster CLUSTER ...`, which must exit 2."""
    assert run_line([*PLAN, "--cluster", cluster]) == 2
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def test_a_node_without_intra_names_intra_not_the_pcie_section_it_never_wrote(tmp_path, capsys):
    line = error_line(capsys, node_file(tmp_path, intra=None))
    assert line.startswith("error: intra: no intra-node interconnect given; add intra: {kind: "), line
    assert "nvswitch|nvlink|hccs|shm" in line and "pcie section" in line


def test_intra_without_a_kind_names_intra_kind(tmp_path, capsys):
    line = error_line(capsys, node_file(tmp_path, intra={"capacity": 5e9}))
    assert line.startswith("error: intra.kind: no kind given"), line


def test_intra_kind_pcie_without_a_pcie_section_names_pcie(tmp_path, capsys):
    line = error_line(capsys, node_file(tmp_path, intra={"kind": "pcie"}))
    assert line == "error: pcie: intra kind pcie but no pcie section; add pcie: {capacity, switches} or another intra kind"


def test_a_node_file_with_the_supported_schema_version_plans(tmp_path, capsys):
    assert run_line([*PLAN, "--cluster", node_file(tmp_path, schema_version=SCHEMA_VERSION), "--json"]) == 0
    assert not capsys.readouterr().err.strip()


@pytest.mark.parametrize("version,says", [
    (SCHEMA_VERSION + 1, f"newer than this sp-plan supports ({SCHEMA_VERSION})"),
    (0, f"write schema_version: {SCHEMA_VERSION}"),
    ("one", f"write schema_version: {SCHEMA_VERSION}"),
])
def test_a_node_file_with_another_schema_version_is_refused_as_the_full_form_is(tmp_path, capsys, version, says):
    node = error_line(capsys, node_file(tmp_path, schema_version=version))
    full = tmp_path / "full.yaml"
    preset_cluster("cpu-local").save(full)
    full.write_text(yaml.safe_dump({**yaml.safe_load(full.read_text()), "schema_version": version}))
    assert node.startswith("error: cluster.schema_version: ") and says in node, node
    assert error_line(capsys, str(full)) == node


def test_a_device_without_the_models_dtype_names_the_clusters_peak_flops(tmp_path, capsys):
    device = yaml.safe_load((CLUSTERS / "cpu-local.yaml").read_text())["device"]
    del device["peak_flops"]["fp32"]  # tiny-gpt is fp32
    line = error_line(capsys, node_file(tmp_path, device=device))
    assert line.startswith("error: model.dtype: cpu-rank has no peak FLOP/s for fp32 in the cluster; "), line
    assert "or add peak_flops.fp32 to the device in the cluster file" in line
    assert "['bf16', 'fp16', 'fp64']" in line


def test_fitting_kernels_for_a_dtype_the_device_lacks_names_the_clusters_peak_flops():
    cluster = preset_cluster("cpu-local")
    del cluster.device(0).peak_flops["fp32"]
    sample = KernelSample(kind="matmul", size=256, heads=1, head_dim=64, causal=False, flops=1e9, seconds=0.1)
    with pytest.raises(PlanError) as e:
        measured_params(cluster, "fp32", [sample])
    assert e.value.field == "dtype" and "add peak_flops.fp32 to the device in the cluster file" in e.value.fix


@pytest.mark.parametrize("change, field", [
    ({"device": {"memory_bytes": 8e9, "peak_flops": {"fp32": 1e-300}}}, "cluster.device.peak_flops.fp32"),
    ({"device": {"memory_bytes": 1e-300, "peak_flops": {"fp32": 1e12}}}, "cluster.device.memory_bytes"),
    ({"intra": {"kind": "shm", "capacity": 1e-300}}, "cluster.intra.capacity"),
])
def test_a_figure_no_device_or_link_can_have_is_refused_before_a_step_overflows(tmp_path, capsys, change, field):
    """1e-300 for 1e300: a positive figure too small to be true (a step priced from it overflows to inf) is named."""
    line = error_line(capsys, node_file(tmp_path, **change))
    assert line.startswith(f"error: {field}: Input should be greater than or equal to"), line


def test_the_service_refuses_an_inline_cluster_with_such_a_figure(tmp_path):
    from fastapi.testclient import TestClient

    from sp_plan.service.app import create_app
    from sp_plan.service.settings import Settings

    spec = preset_cluster("cpu-local", 1).model_dump(mode="json")
    for node in spec["node_types"].values():
        node["devices"][0]["peak_flops"]["fp32"] = 1e-300
    body = {"cluster": spec, "model": "tiny-gpt", "workload": {"seq_len": "4k"}, "use_profile": False}
    with TestClient(create_app(Settings(store=f"sqlite:///{tmp_path}/s.db", processes=1))) as client:
        r = client.post("/v1/plan", json=body)
    assert r.status_code == 422 and "peak_flops" in r.text, r.text


def test_a_missing_cluster_file_is_named_whatever_the_case_of_its_suffix(tmp_path, capsys):
    """``CLUSTER.YAML`` names a file as ``cluster.yaml`` does (planner.yamlio.names_file): missing, not a preset."""
    line = error_line(capsys, str(tmp_path / "missing.YAML"))
    assert line.startswith("error: --cluster: file ") and "does not exist" in line, line


def _dgx_node_file(tmp_path: Path, edit) -> str:
    """dgx-h100's node description with ``edit(spec)`` applied, written to a file."""
    spec = yaml.safe_load((CLUSTERS / "dgx-h100.yaml").read_text())
    edit(spec)
    path = tmp_path / "dgx.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


@pytest.mark.parametrize("edit, field, says", [
    (lambda s: s["device"].update(peak_flops={}), "peak_flops", "at least 1 item"),
    (lambda s: s["pcie"].update(sockets=[]), "pcie.sockets", "at least 1 item"),
    (lambda s: s["pcie"].update(switches=[[0, 1], [2, 3], [4, 5], [6, 9]]), "pcie.switches", "[9] are past"),
    (lambda s: s["pcie"].update(switches=[[0, 1], [1, 3], [4, 5], [6, 7]]), "pcie.switches", "[1] are in two"),
    (lambda s: s.update(devices_per_node=16), "pcie.switches", "[8, 9, 10, 11, 12, 13, 14, 15] are in no group"),
], ids=["no peak flops", "no sockets", "device past the node", "device in two switches", "devices in none"])
def test_a_node_files_devices_and_switches_are_each_accounted_for(tmp_path, capsys, edit, field, says):
    """A preset-style file whose PCIe switches name a device past the node, one twice or leave some out planned with
    those devices missing a PCIe link or holding two; an empty peak_flops or sockets list raised StopIteration."""
    line = error_line(capsys, _dgx_node_file(tmp_path, edit))
    assert field in line.split(": ")[1] and says in line, line


def test_a_devices_nic_must_be_a_nic_linked_to_the_fabric(tmp_path, capsys):
    """A device whose nic names a GPU, a CPU or nothing declared crashed the engine's routing (KeyError)."""
    cluster = preset_cluster("dgx-h100", 2).model_dump(mode="json")
    for bad in ("cpu0", "gpu3", "nic42"):
        cluster["node_types"][next(iter(cluster["node_types"]))]["devices"][0]["nic"] = bad
        path = tmp_path / f"{bad}.yaml"
        path.write_text(yaml.safe_dump(cluster))
        line = error_line(capsys, str(path))
        assert line.startswith(f"error: devices[0].nic: '{bad}' is not a NIC of this node") and "nic0" in line, line


def test_a_cluster_file_of_no_nodes_names_its_nodes_field(tmp_path, capsys):
    """`nodes: []` in a cluster file is the file's field to fix, not the --nodes flag the user did not pass."""
    cluster = preset_cluster("dgx-h100", 1).model_dump(mode="json")
    path = tmp_path / "none.yaml"
    path.write_text(yaml.safe_dump({**cluster, "nodes": []}))
    assert error_line(capsys, str(path)).startswith("error: cluster.nodes: the cluster has zero nodes; list the node")


def test_a_capacity_written_with_units_says_the_unit(tmp_path, capsys):
    """`capacity: 400Gb/s` reads as text: the line says capacities are plain bytes/s, not only "fix that field"."""
    cluster = preset_cluster("dgx-h100", 1).model_dump(mode="json")
    cluster["node_types"][next(iter(cluster["node_types"]))]["links"][0]["capacity"] = "400Gb/s"
    path = tmp_path / "units.yaml"
    path.write_text(yaml.safe_dump(cluster))
    line = error_line(capsys, str(path))
    assert ".links.0.capacity: " in line and line.endswith("write a plain number in bytes/s, e.g. 5.0e10 for 400 Gb/s")
