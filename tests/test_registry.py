"""The weight-role registry's own texts and readers: the docstring table is the code's, the name
parser reads what the builder writes, and the one QKV/SwiGLU split serves the HF mapping."""

from __future__ import annotations

import re

import pytest
import torch

from megatron_gamma.config import load_config
from megatron_gamma.model import roles
from megatron_gamma.training import init_audit


def _docstring_table() -> dict[str, tuple[str, str, str]]:
    """{role: (parameter, TP, group)} from the module docstring's table."""
    lines = roles.__doc__.splitlines()
    bars = [i for i, line in enumerate(lines) if line.startswith("=====")]
    bar = lines[bars[0]]
    spans = [(m.start(), m.end()) for m in re.finditer(r"=+", bar)]
    out = {}
    for line in lines[bars[1] + 1 : bars[2]]:
        cells = [line[a:b].strip() if b < len(line) else line[a:].strip() for a, b in spans]
        if cells[0]:
            out[cells[0]] = (cells[1], cells[3], cells[4])
    return out


def test_docstring_table_is_the_registry():
    table = _docstring_table()
    assert list(table) == [r.name for r in roles.REGISTRY]
    for row in roles.REGISTRY:
        parameter, tp, group = table[row.name]
        if row.name == "bias":
            assert (parameter, tp, group) == ("any *.bias", "owner", "owner")
            continue
        examples = [p.strip().split(" ")[0] for p in parameter.split(",")]
        for example in examples:
            name = "decoder.layers.0." + example.replace(".E.", ".3.").replace("*", "x.")
            assert roles.role_of(name).name == row.name, (row.name, name)
        assert tp == {0: "rows", 1: "cols", None: "-"}[row.partition_dim], row.name
        assert group == row.group.value, row.name


def test_init_audit_names_the_registrys_depth_scaled_roles():
    listed = re.search(r"depth-scaled roles:\s*([\w\s/]+?)\)", init_audit.__doc__).group(1)
    assert sorted(listed.split(" / ")) == sorted(r.name for r in roles.REGISTRY if r.depth_scaled)


@pytest.mark.parametrize(
    ("name", "parsed"),
    [
        ("embedding.word_embeddings.weight", ("embedding", None, None)),
        ("decoder.layers.12.self_attention.linear_qkv.weight", ("qkv", 12, None)),
        ("decoder.layers.3.mlp.experts.local_experts.11.linear_fc2.weight", ("expert_fc2", 3, 11)),
        ("decoder.layers.0.mlp.shared_experts.linear_fc2.weight", ("shared_fc2", 0, None)),
        ("decoder.layers.7.self_attention.q_layernorm.weight", ("norm", 7, None)),
        ("decoder.final_layernorm.weight", ("norm", None, None)),
    ],
)
def test_parse_name(name, parsed):
    assert roles.parse_name(name) == roles.ParamName(*parsed)


def test_with_indices_replaces_layer_and_expert_only():
    name = "decoder.layers.3.mlp.experts.local_experts.1.linear_fc1.bias"
    assert roles.with_indices(name, 13, 9) == (
        "decoder.layers.13.mlp.experts.local_experts.9.linear_fc1.bias"
    )
    assert roles.with_indices(name, 13) == (
        "decoder.layers.13.mlp.experts.local_experts.1.linear_fc1.bias"
    )
    assert roles.with_indices("output_layer.weight", 13, 9) == "output_layer.weight"


def test_qkv_split_is_megatron_cores_grouped_layout_and_the_hf_mappings():
    """Rows [q heads of group 0, k0, v0, q heads of group 1, k1, v1] (megatron-core
    ``get_query_key_value_tensors``), read back by explicit row indices; the HF export's
    q/k/v projections are those same tensors and import joins them back bit for bit."""
    from megatron_gamma.hf.mapping import from_hf, to_hf

    cfg = load_config(
        None,
        {"num_layers": 1, "hidden_size": 32, "num_attention_heads": 4, "num_query_groups": 2},
    )
    m = cfg.model
    d, per = m.kv_channels, m.num_attention_heads // m.num_query_groups
    qkv = torch.randn((per + 2) * m.num_query_groups * d, m.hidden_size)
    rows: dict[str, list[int]] = {"q": [], "k": [], "v": []}
    for group in range(m.num_query_groups):
        base = group * (per + 2) * d
        rows["q"] += range(base, base + per * d)
        rows["k"] += range(base + per * d, base + (per + 1) * d)
        rows["v"] += range(base + (per + 1) * d, base + (per + 2) * d)
    parts = roles.qkv_parts(qkv, m)
    for x in "qkv":
        assert torch.equal(parts[x], qkv[rows[x]])
    fc1 = torch.randn(2 * m.ffn_hidden_size, m.hidden_size)
    halves = roles.glu_parts(fc1, m)
    assert torch.equal(halves["gate"], fc1[: m.ffn_hidden_size])
    assert torch.equal(halves["up"], fc1[m.ffn_hidden_size :])

    a = "decoder.layers.0.self_attention"
    sd = {
        "embedding.word_embeddings.weight": torch.randn(8, m.hidden_size),
        "decoder.layers.0.input_layernorm.weight": torch.randn(m.hidden_size),
        f"{a}.linear_qkv.weight": qkv,
        f"{a}.linear_proj.weight": torch.randn(m.hidden_size, m.hidden_size),
        f"{a}.linear_gate.weight": torch.randn(m.hidden_size, m.hidden_size),
        "decoder.layers.0.pre_mlp_layernorm.weight": torch.randn(m.hidden_size),
        "decoder.layers.0.mlp.linear_fc1.weight": fc1,
        "decoder.layers.0.mlp.linear_fc2.weight": torch.randn(m.hidden_size, m.ffn_hidden_size),
        "decoder.final_layernorm.weight": torch.randn(m.hidden_size),
        "output_layer.weight": torch.randn(8, m.hidden_size),
    }
    hf = to_hf(sd, cfg)
    for x in "qkv":
        assert torch.equal(hf[f"model.layers.0.self_attn.{x}_proj.weight"], parts[x])
    assert torch.equal(hf["model.layers.0.mlp.gate_proj.weight"], halves["gate"])
    back = from_hf(hf, cfg)
    assert back.keys() == sd.keys()
    assert all(torch.equal(back[k], sd[k]) for k in sd)
