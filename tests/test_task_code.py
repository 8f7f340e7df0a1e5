"""What the task files of ``evaluate --include-path`` would make lm-eval run
(:mod:`megatron_gamma.evaluation.task_code`). References: PyYAML's own tag resolution, the loader
lm-eval reads task files with; lm-eval's own task loading (``TaskManager``, ``get_task_dict``),
which must run no code from a file the check lets through."""

from __future__ import annotations

import os

import pytest
import yaml

from megatron_gamma.config import ConfigError
from megatron_gamma.evaluation.task_code import check_task_code, sandbox_templates, task_code

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY_MC = os.path.join(REPO, "tests", "lm_eval_tasks", "tiny_mc.yaml")

SPELLINGS = {
    "shorthand": "task: t\nprocess_docs: !function utils.keep\n",
    "verbatim": "task: t\nprocess_docs: !<!function> utils.keep\n",
    "tag_handle": "%TAG !e! !fun\n---\ntask: t\nprocess_docs: !e!ction utils.keep\n",
    "second_document": "task: t\n---\nprocess_docs: !function utils.keep\n",
}


def _tagged(path) -> str:
    return f"{str(path.resolve())!r} uses the '!function' tag (imports the module beside it)"


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_every_spelling_pyyaml_resolves_to_the_tag_is_found(tmp_path, name):
    text = SPELLINGS[name]
    tags = {getattr(e, "tag", None) for e in yaml.parse(text, Loader=yaml.SafeLoader)}
    assert "!function" in tags  # PyYAML reads it as lm-eval's tag
    (tmp_path / "t.yaml").write_text(text)
    assert task_code(str(tmp_path)) == [_tagged(tmp_path / "t.yaml")]
    with pytest.raises(ConfigError, match="would make lm-eval run Python code"):
        check_task_code(str(tmp_path), trust_task_code=False)
    check_task_code(str(tmp_path), trust_task_code=True)


@pytest.mark.parametrize("include", ["../shared/base.yml", "[../shared/base.yml]"])
def test_included_files_are_read_and_plain_tasks_pass(tmp_path, include):
    """A plain task file includes a base outside the directory that holds the tag, by a string
    or a list (trial 6: a list was not followed): lm-eval reads the base too. The words
    '!function' inside a quoted string are no tag; a .yml file or a __pycache__ folder, which
    lm-eval's index skips, is not read."""
    tasks, shared = tmp_path / "tasks", tmp_path / "shared"
    (tasks / "__pycache__").mkdir(parents=True)
    shared.mkdir()
    (shared / "base.yml").write_text("process_docs: !function utils.keep\n")
    (tasks / "t.yaml").write_text(f"include: {include}\ntask: t\n")
    (tasks / "plain.yaml").write_text("task: plain\ndoc_to_text: 'see !function docs'\n")
    (tasks / "skipped.yml").write_text(SPELLINGS["shorthand"])
    (tasks / "__pycache__" / "x.yaml").write_text(SPELLINGS["shorthand"])
    assert task_code(str(tasks)) == [_tagged(shared / "base.yml")]
    (tasks / "t.yaml").write_text("task: t\n")
    assert task_code(str(tasks)) == []
    check_task_code(str(tasks), trust_task_code=False)
    check_task_code(None, trust_task_code=False)


def test_a_file_pyyaml_cannot_parse_is_searched_as_text(tmp_path):
    (tmp_path / "broken.yaml").write_text("task: [t\nprocess_docs: !function utils.keep\n")
    assert task_code(str(tmp_path)) == [_tagged(tmp_path / "broken.yaml")]


def test_a_metric_outside_lm_evals_registry_is_code(tmp_path):
    """Trial 6: a metric lm-eval's registry lacks goes to evaluate.load(NAME), which imports a
    metric script from that path, and ran a marker there; so does one marked hf_evaluate. A
    registered metric is data."""
    pytest.importorskip("lm_eval")
    spec = yaml.safe_load(open(TINY_MC))
    (tmp_path / "ok.yaml").write_text(yaml.safe_dump(spec))
    check_task_code(str(tmp_path), trust_task_code=False)  # acc: registered
    spec["metric_list"] = [{"metric": str(tmp_path / "mymetric"), "aggregation": "mean"},
                           {"metric": "acc", "hf_evaluate": True}]  # fmt: skip
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(ConfigError) as err:
        check_task_code(str(tmp_path), trust_task_code=False)
    where = repr(str((tmp_path / "m.yaml").resolve()))
    assert (
        f"{where} names metric {str(tmp_path / 'mymetric')!r}, not in lm-eval's metric registry "
        "(evaluate.load imports its script)" in str(err.value)
    )
    assert f"{where} names metric 'acc', marked hf_evaluate" in str(err.value)


def test_templates_render_in_a_sandbox(tmp_path):
    """Trial 6: lm-eval renders doc_to_text in a plain Jinja environment, and a task file's
    template ran os.system when the task loaded, with no tag to find. In the sandbox the same
    template raises SecurityError and the marker is not made; the tiny task's own templates
    render as before. (The reference is a new plain environment: where an earlier evaluation
    in this process sandboxed lm-eval's, as CI's workers do, that one refuses it too.)"""
    pytest.importorskip("lm_eval")
    import jinja2
    import lm_eval.utils
    from jinja2.exceptions import SecurityError

    marker = tmp_path / "ran"
    evil = "{{ cycler.__init__.__globals__.os.system('touch " + str(marker) + "') }}{{ q }}"
    plain = lm_eval.utils.env
    assert lm_eval.utils.apply_template("{{ q }}?", {"q": "x"}) == "x?"
    sandbox_templates()
    try:
        with pytest.raises(SecurityError):
            lm_eval.utils.apply_template(evil, {"q": "x"})
        assert not marker.exists()
        assert lm_eval.utils.apply_template("{{ q | regex_replace('x', 'y') }}?", {"q": "x"}) == (
            "y?"
        )
        sandbox_templates()  # idempotent
        assert lm_eval.utils.env.filters["regex_replace"] is plain.filters["regex_replace"]
    finally:
        lm_eval.utils.env = plain
    jinja2.Environment().from_string(evil).render(q="x")  # the reference: a plain one runs it
    assert marker.exists()
