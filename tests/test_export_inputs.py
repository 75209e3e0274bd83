"""`sp-plan export`'s inputs: the world of a given --cluster/--nodes (named by that flag, with the --nodes that fits),
a --cluster resolved whether or not a nearest plan needs it, and the model's dtype carried into each target's
precision setting (Megatron-LM's recorded parser, torchtitan's recorded config fields, accelerate's PrecisionType)."""
import ast
import json

import pytest
from typer.testing import CliRunner

from sp_plan.cli.app import app
from sp_plan.integrations.export import target
from sp_plan.planner import Plan
from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import Workload
from sp_plan.profiles import load_model, preset_cluster
from test_export import FIX, argv, recorded_parser

runner = CliRunner()
MODEL = load_model("llama3-8b")
WORK = Workload(seq_len=131072, batch=1)
TWO_NODES = preset_cluster("dgx-h100", 2)  # 16 ranks


def usp(token_layout="zigzag", model=MODEL) -> Plan:
    """A 16-rank USP plan made for two DGX H100 nodes (Megatron places it; striped it cannot)."""
    return Plan(algorithm="usp", degrees={"ulysses": 8, "ring": 2}, order=["ulysses", "ring"],
                token_layout=token_layout, zero_stage=2, model=model, workload=WORK, cluster=TWO_NODES.name,
                cluster_fingerprint=TWO_NODES.fingerprint())


def export(*args):
    r = runner.invoke(app, ["export", *map(str, args)])
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    return r


def error_line(r) -> str:
    """The one `error:` line of a refused export (exit 2, nothing on stdout)."""
    lines = [l for l in r.stderr.splitlines() if l.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert r.stdout == "" and "Traceback" not in r.output
    return lines[0]


# ---------------------------------------------------------------- the world of --cluster / --nodes

@pytest.mark.parametrize("layout,extra", [("zigzag", []), ("striped", ["--nearest"])], ids=["expressible", "nearest"])
def test_a_cluster_of_another_world_names_the_flag_and_the_nodes_that_hold_the_plan(tmp_path, layout, extra):
    usp(layout).save(tmp_path / "p.yaml")
    line = error_line(export(tmp_path / "p.yaml", "--to", "megatron", "--cluster", "cpu-local", "--no-profile", *extra))
    assert line == ("error: --cluster: the plan needs 16 ranks (ulysses=8 x ring=2), cpu-local has 4; pass --nodes 4 "
                    "(4 x cpu-local: 16 ranks), or plan again for cpu-local")


def test_nodes_of_the_plans_preset_with_another_world_name_nodes_and_the_count_that_fits(tmp_path):
    usp().save(tmp_path / "p.yaml")
    line = error_line(export(tmp_path / "p.yaml", "--to", "megatron", "--nodes", "3"))
    assert line.startswith("error: --nodes: the plan needs 16 ranks (ulysses=8 x ring=2), dgx-h100x3 has 24; "
                           "pass --nodes 2 (2 x dgx-h100: 16 ranks)")
    line = error_line(export(tmp_path / "p.yaml", "--to", "megatron", "--cluster", "dgx-h100"))
    assert line.startswith("error: --cluster: ") and "dgx-h100 has 8; pass --nodes 2 " in line


def test_a_cluster_file_of_another_world_asks_for_a_cluster_of_the_plans_devices(tmp_path):
    preset_cluster("dgx-h100", 1).save(tmp_path / "one-node.yaml")  # a whole cluster: --nodes cannot grow it
    usp().save(tmp_path / "p.yaml")
    line = error_line(export(tmp_path / "p.yaml", "--to", "megatron", "--cluster", tmp_path / "one-node.yaml"))
    assert line == ("error: --cluster: the plan needs 16 ranks (ulysses=8 x ring=2), dgx-h100 has 8; pass a --cluster "
                    "of 16 devices, or plan again for dgx-h100")


def test_a_cluster_of_the_plans_world_exports_as_the_plan_alone(tmp_path):
    usp().save(tmp_path / "p.yaml")
    alone = export(tmp_path / "p.yaml", "--to", "megatron")
    assert alone.exit_code == 0 and "--context-parallel-size 16" in alone.stdout
    for flags in (["--nodes", "2"], ["--cluster", "dgx-h100", "--nodes", "2"], ["--cluster", "a100-16-eth100"]):
        r = export(tmp_path / "p.yaml", "--to", "megatron", *flags)
        assert r.exit_code == 0 and r.stdout == alone.stdout, (flags, r.output)


@pytest.mark.parametrize("plan", ["made", "bare"])
def test_an_unknown_cluster_is_refused_where_the_plan_needs_no_cluster(tmp_path, plan):
    p = usp() if plan == "made" else Plan(algorithm="ring", degrees={"ring": 4}, order=["ring"], token_layout="zigzag")
    p.save(tmp_path / "p.yaml")
    assert not target("megatron").problems(p)  # expressible: no nearest plan, so no cluster, is needed
    line = error_line(export(tmp_path / "p.yaml", "--to", "megatron", "--cluster", "nosuch"))
    assert line.startswith("error: --cluster: unknown preset 'nosuch'; use one of [")


# ---------------------------------------------------------------- the model's dtype

def with_dtype(p: Plan, dtype: str) -> Plan:
    return p.model_copy(update={"model": p.model.model_copy(update={"dtype": dtype})})


@pytest.mark.parametrize("dtype,bf16,fp16", [("bf16", True, False), ("fp16", False, True), ("fp32", False, False)])
def test_megatron_sets_the_models_precision(dtype, bf16, fp16):
    text = target("megatron").export(with_dtype(usp(), dtype))
    ns = vars(recorded_parser(FIX / "megatron_flags.json").parse_args(argv(text)))
    assert (ns["--bf16"], ns["--fp16"]) == (bf16, fp16)
    # the flag is the only difference from the fp32 export, which is Megatron's default precision
    fp32 = argv(target("megatron").export(with_dtype(usp(), "fp32")))
    assert [w for w in argv(text) if w not in fp32] == (["--bf16"] if bf16 else ["--fp16"] if fp16 else [])


def torchtitan_plan(dtype: str) -> Plan:
    p = Plan(algorithm="allgather", degrees={"ring": 8, "dp": 2}, order=["ring", "dp"], token_layout="zigzag",
             zero_stage=3, model=MODEL, workload=Workload(seq_len=131072, batch=2))
    return with_dtype(p, dtype)


@pytest.mark.parametrize("dtype,param", [("bf16", "bfloat16"), ("fp32", "float32")])
def test_torchtitan_sets_the_mixed_precision_param_of_the_models_dtype(dtype, param):
    words = argv(target("torchtitan").export(torchtitan_plan(dtype)))
    value = words[words.index("--training.mixed_precision_param") + 1]
    field = json.loads((FIX / "torchtitan_config.json").read_text())["training"]["mixed_precision_param"]
    assert value == param and value in field["choices"]


def test_torchtitan_refuses_an_fp16_model_before_any_search(tmp_path):
    p = torchtitan_plan("fp16")
    with pytest.raises(PlanError) as e:
        target("torchtitan").export(p)
    assert e.value.field == "model.dtype" and "bf16/fp32" in e.value.problem
    # a ring plan it cannot express would search for the nearest plan: the dtype is refused first, naming the model
    p.model_copy(update={"algorithm": "ring"}).save(tmp_path / "p.yaml")
    line = error_line(export(tmp_path / "p.yaml", "--to", "torchtitan", "--nearest", "--no-profile"))
    assert line == ("error: model.dtype: torchtitan has no fp16 precision setting (it sets bf16/fp32), and the plan's "
                    "model is fp16; make the plan with a model file of dtype bf16 or fp32, or export to another target")


def accelerator_precision(text: str) -> str:
    """The mixed_precision keyword of the snippet's Accelerator(...) call."""
    calls = [n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "Accelerator"]
    assert len(calls) == 1
    return next(k.value.value for k in calls[0].keywords if k.arg == "mixed_precision")


@pytest.mark.parametrize("p", [
    Plan(algorithm="ring", degrees={"ring": 8, "dp": 2}, order=["ring", "dp"], token_layout="zigzag", zero_stage=3,
         model=MODEL,
         workload=Workload(seq_len=131072, batch=2)),
    Plan(algorithm="ulysses", degrees={"ulysses": 8, "dp": 2}, order=["ulysses", "dp"], token_layout="contiguous",
         model=MODEL, workload=Workload(seq_len=131072, batch=2)),
    Plan(algorithm="ring", degrees={"dp": 16}, order=["dp"], model=MODEL, workload=Workload(seq_len=8192, batch=16)),
], ids=["fsdp2", "deepspeed", "ddp"])
@pytest.mark.parametrize("dtype,mp", [("bf16", "bf16"), ("fp16", "fp16"), ("fp32", "no")])
def test_accelerate_passes_the_models_precision_to_the_accelerator(p, dtype, mp):
    from accelerate.utils import PrecisionType

    got = accelerator_precision(target("accelerate").export(with_dtype(p, dtype)))
    assert got == mp and PrecisionType(got)


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_deepspeed_enables_the_models_precision(dtype):
    p = Plan(algorithm="ulysses", degrees={"ulysses": 16}, order=["ulysses"], token_layout="contiguous",
             model=MODEL, workload=WORK)
    cfg = json.loads(target("deepspeed").export(with_dtype(p, dtype)))
    assert (cfg["bf16"]["enabled"], cfg["fp16"]["enabled"]) == (dtype == "bf16", dtype == "fp16")


def test_a_plan_whose_mesh_order_the_target_cannot_place_exports_the_order_priced_alike(tmp_path):
    """`plan` ranks allgather ring2 dp2 in mesh order dp<ring and shows ring<dp as the same plan (priced alike);
    Megatron places ring<dp only: the export writes that order, says so, and exits 0, where it exited 2 naming a
    nearest plan at +0.0 %. A problem no order fixes (DeepSpeed has no all-gather K/V) still needs --nearest."""
    from sp_plan.integrations.export.nearest import same_plan_in_another_order
    from sp_plan.pipeline import plan as ranked

    cl, m = preset_cluster("cpu-local", 1), load_model("tiny-llama")
    w = Workload(seq_len=4096, batch=2)
    best = ranked(cl, m, w, top_k=1, profile=False)[0]
    assert best.summary().startswith("allgather ring2 dp2") and best.order[:2] == ["dp", "ring"], best.summary()
    t = target("megatron")
    assert t.problems(best)[0][0] == "order"
    same = same_plan_in_another_order(t, best, cl)
    assert same.order[:2] == ["ring", "dp"] and not t.problems(same)
    assert same.predicted.step_time_s == pytest.approx(best.predicted.step_time_s, rel=1e-9)
    assert same_plan_in_another_order(target("deepspeed"), best, cl) is None  # no order gives it all-gather K/V
    path = tmp_path / "plan.yaml"
    best.save(path)
    r = CliRunner().invoke(app, ["export", str(path), "--to", "megatron", "-o", str(tmp_path / "m.sh")])
    assert r.exit_code == 0 and "exporting the same plan in mesh order ring<dp" in " ".join(r.stderr.split())
    assert "ring<dp" in (tmp_path / "m.sh").read_text().splitlines()[0]
