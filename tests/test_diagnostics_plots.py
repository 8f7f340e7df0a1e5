"""The comparison plots of several runs: each run's line is the mean over its layers (norm
inputs: the median of the layers' medians) of the values it was given, and its band the
layers' range, computed here with numpy from the same inputs."""

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest

from megatron_gamma.diagnostics import plots
from megatron_gamma.diagnostics.analyze import RunAnalysis
from megatron_gamma.diagnostics.norm import HIST_EDGES

ITERATIONS = [0, 10, 20]


def _run(name: str, seed: int) -> tuple[RunAnalysis, dict]:
    rng = np.random.default_rng(seed)
    values = {}
    for layer in (0, 1, 2):
        values[f"gate_mean/layer_{layer:02d}"] = rng.uniform(0, 1, 3)
        values[f"gate_closed/layer_{layer:02d}"] = rng.uniform(0, 1, 3)
        for norm in ("input_layernorm", "pre_mlp_layernorm"):
            base = f"{norm}/layer_{layer:02d}"
            values[f"norm_saturated/{base}"] = rng.uniform(0, 1, 3)
            for q in ("p05", "p50", "p95"):
                values[f"norm_log10_ms_{q}/{base}"] = rng.uniform(-14, 0, 3)
    hist = {it: rng.integers(0, 50, len(HIST_EDGES) - 1).tolist() for it in ITERATIONS}
    summary = {
        "gamma": 1.0, "norm_epsilon": 1e-12, "gated_attention": "elementwise", "num_layers": 3
    }  # fmt: skip
    run = RunAnalysis(
        name=name, run_dir="/nonexistent", summary=summary, iterations=list(ITERATIONS),
        metrics={k: v.tolist() for k, v in values.items()},
        norm_histograms={"input_layernorm/layer_00": hist},
    )  # fmt: skip
    return run, values


@pytest.fixture
def figures(monkeypatch):
    saved = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: saved.append(fig) or path)
    return saved


def _stack(values: dict, metric: str) -> np.ndarray:
    return np.stack([v for k, v in values.items() if k.startswith(metric + "/")])


def test_gate_lines_of_several_runs_are_the_layer_means(figures):
    runs = [_run("a", 0), _run("b", 1)]
    plots.plot_gates([r for r, _ in runs], "unused.png")
    (fig,) = figures
    for ax, metric, scale in zip(fig.axes, ("gate_mean", "gate_closed"), (1.0, 100.0), strict=True):
        assert len(ax.lines) == 2
        for line, band, (_, values) in zip(ax.lines, ax.collections, runs, strict=True):
            layers = scale * _stack(values, metric)
            np.testing.assert_array_equal(line.get_xdata(), ITERATIONS)
            np.testing.assert_allclose(line.get_ydata(), layers.mean(0), rtol=1e-12)
            y = band.get_paths()[0].vertices[:, 1]
            assert y.min() == pytest.approx(layers.min()) and y.max() == pytest.approx(layers.max())


def test_norm_lines_of_several_runs_are_the_layer_means_and_medians(figures):
    runs = [_run("a", 2), _run("b", 3)]
    plots.plot_norms([r for r, _ in runs], "unused.png", HIST_EDGES)
    (fig,) = figures
    ax_a, ax_b, _ = fig.axes
    for i, (_, values) in enumerate(runs):
        saturated = 100 * _stack(values, "norm_saturated")
        np.testing.assert_allclose(ax_a.lines[i].get_ydata(), saturated.mean(0), rtol=1e-12)
        y = ax_a.collections[i].get_paths()[0].vertices[:, 1]
        assert y.min() == pytest.approx(saturated.min())
        assert y.max() == pytest.approx(saturated.max())
        medians = _stack(values, "norm_log10_ms_p50")
        line_b = [ln for ln in ax_b.lines if ln.get_marker() == "o"][i]
        np.testing.assert_allclose(line_b.get_ydata(), np.median(medians, 0), rtol=1e-12)
        y = ax_b.collections[i].get_paths()[0].vertices[:, 1]
        assert y.min() == pytest.approx(_stack(values, "norm_log10_ms_p05").min())
        assert y.max() == pytest.approx(_stack(values, "norm_log10_ms_p95").max())


def test_norm_figure_of_several_runs_leaves_out_a_run_without_an_activation_batch(figures):
    """A run analysed without validation data has no norm statistics: analyze of it beside a run
    that has them stopped with an IndexError in norm_saturation.png. That run is now left out
    of the figure, the other drawn as alone."""
    (run, values), (bare, _) = _run("a", 6), _run("b", 7)
    bare.metrics = {k: v for k, v in bare.metrics.items() if not k.startswith("norm_")}
    bare.norm_histograms = {}
    plots.plot_norms([run, bare], "unused.png", HIST_EDGES)
    (fig,) = figures
    ax_a = fig.axes[0]
    (line,) = ax_a.lines
    np.testing.assert_allclose(line.get_ydata(), 100 * _stack(values, "norm_saturated").mean(0))
    assert line.get_color() == plots.run_color(0)


def test_sink_panel_of_several_runs_has_one_point_per_layer_and_whole_layer_ticks(figures):
    """Each run's per-layer line is its last sink share per layer; the layer axis is ticked at
    whole layers only (it showed 0.2, 0.4, ... between layers 0 and 2). Both panels draw the
    uniform causal share (closed form: mean of 1/(i+1), i = 1..s-1) and start their y axis at 0:
    the per-layer panel had neither, so its own spread filled it (trial 16)."""
    runs = [_run("a", 4), _run("b", 5)]
    for run, _ in runs:
        for layer in (0, 1, 2):
            run.metrics[f"sink_share/layer_{layer:02d}"] = [0.1 * layer, 0.2, 0.05 * layer]
        run.seq_length = 16
    plots.plot_sink([r for r, _ in runs], "unused.png")
    (fig,) = figures
    panel = fig.axes[1]
    lines = {line.get_label(): line for line in panel.lines}
    for run, _ in runs:
        line = lines[plots.run_label(run)]
        np.testing.assert_array_equal(line.get_xdata(), [0, 1, 2])
        np.testing.assert_allclose(line.get_ydata(), [0.0, 0.05, 0.1])
    uniform = sum(1 / (i + 1) for i in range(1, 16)) / 15
    for ax in fig.axes[:2]:
        (reference,) = [ln for ln in ax.lines if ln.get_label().startswith("uniform causal")]
        np.testing.assert_allclose(reference.get_ydata(), [uniform, uniform], rtol=1e-12)
        bottom, top = ax.get_ylim()
        assert bottom == 0 and top > max(float(np.max(ln.get_ydata())) for ln in ax.lines)
    fig.canvas.draw()
    ticks = [t for t in panel.get_xticks() if panel.get_xlim()[0] <= t <= panel.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_sink_figure_of_several_runs_leaves_out_a_run_without_an_activation_batch(figures):
    """A run analysed without validation data has no sink shares: beside one that has them,
    its empty per-layer line stopped analyze ("zero-size array to reduction operation maximum")
    once that panel set its y axis from the lines drawn. It is left out of the panel."""
    (run, _), (bare, _) = _run("a", 10), _run("b", 11)
    for layer in (0, 1, 2):
        run.metrics[f"sink_share/layer_{layer:02d}"] = [0.1, 0.2, 0.05 * layer]
    run.seq_length = 16
    plots.plot_sink([run, bare], "unused.png")
    (fig,) = figures
    lines = [ln for ln in fig.axes[1].lines if not ln.get_label().startswith("uniform causal")]
    assert [ln.get_label() for ln in lines] == [plots.run_label(run)]
    np.testing.assert_allclose(lines[0].get_ydata(), [0.0, 0.05, 0.1])


def test_compare_labels_name_the_gate_as_analyze_does():
    """The trial's `compare` of γ = 1 + ε + gate against the ungated baseline: its legend read
    "seed-1 iter 16 (γ=1, ε=1e-12)" vs "(γ=0.5, ε=1e-05)", crediting the gate's share of the
    gap to γ and ε. The label is analyze's, gate included."""
    from megatron_gamma.config import Config
    from megatron_gamma.diagnostics.compare import _label

    gated = Config().replace(gated_attention="elementwise", norm_epsilon=1e-12, init_gamma=1.0)
    base = Config().replace(gated_attention="none", norm_epsilon=1e-5, init_gamma=0.5)
    ckpt = "/study/arm/d64/seed-1/checkpoints/iter_0000016"
    assert _label(ckpt, gated) == "seed-1 iter 16 (γ=1, ε=1e-12, gated-elementwise)"
    assert _label(ckpt, base) == "seed-1 iter 16 (γ=0.5, ε=1e-05, no gate)"
    headwise = gated.replace(gated_attention="headwise")
    assert _label(ckpt, headwise) == "seed-1 iter 16 (γ=1, ε=1e-12, gated-headwise)"


def test_the_delta_sym_plot_names_its_even_line(figures):
    """The lower panel's dotted line at 50 % (right axis) had no legend entry."""
    from megatron_gamma.diagnostics.tokens import DifficultyBin

    bins = [DifficultyBin(lo=0.0, hi=1.0, count=10, mean_delta=0.1, sem_delta=0.01,
                          a_better=0.7, mean_loss_a=0.4, mean_loss_b=0.6,
                          mean_difficulty=0.5)]  # fmt: skip
    plots.plot_compare(bins, ("A", "B"), "unused.png")
    (fig,) = figures
    (legend,) = fig.legends  # below the panels: inside the lower one it covered points (trial 15)
    labels = [t.get_text() for t in legend.get_texts()]
    assert "50% (right axis): A and B even" in labels and "mean loss of A" in labels
    assert fig.axes[1].get_legend() is None and fig.axes[2].get_legend() is None


def _legend_texts(legend) -> list[str]:
    return [t.get_text() for t in legend.get_texts()]


def test_figures_of_several_runs_say_what_their_bands_show(figures):
    """Trial 15 #7: the min-max band over layers around each run's mean was in no legend or
    title. Every figure of several runs that draws it now names it in its legend."""
    runs = [_run("a", 8)[0], _run("b", 9)[0]]
    for run in runs:
        for layer in (0, 1, 2):
            run.metrics[f"stable_rank/fc2/layer_{layer:02d}"] = [2.0 + layer, 3.0, 4.0]
            run.metrics[f"sink_share/layer_{layer:02d}"] = [0.1 * layer, 0.2, 0.05 * layer]
    plots.plot_role_grid(runs, "stable_rank", "unused.png", "title", "stable rank")
    plots.plot_sink(runs, "unused.png")
    plots.plot_norms(runs, "unused.png", HIST_EDGES)
    plots.plot_gates(runs, "unused.png")
    grid, sink, norms, gates = figures
    (legend,) = grid.legends
    assert plots.BAND_LABEL in _legend_texts(legend)
    assert plots.BAND_LABEL in _legend_texts(sink.axes[0].get_legend())
    assert plots.BAND_LABEL in _legend_texts(norms.axes[0].get_legend())
    assert "line: median of the layers' medians; band: lowest p05 to highest p95" in (
        _legend_texts(norms.axes[1].get_legend())
    )
    for ax in gates.axes:
        assert plots.BAND_LABEL in _legend_texts(ax.get_legend())
    for fig in figures:
        assert fig.axes[0].collections, "no band drawn"


def test_gates_figure_names_its_run_and_keeps_its_axes_in_range(figures):
    """Trial 15 #7: gates.png had no run subtitle, unlike the other figures of one run, and its
    "gates below 0.1 (%)" axis ran from -0.04 to 0.04 when no gate was closed. The labels said
    "gated" for both granularities."""
    run, values = _run("seed-1", 10)
    for layer in (0, 1, 2):
        run.metrics[f"gate_closed/layer_{layer:02d}"] = [0.0, 0.0, 0.0]
    run.summary["gated_attention"] = "headwise"
    plots.plot_gates([run], "unused.png")
    plots.plot_norms([run], "unused.png", HIST_EDGES)
    gates, norms = figures
    label = "seed-1 (γ=1, ε=1e-12, gated-headwise)"
    assert plots.run_label(run) == label
    assert gates.get_suptitle().endswith("\n" + label)
    mean_ax, closed_ax = gates.axes
    assert closed_ax.get_ylim() == (0.0, 100.0)
    top = max(max(v) for k, v in values.items() if k.startswith("gate_mean/"))
    assert mean_ax.get_ylim() == pytest.approx((0.0, min(1.0, 1.12 * top)))
    # the norm figure of one run colours its lines by layer: a legend says which colour is which
    (legend,) = norms.legends
    assert _legend_texts(legend) == ["layer 0", "layer 1", "layer 2"]
