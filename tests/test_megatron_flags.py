"""docs/megatron-flags.md against the parser: every Megatron-LM flag it lists as accepted is a
``pretrain`` flag, every flag it lists as refused stops the command line naming the flag with the
documented reason, and the refusal table in code and the document hold the same flags."""

from pathlib import Path

import pytest

from megatron_gamma import cli
from megatron_gamma.megatron_flags import REFUSED

DOC = Path(__file__).parents[1] / "docs" / "megatron-flags.md"
STATUSES = {"accepted", "no-op", "renamed", "refused"}


def _rows() -> list[tuple[str, str, str, str]]:
    rows = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`--"):
            rows.append((cells[0].strip("`"), *cells[1:]))
    return rows


def _pretrain_flags() -> set[str]:
    parser = cli.build_parser()
    pretrain = parser._subparsers._group_actions[0].choices["pretrain"]
    return set(pretrain._option_string_actions)


def test_the_table_lists_each_flag_once_with_a_known_status():
    rows = _rows()
    assert len(rows) > 100
    flags = [r[0] for r in rows]
    assert len(flags) == len(set(flags)), sorted(f for f in flags if flags.count(f) > 1)
    assert {r[1] for r in rows} <= STATUSES, {r[1] for r in rows} - STATUSES
    assert all(r[3] for r in rows), [r[0] for r in rows if not r[3]]


def test_accepted_flags_are_pretrain_flags():
    known = _pretrain_flags()
    missing = [
        f for f, status, _, _ in _rows() if status in ("accepted", "no-op") and f not in known
    ]
    assert not missing


def test_refused_flags_are_the_code_table_with_its_reasons():
    documented = {f: why for f, status, _, why in _rows() if status in ("refused", "renamed")}
    assert set(documented) == set(REFUSED)
    for flag, (why, fix) in REFUSED.items():
        assert documented[flag] == f"{why}. Fix: {fix}", flag
    assert not set(REFUSED) & _pretrain_flags()


@pytest.mark.parametrize("flag", sorted(REFUSED))
def test_a_refused_flag_stops_the_command_line_naming_it(flag, capsys):
    with pytest.raises(SystemExit) as exit_:
        cli.parse_args(["pretrain", flag, "--lr", "1e-3"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    why, fix = REFUSED[flag]
    assert f"{flag}: refused: {why}. Fix: {fix}" in err


def test_refused_and_unknown_flags_are_reported_together(capsys):
    with pytest.raises(SystemExit):
        cli.parse_args(
            ["pretrain", "--tp-comm-overlap", "--use-legacy-models", "--save-intervl", "3"]
        )
    err = capsys.readouterr().err
    assert "--tp-comm-overlap: refused:" in err and "--use-legacy-models: refused:" in err
    assert "--save-intervl: did you mean --save-interval?" in err


def test_the_table_names_a_status_for_every_flag_in_megatron_lm_examples():
    listed = {r[0] for r in _rows()}
    fixtures = Path(__file__).parent / "megatron_lm_examples"
    used = set()
    for path in fixtures.glob("*.args"):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.startswith("--"):
                used.add(line.split()[0])
    assert not used - listed, sorted(used - listed)
