"""The study's design side: the schema (LR grids, per-size recipes and overrides, names), the plan
with its shared / grid / confirm phases, ``sweep --jobs``, the data fingerprint, ``sweep --slurm``'s
cluster flags and the GPU studies' configs and memory.

Expected values are written out by hand from the study files below (LRs, keys, orders), or come
from an independent path (the estimator's memory model, the config's own validation).
"""

from __future__ import annotations

import functools
import json
import math
import os
import shlex
import subprocess
import sys

import pytest
import yaml

from megatron_gamma.estimate import estimate_memory
from megatron_gamma.launch.slurm import ClusterOptions
from megatron_gamma.model.vocab import padded_vocab_size
from megatron_gamma.study import rundir
from megatron_gamma.study import sweep as sweep_mod
from megatron_gamma.study.slurm import submit_study
from megatron_gamma.study.spec import (
    CONFIRM,
    GRID,
    SHARED,
    StudyChangedError,
    StudyError,
    best_lr,
    extend_lr,
    grid_runs,
    load_study,
    plan,
)
from megatron_gamma.study.sweep import (
    DATA_FINGERPRINT,
    RUN_FILE,
    check_data_unchanged,
    check_runs_unchanged,
    check_unchanged,
    describe_plan,
    dry_run,
    prepare_data,
    write_manifest,
    write_run_files,
)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STUDIES = os.path.join(ROOT, "examples", "studies")
DEMO = os.path.join(ROOT, "megatron_gamma", "data", "demo")


def _study(tmp_path, edit=None, name="s.yaml") -> str:
    """A 2-arm x 2-size x 3-seed study on the demo corpus with an LR grid (absolute paths)."""
    raw = {
        "name": "t",
        "config": [os.path.join(ROOT, "examples", "configs", "demo.yaml")],
        "set": {"seq_length": 64, "micro_batch_size": 4, "global_batch_size": 8, "lr": 2.0e-3,
                "min_lr": 2.0e-4, "lr_warmup_iters": 2, "eval_iters": 2},
        "data": {"inputs": [os.path.join(DEMO, "en.jsonl")],
                 "tokenizer_model": os.path.join(DEMO, "tokenizer.json"), "heldout_every": 10},
        "baseline": "base",
        "arms": {"base": {"init_gamma": 0.5}, "g1": {"init_gamma": 1.0}},
        "sizes": {
            "d32": {"hidden_size": 32, "num_layers": 1, "num_attention_heads": 2,
                    "ffn_hidden_size": 128, "tokens": 8192},
            "d64": {"hidden_size": 64, "num_layers": 1, "num_attention_heads": 4,
                    "ffn_hidden_size": 256, "tokens": 8192},
        },
        "seeds": [1, 2, 3],
        "lr_grid": {"factors": [0.5, 1, 2], "select_seed": 1},
        "margin": 0.02,
    }  # fmt: skip
    if edit:
        edit(raw)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return str(path)


# ---- schema ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "edit, match",
    [
        (lambda r: r["lr_grid"].update(values=[1e-3, 2e-3]), r"lr_grid=.*exactly one of values"),
        (lambda r: r["lr_grid"].update(factors=[1]), r"lr_grid\.factors=\[1\.0\]: a grid needs"),
        (lambda r: r["lr_grid"].update(factors=[0.5, -1]), r"lr_grid\.factors=.*positive"),
        (lambda r: r["lr_grid"].update(select_seed=7), r"lr_grid\.select_seed=7: not a seed"),
        (lambda r: r["lr_grid"].update(step=2), r"lr_grid\.step=2: unknown key"),
        (lambda r: r["lr_grid"].update(extend=-1), r"lr_grid\.extend=-1: must be an integer >= 0"),
        (
            lambda r: r["arms"]["g1"].update(lr_grid={"values": [1e-3, 2e-3], "select_seed": 2}),
            r"arms\.g1\.lr_grid\.select_seed=2: set only in the top-level lr_grid",
        ),
        (lambda r: r["arms"]["g1"].update(lr=1e-3), r"arms\.g1\.lr=0\.001: an arm's own LR"),
        (
            lambda r: r["sizes"]["d32"].update(lr_warmup_fraction=1.5),
            r"sizes\.d32\.lr_warmup_fraction=1\.5: must be a fraction",
        ),
        (
            lambda r: r["sizes"]["d32"].update(micro_batch_size=0),
            r"sizes\.d32\.micro_batch_size=0: must be an integer >= 1",
        ),
        (lambda r: r["sizes"]["d32"].update(lr=0), r"sizes\.d32\.lr=0: must be a positive number"),
        (lambda r: r.update(margin=-0.1), r"margin=-0\.1: must be a finite number of nats >= 0"),
        (lambda r: r.update(margin=math.inf), r"margin=inf: must be a finite number of nats >= 0"),
        (lambda r: r.update(name="a/b"), r"name='a/b': not a safe directory name"),
    ],
)
def test_schema_errors_name_the_key(tmp_path, edit, match):
    with pytest.raises(StudyError, match=match):
        load_study(_study(tmp_path, edit))


def _rename(where: str, bad: str):
    def edit(raw):
        group = raw[where]
        first = next(iter(group))
        group[bad] = group.pop(first)
        if where == "arms" and first == raw["baseline"]:
            raw["baseline"] = bad

    return edit


@pytest.mark.parametrize("bad", ["../../escaped-size", "/abs-size", "", "a/../b", ".hidden", "a b"])
@pytest.mark.parametrize("where", ["sizes", "arms"])
def test_unsafe_names_are_refused(tmp_path, bad, where):
    with pytest.raises(StudyError, match=rf"{where}=.*not a safe directory name"):
        load_study(_study(tmp_path, _rename(where, bad)))


def _absolute_example(tmp_path, name: str, edit) -> str:
    """A shipped example study with its relative paths made absolute and ``edit`` applied,
    written into ``tmp_path``."""
    with open(os.path.join(STUDIES, name), encoding="utf-8") as f:
        raw = yaml.safe_load(f)
    raw["config"] = [os.path.normpath(os.path.join(STUDIES, c)) for c in raw["config"]]
    data = raw["data"]
    data["inputs"] = [os.path.normpath(os.path.join(STUDIES, p)) for p in data["inputs"]]
    data["tokenizer_model"] = os.path.normpath(os.path.join(STUDIES, data["tokenizer_model"]))
    edit(raw)
    path = tmp_path / name
    path.write_text(yaml.safe_dump(raw, sort_keys=False), encoding="utf-8")
    return str(path)


def test_an_arm_that_sets_more_than_the_factors_is_refused(tmp_path):
    # paper-cpu.yaml with gamma1 also changing weight decay and fc2's γ: the report would pair
    # it with the baseline as "γ alone" and credit both changes to γ
    def confound(raw):
        raw["arms"]["gamma1"].update(weight_decay=0.0, init_gamma_overrides="fc2=0.5")

    with pytest.raises(StudyError) as e:
        load_study(_absolute_example(tmp_path, "paper-cpu.yaml", confound))
    assert str(e.value) == (
        "arms.gamma1={'weight_decay': 0.0, 'init_gamma_overrides': 'fc2=0.5'}: arm 'gamma1' sets "
        "config field(s) other than the study factors (weight_decay, init_gamma_overrides); an "
        "arm may set only init_gamma, norm_epsilon, gated_attention (and sizes, seeds, lr_grid), "
        "since the report pairs arms by those settings alone and would credit any other "
        "difference to γ, ε or the gate. Fix: set weight_decay, init_gamma_overrides in the "
        "study's shared config (set: or config:) so every arm gets it, or run a separate study"
    )


@pytest.mark.parametrize(
    "field, value",
    [
        ("qk_layernorm", True),
        ("init_gamma_overrides", "embedding=2"),
        ("embedding_fan_in", "vocab"),
    ],
)
def test_an_arm_may_not_set_a_field_even_when_every_arm_sets_it(tmp_path, field, value):
    def everywhere(raw):
        for arm in raw["arms"].values():
            arm[field] = value

    with pytest.raises(StudyError, match=rf"^arms\.base=\{{'{field}': .*\({field}\); an arm may"):
        load_study(_study(tmp_path, everywhere))
    # the same field in set: is every arm's, and loads
    study = load_study(_study(tmp_path, lambda r: r["set"].update({field: value})))
    assert study.fields[field] == value
    assert {a.name: a.fields for a in study.arms.values()} == {
        "base": {"init_gamma": 0.5},
        "g1": {"init_gamma": 1.0},
    }


def test_a_shared_init_method_under_which_gamma_does_nothing_is_refused(tmp_path):
    """Trial 9 #5: `set: {init_method: normal}` loaded and planned, though under it every
    weight is drawn from init_method_std whatever init_gamma, the factor every γ arm differs
    in; an arm may not set it (above), and now neither may the study's set nor a size's own
    config file."""
    normal = _study(tmp_path, lambda r: r["set"].update(init_method="normal"))
    with pytest.raises(StudyError) as e:
        load_study(normal)
    assert str(e.value) == (
        "init_method='normal': given in the study's set; init_gamma, the factor this study "
        "compares, has no effect under it (every weight is drawn from init_method_std whatever "
        "γ), so its γ arms would differ in nothing and the report would credit their noise to "
        "γ. Fix: set init_method: gamma in the study's set: (or remove init_method from its "
        "set: and config files)"
    )
    recipe = tmp_path / "normal-init.yaml"
    recipe.write_text("init: {init_method: normal}\n", encoding="utf-8")

    def in_a_size_config(raw):
        raw["sizes"]["d64"]["config"] = [str(recipe)]

    with pytest.raises(StudyError, match=r"^init_method='normal': given in the config file\(s\) "
                       rf"of size 'd64' \(.*demo\.yaml, {recipe}\); init_gamma"):  # fmt: skip
        load_study(_study(tmp_path, in_a_size_config))
    # init_method: gamma given explicitly loads
    gamma = _study(tmp_path, lambda r: r["set"].update(init_method="gamma"))
    assert load_study(gamma).fields["init_method"] == "gamma"


@pytest.mark.parametrize("name", sorted(n for n in os.listdir(STUDIES) if n.endswith(".yaml")))
def test_every_shipped_example_study_loads_with_arms_that_set_only_factors(name):
    study = load_study(os.path.join(STUDIES, name))
    assert study.baseline in study.arms and len(study.arms) >= 2
    for arm in study.arms.values():
        assert set(arm.fields) <= {"init_gamma", "norm_epsilon", "gated_attention"}, arm.name
        assert "init_gamma" in arm.fields, arm.name


@pytest.mark.slow
@pytest.mark.parametrize(
    "where, bad", [("sizes", "../../escaped-size"), ("sizes", "ABS"), ("arms", "")]
)
def test_sweep_with_unsafe_name_writes_nothing(tmp_path, where, bad):
    work = tmp_path / "a" / "b"
    work.mkdir(parents=True)
    bad = str(tmp_path / "abs-size") if bad == "ABS" else bad
    study = _study(work, _rename(where, bad))
    out = work / "out"
    proc = subprocess.run(
        [sys.executable, "-m", "megatron_gamma.cli", "sweep", study, "--output-dir", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": ROOT},
        timeout=300,
    )
    assert proc.returncode == 2 and "not a safe directory name" in proc.stderr, proc.stderr
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert written == ["a", "a/b", "a/b/s.yaml"], written


def test_run_directory_outside_output_dir_is_refused(tmp_path):
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    os.symlink(outside, out / "g1")  # DIR/g1 leads out of DIR
    study = load_study(_study(tmp_path))
    with pytest.raises(StudyError, match=r"run='g1/d32/seed-1': its directory .* lies outside"):
        plan(study, str(out), final_loss=lambda run: None)
    assert list(outside.iterdir()) == []


def test_a_run_log_that_is_a_symbolic_link_is_refused_before_any_run_starts(tmp_path, monkeypatch):
    """``pretrain.log`` is appended to in place: a link in a study directory from elsewhere would
    append every run's console to the file it points to."""
    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    out = tmp_path / "out"
    study = load_study(_study(tmp_path))
    runs = plan(study, str(out), final_loss=lambda run: None)
    os.makedirs(runs[0].config.logging.run_dir)
    log = os.path.join(runs[0].config.logging.run_dir, sweep_mod.LOG_FILE)
    os.symlink(victim, log)

    def started(*args, **kwargs):  # a refusal that came too late fails here, not after a sweep
        raise AssertionError("the sweep went on to write its manifest")

    monkeypatch.setattr(sweep_mod, "write_manifest", started)
    with pytest.raises(StudyError) as e:
        sweep_mod.sweep(_study(tmp_path), str(out))
    assert str(e.value).startswith(
        f"run {runs[0].key}: {log}: a symbolic link (to {str(victim)!r}); this file is written in "
        "place"
    )
    assert victim.read_text() == "keep me\n"
    assert sorted(os.listdir(out)) == [runs[0].arm]  # refused before the manifest or the data


def test_size_recipe_and_overrides_layer_in_order(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "optimizer: {lr: 9.0e-4, min_lr: 9.0e-5, lr_warmup_iters: 50}\n"
        "training: {micro_batch_size: 2}\n",
        encoding="utf-8",
    )

    def edit(raw):
        del raw["set"]["lr"], raw["set"]["min_lr"], raw["set"]["micro_batch_size"]
        del raw["set"]["lr_warmup_iters"]
        raw["sizes"]["d32"].update(config=str(recipe))  # its own recipe
        raw["sizes"]["d64"].update(
            config=str(recipe), lr=4.0e-4, micro_batch_size=8, lr_warmup_fraction=0.25
        )

    study = load_study(_study(tmp_path, edit))
    runs = {r.key: r for r in plan(study, str(tmp_path / "o"), final_loss=lambda run: None)}
    small, large = runs["base/d32/seed-1"].config, runs["base/d64/seed-1"].config
    assert (small.optimizer.lr, small.optimizer.min_lr) == (9.0e-4, 9.0e-5)
    assert (small.optimizer.lr_warmup_iters, small.optimizer.lr_warmup_fraction) == (50, None)
    assert small.training.micro_batch_size == 2
    # the size's LR, micro-batch and warmup fraction replace the recipe's; a grid run keeps the
    # shared run's min_lr / lr
    assert large.optimizer.lr == 4.0e-4 and large.training.micro_batch_size == 8
    assert (large.optimizer.lr_warmup_fraction, large.optimizer.lr_warmup_iters) == (0.25, 0)
    out = str(tmp_path / "o dir")
    path = write_manifest(study, list(runs.values()), out, "my study.yaml")
    with open(path, encoding="utf-8") as f:
        manifest = json.load(f)
    assert manifest["shared_lr"] is None  # d32 at 9e-4, d64 at 4e-4: per run's lr
    # each run records its arm's fields, which report checks before it pairs two arms
    fields = {e["key"]: e["arm_fields"] for e in manifest["runs"]}
    assert len(fields) == len(runs) and fields["base/d64/lr-0.0002/seed-1"] == {"init_gamma": 0.5}
    assert {e["arm"]: e["arm_fields"] for e in manifest["runs"]} == {
        "base": {"init_gamma": 0.5},
        "g1": {"init_gamma": 1.0},
    }
    # the printed reproduction command survives the shell: paths with spaces stay one argument
    assert shlex.split(manifest["sweep_command"]) == [
        "megatron-gamma",
        "sweep",
        "my study.yaml",
        "--output-dir",
        out,
    ]
    grid = runs["base/d64/lr-0.0002/seed-1"].config.optimizer
    assert (grid.lr, grid.min_lr) == (2.0e-4, pytest.approx(9.0e-5 * 2.0e-4 / 4.0e-4, rel=1e-5))


# ---- the plan: shared, grid, confirm ---------------------------------------------------------


def _keys(runs) -> list[tuple[str, str, float]]:
    return [(r.key, r.lr_phase, r.lr) for r in runs]


def test_plan_phases_before_the_grid_finishes(tmp_path):
    study = load_study(_study(tmp_path))
    runs = plan(study, str(tmp_path / "o"), final_loss=lambda run: None)
    assert study.lr_select_seed == 1 and study.margin == 0.02
    # size, then seed (selection seed first), shared before grid, then LR, arms interleaved
    assert _keys(runs) == [
        ("base/d32/seed-1", SHARED, 2e-3),
        ("g1/d32/seed-1", SHARED, 2e-3),
        ("base/d32/lr-0.001/seed-1", GRID, 1e-3),
        ("g1/d32/lr-0.001/seed-1", GRID, 1e-3),
        ("base/d32/lr-0.004/seed-1", GRID, 4e-3),
        ("g1/d32/lr-0.004/seed-1", GRID, 4e-3),
        ("base/d32/seed-2", SHARED, 2e-3),
        ("g1/d32/seed-2", SHARED, 2e-3),
        ("base/d32/seed-3", SHARED, 2e-3),
        ("g1/d32/seed-3", SHARED, 2e-3),
        ("base/d64/seed-1", SHARED, 2e-3),
        ("g1/d64/seed-1", SHARED, 2e-3),
        ("base/d64/lr-0.001/seed-1", GRID, 1e-3),
        ("g1/d64/lr-0.001/seed-1", GRID, 1e-3),
        ("base/d64/lr-0.004/seed-1", GRID, 4e-3),
        ("g1/d64/lr-0.004/seed-1", GRID, 4e-3),
        ("base/d64/seed-2", SHARED, 2e-3),
        ("g1/d64/seed-2", SHARED, 2e-3),
        ("base/d64/seed-3", SHARED, 2e-3),
        ("g1/d64/seed-3", SHARED, 2e-3),
    ]
    assert [r.key for r in runs if r.grid] == [
        "base/d32/seed-1", "g1/d32/seed-1", "base/d64/seed-1", "g1/d64/seed-1"
    ]  # fmt: skip
    for r in runs:
        assert r.config.optimizer.lr == r.lr
        assert r.config.optimizer.min_lr == pytest.approx(r.lr / 10, rel=1e-9)
        assert r.config.logging.run_dir == str(tmp_path / "o" / r.key)
    assert [(p.arm, p.size, p.seeds, p.lrs) for p in study.pending] == [
        ("base", "d32", [2, 3], [1e-3, 2e-3, 4e-3]),
        ("base", "d64", [2, 3], [1e-3, 2e-3, 4e-3]),
        ("g1", "d32", [2, 3], [1e-3, 2e-3, 4e-3]),
        ("g1", "d64", [2, 3], [1e-3, 2e-3, 4e-3]),
    ]


def test_finished_grid_plans_the_confirm_runs(tmp_path):
    """A fake finished grid: at d32, base is best at 4e-3 and g1 ties 1e-3 with 2e-3 (the
    smaller LR wins the tie); at d64 base's grid lacks one run and g1's shared LR wins."""
    losses = {
        "base/d32/lr-0.001/seed-1": 5.0,
        "base/d32/seed-1": 4.9,
        "base/d32/lr-0.004/seed-1": 4.7,
        "g1/d32/lr-0.001/seed-1": 4.8,
        "g1/d32/seed-1": 4.8,
        "g1/d32/lr-0.004/seed-1": 4.85,
        "base/d64/seed-1": 4.5,
        "base/d64/lr-0.004/seed-1": 4.4,
        "g1/d64/lr-0.001/seed-1": 4.6,
        "g1/d64/seed-1": 4.3,
        "g1/d64/lr-0.004/seed-1": 4.35,
    }
    out = str(tmp_path / "o")
    study = load_study(_study(tmp_path, lambda raw: raw["lr_grid"].update(extend=0)))
    runs = plan(study, out, final_loss=lambda run: losses.get(run.key))
    confirm = [(r.key, r.lr, r.seed) for r in runs if r.lr_phase == CONFIRM]
    assert confirm == [
        ("g1/d32/lr-0.001/seed-2", 1e-3, 2),
        ("base/d32/lr-0.004/seed-2", 4e-3, 2),
        ("g1/d32/lr-0.001/seed-3", 1e-3, 3),
        ("base/d32/lr-0.004/seed-3", 4e-3, 3),
    ]  # order: seed, then LR, then arm
    assert [(p.arm, p.size) for p in study.pending] == [("base", "d64")]
    best = {r.key: r for r in runs}["base/d32/lr-0.004/seed-3"].config
    assert (best.optimizer.lr, best.optimizer.min_lr, best.training.seed) == (4e-3, 4e-4, 3)
    assert grid_runs(study, out, "g1", "d64", lambda run: losses.get(run.key))[1] == []
    # the manifest the report reads (agreed fields)
    path = write_manifest(study, runs, out, "s.yaml")
    with open(path, encoding="utf-8") as f:
        manifest = json.load(f)
    assert (manifest["margin"], manifest["shared_lr"], manifest["lr_select_seed"]) == (
        0.02,
        2e-3,
        1,
    )
    entries = {e["key"]: e for e in manifest["runs"]}
    assert len(entries) == len(runs) == 24
    assert (entries["base/d32/seed-1"]["lr_phase"], entries["base/d32/seed-1"]["grid"]) == (
        SHARED,
        True,
    )
    assert "grid" not in entries["base/d32/seed-2"]
    assert entries["g1/d64/lr-0.004/seed-1"]["lr_phase"] == GRID
    assert entries["base/d32/lr-0.004/seed-3"]["lr"] == 4e-3
    assert entries["base/d32/lr-0.004/seed-3"]["lr_phase"] == CONFIRM


def test_a_best_lr_on_the_grid_edge_extends_the_grid_before_confirming(tmp_path):
    """Loss falling with LR (base) walks the grid up 2e-3 → 4e-3 → 8e-3 → 16e-3, then stops
    (extend: 2) and confirms on the edge; g1's bowl (minimum at 1e-3) walks it down once to 5e-4
    and confirms the interior best 1e-3 there; with extend: 0 the edge is confirmed at once."""
    out = str(tmp_path / "o")
    study = load_study(_study(tmp_path))
    assert extend_lr([1e-3, 2e-3, 4e-3], 4e-3) == 8e-3
    assert extend_lr([1e-3, 2e-3, 4e-3], 1e-3) == 5e-4
    assert extend_lr([1e-3, 2e-3, 4e-3], 2e-3) is None
    assert extend_lr([1e-3, 3e-3], 3e-3) == 9e-3
    finished: dict[str, float] = {}

    def loss(run):
        return finished.get(run.key)

    def fall(lr):  # base: lower loss at higher LR, without a minimum in reach
        return 5.0 - lr

    def bowl(lr):  # g1: minimum at 1e-3
        return 4.0 + (lr - 1e-3) ** 2 * 1e4

    grid, confirm = grid_runs(study, out, "base", "d32", loss)
    assert [r.lr for r in grid] == [1e-3, 4e-3] and confirm is None
    seen = []
    for _ in range(4):
        finished["base/d32/seed-1"] = fall(2e-3)
        for r in grid:
            finished[r.key] = fall(r.lr)
        grid, confirm = grid_runs(study, out, "base", "d32", loss)
        seen.append([r.lr for r in grid])
        if confirm is not None:
            break
    assert seen == [[1e-3, 4e-3, 8e-3], [1e-3, 4e-3, 8e-3, 1.6e-2], [1e-3, 4e-3, 8e-3, 1.6e-2]]
    assert [(r.key, r.lr, r.lr_phase) for r in confirm] == [
        ("base/d32/lr-0.016/seed-2", 1.6e-2, CONFIRM),
        ("base/d32/lr-0.016/seed-3", 1.6e-2, CONFIRM),
    ]
    runs = plan(study, out, final_loss=loss)
    assert [r.key for r in runs if r.arm == "base" and r.size == "d32" and r.lr_phase == GRID] == [
        "base/d32/lr-0.001/seed-1", "base/d32/lr-0.004/seed-1", "base/d32/lr-0.008/seed-1",
        "base/d32/lr-0.016/seed-1",
    ]  # fmt: skip
    finished["g1/d32/seed-1"] = bowl(2e-3)
    for lr in (1e-3, 4e-3):
        finished[f"g1/d32/lr-{lr:g}/seed-1"] = bowl(lr)
    grid, confirm = grid_runs(study, out, "g1", "d32", loss)
    assert [r.lr for r in grid] == [5e-4, 1e-3, 4e-3] and confirm is None
    finished["g1/d32/lr-0.0005/seed-1"] = bowl(5e-4)
    grid, confirm = grid_runs(study, out, "g1", "d32", loss)
    assert [(r.lr, r.seed) for r in confirm] == [(1e-3, 2), (1e-3, 3)]
    flat = load_study(_study(tmp_path, lambda raw: raw["lr_grid"].update(extend=0), "f.yaml"))
    grid, confirm = grid_runs(flat, out, "base", "d32", loss)
    assert [r.lr for r in grid] == [1e-3, 4e-3] and [r.lr for r in confirm] == [4e-3, 4e-3]


def test_a_diverged_lr_ranks_after_every_finite_one():
    """A NaN loss compares neither less nor greater, so ``min`` kept it whenever it came first;
    a diverged run (NaN or inf) now ranks last, and a grid that diverged everywhere has its
    smallest LR as best (on the edge: the grid extends downwards)."""
    assert best_lr({1e-3: math.nan, 2e-3: 4.1, 4e-3: 4.5}) == 2e-3
    assert best_lr({2e-3: math.nan, 1e-3: 4.6, 4e-3: 6.0}) == 1e-3
    assert best_lr({4e-3: math.inf, 2e-3: 4.1, 1e-3: 4.1}) == 1e-3  # a tie: the smaller LR
    everywhere = {4e-3: math.nan, 1e-3: math.inf, 2e-3: math.nan}
    assert best_lr(everywhere) == 1e-3 and extend_lr(sorted(everywhere), 1e-3) == 5e-4


def test_dry_run_lists_pending_confirm_runs(tmp_path):
    study = load_study(_study(tmp_path))
    runs = plan(study, str(tmp_path / "o"), final_loss=lambda run: None)
    text = describe_plan(study, runs)
    pending = [ln for ln in text.splitlines() if ln.endswith("pending (LR chosen after the grid)")]
    assert len(pending) == 8  # 2 arms x 2 sizes x seeds 2 and 3
    assert pending[0].startswith("base/d32/lr-?/seed-2 ")
    assert "20 runs planned + 8 pending" in text
    assert "runs left: 28 (8 of them pending confirm runs" in text


# ---- sweep --jobs -----------------------------------------------------------------------------


def _fake_sweep(tmp_path, monkeypatch, jobs, fail=()):
    """Run ``sweep`` with ``pretrain`` replaced by a short sleep; returns (events, error)."""
    events, finished = [], {}
    losses = {"lr-0.001": 4.0}  # the smallest LR wins every grid, and its extension loses

    def start(run, single_thread):
        events.append(("start", run.key, single_thread))
        run_dir = run.config.logging.run_dir
        os.makedirs(run_dir, exist_ok=True)
        with open(os.path.join(run_dir, sweep_mod.RUN_FILE), "w", encoding="utf-8") as f:
            f.write("{}")
        code = f"import sys, time; time.sleep(0.4); sys.exit({int(run.key in fail)})"
        proc = subprocess.Popen([sys.executable, "-c", code])
        log = open(os.path.join(run_dir, "pretrain.log"), "a")
        return sweep_mod._Running(run, proc, log, 0.0)

    real_finish = sweep_mod._finish

    def finish(job):
        events.append(("done", job.run.key))
        finished[job.run.key] = job.proc.returncode == 0
        return real_finish(job)

    def is_finished(run_dir, iters):
        return bool(finished.get(os.path.relpath(run_dir, tmp_path / "o")))

    def finished_loss(run):
        if not finished.get(run.key):
            return None
        return losses.get(run.key.split("/")[2], 5.0)

    monkeypatch.setattr(sweep_mod, "_start", start)
    monkeypatch.setattr(sweep_mod, "_finish", finish)
    monkeypatch.setattr(sweep_mod, "prepare_data", lambda *a: None)
    monkeypatch.setattr(rundir, "is_finished", is_finished)
    monkeypatch.setattr(rundir, "finished_loss", finished_loss)
    monkeypatch.setattr(rundir, "read_run", lambda d: rundir.RunRecord(valid={1: 5.0}))
    monkeypatch.setattr(sweep_mod, "_write_json", lambda path, value: None)

    def drop_size(raw):
        del raw["sizes"]["d64"]

    error = None
    try:
        sweep_mod.sweep(_study(tmp_path, drop_size), str(tmp_path / "o"), jobs=jobs, out=sys.stderr)
    except StudyError as e:
        error = str(e)
    return events, error


def test_jobs_run_in_parallel_arms_interleaved_and_confirm_after_grid(tmp_path, monkeypatch):
    events, error = _fake_sweep(tmp_path, monkeypatch, jobs=2)
    assert error is None
    starts = [e[1] for e in events if e[0] == "start"]
    assert sorted(starts[6:8]) == ["base/d32/lr-0.0005/seed-1", "g1/d32/lr-0.0005/seed-1"]
    assert starts == [
        "base/d32/seed-1",
        "g1/d32/seed-1",
        "base/d32/lr-0.001/seed-1",
        "g1/d32/lr-0.001/seed-1",
        "base/d32/lr-0.004/seed-1",
        "g1/d32/lr-0.004/seed-1",
        # lr 1e-3, on the edge, won both grids: 5e-4 is tried (in the order the grids finish)
        *starts[6:8],  # in either order: checked as a set above
        # 1e-3 wins again, now bracketed: its confirm runs join each seed's round
        "base/d32/seed-2",
        "g1/d32/seed-2",
        "base/d32/lr-0.001/seed-2",
        "g1/d32/lr-0.001/seed-2",
        "base/d32/seed-3",
        "g1/d32/seed-3",
        "base/d32/lr-0.001/seed-3",
        "g1/d32/lr-0.001/seed-3",
    ]
    assert all(e[2] is True for e in events if e[0] == "start")  # single-threaded
    # two at a time: the first two start before either finishes, never three running
    running, peak = set(), 0
    for e in events:
        running.add(e[1]) if e[0] == "start" else running.discard(e[1])
        peak = max(peak, len(running))
    assert peak == 2 and events[1][0] == "start"


def test_a_failed_run_does_not_stop_the_others(tmp_path, monkeypatch):
    events, error = _fake_sweep(tmp_path, monkeypatch, jobs=1, fail={"g1/d32/seed-2"})
    starts = [e[1] for e in events if e[0] == "start"]
    assert starts[-1] == "g1/d32/lr-0.001/seed-3" and len(starts) == 16
    assert "runs=1 failed of 16 started: g1/d32/seed-2: pretrain exited with code 1" in error
    assert os.path.join(str(tmp_path / "o"), "g1/d32/seed-2", "pretrain.log") in error


def test_single_thread_environment(monkeypatch, tmp_path):
    seen = {}

    class Popen:
        def __init__(self, cmd, stdout, stderr, env):
            seen.update(cmd=cmd, env=env)

    monkeypatch.setattr(sweep_mod.subprocess, "Popen", Popen)
    monkeypatch.setenv("OMP_NUM_THREADS", "8")
    run = plan(load_study(_study(tmp_path)), str(tmp_path / "o"), final_loss=lambda r: None)[0]
    job = sweep_mod._start(run, single_thread=True)
    job.log.close()
    assert seen["env"]["OMP_NUM_THREADS"] == "1" and seen["env"]["MKL_NUM_THREADS"] == "1"
    assert seen["cmd"][-3:] == ["pretrain", "--config", os.path.join(str(tmp_path / "o"),
                                run.key, "study-config.yaml")]  # fmt: skip
    sweep_mod._start(run, single_thread=False).log.close()
    assert seen["env"]["OMP_NUM_THREADS"] == "8"


# ---- the data fingerprint ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A study over a copy of the demo corpus, its data prepared once (real preprocess)."""
    root = tmp_path_factory.mktemp("fp")
    corpus = root / "en.jsonl"
    with open(os.path.join(DEMO, "en.jsonl"), encoding="utf-8") as f:
        corpus.write_text("".join(f.readlines()[:40]), encoding="utf-8")

    def edit(raw):
        raw["data"]["inputs"] = [str(corpus)]

    study_path = _study(root, edit)
    out = str(root / "o")
    prepare_data(load_study(study_path), out, sys.stderr)
    return root, study_path, out


@pytest.mark.slow
def test_fingerprint_recorded_and_unchanged_data_accepted(prepared):
    root, study_path, out = prepared
    with open(os.path.join(out, "data", DATA_FINGERPRINT), encoding="utf-8") as f:
        fp = json.load(f)
    assert fp["heldout_every"] == 10 and fp["inputs"][0]["path"] == str(root / "en.jsonl")
    assert fp["inputs"][0]["size"] == os.path.getsize(root / "en.jsonl")
    assert check_data_unchanged(load_study(study_path), out) == fp


@pytest.mark.slow
def test_changed_heldout_every_is_refused(prepared, tmp_path):
    root, study_path, out = prepared

    def edit(raw):
        raw["data"]["inputs"] = [str(root / "en.jsonl")]
        raw["data"]["heldout_every"] = 5

    before = os.stat(os.path.join(out, "data", "train.jsonl")).st_mtime_ns
    with pytest.raises(
        StudyChangedError, match=r"data\.heldout_every: 10 -> 5\)\. Fix: .*new --output-dir"
    ):
        sweep_mod.sweep(_study(tmp_path, edit), out)
    assert os.stat(os.path.join(out, "data", "train.jsonl")).st_mtime_ns == before


@pytest.mark.slow
def test_changed_input_file_is_refused(prepared, tmp_path):
    root, study_path, out = prepared
    corpus = root / "en.jsonl"
    original = corpus.read_bytes()
    try:
        corpus.write_bytes(original.replace(b"the", b"teh", 1))  # same size, new content
        with pytest.raises(StudyChangedError, match=r"data\.inputs '.*en\.jsonl': content changed"):
            check_data_unchanged(load_study(study_path), out)
        proc = subprocess.run(
            [sys.executable, "-m", "megatron_gamma.cli", "sweep", study_path, "--output-dir", out,
             "--dry-run"],
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 2 and "content changed" in proc.stderr, proc.stderr
    finally:
        corpus.write_bytes(original)
    assert check_data_unchanged(load_study(study_path), out) is not None


def test_a_setting_one_version_does_not_record_is_named_not_refused(tmp_path):
    """A run recorded by a megatron-gamma without a setting (one added since, as
    check_for_nan_in_loss_and_grad was), or with one since removed, cannot be compared on it.
    The sweep once refused, as "changed", every study begun before an upgrade that added a
    field. Those settings are now named in a note (the plan's last line), and every setting
    both versions record is still compared."""
    study_path = _study(tmp_path)
    out = str(tmp_path / "o")
    runs = plan(load_study(study_path), out)
    run = runs[0]
    write_run_files(run)
    path = os.path.join(run.config.logging.run_dir, RUN_FILE)
    with open(path, encoding="utf-8") as f:
        stored = json.load(f)
    assert check_unchanged(run) == [] and check_runs_unchanged(runs) == ""
    assert stored["config"]["training"].pop("check_for_nan_in_loss_and_grad") is False
    stored["config"]["training"]["retired_setting"] = 3
    with open(path, "w", encoding="utf-8") as f:
        json.dump(stored, f)
    uncompared = [
        "config.training.check_for_nan_in_loss_and_grad (now False)",
        "config.training.retired_setting (recorded 3, no longer a setting)",
    ]
    assert check_unchanged(run) == uncompared
    note = check_runs_unchanged(runs)
    assert note == (
        f"note: 1 existing run(s) ({run.key}) were recorded by a megatron-gamma with other "
        f"settings, so these were not compared: {'; '.join(uncompared)}. A finished run is kept "
        "as it is; an unfinished one resumes with today's values. Redo a run by deleting its "
        "directory, or sweep into a new --output-dir"
    )
    assert dry_run(study_path, out).endswith("\n" + note)
    stored["config"]["optimizer"]["lr"] = 1e-3
    with open(path, "w", encoding="utf-8") as f:
        json.dump(stored, f)
    with pytest.raises(StudyChangedError, match=r"config\.optimizer\.lr: 0\.001 -> 0\.002\)"):
        check_unchanged(run)


def test_data_without_fingerprint_is_refused(tmp_path):
    out = tmp_path / "o"
    (out / "data").mkdir(parents=True)
    (out / "data" / "train.jsonl").write_text("{}\n", encoding="utf-8")
    study = load_study(_study(tmp_path))
    assert check_data_unchanged(study, str(out)) is None  # no dataset: nothing trained on it
    (out / "data" / "train_text_document.idx").write_bytes(b"")
    with pytest.raises(StudyChangedError, match="prepared without a fingerprint"):
        check_data_unchanged(study, str(out))


def test_a_sweep_stopped_before_its_data_were_prepared_takes_the_fixed_corpus(tmp_path):
    """Trial 13: a sweep stopped at a malformed line of its corpus had written the data
    fingerprint, and the sweep with the corpus fixed was refused because "its runs trained on
    the old data", though no dataset had been prepared and no run had started. Until a
    dataset exists, the fingerprint is written anew and the split made from the new data."""
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "one"}\n{"text": "two\n', encoding="utf-8")
    good = tmp_path / "good.jsonl"
    with open(os.path.join(DEMO, "en.jsonl"), encoding="utf-8") as f:
        good.write_text("".join(f.readlines()[:40]), encoding="utf-8")
    out = str(tmp_path / "o")
    with pytest.raises(StudyError, match="line 2 is not JSON"):
        prepare_data(
            load_study(_study(tmp_path, lambda r: r["data"].update(inputs=[str(bad)]))),
            out,
            sys.stderr,
        )
    fixed = load_study(_study(tmp_path, lambda r: r["data"].update(inputs=[str(good)]), "f.yaml"))
    assert check_data_unchanged(fixed, out) is None
    prefixes = prepare_data(fixed, out, sys.stderr)
    with open(os.path.join(out, "data", "train.jsonl"), encoding="utf-8") as f:
        train = [json.loads(line)["text"] for line in f]
    with open(good, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    assert train == [t for i, t in enumerate(texts) if i % 10]  # every 10th held out
    assert os.path.isfile(prefixes["train"] + ".idx")
    assert check_data_unchanged(fixed, out)["inputs"][0]["path"] == str(good)


def test_a_study_can_skip_and_count_bad_lines_and_records(tmp_path, capsys):
    """Trial 13: the study file had no --on-error skip, and its error no Fix. A line that is
    not JSON stops the sweep naming the file, the line and both fixes (parsed without its
    newline, as preprocess parses it); with data.on_error: skip it is left out and counted,
    and a record preprocess refuses (no text) is skipped by preprocess --on-error skip."""
    corpus = tmp_path / "c.jsonl"
    with open(os.path.join(DEMO, "en.jsonl"), encoding="utf-8") as f:
        lines = f.readlines()[:40]
    corpus.write_text("".join([*lines[:5], '{"text": "cut\n', '{"id": 7}\n', *lines[5:]]))
    stop = load_study(_study(tmp_path, lambda r: r["data"].update(inputs=[str(corpus)])))
    with pytest.raises(StudyError) as e:
        prepare_data(stop, str(tmp_path / "stop"), sys.stderr)
    assert str(e.value).startswith(
        f"data.inputs={str(corpus)!r}: line 6 is not JSON (Unterminated string starting at: "
        "line 1 column 10 (char 9)). Fix: one JSON object per line (repair or remove that "
        "line), or data.on_error: skip"
    )

    def skip(raw):
        raw["data"].update(inputs=[str(corpus)], on_error="skip")

    study = load_study(_study(tmp_path, skip, "skip.yaml"))
    out = str(tmp_path / "skip")
    prepare_data(study, out, sys.stdout)
    assert f"(1 line not JSON skipped: {corpus}:6)" in capsys.readouterr().out
    with open(os.path.join(out, "data", "train.stats.json"), encoding="utf-8") as f:
        stats = json.load(f)
    errors = {k: n for k, n in stats["errors"].items() if n}
    assert errors == {"missing_key": 1}  # the record without text, in train
    assert check_data_unchanged(study, out)["on_error"] == "skip"
    with pytest.raises(StudyChangedError, match=r"data\.on_error: skip -> stop"):
        check_data_unchanged(stop, out)


def _tree(path) -> list[str]:
    return sorted(
        os.path.relpath(os.path.join(d, f), path) for d, _, fs in os.walk(path) for f in fs
    )


@pytest.mark.parametrize(
    "lines, heldout_every, match",
    [
        (['{"text": "one"}', '{"text": "two'], 10, r"line 2 is not JSON"),
        (['{"text": "one"}', '{"id": 7}'], 10, r":2: no key 'text' \(keys: id\)\. Fix: "),
        (['{"text": "one"}', '["two"]'], 10, r":2: a JSON list, not an object\. Fix: "),
        (['{"text": "one"}', '{"text": 12345}'], 10, r":2: 'text' is an int, not a string"),
        (['{"text": "only one"}'], 10, r"1 document\(s\) with text, none of them in the train"),
        (  # the held-out documents (0, 2, 4) are empty once control characters are removed
            ['{"text": " \\u0000"}', '{"text": "a"}', '{"text": ""}', '{"text": "b"}',
             '{"text": "\\u200b"}', '{"text": "c"}'],
            2,
            r"3 document\(s\) with text, none of them in the held-out split \(documents 0, 2, 4, "
            r".*3 record\(s\) in that split.* Fix: give data\.inputs more documents with text, "
            r"or a smaller data\.heldout_every$",
        ),
    ],
)  # fmt: skip
def test_dry_run_refuses_the_corpus_the_sweep_refuses_and_writes_nothing(
    tmp_path, lines, heldout_every, match
):
    """Trial 13: ``sweep --dry-run`` printed a plan for a corpus the sweep refused 4 s later.
    The dry run now reads the corpus as the sweep splits it: each bad corpus is refused by
    ``dry_run``, ``sweep --slurm --dry-run`` and the CLI with the message the sweep itself
    stops with (the reference), and the output directory is never created."""
    corpus = tmp_path / "c.jsonl"
    corpus.write_text("\n".join(lines) + "\n", encoding="utf-8")

    def edit(raw):
        raw["data"].update(inputs=[str(corpus)], heldout_every=heldout_every)

    study_path = _study(tmp_path, edit)
    out = tmp_path / "o"
    with pytest.raises(StudyError, match=match) as planned:
        dry_run(study_path, str(out))
    assert not out.exists()
    with pytest.raises(StudyError, match=match) as slurm:
        submit_study(study_path, str(out), ClusterOptions(), dry_run=True, out=sys.stderr)
    assert not out.exists()
    with pytest.raises(StudyError) as swept:
        sweep_mod.sweep(study_path, str(tmp_path / "real"))
    assert str(planned.value) == str(slurm.value) == str(swept.value)
    assert _tree(tmp_path / "real" / "data") == ["fingerprint.json"]  # no split, no dataset
    if heldout_every == 10 and "not JSON" in match:
        proc = subprocess.run(
            [sys.executable, "-m", "megatron_gamma.cli", "sweep", study_path, "--output-dir",
             str(out), "--dry-run"],
            capture_output=True, text=True, env={**os.environ, "PYTHONPATH": ROOT}, timeout=300,
        )  # fmt: skip
        assert proc.returncode == 2 and str(swept.value) in proc.stderr, proc.stderr
        assert not out.exists()


def test_dry_run_counts_the_documents_of_each_split_and_writes_nothing(tmp_path):
    """The plan ends with the documents each split will get: document i is held out when
    i % heldout_every == 0 (counted here from the corpus's lines); a record without text
    under data.on_error: skip is counted in its split (preprocess then skips it)."""
    corpus = tmp_path / "c.jsonl"
    with open(os.path.join(DEMO, "en.jsonl"), encoding="utf-8") as f:
        docs = f.readlines()[:23]
    corpus.write_text("".join([*docs[:5], '{"text": "cut\n', '{"id": 7}\n', *docs[5:]]))

    def edit(raw):
        raw["data"].update(inputs=[str(corpus)], on_error="skip")

    out = tmp_path / "o"
    text = dry_run(_study(tmp_path, edit), str(out))
    values = len(docs) + 1  # the line that is not JSON is skipped, the record without text not
    heldout = len(range(0, values, 10))
    assert text.splitlines()[-1] == (
        f"data: {values - heldout} train, {heldout} held-out documents (1 line not JSON "
        f"skipped: {corpus}:6) (read from data.inputs, to be prepared by the sweep)"
    )
    assert not out.exists()


# ---- sweep --slurm ----------------------------------------------------------------------------


def test_slurm_passes_account_qos_dependency(tmp_path):
    options = ClusterOptions(account="acct1", qos="high", dependency="afterok:123")
    result = submit_study(
        _study(tmp_path), str(tmp_path / "o"), options, dry_run=True, out=sys.stderr
    )
    lines = result.script.splitlines()
    for directive in ("--account=acct1", "--qos=high", "--dependency=afterok:123"):
        assert f"#SBATCH {directive}" in lines
    assert "#SBATCH --array=0-19" in lines  # 12 shared + 8 grid runs; confirm runs come later
    assert any(ln.startswith("#   base: ") for ln in lines)  # GPU-hours per arm

    assert not (tmp_path / "o").exists()


def test_slurm_refuses_a_percent_in_the_output_dir(tmp_path):
    """The array's --output is DIR/slurm/%x-%A_%a.out: SLURM would read a '%' in DIR as a
    pattern (%u: the user name) and write the logs into another directory."""
    from megatron_gamma.launch.slurm import SubmitError

    out = tmp_path / "out%u"
    with pytest.raises(SubmitError) as e:
        submit_study(_study(tmp_path), str(out), ClusterOptions(), dry_run=True, out=sys.stderr)
    assert str(e.value) == (
        f"output_dir={str(out)!r}: holds '%', which SLURM reads as a filename pattern in the "
        "job's --output path. Fix: choose a directory without '%'"
    )


# ---- the GPU studies --------------------------------------------------------------------------


def test_gpu_hours_are_also_given_at_the_measured_mfu(tmp_path):
    study = os.path.join(ROOT, "examples", "studies", "paper-gpu.yaml")
    result = submit_study(study, str(tmp_path / "o"), ClusterOptions(), dry_run=True,
                          out=sys.stderr)  # fmt: skip
    lines = result.script.splitlines()
    total = next(ln for ln in lines if ln.startswith("#   total: ")).split()
    now, later = float(total[2]), float(total[-2])
    measured = next(ln for ln in lines if "MFU measured for the 0.1B recipe on one H200" in ln)
    at_measured = [float(x) for x in measured.split("): ")[1].split(" + ")]
    scale = 0.4 / 0.116  # ASSUMED_MFU / MEASURED_MFU, written out
    rounding = 0.005 * scale + 0.005
    assert now > 0 and later > 0
    assert at_measured == pytest.approx([now * scale, later * scale], abs=rounding)


@pytest.mark.parametrize("name, world_size", [("paper-gpu.yaml", 1), ("paper-0.1b-1.5b.yaml", 8)])
def test_gpu_studies_build_valid_configs_that_fit_80gb(tmp_path, name, world_size):
    study = load_study(os.path.join(STUDIES, name))
    out = str(tmp_path / "o")
    runs = plan(study, out, final_loss=lambda run: None)
    # every confirm run the grids could choose: make each grid LR the winner in turn (an edge
    # winner plans the next LR beyond it instead)
    for p in study.pending:
        for lr in p.lrs:
            inside = p.lrs[0] < lr < p.lrs[-1]
            grid, won = grid_runs(
                study,
                out,
                p.arm,
                p.size,
                lambda run, lr=lr, lrs=p.lrs: 1.0 + (run.lr != lr) if run.lr in lrs else None,
            )
            if inside:
                assert [r.seed for r in won] == ([] if lr == p.shared_lr else p.seeds)
                runs += won
            else:
                assert won is None and len(grid) == len(p.lrs)
                runs += [r for r in grid if r.lr not in p.lrs]
    assert {a for a in study.arms if "@" not in a} >= {"baseline", "gamma0.5+eps+gate"}
    gate = study.arms["gamma0.5+eps+gate"].fields
    assert (gate["init_gamma"], gate["norm_epsilon"], gate["gated_attention"]) == (
        0.5,
        1e-12,
        "elementwise",
    )
    for run in runs:
        cfg = run.config
        o = cfg.optimizer
        assert o.lr_warmup_fraction and not o.lr_warmup_iters, run.key
        vocab = padded_vocab_size(cfg.model.vocab_size or 4096, cfg)
        mem = estimate_memory(cfg, vocab, world_size)
        total = mem.total(cfg.parallel.use_distributed_optimizer,
                          cfg.training.recompute_granularity == "full")  # fmt: skip
        assert total < 80 * 1024**3, (run.key, total / 1024**3)
    if name == "paper-0.1b-1.5b.yaml":  # each size's own recipe
        shared = {r.size: r.config for r in runs if r.lr_phase == SHARED}
        assert {s: c.optimizer.lr for s, c in shared.items()} == {
            "0.1b": 6.0e-4, "0.3b": 4.0e-4, "0.7b": 3.0e-4, "1.5b": 2.5e-4
        }  # fmt: skip
        assert shared["1.5b"].parallel.tensor_model_parallel_size == 2
        assert shared["1.5b"].training.micro_batch_size == 4


def test_a_sweep_directory_that_cannot_be_one_is_refused_before_the_study_is_read(tmp_path):
    """sweep (and its dry run, and --slurm) refuse an --output-dir that is a file (the real run
    ended with a FileExistsError traceback, the dry run said nothing) or a directory of other
    files of a pretrain run without study.json (the study was mixed in with it), and --jobs 0
    in the dry run as the real run does; the study path here does not exist, so any later
    check would fail otherwise. An empty directory, or an earlier sweep's, is accepted."""
    from megatron_gamma.study.sweep import check_study_dir, dry_run, sweep

    missing = str(tmp_path / "no-study.yaml")
    afile = tmp_path / "config.yaml"
    afile.write_text("model: {}\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: {}\n")
    (run / "metrics.jsonl").write_text("")
    cases = [
        (str(afile), 1, f"output_dir={str(afile)!r}: exists and is not a directory. Fix: pass a "
                        "new --output-dir, or the directory of an earlier sweep of this study"),
        (str(run), 1, f"output_dir={str(run)!r}: holds config.yaml and metrics.jsonl and no "
                      "study.json: a pretrain run's directory"),
        (str(tmp_path / "new"), 0, "jobs=0: must be >= 1. Fix: pass --jobs 1 or more"),
    ]  # fmt: skip
    for output_dir, jobs, message in cases:
        calls = [
            functools.partial(dry_run, missing, output_dir, jobs=jobs),
            functools.partial(sweep, missing, output_dir, jobs=jobs),
        ]
        if jobs:  # --slurm takes no --jobs
            slurm = functools.partial(submit_study, missing, output_dir, ClusterOptions())
            calls.append(functools.partial(slurm, dry_run=True))
        for call in calls:
            with pytest.raises(StudyError) as e:
                call()
            assert str(e.value).startswith(message), str(e.value)
    assert afile.read_text() == "model: {}\n" and sorted(os.listdir(run)) == [
        "config.yaml",
        "metrics.jsonl",
    ]
    (tmp_path / "empty").mkdir()
    check_study_dir(str(tmp_path / "empty"))
    (run / "study.json").write_text("{}")
    check_study_dir(str(run))


def test_a_pretrain_config_given_as_a_study_is_named_as_one(tmp_path):
    """A pretrain config passed to sweep was refused by its first section with the whole section
    printed as a Python dict; it is named as a pretrain config, and an unknown key's value is
    shown only when it is a scalar."""
    config = tmp_path / "demo.yaml"
    config.write_text(yaml.safe_dump({"model": {"num_layers": 2, "hidden_size": 64},
                                      "training": {"train_iters": 3}}))  # fmt: skip
    with pytest.raises(StudyError) as e:
        load_study(str(config))
    assert str(e.value) == (
        f"{config}: sections model, training make it a pretrain config, not a study. Fix: pass "
        "a study file (examples/studies/*.yaml), which names a pretrain config under 'config:'"
    )
    study = yaml.safe_load(open(os.path.join(STUDIES, "smoke.yaml")))
    for extra, shown in (({"colour": "blue"}, "colour='blue'"), ({"extras": {"a": 1}}, "extras")):
        path = tmp_path / "study.yaml"
        path.write_text(yaml.safe_dump({**study, **extra}))
        with pytest.raises(StudyError) as e:
            load_study(str(path))
        assert str(e.value).startswith(f"{shown}: unknown study key. Fix: use one of name, ")


def test_a_study_file_given_to_pretrain_is_named_as_one(tmp_path, capsys):
    """pretrain --config examples/studies/smoke.yaml said "name: unknown key"; it is named as a
    study file, with the sweep command that runs it. One stray study key in a pretrain config
    keeps the unknown-key error (with its sections)."""
    from megatron_gamma.cli import main

    smoke = os.path.join(STUDIES, "smoke.yaml")
    assert main(["pretrain", "--config", smoke]) == 2
    assert capsys.readouterr().err == (
        f"megatron-gamma pretrain: error: config={smoke!r}: keys arms, baseline, checkpoints, "
        "config, diagnostics_points, name, seeds, set, sizes make it a study file, not a "
        f"pretrain config. Fix: run it with `megatron-gamma sweep {smoke} --output-dir DIR`, or "
        "pass --config a pretrain config (examples/configs/*.yaml)\n"
    )
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump({"name": "x", "training": {"train_iters": 3}}))
    assert main(["pretrain", "--config", str(config)]) == 2
    assert f"config={str(config)!r}: name: unknown key. Fix: remove it" in capsys.readouterr().err


def test_report_on_a_missing_directory_says_it_does_not_exist(tmp_path, capsys):
    """report DIR said "no study.json" of a DIR that does not exist."""
    from megatron_gamma.cli import main

    gone = str(tmp_path / "nothere")
    assert main(["report", gone]) == 2
    assert capsys.readouterr().err == (
        f"megatron-gamma report: error: study_dir={gone!r}: does not exist. Fix: pass the "
        "--output-dir DIR of a `megatron-gamma sweep STUDY.yaml --output-dir DIR` run\n"
    )
    (tmp_path / "afile").write_text("")
    assert main(["report", str(tmp_path / "afile")]) == 2
    assert ": is not a directory. Fix: pass the --output-dir DIR" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2
    assert f"study_dir={str(tmp_path)!r}: no study.json. Fix:" in capsys.readouterr().err


def test_report_on_a_reports_own_output_says_it_keeps_no_runs(capsys):
    """Trial 10: ``report docs/reproduction`` (the committed study's report output) said only
    "no study.json ... run sweep first"; it now says the folder holds a report's tables and no
    runs, and where the committed rows' re-judging is described."""
    from megatron_gamma.cli import main

    committed = os.path.join(ROOT, "docs", "reproduction")
    assert main(["report", committed]) == 2
    assert capsys.readouterr().err == (
        f"megatron-gamma report: error: study_dir={committed!r}: no study.json; it holds a "
        "report's tables (runs.csv, losses.csv), not a study: report judges the runs of a "
        "sweep's --output-dir, and a report's output keeps no runs (docs/reproduction.md says "
        "how the committed study's rows were re-judged). Fix: pass the --output-dir DIR of a "
        "`megatron-gamma sweep STUDY.yaml --output-dir DIR` run\n"
    )


def test_study_runs_train_on_through_a_nan(tmp_path):
    """A sweep records a diverged run as a result (an LR that diverged ranks last, a diverged
    seed keeps a row undecided), so every run it plans trains on through a NaN loss instead of
    stopping at it (pretrain's default, Megatron-LM's --check-for-nan-in-loss-and-grad)."""
    runs = plan(load_study(_study(tmp_path)), str(tmp_path / "o"), final_loss=lambda run: None)
    assert runs and {r.config.training.check_for_nan_in_loss_and_grad for r in runs} == {False}


def test_sweep_run_configs_resume_their_own_checkpoints_without_false_warnings(tmp_path):
    """Each run's study-config.yaml (pretrain's --config, a resolved config that loads from and
    saves to the run's checkpoints/) passes pretrain's check of a load taken from a file, and
    warns only about what the study set that does nothing: the demo recipe's split, replaced by
    the sweep's per-split paths. Trial 9, finding 2: 104 false warnings opened each run's log."""
    from megatron_gamma.config import check_load_origin, load_config
    from megatron_gamma.config.effects import given_keys, no_effect_warnings

    runs = plan(load_study(_study(tmp_path)), str(tmp_path / "o"))
    for run in runs[:2]:
        path = write_run_files(run)
        cfg = load_config(path, {})
        assert (
            cfg.checkpoint.load
            == cfg.checkpoint.save
            == os.path.join(run.config.logging.run_dir, "checkpoints")
        )
        assert check_load_origin(cfg, path, {}) is None
        assert no_effect_warnings(cfg, given_keys(path, {})) == [
            "split='95,5,0': no effect under these settings; it counts with --data-path (not "
            "per-split paths, not --mock-data)"
        ]
