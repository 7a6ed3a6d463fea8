"""`tunelab bench`'s modes as subcommands parse into the same settings as the flag form, which keeps working."""

from __future__ import annotations

import pytest

from tunelab.cli import main
from tunelab.commands import bench


@pytest.fixture
def parsed(monkeypatch):
    seen: dict = {}
    monkeypatch.setattr(bench, "run", lambda args: seen.update(vars(args)) or 0)

    def parse(*argv: str) -> dict:
        seen.clear()
        assert main(["bench", *argv]) == 0
        return dict(seen)

    return parse


def test_subcommands_and_flags_name_the_same_settings(parsed):
    sub = parsed("sweep", "--axis", "micro_batch=4,8", "seq_len=128", "--steps", "3")
    flag = parsed("--sweep", "micro_batch=4,8", "seq_len=128", "--steps", "3")
    for key in ("sweep", "overrides", "steps", "warmup"):
        assert sub[key] == flag[key]
    assert sub["sweep"] == ["micro_batch=4,8"] and sub["overrides"] == ["seq_len=128"]
    assert parsed("calibrate", "--methods", "lora,full")["calibrate"] is True
    assert parsed("suite", "gpu", "--rows", "8b-lora")["suite_rows"] == "8b-lora"
    assert parsed("export", "csv")["export"] == "csv"
    assert parsed("profile", "out/p")["profile"] == "out/p"


def test_flags_before_the_mode_are_kept_and_overrides_go_anywhere(parsed):
    got = parsed("--config", "c.yaml", "run", "lr=1e-4", "--warmup", "1")
    assert (got["mode"], got["config"], got["overrides"], got["warmup"]) == ("run", "c.yaml", ["lr=1e-4"], 1)
    got = parsed("micro_batch=4", "--steps", "3", "seq_len=128")
    assert (got["mode"], got["overrides"], got["steps"]) == (None, ["micro_batch=4", "seq_len=128"], 3)


def test_an_unknown_flag_after_an_override_is_still_refused(parsed, capsys):
    with pytest.raises(SystemExit):
        parsed("micro_batch=4", "--bogus")
    assert "unrecognized arguments: --bogus" in capsys.readouterr().err
