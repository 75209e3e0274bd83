"""Interleaved pipeline stages in the exports: Megatron-LM's flags (checked by its recorded argument parser and by
Megatron-Core 0.16.1's TransformerConfig and PipelineParallelLayerLayout), torchtitan's Interleaved1F1B (its split of
the layers mirrored), and the targets that run plain 1F1B refusing them or taking the nearest plan."""
import shlex
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from sp_plan.integrations.export import TARGETS, target
from sp_plan.integrations.export.megatron import pipeline_layout
from sp_plan.integrations.export.nearest import nearest
from sp_plan.planner import Plan
from sp_plan.planner.errors import PlanError
from sp_plan.planner.model import Workload
from sp_plan.profiles import load_model, preset_cluster
from test_export import recorded_parser

FIX = Path(__file__).parent / "fixtures" / "export"
MODEL = load_model("llama3-8b")  # 32 layers
LLAMA3_405B = load_model("llama3-405b")  # 126 layers
PUBLISHED = [7] + [8] * 14 + [7]
TRAIN = Workload(seq_len=131072, batch=32)


def argv(text: str) -> list[str]:
    """The words of an exported command line as a shell reads them (comments dropped, continuations joined)."""
    return shlex.split("\n".join(l for l in text.splitlines() if not l.startswith("#")).replace("\\\n", " "))


def parsed(text: str) -> dict:
    """The export's flags through Megatron-LM's argument parser, rebuilt from its recorded fixture."""
    return vars(recorded_parser(FIX / "megatron_flags.json").parse_args(argv(text)))


#: checks that hand the export to Megatron-Core's own classes: importing it takes seconds of CPU, so they run in the
#: whole suite rather than the inner loop
imports_megatron_core = pytest.mark.slow


def megatron_layout(layout: str, pp: int):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout
    return PipelineParallelLayerLayout(layout, pp)


def llama3(v: int) -> Plan:
    return Plan(algorithm="allgather", degrees={"tp": 8, "ring": 16, "pp": 16, "dp": 8},
                order=["tp", "ring", "pp", "dp"], token_layout="zigzag", zero_stage=2, stage_layers=PUBLISHED,
                virtual_stages=v, model=LLAMA3_405B, workload=Workload(seq_len=131072, batch=128))


@pytest.mark.parametrize("v", [2, 4, 8])
def test_llama3s_chunks_go_to_megatron_as_a_pipeline_layout(v):
    """The first and last stage's layers do not divide by v: a layout string rather than virtual stages per rank,
    whose first chunk at v=8 holds only the embedding and whose last only the output and loss."""
    ns = parsed(target("megatron").export(llama3(v)))
    assert ns["--num-virtual-stages-per-pipeline-rank"] is None and ns["--decoder-first-pipeline-num-layers"] is None
    assert ns["--pipeline-model-parallel-layout"] and ns["--pipeline-model-parallel-size"] == 16
    if v == 8:
        assert ns["--pipeline-model-parallel-layout"] == "E|(t|)*126L"


@imports_megatron_core
@pytest.mark.parametrize("v", [2, 4, 8])
def test_llama3s_pipeline_layout_parses_in_megatron_rank_by_rank(v):
    """The embedding and loss take the place of the layers that do not divide by v: Megatron's layout string, whose
    chunk j of rank i holds the layers the plan's chunks do."""
    ns = parsed(target("megatron").export(llama3(v)))
    layout = megatron_layout(ns["--pipeline-model-parallel-layout"], ns["--pipeline-model-parallel-size"])
    layout.validate_layer_layout(num_layers=LLAMA3_405B.layers, mtp_num_layers=None)
    assert layout.virtual_pipeline_model_parallel_size == v
    assert [sum(str(t).endswith("decoder") for c in rank for t in c) for rank in layout.layout] == PUBLISHED
    first, last = layout.layout[0][0], layout.layout[-1][-1]
    assert str(first[0]).endswith("embedding") and str(last[-1]).endswith("loss")
    if v == 8:  # the paper's words: the first chunk only the embedding, the last only the output and loss
        assert len(first) == 1 and len(last) == 1


DIVIDING = [(None, 2, None), (None, 4, None), ([6, 10, 10, 6], 2, 6)]


def dividing(stages, v) -> Plan:
    return Plan(algorithm="ring", degrees={"pp": 4, "ring": 2, "dp": 1}, order=["ring", "pp"], token_layout="zigzag",
                stage_layers=stages, virtual_stages=v, model=MODEL, workload=TRAIN)


@pytest.mark.parametrize("stages,v,first", DIVIDING)
def test_stages_that_divide_by_v_go_to_megatron_as_virtual_stages_per_rank(stages, v, first):
    ns = parsed(target("megatron").export(dividing(stages, v)))
    assert ns["--num-virtual-stages-per-pipeline-rank"] == v and ns["--pipeline-model-parallel-layout"] is None
    assert ns["--decoder-first-pipeline-num-layers"] == first


@imports_megatron_core
@pytest.mark.parametrize("stages,v,first", DIVIDING)
def test_virtual_stages_per_rank_build_megatron_core_config(stages, v, first):
    ns = parsed(target("megatron").export(dividing(stages, v)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.transformer_config import TransformerConfig
    cfg = TransformerConfig(num_layers=MODEL.layers, hidden_size=MODEL.hidden, num_attention_heads=MODEL.heads,
                            pipeline_model_parallel_size=4,
                            virtual_pipeline_model_parallel_size=ns["--num-virtual-stages-per-pipeline-rank"],
                            num_layers_in_first_pipeline_stage=ns["--decoder-first-pipeline-num-layers"],
                            num_layers_in_last_pipeline_stage=ns["--decoder-last-pipeline-num-layers"],
                            pipeline_dtype=__import__("torch").bfloat16)
    assert cfg.virtual_pipeline_model_parallel_size == v
    assert cfg.num_layers_in_first_pipeline_stage == cfg.num_layers_in_last_pipeline_stage == first


def test_layout_strings_fold_runs_and_keep_the_embedding_and_loss_at_the_ends():
    assert pipeline_layout([3, 4, 4, 3], 2) == "Et|(tt|)*6tL"
    assert pipeline_layout([2, 2], 3) == "E|(t|)*4L"


@imports_megatron_core
def test_a_layout_string_splits_in_megatron_into_the_stages_chunks():
    layout = megatron_layout(pipeline_layout([5, 10, 10, 7], 2), 4)
    layout.validate_layer_layout(num_layers=32, mtp_num_layers=None)
    assert [[len(c) for c in rank] for rank in layout.layout] == [[3, 3], [5, 5], [5, 5], [4, 4]]


def test_plain_1f1b_exports_as_before():
    p = llama3(1)
    text = target("megatron").export(p)
    assert "virtual" not in text and "--pipeline-model-parallel-layout" not in text
    assert "--decoder-first-pipeline-num-layers 7" in text


@pytest.mark.parametrize("name", sorted(set(TARGETS) - {"megatron", "torchtitan"}))
def test_targets_without_an_interleaved_schedule_name_virtual_stages(name):
    p = Plan(algorithm="ulysses", degrees={"pp": 4, "ulysses": 2}, order=["ulysses", "pp"], token_layout="contiguous",
             virtual_stages=2, model=MODEL, workload=TRAIN)
    probs = dict(target(name).problems(p))
    assert "plain 1F1B" in probs["virtual_stages"] and "2 virtual stages" in probs["virtual_stages"]
    with pytest.raises(PlanError):
        target(name).export(p)


def torchtitan_plan(stages, v: int, model=MODEL, pp: int = 4) -> Plan:
    return Plan(algorithm="allgather", degrees={"pp": pp, "ring": 2}, order=["ring", "pp"], token_layout="zigzag",
                zero_stage=2, stage_layers=stages, virtual_stages=v, model=model, workload=TRAIN)


def torchtitan_split(text: str) -> dict:
    words = argv(text)
    return {w.split(".")[-1]: words[i + 1] for i, w in enumerate(words) if w.startswith("--parallelism.pipeline")}


@pytest.mark.parametrize("p", [torchtitan_plan(None, 2), torchtitan_plan(None, 4),
                               torchtitan_plan(PUBLISHED, 2, LLAMA3_405B, 16),
                               torchtitan_plan(PUBLISHED, 8, LLAMA3_405B, 16)], ids=lambda p: p.summary())
def test_torchtitan_runs_interleaved_1f1b_with_the_plans_chunks(p):
    """_get_pipeline_metadata makes ceil((layers + both weights) / layers_per_stage) stages, split by
    generate_llm_fqn_per_model_part (stage_split over pp x v stages), stage k on rank k mod pp."""
    from sp_plan.integrations.export.torchtitan import stage_split
    from sp_plan.planner.stages import stage_chunks

    got = torchtitan_split(target("torchtitan").export(p))
    pp, v = p.degrees["pp"], p.virtual_stages
    assert got["pipeline_parallel_schedule"] == "Interleaved1F1B"
    a, b = int(got["pipeline_parallel_first_stage_less_layers"]), int(got["pipeline_parallel_last_stage_less_layers"])
    per = int(got["pipeline_parallel_layers_per_stage"])
    layers = p.model.layers
    assert -(-(layers + a + b) // per) == pp * v  # pp x v stages, v a rank
    chunks = stage_chunks(p.stage_layers or [layers // pp] * pp, v)
    assert stage_split(layers, pp * v, a, b) == [chunks[k % pp][k // pp] for k in range(pp * v)]


def test_torchtitan_refuses_chunks_its_even_split_does_not_make_and_its_nearest_plan_runs():
    p = torchtitan_plan([6, 10, 10, 6], 2)  # chunks 3, 5, 5, 3 | 3, 5, 5, 3: not an even split
    t = target("torchtitan")
    assert "cannot make the plan's 2 chunks a pipeline rank" in dict(t.problems(p))["virtual_stages"]
    assert torchtitan_split(t.export(torchtitan_plan(None, 1)))["pipeline_parallel_schedule"] == "1F1B"
    c = preset_cluster("dgx-h100", 1)
    w = Workload(seq_len=65536, batch=8)
    near = nearest(t, p.model_copy(update={"workload": w}), c, MODEL, w)
    assert not t.problems(near.plan)


def test_sp_plan_export_writes_the_layout_quoted_for_the_shell(tmp_path):
    p = llama3(8)
    p.save(tmp_path / "l3.yaml")
    r = subprocess.run([sys.executable, "-m", "sp_plan.cli.app", "export", str(tmp_path / "l3.yaml"), "--to",
                        "megatron", "-o", str(tmp_path / "l3.args")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "l3.args").read_text()
    assert "--pipeline-model-parallel-layout 'E|(t|)*126L'" in text
    words = "\n".join(l for l in text.splitlines() if not l.startswith("#")).replace("\\\n", " ")
    out = subprocess.run(["bash", "-c", f"set -- {words}; echo $#"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and int(out.stdout) == len(argv(text))  # bash reads the words shlex does
