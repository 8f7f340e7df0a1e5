"""Which task files of ``evaluate --include-path`` would make lm-eval run Python code
(:mod:`megatron_gamma.evaluation.task_code`). The reference is PyYAML's own tag resolution, the
loader lm-eval reads task files with: every spelling of the ``!function`` tag it resolves is
found, and a file without one is not."""

from __future__ import annotations

import pytest
import yaml

from megatron_gamma.config import ConfigError
from megatron_gamma.evaluation.task_code import check_task_code, files_with_code

SPELLINGS = {
    "shorthand": "task: t\nprocess_docs: !function utils.keep\n",
    "verbatim": "task: t\nprocess_docs: !<!function> utils.keep\n",
    "tag_handle": "%TAG !e! !fun\n---\ntask: t\nprocess_docs: !e!ction utils.keep\n",
    "second_document": "task: t\n---\nprocess_docs: !function utils.keep\n",
}


@pytest.mark.parametrize("name", sorted(SPELLINGS))
def test_every_spelling_pyyaml_resolves_to_the_tag_is_found(tmp_path, name):
    text = SPELLINGS[name]
    tags = {getattr(e, "tag", None) for e in yaml.parse(text, Loader=yaml.SafeLoader)}
    assert "!function" in tags  # PyYAML reads it as lm-eval's tag
    (tmp_path / "t.yaml").write_text(text)
    assert files_with_code(str(tmp_path)) == [str((tmp_path / "t.yaml").resolve())]
    with pytest.raises(ConfigError, match="use lm-eval's '!function' tag"):
        check_task_code(str(tmp_path), trust_task_code=False)
    check_task_code(str(tmp_path), trust_task_code=True)


def test_included_files_are_read_and_plain_tasks_pass(tmp_path):
    """A plain task file includes a base outside the directory that holds the tag: lm-eval
    reads the base too. The words '!function' inside a quoted string are no tag."""
    tasks, shared = tmp_path / "tasks", tmp_path / "shared"
    tasks.mkdir()
    shared.mkdir()
    (shared / "base.yml").write_text("process_docs: !function utils.keep\n")
    (tasks / "t.yaml").write_text("include: ../shared/base.yml\ntask: t\n")
    (tasks / "plain.yaml").write_text("task: plain\ndoc_to_text: 'see !function docs'\n")
    assert files_with_code(str(tasks)) == [str((shared / "base.yml").resolve())]
    (tasks / "t.yaml").write_text("task: t\n")
    assert files_with_code(str(tasks)) == []
    check_task_code(str(tasks), trust_task_code=False)
    check_task_code(None, trust_task_code=False)


def test_a_file_pyyaml_cannot_parse_is_searched_as_text(tmp_path):
    (tmp_path / "broken.yaml").write_text("task: [t\nprocess_docs: !function utils.keep\n")
    assert files_with_code(str(tmp_path)) == [str((tmp_path / "broken.yaml").resolve())]
