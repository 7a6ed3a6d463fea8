"""`tunelab bench` has subcommands only: each parses its own options and the config's KEY=VALUE overrides that
follow it; the flag form it replaced, or no subcommand at all, is a one-line error that names what to type."""

from __future__ import annotations

import pytest

from tunelab.cli import main
from tunelab.commands import bench


@pytest.fixture
def parsed(monkeypatch):
    seen: dict = {}
    for name in bench.SUBCOMMANDS:
        monkeypatch.setitem(bench.SUBCOMMANDS, name, lambda args: seen.update(vars(args)) or 0)

    def parse(*argv: str) -> dict:
        seen.clear()
        assert main(["bench", *argv]) == 0
        return dict(seen)

    return parse


def test_each_subcommand_takes_its_options_and_the_overrides_after_it(parsed):
    got = parsed("run", "--config", "configs/quickstart.yaml", "micro_batch=8", "--steps", "3")
    assert (got["mode"], got["config"], got["overrides"], got["steps"], got["warmup"]) == (
        "run",
        "configs/quickstart.yaml",
        ["micro_batch=8"],
        3,
        2,
    )
    got = parsed("sweep", "--axis", "micro_batch=4,8", "lora.r=8", "--axis", "seq_len=128,256")
    assert got["axis"] == ["micro_batch=4,8", "seq_len=128,256"] and got["overrides"] == ["lora.r=8"]
    assert parsed("calibrate", "--methods", "lora,full")["steps"] == bench.CALIBRATE_STEPS
    assert parsed("run")["steps"] == bench.DEFAULT_STEPS  # calibrate's default is its own
    got = parsed("peers", "hf-trainer-tuned,trl-sft", "lr=1e-4", "--rounds", "1")
    assert (got["names"], got["rounds"], got["overrides"]) == ("hf-trainer-tuned,trl-sft", 1, ["lr=1e-4"])
    got = parsed("suite", "gpu", "--rows", "8b-lora", "micro_batch=2")
    assert (got["suite"], got["rows"], got["overrides"]) == ("gpu", "8b-lora", ["micro_batch=2"])
    assert parsed("export", "csv", "output_dir=runs/x")["overrides"] == ["output_dir=runs/x"]
    assert parsed("profile", "out/p", "micro_batch=2")["dir"] == "out/p"
    got = parsed("fit", "--write")
    assert got["write"] is True and got["rows"] == "benchmarks/plan-accuracy/rows"


def one_line_error(capsys, *argv: str) -> str:
    assert main(["bench", *argv]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("tunelab bench: error: "), err
    return err


@pytest.mark.parametrize(
    ("argv", "use"),
    [
        (["--sweep", "micro_batch=4,8"], "tunelab bench sweep --axis KEY=V1,V2"),
        (["--config", "c.yaml", "--calibrate"], "tunelab bench calibrate"),
        (["--suite", "gpu", "--suite-rows", "1b-lora"], "tunelab bench suite NAME"),
        (["--peer", "trl-sft"], "tunelab bench peers NAME[,NAME]"),
        (["--export", "csv"], "tunelab bench export csv|json"),
        (["--config", "c.yaml", "micro_batch=8", "--profile", "p"], "tunelab bench profile DIR"),
        (["--config", "c.yaml", "--steps", "3"], "tunelab bench run --config"),
    ],
)
def test_the_flag_form_is_a_one_line_error_naming_the_subcommand(capsys, argv, use):
    assert use in one_line_error(capsys, *argv)


def test_no_subcommand_lists_them(capsys):
    err = one_line_error(capsys)
    assert "run, sweep, profile, calibrate, peers, suite, export, fit" in err


def test_an_unknown_flag_after_a_subcommand_is_refused(parsed, capsys):
    with pytest.raises(SystemExit):
        parsed("run", "micro_batch=4", "--bogus")
    err = capsys.readouterr().err
    assert "unrecognized arguments:" in err and "--bogus" in err


def test_fit_takes_no_config_overrides(capsys):
    assert "drop micro_batch=8" in one_line_error(capsys, "fit", "micro_batch=8")


def test_calibration_contrasts_the_configs_method_with_the_other_flop_count():
    from tunelab.bench.loops import calibration_methods

    assert calibration_methods("qlora", None) == ["qlora", "full"]
    assert calibration_methods("full", None) == ["full", "lora"]
    assert calibration_methods("lora", "dora, full") == ["dora", "full"]
